//! Versioned on-store formats: log entries (JSON, `"v":1`), `lease.json`, and the blob
//! header in front of each zstd frame.
//!
//! A reader that meets a version or kind it does not know refuses with
//! [`Error::UnknownFormat`], so later kinds (incremental deltas) can be added safely.

use serde::{Deserialize, Serialize};

use crate::Error;

/// Log entry format version written by this build.
pub const ENTRY_VERSION: u64 = 1;
/// Blob format version written by this build.
pub const BLOB_VERSION: u32 = 1;
/// Magic bytes that open every snapshot blob, followed by a little-endian u32 version.
pub const BLOB_MAGIC: [u8; 8] = *b"idemsnap";
const KINDS: [&str; 4] = ["claim", "snapshot", "delta", "release"];

/// One entry of an org's create-only log (`orgs/<org>/log/<seq:020>.json`).
///
/// Two entries are "the same" only if every field matches, nonce included (I9).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum LogEntry {
    /// A writer claimed `round`; fences every lower round (I7).
    Claim {
        /// Log position.
        seq: u64,
        /// The claimed round.
        round: u64,
        /// Writer id.
        writer: String,
        /// 16 random bytes, hex; unique per attempt.
        nonce: String,
        /// Creation time, ms since the Unix epoch.
        at_ms: u64,
    },
    /// A snapshot published under `round`.
    Snapshot {
        /// Log position.
        seq: u64,
        /// The shipping writer's round.
        round: u64,
        /// Writer id.
        writer: String,
        /// 16 random bytes, hex; unique per attempt.
        nonce: String,
        /// Creation time, ms since the Unix epoch.
        at_ms: u64,
        /// Blob file name inside the org's `snap/` directory.
        blob: String,
        /// sha256 of the uncompressed database image, hex.
        sha256: String,
        /// Uncompressed size in bytes.
        bytes: u64,
        /// Stored blob size in bytes (header + zstd frame).
        compressed_bytes: u64,
        /// The caller's commit counter contained in the snapshot.
        commit: u64,
    },
    /// Pages changed since the entry at `base` (a snapshot or delta of the same round),
    /// published under `round`. Hydrate applies it only if the database checksum before it is
    /// `base_checksum`, and proves the result is `checksum` (I10).
    Delta {
        /// Log position.
        seq: u64,
        /// The shipping writer's round.
        round: u64,
        /// Writer id.
        writer: String,
        /// 16 random bytes, hex; unique per attempt.
        nonce: String,
        /// Creation time, ms since the Unix epoch.
        at_ms: u64,
        /// Blob file name inside the org's `snap/` directory.
        blob: String,
        /// sha256 of the uncompressed delta body, hex.
        sha256: String,
        /// Uncompressed body size in bytes.
        bytes: u64,
        /// Stored blob size in bytes (header + zstd frame).
        compressed_bytes: u64,
        /// The caller's commit counter the delta brings the database to.
        commit: u64,
        /// Log position of the entry this delta applies to.
        base: u64,
        /// Database checksum before the delta (16 hex digits; see the `delta` module).
        base_checksum: String,
        /// Database checksum after the delta.
        checksum: String,
        /// Page size in bytes.
        page_size: u32,
        /// Database size in pages after the delta.
        db_pages: u32,
        /// Pages the delta carries.
        changed_pages: u32,
    },
    /// The writer of `round` handed the org over; the next claim need not wait for its lease.
    Release {
        /// Log position.
        seq: u64,
        /// The releasing round.
        round: u64,
        /// Writer id.
        writer: String,
        /// 16 random bytes, hex; unique per attempt.
        nonce: String,
        /// Creation time, ms since the Unix epoch.
        at_ms: u64,
    },
}

impl LogEntry {
    /// Log position of this entry.
    pub fn seq(&self) -> u64 {
        match self {
            LogEntry::Claim { seq, .. }
            | LogEntry::Snapshot { seq, .. }
            | LogEntry::Delta { seq, .. }
            | LogEntry::Release { seq, .. } => *seq,
        }
    }
    /// Round of the writer that created it.
    pub fn round(&self) -> u64 {
        match self {
            LogEntry::Claim { round, .. }
            | LogEntry::Snapshot { round, .. }
            | LogEntry::Delta { round, .. }
            | LogEntry::Release { round, .. } => *round,
        }
    }
    /// Writer id of its creator.
    pub fn writer(&self) -> &str {
        match self {
            LogEntry::Claim { writer, .. }
            | LogEntry::Snapshot { writer, .. }
            | LogEntry::Delta { writer, .. }
            | LogEntry::Release { writer, .. } => writer,
        }
    }
    /// Creation time, ms since the Unix epoch.
    pub fn at_ms(&self) -> u64 {
        match self {
            LogEntry::Claim { at_ms, .. }
            | LogEntry::Snapshot { at_ms, .. }
            | LogEntry::Delta { at_ms, .. }
            | LogEntry::Release { at_ms, .. } => *at_ms,
        }
    }
    /// The blob a snapshot or delta entry names.
    pub fn blob(&self) -> Option<&str> {
        match self {
            LogEntry::Snapshot { blob, .. } | LogEntry::Delta { blob, .. } => Some(blob),
            _ => None,
        }
    }

