//! What operations hand back: a claim, a shipped snapshot, a hydration.

use std::sync::Arc;

use crate::delta::PageHashes;
use crate::{LogEntry, OrgId};

/// The newest snapshot or delta this claim published: where the next delta applies, and the
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
            .field("checksum", &crate::delta::checksum_hex(self.hashes.sum()))
            .finish()
    }
}

/// A writer's claim on an org for one round. Ship with it; it is fenced by any later claim.
#[derive(Debug, Clone)]
pub struct Claim {
    /// The org.
    pub org: OrgId,
    /// The round claimed; strictly greater than every round before it (I7).
    pub round: u64,
    /// The writer id.
    pub writer: String,
    /// Nonce of the claim entry.
    pub nonce: String,
    /// Log position of the claim entry.
    pub seq: u64,
    pub(crate) next_seq: u64,
    pub(crate) lease_renewed_ms: u64,
    /// The home written into this claim's leases.
    pub(crate) home: Option<String>,
    pub(crate) unusable: Option<&'static str>,
    pub(crate) tip: Option<Tip>,
    /// The snapshot the chain started from (compacted deltas apply to it).
    pub(crate) snapshot_tip: Option<Tip>,
}

impl Claim {
    /// The log position the next ship or release will publish at.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Log position of the newest snapshot or delta this claim published, which the next
    /// [`crate::Replica::ship_delta`] applies to; `None` until a snapshot is shipped.
    pub fn chain_tip(&self) -> Option<u64> {
        self.tip.as_ref().map(|t| t.seq)
    }

    /// Why this claim can no longer publish (fenced, released, unknown outcome), if so.
    pub fn unusable(&self) -> Option<&'static str> {
        self.unusable
    }
}

/// A published snapshot or delta: where it is and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shipped {
    /// Log position of the entry.
    pub seq: u64,
    /// True for a delta, false for a full snapshot.
    pub delta: bool,
    /// Round it was published under.
    pub round: u64,
    /// The caller's commit counter contained in it.
    pub commit: u64,
    /// Uncompressed size in bytes (database image, or delta body).
    pub bytes: u64,
    /// Stored blob size in bytes (what one ship uploads, besides the small log entry).
    pub compressed_bytes: u64,
    /// sha256 of the uncompressed image or delta body, hex.
    pub sha256: String,
    /// Full object path of the blob.
    pub blob: String,
}

impl Shipped {
    pub(crate) fn from_entry(
        entry: &LogEntry,
        blob_path: impl FnOnce(&str) -> String,
    ) -> Option<Shipped> {
        match entry {
            LogEntry::Snapshot {
                seq,
                round,
                blob,
                sha256,
                bytes,
                compressed_bytes,
                commit,
                ..
            } => Some(Shipped {
                seq: *seq,
                delta: false,
                round: *round,
                commit: *commit,
                bytes: *bytes,
                compressed_bytes: *compressed_bytes,
                sha256: sha256.clone(),
                blob: blob_path(blob),
            }),
            LogEntry::Delta {
                seq,
                round,
                blob,
                sha256,
                bytes,
                compressed_bytes,
                commit,
                ..
            } => Some(Shipped {
                seq: *seq,
                delta: true,
                round: *round,
                commit: *commit,
                bytes: *bytes,
                compressed_bytes: *compressed_bytes,
                sha256: sha256.clone(),
                blob: blob_path(blob),
            }),
            _ => None,
        }
    }
}

/// Result of a hydrate or restore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hydrated {
    /// The snapshot installed; `None` when the org has no snapshot yet (nothing installed).
    pub snapshot: Option<Shipped>,
    /// The commit counter of the installed state (0 when empty).
    pub commit: u64,
    /// Log position of the last entry applied: the snapshot's, or the last delta's.
    pub position: Option<u64>,
    /// Deltas applied on top of the snapshot.
    pub deltas: usize,
}

/// Result of [`crate::Replica::verify`].
#[derive(Debug, Default)]
pub struct VerifyReport {
    /// Log positions of snapshots that passed sha256, size and `integrity_check`, and of
    /// deltas whose chain from their snapshot rebuilt the checksummed database.
    pub ok: Vec<u64>,
    /// Snapshots and deltas that failed, with why.
    pub failed: Vec<(u64, crate::Error)>,
}

/// Result of [`crate::Replica::retain`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RetentionReport {
    /// Log positions deleted.
    pub deleted_entries: Vec<u64>,
    /// Blob object paths deleted (expired snapshots and orphans).
    pub deleted_blobs: Vec<String>,
    /// Snapshot entries kept.
    pub kept_snapshots: usize,
}
