//! The injectable clock: tests of retention, leases and effect stamps need deterministic time.
//!
//! This is the workspace's one clock: `idem-org` takes an `Arc<dyn Clock>` from the embedder
//! and feeds both idem and the snapshot store from it.

use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
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

/// A clock tests set by hand: it reads what it was last set to, in ms since the Unix epoch.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    /// A clock reading `ms` (milliseconds since the Unix epoch).
    pub fn new(ms: u64) -> Self {
        ManualClock(AtomicU64::new(ms))
    }

    /// Moves the clock forward by `ms` milliseconds (saturating).
    pub fn advance(&self, ms: u64) {
        let _ = self
            .0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |now| {
                Some(now.saturating_add(ms))
            });
    }

    /// Sets the clock to `ms` milliseconds since the Unix epoch.
    pub fn set(&self, ms: u64) {
        self.0.store(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_reads_what_it_was_set_to() {
        let clock = ManualClock::new(1_000);
        clock.advance(500);
        assert_eq!(clock.now_ms(), 1_500);
        clock.set(7);
        assert_eq!(clock.now_ms(), 7);
        clock.advance(u64::MAX);
        assert_eq!(clock.now_ms(), u64::MAX);
    }
}