    /// The commit counter a snapshot or delta entry holds.
    pub fn commit(&self) -> Option<u64> {
        match self {
            LogEntry::Snapshot { commit, .. } | LogEntry::Delta { commit, .. } => Some(*commit),
            _ => None,
        }
    }

    /// Kind name as stored (`claim`, `snapshot`, `delta`, `release`).
    pub fn kind_name(&self) -> &'static str {
        match self {
            LogEntry::Claim { .. } => "claim",
            LogEntry::Snapshot { .. } => "snapshot",
            LogEntry::Delta { .. } => "delta",
            LogEntry::Release { .. } => "release",
        }
    }

    /// Serializes with the format version (`{"v":1,"kind":...}`).
    ///
    /// # Errors
    /// Never in practice; a serde failure maps to [`Error::Corrupt`].
    pub fn encode(&self) -> Result<Vec<u8>, Error> {
        let mut value = serde_json::to_value(self).map_err(|e| corrupt("<encode>", e))?;
        if let Some(map) = value.as_object_mut() {
            map.insert("v".into(), ENTRY_VERSION.into());
        }
        serde_json::to_vec(&value).map_err(|e| corrupt("<encode>", e))
    }

    /// Parses an entry read from `object`.
    ///
    /// # Errors
    /// [`Error::UnknownFormat`] for an unknown `v` or `kind`; [`Error::Corrupt`] for anything
    /// that is not a well-formed entry, or whose `seq` differs from `expected_seq`.
    pub fn decode(
        object: &str,
        bytes: &[u8],
        expected_seq: Option<u64>,
    ) -> Result<LogEntry, Error> {
        let mut value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| corrupt(object, e))?;
        let map = value
            .as_object_mut()
            .ok_or_else(|| corrupt(object, "not a json object"))?;
        match map.remove("v").and_then(|v| v.as_u64()) {
            Some(ENTRY_VERSION) => {}
            other => {
                return Err(Error::UnknownFormat {
                    object: object.into(),
                    detail: format!("entry version {other:?}, this build reads {ENTRY_VERSION}"),
                });
            }
        }
        let kind = map.get("kind").and_then(|k| k.as_str()).unwrap_or("");
        if !KINDS.contains(&kind) {
            return Err(Error::UnknownFormat {
                object: object.into(),
                detail: format!("entry kind {kind:?}"),
            });
        }
        let entry: LogEntry = serde_json::from_value(value).map_err(|e| corrupt(object, e))?;
        if let Some(seq) = expected_seq
            && entry.seq() != seq
        {
            return Err(corrupt(
                object,
                format!("entry says seq {} but is stored at {seq}", entry.seq()),
            ));
        }
        if let Some(blob) = entry.blob()
            && !valid_blob_name(blob)
        {
            return Err(corrupt(object, format!("bad blob name {blob:?}")));
        }
        Ok(entry)
    }
}

/// A blob name is one path segment: digits, dash, lowercase hex, ending `.db.zst`
/// (snapshot) or `.delta.zst` (delta).
pub(crate) fn valid_blob_name(name: &str) -> bool {
    (name.ends_with(".db.zst") || name.ends_with(".delta.zst"))
        && name.len() <= 128
        && name.bytes().next().is_some_and(|b| b.is_ascii_digit())
        && name
            .bytes()
            .all(|b| b.is_ascii_digit() || b == b'-' || b == b'.' || b.is_ascii_lowercase())
        && !name.contains("..")
}

/// The advisory lease in `orgs/<org>/lease.json` (liveness only; fencing is the log's job).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// Holder's writer id.
    pub writer: String,
    /// Holder's round.
    pub round: u64,
    /// Expiry, ms since the Unix epoch.
    pub expires_at_ms: u64,
    /// The holder's process instance (random per [`crate::Replica`] opened): two processes
    /// configured with one writer id are told apart by it. Empty in leases of older versions.
    #[serde(default)]
    pub instance: String,
    /// The holder's home: the id of the data directory it works in, if it gave one
    /// ([`crate::Replica::claim_from`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub home: Option<String>,
}

