//! The one injected clock of the workspace: wall time for what people read and what ages are
//! measured in, and the host's monotonic time for durations and liveness (I15).
//!
//! This module is the only code that reads the host's time (`clippy.toml` forbids
//! `Instant::now` and `SystemTime::now` elsewhere), so a [`ManualClock`] drives everything
//! that decides by time: prune and retention ages, lease expiry, snapshot intervals.
//! [`Stopwatch`] measures how long something took (metrics, benches, test deadlines), which
//! decides nothing.

use std::fmt::Debug;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The injected clock. Injected so tests control leases, retention ages and effect stamps,
/// one clock per simulated process.
pub trait Clock: Send + Sync + Debug {
    /// Wall time, ms since the Unix epoch: stamps keys, effects and log entries, and measures
    /// retention and prune ages. It may jump either way (a mis-set host, an NTP step), so no
    /// lease decision reads it, and another host's never reaches a decision (I15).
    fn now_ms(&self) -> u64;

    /// Monotonic time in ms since an arbitrary start fixed for this clock: never goes back,
    /// does not follow steps of the wall clock, and means nothing to another process. A
    /// claimant measures how long it has seen a lease unchanged with it (I15); the shipper
    /// measures how long since its last full snapshot with it.
    fn monotonic_ms(&self) -> u64;

    /// [`Clock::now_ms`] as a `SystemTime`, for APIs that take one.
    fn now(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.now_ms())
    }
}

/// The system clock: `SystemTime` for the wall, the host's monotonic clock (`Instant`, which
/// on Linux is `CLOCK_MONOTONIC`, unaffected by steps of the wall clock) for liveness.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[allow(clippy::disallowed_methods)] // The one reader of the host's wall clock.
    fn now_ms(&self) -> u64 {
        system_time_ms(SystemTime::now())
    }

    fn monotonic_ms(&self) -> u64 {
        // One start for the whole process, so every handle's readings compare.
        static START: OnceLock<Stopwatch> = OnceLock::new();
        START.get_or_init(Stopwatch::start).elapsed_ms()
    }
}

/// A clock tests set by hand, one per simulated process: [`ManualClock::advance`] is time
/// passing (the wall and the monotonic clock move together), [`ManualClock::set`] is a step
/// of the wall clock alone (a mis-set host, an NTP step), which the monotonic clock ignores.
#[derive(Debug, Default)]
pub struct ManualClock {
    wall: AtomicU64,
    monotonic: AtomicU64,
}

impl ManualClock {
    /// A clock whose wall reads `ms` (since the Unix epoch) and whose monotonic clock reads 0.
    pub fn new(ms: u64) -> Self {
        ManualClock {
            wall: AtomicU64::new(ms),
            monotonic: AtomicU64::new(0),
        }
    }

    /// Lets `ms` milliseconds pass: both clocks move forward by `ms` (saturating).
    pub fn advance(&self, ms: u64) {
        for clock in [&self.wall, &self.monotonic] {
            let _ = clock.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |now| {
                Some(now.saturating_add(ms))
            });
        }
    }

    /// Steps the wall clock to `ms` (either way); the monotonic clock does not move.
    pub fn set(&self, ms: u64) {
        self.wall.store(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.wall.load(Ordering::SeqCst)
    }

    fn monotonic_ms(&self) -> u64 {
        self.monotonic.load(Ordering::SeqCst)
    }
}

/// Elapsed time on the host's monotonic clock, for measuring how long something took
/// (metrics, benches, test deadlines); never for a decision a test must control, which reads
/// an injected [`Clock`].
///
/// ```
/// # use idem_base::Stopwatch;
/// let watch = Stopwatch::start();
/// assert!(watch.elapsed() < std::time::Duration::from_secs(60));
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Stopwatch(Instant);

impl Stopwatch {
    /// A stopwatch started now.
    #[allow(clippy::disallowed_methods)] // The one reader of the host's monotonic clock.
    pub fn start() -> Self {
        Stopwatch(Instant::now())
    }

    /// Time since [`Stopwatch::start`] (or the last [`Stopwatch::restart`]).
    pub fn elapsed(&self) -> Duration {
        self.0.elapsed()
    }

    /// [`Stopwatch::elapsed`] in whole milliseconds (saturating).
    pub fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Starts again from now.
    pub fn restart(&mut self) {
        *self = Stopwatch::start();
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
        assert_eq!(clock.monotonic_ms(), 500);
        clock.set(7);
        assert_eq!(clock.now_ms(), 7);
        assert_eq!(clock.monotonic_ms(), 500);
        clock.advance(u64::MAX);
        assert_eq!(clock.now_ms(), u64::MAX);
        assert_eq!(clock.monotonic_ms(), u64::MAX);
    }

    #[test]
    fn the_system_clock_reads_the_wall_and_a_monotonic_clock() {
        let wall = SystemClock.now_ms();
        assert!(wall > 1_600_000_000_000);
        assert!(SystemClock.now() >= UNIX_EPOCH + Duration::from_millis(wall));
        let first = SystemClock.monotonic_ms();
        assert!(SystemClock.monotonic_ms() >= first);
    }
}
