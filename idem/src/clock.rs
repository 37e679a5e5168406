//! The injectable clock: tests of retention need deterministic time.

use std::fmt::Debug;
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of wall-clock time in integer milliseconds since the Unix epoch.
pub trait Clock: Send + Sync + Debug {
    /// Now, in milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// The system clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        system_time_ms(SystemTime::now())
    }
}

/// Converts a `SystemTime` to milliseconds since the Unix epoch (0 for times before it,
/// saturating at `i64::MAX` so the value always fits an SQLite integer).
pub fn system_time_ms(t: SystemTime) -> u64 {
    let ms = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    u64::try_from(ms).unwrap_or(u64::MAX).min(i64::MAX as u64)
}
