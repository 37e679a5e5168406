//! One renderer for an error and its sources, for logs, CLI output and stored error text.

use std::error::Error;
use std::fmt;

/// An error and its [`Error::source`] chain on one line, joined with `": "`.
///
/// [`ErrorChain::new`] skips a source whose text the line already holds (a message that
/// repeats its source with `{0}`); [`ErrorChain::every`] keeps each message, for text that
/// is stored and must not depend on how a message was phrased (`idem`'s `last_error`).
///
/// ```
/// # use idem_base::ErrorChain;
/// #[derive(Debug)]
/// struct Outer(std::io::Error);
/// impl std::fmt::Display for Outer {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         write!(f, "opening the store")
///     }
/// }
/// impl std::error::Error for Outer {
///     fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
///         Some(&self.0)
///     }
/// }
/// let e = Outer(std::io::Error::other("disk full"));
/// assert_eq!(ErrorChain::new(&e).to_string(), "opening the store: disk full");
/// ```
#[derive(Clone, Copy)]
pub struct ErrorChain<'a> {
    error: &'a dyn Error,
    skip_repeats: bool,
}

impl<'a> ErrorChain<'a> {
    /// `error` and each source whose text the line does not already contain.
    pub fn new(error: &'a dyn Error) -> Self {
        ErrorChain {
            error,
            skip_repeats: true,
        }
    }

    /// `error` and every source, each message once per level even if repeated.
    pub fn every(error: &'a dyn Error) -> Self {
        ErrorChain {
            error,
            skip_repeats: false,
        }
    }
}

impl fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text = self.error.to_string();
        let mut source = self.error.source();
        while let Some(s) = source {
            let more = s.to_string();
            if !(self.skip_repeats && text.contains(&more)) {
                text.push_str(": ");
                text.push_str(&more);
            }
            source = s.source();
        }
        f.write_str(&text)
    }
}

impl fmt::Debug for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Wrap(&'static str, Option<std::io::Error>);

    impl fmt::Display for Wrap {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    impl Error for Wrap {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            self.1.as_ref().map(|e| e as &(dyn Error + 'static))
        }
    }

    #[test]
    fn sources_join_with_a_colon_and_repeats_are_skipped_unless_asked() {
        let plain = Wrap("outer", Some(std::io::Error::other("inner")));
        assert_eq!(ErrorChain::new(&plain).to_string(), "outer: inner");
        let repeated = Wrap("outer: inner", Some(std::io::Error::other("inner")));
        assert_eq!(ErrorChain::new(&repeated).to_string(), "outer: inner");
        assert_eq!(
            ErrorChain::every(&repeated).to_string(),
            "outer: inner: inner"
        );
        assert_eq!(ErrorChain::new(&Wrap("alone", None)).to_string(), "alone");
    }
}
