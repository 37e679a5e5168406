//! Per-call settings of [`crate::once_with`] and the [`Outcome`] it returns.

use std::sync::Arc;

use crate::effect::WriteHook;
use crate::failpoint::Failpoints;
use crate::{Clock, Error, SystemClock};

/// Default limit on a stored result: 1 MiB.
pub const DEFAULT_MAX_RESULT_BYTES: usize = 1 << 20;

/// Settings for one call of [`crate::once_with`]: a small builder.
///
/// ```
/// let opts = idem::Options::new()
///     .fingerprint(b"sha256-of-the-request-body".to_vec())
///     .max_attempts(3)
///     .max_result_bytes(64 * 1024);
/// # let _ = opts;
/// ```
#[derive(Clone)]
pub struct Options {
    pub(crate) fingerprint: Option<Vec<u8>>,
    pub(crate) max_attempts: Option<u32>,
    pub(crate) max_result_bytes: usize,
    pub(crate) clock: Option<Arc<dyn Clock>>,
    pub(crate) failpoints: Option<Arc<dyn Failpoints>>,
    pub(crate) attempt_id: Option<[u8; 16]>,
    pub(crate) on_write: Option<WriteHook>,
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("fingerprint", &self.fingerprint)
            .field("max_attempts", &self.max_attempts)
            .field("max_result_bytes", &self.max_result_bytes)
            .field("clock", &self.clock)
            .field("failpoints", &self.failpoints)
            .field("attempt_id", &self.attempt_id)
            .field("on_write", &self.on_write.is_some())
            .finish()
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            fingerprint: None,
            max_attempts: None,
            max_result_bytes: DEFAULT_MAX_RESULT_BYTES,
            clock: None,
            failpoints: None,
            attempt_id: None,
            on_write: None,
        }
    }
}

impl Options {
    /// Defaults: no fingerprint, unlimited attempts, 1 MiB result limit, the system clock.
    pub fn new() -> Self {
        Self::default()
    }

    /// A fingerprint (digest) of the request payload, stored with the key when it is applied.
    /// A later call whose fingerprint differs (including present versus absent) gets
    /// [`Error::FingerprintMismatch`] and changes nothing (I4).
    pub fn fingerprint(mut self, fingerprint: impl Into<Vec<u8>>) -> Self {
        self.fingerprint = Some(fingerprint.into());
        self
    }

    /// After this many failed attempts of a key, calls return [`Error::AttemptsExhausted`]
    /// without running `apply`, until [`crate::clear_failures`] clears the key.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = Some(attempts);
        self
    }

    /// Largest result `apply` may return, in bytes (default 1 MiB).
    pub fn max_result_bytes(mut self, bytes: usize) -> Self {
        self.max_result_bytes = bytes;
        self
    }

    /// The clock that stamps `applied_at` and failed attempts (tests inject a
    /// [`crate::ManualClock`]).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// True when a clock was set with [`Options::clock`] (as [`crate::effect::Options`]).
    pub fn has_clock(&self) -> bool {
        self.clock.is_some()
    }

    /// Failpoints for tests (see [`crate::failpoint`]); production code leaves this unset.
    pub fn failpoints(mut self, failpoints: Arc<dyn Failpoints>) -> Self {
        self.failpoints = Some(failpoints);
        self
    }

    /// Fixes the per-call attempt id (random by default). Tests use this to make two calls
    /// share an id; the I9 re-read still compares the whole row, not the id alone.
    pub fn attempt_id(mut self, id: [u8; 16]) -> Self {
        self.attempt_id = Some(id);
        self
    }

    /// A write run inside the dedup transaction just before its COMMIT, whenever that
    /// transaction commits a change: the applied row, or a counted failed attempt (I1, I5).
    /// It commits atomically with them; an error from it rolls the transaction back (an
    /// applied run then fails as [`Error::Sqlite`] or [`Error::Busy`]; a failure count is
    /// lost, which I5 allows). The same hook shape as [`crate::effect::Options::on_write`]:
    /// the org layer raises its commit sequence here, for `once` and effects alike (I6).
    pub fn on_write(mut self, hook: WriteHook) -> Self {
        self.on_write = Some(hook);
        self
    }

    /// Now, in ms since the Unix epoch, by the set clock or else the system clock.
    pub(crate) fn now(&self) -> u64 {
        match &self.clock {
            Some(c) => c.now_ms(),
            None => SystemClock.now_ms(),
        }
    }
}

/// What a call of `once` produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The idempotency key.
    pub key: String,
    /// The result of the run that applied the key, byte-identical on every replay (I3).
    pub result: Vec<u8>,
    /// True when this call ran `apply` and committed; false for a replay.
    pub applied: bool,
    /// The round of the run that applied the key.
    pub round: u64,
    /// When the key was applied, in milliseconds since the Unix epoch.
    pub applied_at_ms: u64,
}

impl Outcome {
    /// For callers that want "fail if already done": the result of a first run, or
    /// [`Error::AlreadyApplied`] carrying the stored result for a replay.
    ///
    /// # Errors
    /// [`Error::AlreadyApplied`] when this outcome is a replay.
    pub fn strict(self) -> Result<Vec<u8>, Error> {
        if self.applied {
            Ok(self.result)
        } else {
            Err(Error::AlreadyApplied {
                key: self.key,
                round: self.round,
                result: self.result,
            })
        }
    }
}
