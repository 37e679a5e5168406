//! Fault-injection seams between the steps of [`crate::once`], passed per call.
//!
//! Production code leaves them unset. Tests (ours and callers') use them to order interleavings
//! and to inject the failures of I9 deterministically, without sleeps.

use std::fmt::Debug;

/// A point between two steps of `once`'s write path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Point {
    /// The write transaction is open and the key is known unapplied; `apply` is about to run.
    BeforeApply,
    /// The key row is written; COMMIT is next. An injected error acts as a COMMIT that failed
    /// and rolled back.
    BeforeCommit,
    /// COMMIT succeeded. An injected error acts as a COMMIT that landed but reported failure.
    AfterCommit,
    /// A failed COMMIT is about to be settled by a re-read. An injected error fails the re-read.
    BeforeReread,
}

/// An error injected at a seam.
#[derive(Debug, thiserror::Error)]
#[error("injected fault at {point:?}")]
pub struct Injected {
    /// Where it was injected.
    pub point: Point,
}

/// Hooks called at each [`Point`]. Returning `Err` injects the failure described on the point.
pub trait Seam: Send + Sync + Debug {
    /// Called at `point`.
    ///
    /// # Errors
    /// An [`Injected`] error makes `once` behave as the point's documentation says.
    fn at(&self, point: Point) -> Result<(), Injected>;
}
