//! Idempotency key validation.

use crate::Error;

/// Longest accepted idempotency key, in bytes of UTF-8.
pub const MAX_KEY_BYTES: usize = 255;

/// Checks an idempotency key: 1–255 bytes of UTF-8 without NUL. Keys compare byte for byte.
///
/// # Errors
/// [`Error::InvalidKey`] naming the rule that was broken.
pub fn validate_key(key: &str) -> Result<(), Error> {
    if key.is_empty() {
        return Err(Error::InvalidKey { reason: "empty" });
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(Error::InvalidKey {
            reason: "longer than 255 bytes",
        });
    }
    if key.as_bytes().contains(&0) {
        return Err(Error::InvalidKey {
            reason: "contains a NUL byte",
        });
    }
    Ok(())
}
