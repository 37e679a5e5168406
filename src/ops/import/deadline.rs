//! The `--timeout` of reading the tenant's file, on an injectable monotonic clock so tests
//! can run a copy out of time deterministically.

use std::time::Duration;

use idem_base::Stopwatch;

/// A monotonic time source.
pub(crate) trait Clock {
    /// Time since a fixed start of this clock.
    fn now(&self) -> Duration;
    /// Waits for `d` (another process's lock to go).
    fn sleep(&self, d: Duration);
}

/// The process's monotonic clock.
pub(crate) struct Monotonic(Stopwatch);

impl Monotonic {
    /// A clock starting now.
    pub(crate) fn start() -> Self {
        Monotonic(Stopwatch::start())
    }
}

impl Clock for Monotonic {
    fn now(&self) -> Duration {
        self.0.elapsed()
    }
    fn sleep(&self, d: Duration) {
        std::thread::sleep(d);
    }
}

/// When the read of the tenant's file must have ended.
pub(crate) struct Deadline<'c> {
    clock: &'c dyn Clock,
    end: Duration,
    timeout: Duration,
}

/// The longest pause between two attempts at a lock another process holds.
const MAX_PAUSE: Duration = Duration::from_millis(50);

impl<'c> Deadline<'c> {
    /// `timeout` from now on `clock`.
    pub(crate) fn new(clock: &'c dyn Clock, timeout: Duration) -> Self {
        Deadline {
            clock,
            end: clock.now().saturating_add(timeout),
            timeout,
        }
    }

    /// The `--timeout` this deadline enforces.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The clock's time now.
    pub(crate) fn now(&self) -> Duration {
        self.clock.now()
    }

    /// Time left, or `None` once the deadline has passed.
    pub(crate) fn remaining(&self) -> Option<Duration> {
        let now = self.clock.now();
        (now < self.end).then(|| self.end - now)
    }

    /// Waits before attempt `attempt + 1` at something another process holds: 1 ms, doubling
    /// up to 50 ms, never past the deadline. False when the deadline has passed.
    pub(crate) fn pause(&self, attempt: u32) -> bool {
        let Some(left) = self.remaining() else {
            return false;
        };
        let pause = Duration::from_millis(1u64 << attempt.min(6)).min(MAX_PAUSE);
        self.clock.sleep(pause.min(left));
        self.remaining().is_some()
    }
}
