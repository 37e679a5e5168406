//! Named failpoints between the steps of idem's write transactions, injected per call.
//!
//! Production code leaves them unset. Tests (ours and callers') pass a [`Failpoints`] in
//! [`crate::Options::failpoints`] or [`crate::effect::Options::failpoints`] to order
//! interleavings and to inject the failures of I9 deterministically, without sleeps. The words
//! are those of `idem-replica`'s failpoints: a [`FailPoint`] names the seam, [`Failpoints`] is
//! the hook, [`Injected`] is the error the hook's refusal becomes.

use std::fmt::Debug;

/// Which write transaction a [`FailPoint`] fires in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Write {
    /// [`crate::once`]: the dedup transaction.
    Once,
    /// [`crate::effect::reserve`]: the reservation, or a contender turning a lapsed lease
    /// AMBIGUOUS.
    Reserve,
    /// [`crate::effect::settle`]: RESERVED → COMMITTED / FAILED / AMBIGUOUS.
    Settle,
    /// [`crate::effect::resolve`]: AMBIGUOUS → COMMITTED / FAILED.
    Resolve,
}

/// A seam between two steps of a write transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FailPoint {
    /// `once`: the write transaction is open and the key is known unapplied; `apply` is about
    /// to run. An injected error fails the attempt as `apply` failing would
    /// ([`crate::Error::Apply`]).
    BeforeApply,
    /// Effect writes only: the write transaction is open and its statement ran. An injected
    /// error acts as `SQLITE_BUSY` reported in band before COMMIT: nothing committed, the write
    /// is retried.
    Busy(Write),
    /// COMMIT is next. An injected error acts as a COMMIT that failed and did not land (the
    /// transaction rolls back); the outcome is settled by a re-read (I9).
    BeforeCommit(Write),
    /// COMMIT succeeded. An injected error acts as a COMMIT that landed but reported failure.
    AfterCommit(Write),
    /// A failed COMMIT is about to be settled by a re-read. An injected error fails the
    /// re-read, so the outcome stays unknown.
    BeforeReread(Write),
}

/// The error a [`Failpoints`] hook's refusal becomes; it appears as the source of the idem
/// error the point's documentation names.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("injected fault at {point:?}: {message}")]
pub struct Injected {
    /// Where it was injected.
    pub point: FailPoint,
    /// The hook's message.
    pub message: String,
}

/// The hook called at every [`FailPoint`] a call passes. Returning `Err(message)` injects the
/// failure described on the point; a test implementation may also block to order the call
/// against another.
pub trait Failpoints: Send + Sync + Debug {
    /// Called when the write reaches `point`.
    ///
    /// # Errors
    /// A message: the write then fails at `point` with [`Injected`] as the point describes.
    fn hit(&self, point: FailPoint) -> Result<(), String>;
}

/// Calls `failpoints` (if any) at `point`.
pub(crate) fn hit(
    failpoints: Option<&std::sync::Arc<dyn Failpoints>>,
    point: FailPoint,
) -> Result<(), Injected> {
    match failpoints {
        Some(f) => f.hit(point).map_err(|message| Injected { point, message }),
        None => Ok(()),
    }
}
