//! The result bytes an error carries when an executor ran but its settlement could not be
//! recorded as it was: what an operator resolves the effect with.

use std::fmt;

/// An executor's result, carried by the errors that say "it executed" without a stored result
/// ([`crate::Error::EffectNotRecorded`], [`crate::Error::EffectResultNotKept`]), so the caller
/// still has it and an operator can resolve the key with it.
///
/// Its `Debug` shows the length and at most 32 bytes, never a whole (possibly large) result.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Output(Vec<u8>);

impl Output {
    /// Wraps an executor's result.
    pub fn new(bytes: Vec<u8>) -> Self {
        Output(bytes)
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The bytes, owned.
    pub fn into_vec(self) -> Vec<u8> {
        self.0
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True for an empty result.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Output {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 32;
        let head = &self.0[..self.0.len().min(SHOWN)];
        let more = if self.0.len() > SHOWN { "…" } else { "" };
        write!(
            f,
            "Output({} bytes: {:?}{more})",
            self.0.len(),
            String::from_utf8_lossy(head)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::Output;

    #[test]
    fn debug_shows_the_length_and_a_short_head_only() {
        let big = Output::new(vec![b'x'; 10_000]);
        let shown = format!("{big:?}");
        assert!(shown.starts_with("Output(10000 bytes: \"xxxx"), "{shown}");
        assert!(shown.len() < 80, "{shown}");
        assert_eq!(
            format!("{:?}", Output::new(b"ok".to_vec())),
            "Output(2 bytes: \"ok\")"
        );
    }
}
