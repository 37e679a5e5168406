//! Settings and injected components of the effect protocol: lease, result limit, clock, lapse
//! rule, failpoints, write hook.

use std::fmt::Debug;
use std::sync::Arc;

use rusqlite::Connection;

use super::row::{Effect, State};
use crate::failpoint::{self, FailPoint, Failpoints, Injected};
use crate::{Clock, DEFAULT_MAX_RESULT_BYTES, SystemClock};

/// Default reservation lease: 60 s, in milliseconds.
pub const DEFAULT_LEASE_MS: u64 = 60_000;

/// When a RESERVED row's lease lapses for this caller, in ms of the caller's clock
/// ([`Options::clock`]). See [`Options::lapse`].
pub type LapseFn = Arc<dyn Fn(&Effect) -> u64 + Send + Sync>;

/// A write run inside a write transaction just before its COMMIT, so it commits atomically
/// with it: every effect transition ([`Options::on_write`]) and every dedup transaction that
/// commits ([`crate::Options::on_write`]). The org layer bumps its commit counter here, which
/// is how a write is covered by the ship that acknowledges it (I6). Not a failpoint:
/// production code sets it.
pub type WriteHook = Arc<dyn Fn(&Connection) -> rusqlite::Result<()> + Send + Sync>;

/// Settings of the effect calls: a small builder.
///
/// ```
/// let opts = idem::effect::Options::new().lease_ms(30_000).holder("replica-a");
/// # let _ = opts;
/// ```
#[derive(Clone, Default)]
pub struct Options {
    pub(crate) lease_ms: Option<u64>,
    pub(crate) clock: Option<Arc<dyn Clock>>,
    pub(crate) failpoints: Option<Arc<dyn Failpoints>>,
    pub(crate) attempt_id: Option<[u8; 16]>,
    pub(crate) holder: Option<String>,
    pub(crate) on_write: Option<WriteHook>,
    pub(crate) max_result_bytes: Option<usize>,
    pub(crate) lapse: Option<LapseFn>,
}

impl Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("lease_ms", &self.lease())
            .field("clock", &self.clock)
            .field("failpoints", &self.failpoints)
            .field("attempt_id", &self.attempt_id)
            .field("holder", &self.holder)
            .field("on_write", &self.on_write.is_some())
            .field("max_result_bytes", &self.max_result())
            .field("lapse", &self.lapse.is_some())
            .finish()
    }
}

impl Options {
    /// Defaults: a 60 s lease, results up to [`DEFAULT_MAX_RESULT_BYTES`] (1 MiB), the system
    /// clock, a lease lapsing at its row's own stamp, a random attempt id, no holder label.
    pub fn new() -> Self {
        Self::default()
    }

    /// How long a reservation holds the key, in milliseconds. It must outlast the executor:
    /// a contender that finds the lease lapsed turns the key AMBIGUOUS.
    pub fn lease_ms(mut self, ms: u64) -> Self {
        self.lease_ms = Some(ms);
        self
    }

    /// The clock that stamps rows and judges leases (tests inject a [`crate::ManualClock`]
    /// to lapse a lease).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// True when a clock was set with [`Options::clock`] (the org layer then keeps it instead
    /// of its registry clock).
    pub fn has_clock(&self) -> bool {
        self.clock.is_some()
    }

    /// Failpoints for tests (see [`crate::failpoint`]); production code leaves this unset.
    pub fn failpoints(mut self, failpoints: Arc<dyn Failpoints>) -> Self {
        self.failpoints = Some(failpoints);
        self
    }

    /// Fixes the attempt id (random by default). Reusing an id across attempts is allowed: the
    /// protocol never recognises a row by its attempt id alone (I9).
    pub fn attempt_id(mut self, id: [u8; 16]) -> Self {
        self.attempt_id = Some(id);
        self
    }

    /// The attempt id fixed with [`Options::attempt_id`], if any.
    pub fn fixed_attempt_id(&self) -> Option<[u8; 16]> {
        self.attempt_id
    }

    /// A label stored with the reservation and shown in "in progress" errors (writer id, host).
    pub fn holder(mut self, holder: impl Into<String>) -> Self {
        self.holder = Some(holder.into());
        self
    }

    /// The largest executor result kept, in bytes (default [`DEFAULT_MAX_RESULT_BYTES`], 1 MiB;
    /// SQLite itself refuses values above 1 000 000 000 bytes). It is checked before the
    /// settlement is written: a larger result is recorded as executed without its result
    /// (COMMITTED, the reason in `error`), the call gets
    /// [`crate::Error::EffectResultNotKept`] carrying it, and every later call gets that error
    /// without it — never a second execution. A [`super::Resolution::Executed`] above the
    /// limit is refused ([`crate::Error::EffectResultTooLarge`]).
    pub fn max_result_bytes(mut self, bytes: usize) -> Self {
        self.max_result_bytes = Some(bytes);
        self
    }

    /// How this caller judges when a RESERVED row's lease lapses, in ms of its clock
    /// ([`Options::clock`]). The default is the row's own `lease_until_ms`, stamped by the
    /// clock of the writer that reserved it — right when every writer of the database runs on
    /// one host (a local file shared by processes). A caller that may read rows another host
    /// stamped must not compare that host's stamp with its own clock (I15): the org layer
    /// sets a rule of its own observation here (`docs/effects.md`, "Whose clock").
    ///
    /// The rule decides, on every path: a contender's reservation ([`super::reserve`]: live →
    /// in progress, lapsed → AMBIGUOUS), the reads that report a lapsed reservation as
    /// AMBIGUOUS ([`super::list_with`], [`super::get_with`]) and [`super::resolve_with`].
    pub fn lapse(mut self, rule: LapseFn) -> Self {
        self.lapse = Some(rule);
        self
    }

    /// When `row`'s lease lapses for this caller (see [`Options::lapse`]), in ms of its clock.
    pub fn lapses_at(&self, row: &Effect) -> u64 {
        match &self.lapse {
            Some(rule) => rule(row),
            None => row.lease_until_ms,
        }
    }

    /// True when `row` is RESERVED and its lease lapsed at `now_ms` (ms of this caller's
    /// clock) as [`Options::lapse`] judges: nobody can know whether its executor ran, so every
    /// reader and command treats it as AMBIGUOUS.
    pub fn is_lapsed_at(&self, row: &Effect, now_ms: u64) -> bool {
        row.state == State::Reserved && now_ms >= self.lapses_at(row)
    }

    /// [`Options::is_lapsed_at`] at this caller's clock's now.
    pub fn is_lapsed(&self, row: &Effect) -> bool {
        self.is_lapsed_at(row, self.now())
    }

    /// A write committed in the same transaction as every transition (see [`WriteHook`]).
    pub fn on_write(mut self, hook: WriteHook) -> Self {
        self.on_write = Some(hook);
        self
    }

    pub(crate) fn max_result(&self) -> usize {
        self.max_result_bytes.unwrap_or(DEFAULT_MAX_RESULT_BYTES)
    }

    pub(crate) fn lease(&self) -> u64 {
        self.lease_ms.unwrap_or(DEFAULT_LEASE_MS)
    }

    /// Now on this caller's clock ([`Options::clock`], else the system clock), in ms since
    /// the Unix epoch.
    pub fn now(&self) -> u64 {
        match &self.clock {
            Some(c) => c.now_ms(),
            None => SystemClock.now_ms(),
        }
    }

    pub(crate) fn hit(&self, point: FailPoint) -> Result<(), Injected> {
        failpoint::hit(self.failpoints.as_ref(), point)
    }
}
