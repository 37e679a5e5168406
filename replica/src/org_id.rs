//! Validated tenant ids: the only way an org name reaches an object path (I12).

use crate::Error;

/// A validated org (tenant) id.
///
/// Matches `^[a-z0-9][a-z0-9._-]{0,127}$`, never contains `..` and never ends in `.`, so it
/// is always exactly one safe path segment: no traversal, no separator, no prefix confusion,
/// and no two ids that one file system maps to one directory (I12). Upper case is refused,
/// not folded: `Acme` and `acme` would be two tenants on a case-sensitive file system and
/// one on a case-insensitive one, so only one spelling exists (a trailing dot likewise,
/// which some file systems strip).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OrgId(String);

impl OrgId {
    /// Validates `s` as an org id.
    ///
    /// # Errors
    /// [`Error::InvalidOrgId`] when `s` is empty, longer than 128 bytes, does not start with a
    /// lowercase ASCII letter or digit, contains anything but `a-z 0-9 . _ -`, contains `..`,
    /// or ends in `.`.
    pub fn new(s: &str) -> Result<OrgId, Error> {
        let reject = |reason| {
            let mut id: String = s.chars().take(200).collect();
            id.truncate(200);
            Err(Error::InvalidOrgId { id, reason })
        };
        let Some(first) = s.bytes().next() else {
            return reject("empty");
        };
        if s.len() > 128 {
            return reject("longer than 128 bytes");
        }
        let lower_alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        if !lower_alnum(first) {
            return reject("must start with a lowercase ascii letter or digit");
        }
        if !s
            .bytes()
            .all(|b| lower_alnum(b) || b == b'.' || b == b'_' || b == b'-')
        {
            return reject("only lowercase ascii letters, digits, '.', '_' and '-' are allowed");
        }
        if s.contains("..") {
            return reject("must not contain '..'");
        }
        if s.ends_with('.') {
            return reject("must not end in '.'");
        }
        Ok(OrgId(s.to_owned()))
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for OrgId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for OrgId {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        OrgId::new(s)
    }
}

impl AsRef<str> for OrgId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// Validates a writer id: 1–256 bytes, no control characters. Writer ids never form paths.
pub(crate) fn check_writer(writer: &str) -> Result<(), Error> {
    let reason = if writer.is_empty() {
        "empty"
    } else if writer.len() > 256 {
        "longer than 256 bytes"
    } else if writer.chars().any(char::is_control) {
        "contains control characters"
    } else {
        return Ok(());
    };
    Err(Error::InvalidWriter {
        writer: writer.chars().take(200).collect(),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_ids_are_accepted() -> Result<(), Error> {
        for s in ["acme", "a", "a.b_c-9", &"x".repeat(128), "0org"] {
            assert_eq!(OrgId::new(s)?.as_str(), s);
        }
        Ok(())
    }

    #[test]
    fn bad_ids_are_rejected_with_a_typed_error() {
        let kb = "a".repeat(1024);
        for s in [
            "", "../x", "a/b", "..", "a..b", ".hidden", "-x", "é", "acme\0", "a b", &kb, "a\\b",
            "x/", "Acme", "ACME", "acme.", "aCme",
        ] {
            let e = OrgId::new(s);
            assert!(
                matches!(e, Err(Error::InvalidOrgId { .. })),
                "{s:?} accepted"
            );
        }
    }
}
