//! Settings and injected components of the effect protocol: lease, clock, seams, write hook.

use std::fmt::Debug;
use std::sync::Arc;

use rusqlite::Connection;

use crate::{Clock, SystemClock};

/// Default reservation lease: 60 s.
pub const DEFAULT_LEASE_MS: u64 = 60_000;

/// Which write of the protocol a seam fires in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EffectStep {
    /// [`crate::reserve`]: the reservation, or a contender turning a lapsed lease AMBIGUOUS.
    Reserve,
    /// [`crate::settle`]: RESERVED → COMMITTED / FAILED / AMBIGUOUS.
    Settle,
    /// [`crate::resolve`]: AMBIGUOUS → COMMITTED / FAILED.
    Resolve,
}

/// A point between two steps of an effect write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EffectPoint {
    /// The write transaction is open and its statement ran. An injected error acts as
    /// `SQLITE_BUSY` reported in band before COMMIT: nothing committed, the write is retried.
    Busy(EffectStep),
    /// COMMIT is next. An injected error acts as a COMMIT with an unknown outcome that did not
    /// land (the transaction rolls back).
    BeforeCommit(EffectStep),
    /// COMMIT succeeded. An injected error acts as a COMMIT that landed but reported failure.
    AfterCommit(EffectStep),
    /// A COMMIT with an unknown outcome is about to be settled by a re-read. An injected error
    /// fails the re-read.
    BeforeReread(EffectStep),
}

/// An error injected at an [`EffectPoint`].
#[derive(Debug, thiserror::Error)]
#[error("injected fault at {point:?}")]
pub struct EffectInjected {
    /// Where it was injected.
    pub point: EffectPoint,
}

/// Hooks called at each [`EffectPoint`]; returning `Err` injects the failure described on the
/// point. Production code leaves them unset.
pub trait EffectSeam: Send + Sync + Debug {
    /// Called at `point`.
    ///
    /// # Errors
    /// An [`EffectInjected`] makes the protocol behave as the point's documentation says.
    fn at(&self, point: EffectPoint) -> Result<(), EffectInjected>;
}

/// A write run inside every effect transition's transaction, before its COMMIT, so it commits
/// atomically with the transition (the org layer bumps its commit counter here).
pub type WriteHook = Arc<dyn Fn(&Connection) -> rusqlite::Result<()> + Send + Sync>;

/// Settings of the effect calls: a small builder.
#[derive(Clone, Default)]
pub struct EffectOptions {
    pub(crate) lease_ms: Option<u64>,
    pub(crate) clock: Option<Arc<dyn Clock>>,
    pub(crate) seam: Option<Arc<dyn EffectSeam>>,
    pub(crate) attempt_id: Option<[u8; 16]>,
    pub(crate) holder: Option<String>,
    pub(crate) on_write: Option<WriteHook>,
}

impl Debug for EffectOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EffectOptions")
            .field("lease_ms", &self.lease())
            .field("clock", &self.clock)
            .field("seam", &self.seam)
            .field("attempt_id", &self.attempt_id)
            .field("holder", &self.holder)
            .field("on_write", &self.on_write.is_some())
            .finish()
    }
}

impl EffectOptions {
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

    /// The clock that stamps rows and judges leases (tests inject one to lapse a lease).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// True when a clock was set with [`EffectOptions::clock`].
    pub fn has_clock(&self) -> bool {
        self.clock.is_some()
    }

    /// Fault-injection seams for tests.
    pub fn seam(mut self, seam: Arc<dyn EffectSeam>) -> Self {
        self.seam = Some(seam);
        self
    }

    /// Fixes the attempt id (random by default). Reusing an id across attempts is allowed: the
    /// protocol never recognises a row by its attempt id alone.
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

    pub(crate) fn at(&self, point: EffectPoint) -> Result<(), EffectInjected> {
        match &self.seam {
            Some(s) => s.at(point),
            None => Ok(()),
        }
    }
}
