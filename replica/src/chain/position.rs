//! A chain position: what a hydrate (or a reused local file) proved about the newest
//! published position below a claim, which the claim continues and a [`crate::Shipper`]
//! seeds its budget from. The claim holds it (fencing decides whether it may publish); the
//! chain rules (`chain/mod.rs`) decide what it is.

use std::sync::Arc;

use crate::format::checksum::{PageHashes, checksum_hex};

/// The newest snapshot or delta a claim published: where the next delta applies, and the
/// page hashes of the database there.
#[derive(Clone)]
pub(crate) struct Tip {
    pub(crate) seq: u64,
    pub(crate) hashes: Arc<PageHashes>,
}

impl std::fmt::Debug for Tip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tip")
            .field("seq", &self.seq)
            .field("checksum", &checksum_hex(self.hashes.sum()))
            .finish()
    }
}

/// The chain a claim continues: what a hydrate (or a reused local file) proved about the
/// newest published position below the claim, which a [`crate::Shipper`] seeds its budget
/// from, so the bounds on what a hydrate reads hold across rounds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Inherited {
    /// The commit counter the position holds.
    pub(crate) commit: u64,
    /// Compressed bytes of the chain's snapshot.
    pub(crate) snapshot_bytes: u64,
    /// Database pages in the chain's snapshot.
    pub(crate) snapshot_pages: u64,
    /// When the chain's snapshot was published, ms since the Unix epoch.
    pub(crate) snapshot_at_ms: u64,
    /// Compressed bytes of the deltas a hydrate of the position reads.
    pub(crate) delta_bytes: u64,
    /// How many deltas that is.
    pub(crate) deltas: u64,
}
