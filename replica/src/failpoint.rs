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
    /// Ship: nothing uploaded yet (a delta: packed; a snapshot: before its first segment).
    ShipBeforeUpload,
    /// Ship of a segmented snapshot: one more of its segments was PUT (fires once per
    /// segment uploaded, not for segments reused from the previous snapshot); others may still
    /// be in flight and the manifest is not yet written.
    ShipDuringUpload,
    /// Ship: blob uploaded, log entry not yet published.
    ShipAfterUpload,
    /// Ship: log entry created, successor check not yet done.
    ShipAfterPublish,
    /// Release: release entry not yet published.
    ReleaseBeforePublish,
    /// Hydrate/restore: a segment or a delta's body downloaded (fires once per object), not
    /// yet verified or installed.
    HydrateAfterDownload,
    /// Clone: the clone references are written, the source snapshot's entry not yet read
    /// again (fires for the clone's org).
    CloneAfterReferences,
    /// Journal acquire: another acquire of this process is adopting the dead run the org's
    /// walk ended in, and this one is about to wait for that attempt to end (K2).
    AdoptionAwaited,
    /// Journal acquire: the walk's state is installed in the tenure's local file (and its
    /// first checkpoint written, when it needs one); the writer has not opened the file.
    JournalInstalled,
    /// Per-org acquire ([`crate::Replica::hydrate_for_writer`]): the claim's state is
    /// installed in the local file, unchecked; the writer has not opened the file.
    HydrateInstalled,
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
