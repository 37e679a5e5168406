//! What operations hand back: a claim, a shipped snapshot, a hydration.

use crate::{LogEntry, OrgId};

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
    pub(crate) unusable: Option<&'static str>,
}

impl Claim {
    /// The log position the next ship or release will publish at.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Why this claim can no longer publish (fenced, released, unknown outcome), if so.
    pub fn unusable(&self) -> Option<&'static str> {
        self.unusable
    }
}

/// A published snapshot: where it is and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shipped {
    /// Log position of the snapshot entry.
    pub seq: u64,
    /// Round it was published under.
    pub round: u64,
    /// The caller's commit counter contained in it.
    pub commit: u64,
    /// Uncompressed size in bytes.
    pub bytes: u64,
    /// Stored blob size in bytes (what one ship uploads, besides the small log entry).
    pub compressed_bytes: u64,
    /// sha256 of the uncompressed image, hex.
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
}

/// Result of [`crate::Replica::verify`].
#[derive(Debug, Default)]
pub struct VerifyReport {
    /// Log positions of snapshots that passed sha256, size and `integrity_check`.
    pub ok: Vec<u64>,
    /// Snapshots that failed, with why.
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
