//! Settings and injected components of the effect protocol: lease, clock, failpoints, write
//! hook.

use std::fmt::Debug;
use std::sync::Arc;

use rusqlite::Connection;

use crate::failpoint::{self, FailPoint, Failpoints, Injected};
use crate::{Clock, SystemClock};

/// Default reservation lease: 60 s, in milliseconds.
pub const DEFAULT_LEASE_MS: u64 = 60_000;

/// A write run inside every effect transition's transaction, before its COMMIT, so it commits
/// atomically with the transition (the org layer bumps its commit counter here, which is how
/// a transition is covered by the ship that acknowledges it, I6). Not a failpoint: production
/// code sets it.
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
            .finish()
    }
}

impl Options {
    /// Defaults: a 60 s lease, the system clock, a random attempt id, no holder label.
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

    /// A label stored with the reservation and shown in "in progress" errors (writer id, host).
    pub fn holder(mut self, holder: impl Into<String>) -> Self {
        self.holder = Some(holder.into());
        self
    }

    /// A write committed in the same transaction as every transition (see [`WriteHook`]).
    pub fn on_write(mut self, hook: WriteHook) -> Self {
        self.on_write = Some(hook);
        self
    }

    pub(crate) fn lease(&self) -> u64 {
        self.lease_ms.unwrap_or(DEFAULT_LEASE_MS)
    }

    pub(crate) fn now(&self) -> u64 {
        match &self.clock {
            Some(c) => c.now_ms(),
            None => SystemClock.now_ms(),
        }
    }

    pub(crate) fn hit(&self, point: FailPoint) -> Result<(), Injected> {
        failpoint::hit(self.failpoints.as_ref(), point)
    }
}