#[derive(Serialize, Deserialize)]
struct LeaseWire {
    v: u64,
    #[serde(flatten)]
    lease: Lease,
}

impl Lease {
    pub(crate) fn encode(&self) -> Result<Vec<u8>, Error> {
        serde_json::to_vec(&LeaseWire {
            v: ENTRY_VERSION,
            lease: self.clone(),
        })
        .map_err(|e| corrupt("<lease>", e))
    }
    pub(crate) fn decode(object: &str, bytes: &[u8]) -> Result<Lease, Error> {
        let wire: LeaseWire = serde_json::from_slice(bytes).map_err(|e| corrupt(object, e))?;
        if wire.v != ENTRY_VERSION {
            return Err(Error::UnknownFormat {
                object: object.into(),
                detail: format!("lease version {}", wire.v),
            });
        }
        Ok(wire.lease)
    }
}

/// Prepends the blob header to a zstd frame.
pub(crate) fn blob_header() -> [u8; 12] {
    let mut h = [0u8; 12];
    h[..8].copy_from_slice(&BLOB_MAGIC);
    h[8..].copy_from_slice(&BLOB_VERSION.to_le_bytes());
    h
}

/// Checks the blob header and returns the zstd frame after it.
pub(crate) fn blob_body<'a>(object: &str, blob: &'a [u8]) -> Result<&'a [u8], Error> {
    if blob.len() < 12 || blob[..8] != BLOB_MAGIC {
        return Err(corrupt(object, "blob header missing"));
    }
    let mut v = [0u8; 4];
    v.copy_from_slice(&blob[8..12]);
    let version = u32::from_le_bytes(v);
    if version != BLOB_VERSION {
        return Err(Error::UnknownFormat {
            object: object.into(),
            detail: format!("blob version {version}"),
        });
    }
    Ok(&blob[12..])
}

pub(crate) fn corrupt(object: &str, reason: impl std::fmt::Display) -> Error {
    Error::Corrupt {
        path: object.into(),
        reason: reason.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap() -> LogEntry {
        LogEntry::Snapshot {
            seq: 7,
            round: 2,
            writer: "w".into(),
            nonce: "00".into(),
            at_ms: 5,
            blob: "00000000000000000007-2-00.db.zst".into(),
            sha256: "ab".into(),
            bytes: 10,
            compressed_bytes: 4,
            commit: 3,
        }
    }

    #[test]
    fn entry_round_trips_with_version() -> Result<(), Error> {
        let bytes = snap().encode()?;
        let text = String::from_utf8_lossy(&bytes);
        assert!(
            text.contains("\"v\":1") && text.contains("\"kind\":\"snapshot\""),
            "{text}"
        );
        assert_eq!(LogEntry::decode("x", &bytes, Some(7))?, snap());
        Ok(())
    }

    #[test]
    fn unknown_version_or_kind_is_refused() {
        let v2 = br#"{"v":2,"kind":"claim","seq":1,"round":1,"writer":"w","nonce":"n","at_ms":0}"#;
        assert!(matches!(
            LogEntry::decode("x", v2, None),
            Err(Error::UnknownFormat { .. })
        ));
        let future = br#"{"v":1,"kind":"compacted","seq":1}"#;
        assert!(matches!(
            LogEntry::decode("x", future, None),
            Err(Error::UnknownFormat { .. })
        ));
        assert!(matches!(
            LogEntry::decode("x", b"{nope", None),
            Err(Error::Corrupt { .. })
        ));
    }

    #[test]
    fn entry_at_wrong_seq_or_with_bad_blob_name_is_corrupt() -> Result<(), Error> {
        let bytes = snap().encode()?;
        assert!(matches!(
            LogEntry::decode("x", &bytes, Some(8)),
            Err(Error::Corrupt { .. })
        ));
        let mut bad = snap();
        if let LogEntry::Snapshot { blob, .. } = &mut bad {
            *blob = "../../acme2/snap/x.db.zst".into();
        }
        assert!(matches!(
            LogEntry::decode("x", &bad.encode()?, None),
            Err(Error::Corrupt { .. })
        ));
        Ok(())
    }

    #[test]
    fn blob_header_version_is_checked() {
        let mut b = blob_header().to_vec();
        b.extend_from_slice(b"frame");
        assert!(matches!(blob_body("x", &b), Ok(f) if f == b"frame"));
        b[8] = 9;
        assert!(matches!(
            blob_body("x", &b),
            Err(Error::UnknownFormat { .. })
        ));
        assert!(matches!(
            blob_body("x", b"short"),
            Err(Error::Corrupt { .. })
        ));
    }
}
