//! Named seams between protocol steps, injected per instance so tests order interleavings
//! deterministically (no sleeps) and run in parallel.

use crate::OrgId;

/// A seam between two protocol steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FailPoint {
    /// Claim: log read, lease checked, claim entry not yet created.
    ClaimBeforePublish,
    /// Claim: claim entry created, lease not yet written.
    ClaimAfterPublish,
    /// Ship: snapshot compressed, blob not yet uploaded.
    ShipBeforeUpload,
    /// Ship: blob uploaded, log entry not yet published.
    ShipAfterUpload,
    /// Ship: log entry created, successor check not yet done.
    ShipAfterPublish,
    /// Release: release entry not yet published.
    ReleaseBeforePublish,
    /// Hydrate/restore: blob downloaded, not yet verified or installed.
    HydrateAfterDownload,
}

/// Hook called at every [`FailPoint`].
///
/// Returning `Err(message)` makes the operation fail there with [`crate::Error::Injected`]
/// as if the store had failed; a test implementation may also await a channel to pause the
/// operation and order it against another.
#[async_trait::async_trait]
pub trait Failpoints: Send + Sync + std::fmt::Debug {
    /// Called when the operation for `org` reaches `point`.
    async fn hit(&self, point: FailPoint, org: &OrgId) -> Result<(), String>;
}
