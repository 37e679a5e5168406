//! The log entry format: JSON, a header every kind shares and a body per kind.
//!
//! On the wire an entry is one flat JSON object with its keys in sorted order, e.g.
//! `{"at_ms":…,"kind":"claim","nonce":"…","round":1,"seq":1,"v":1,"writer":"w"}`. A reader
//! that meets a version or kind it does not know refuses with [`Error::UnknownFormat`], so
//! later kinds can be added safely.
//!
//! Version 1 is every entry whose snapshot or delta lives in a blob object (`"blob"`).
//! Version 2 is exactly the entries that carry their packed body inline (`"inline"`, base64
//! of the same bytes a blob would hold): a reader of version 1 only refuses them instead of
//! looking for a blob that does not exist, and every version 1 entry stays byte for byte
//! what it always was. Version 3 is exactly the snapshot entries that name a manifest of
//! segments (`"manifest"`, [`crate::format::segment`]) instead of one blob, refused the same way by
//! earlier readers. Version 4 is exactly the entries of a pipelined claim (header keys
//! `"window"` and `"floor"`, [`Pipeline`]; `docs/design.md` 3e), of any body: an earlier reader
//! refuses them, because the rules for strays and holes change how the entries around them
//! read (rule V). Version 5 is exactly the entries with a journal mark (`"journal"`,
//! [`JournalMark`]; `docs/design.md` 3g): [`LogEntry::decode`] refuses them as every earlier
//! reader does, and only the journal's readers ([`LogEntry::decode_journal`]) read them (K3).

use serde::{Deserialize, Serialize};

use crate::Error;
use crate::format::mark::JournalMark;

/// Log entry format version of every entry without an inline body (and of leases).
pub const ENTRY_VERSION: u64 = 1;
/// Log entry format version of an entry carrying its packed body inline ([`BlobRef::Inline`]).
pub const INLINE_ENTRY_VERSION: u64 = 2;
/// Log entry format version of a snapshot entry naming a segment manifest
/// ([`BlobRef::Manifest`]).
pub const MANIFEST_ENTRY_VERSION: u64 = 3;
/// Log entry format version of every entry of a pipelined claim ([`EntryHeader::pipeline`]).
pub const PIPELINED_ENTRY_VERSION: u64 = 4;
/// Log entry format version of every entry with a journal mark ([`EntryHeader::journal`]).
pub const JOURNAL_ENTRY_VERSION: u64 = 5;
/// Most ships a pipelined claim may keep in flight; a window read from the store is clamped
/// to it (`docs/design.md` 3e, rule R1), and a claim's `read_concurrency` must exceed it (C3).
pub const MAX_SHIP_WINDOW: u64 = 8;
/// Largest log entry object read (4 MiB). The largest entry written is a delta carrying the
/// largest inline body ([`crate::MAX_INLINE_DELTA_BYTES`], 1 MiB, about 1.4 MB in base64)
/// with its JSON fields; every other entry is a few hundred bytes. A larger object at a log
/// position is refused as [`crate::Error::Corrupt`] before it is held.
pub const MAX_ENTRY_BYTES: u64 = 4 << 20;
const KINDS: [&str; 4] = ["claim", "snapshot", "delta", "release"];

/// One entry of an org's create-only log (`orgs/<org>/log/<seq:020>.json`): an [`EntryHeader`]
/// every kind shares, and the [`EntryBody`] of its kind.
///
/// Two entries are "the same" only if every field matches, nonce included (I9).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    /// Position, round, writer, nonce and time.
    #[serde(flatten)]
    pub header: EntryHeader,
    /// What the entry records.
    #[serde(flatten)]
    pub body: EntryBody,
}

/// The fields every log entry has.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryHeader {
    /// Log position.
    pub seq: u64,
    /// Round of the writer that created it: the claimed round for a claim (I7).
    pub round: u64,
    /// Writer id.
    pub writer: String,
    /// 16 random bytes, hex; unique per attempt, so a re-read tells our own write from
    /// another's (I9).
    pub nonce: String,
    /// Creation time, ms since the Unix epoch.
    pub at_ms: u64,
    /// The pipelining keys of an entry of a pipelined claim (format version 4); `None` for
    /// every other entry, which reads as window 1 and floor = its own seq.
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub pipeline: Option<Pipeline>,
    /// What the entry says about the journal (format version 5): a claim naming its run, a
    /// checkpoint naming its slot. `None` for every entry of the per-org path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub journal: Option<JournalMark>,
}

/// The two header keys of an entry of a pipelined claim (`docs/design.md` 3e).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pipeline {
    /// The claim's ship window: at most this many of its ships unresolved at once; the same
    /// in every entry of the claim, 2..=[`MAX_SHIP_WINDOW`] when written.
    pub window: u64,
    /// The lowest slot of the claim that was unresolved (issued, outcome not seen) when this
    /// entry was issued: at most the entry's seq, equal to it for a claim entry and for an
    /// entry issued with nothing in flight. Non-decreasing along a claim.
    pub floor: u64,
}

/// What a log entry records, by kind (`"kind"` on the wire).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum EntryBody {
    /// A writer claimed the header's round; fences every lower round (I7). Names the
    /// claimer's process so a claimant can judge it alive before the org lease says so.
    Claim(Claimer),
    /// A full snapshot published under the header's round.
    Snapshot(Stored),
    /// Pages changed since the entry at `base` (a snapshot or delta of the same round),
    /// published under the header's round. Hydrate applies it only if the database checksum
    /// before it is `base_checksum`, and proves the result is `checksum` (I10).
    Delta(DeltaLink),
    /// The writer of the header's round handed the org over; the next claim need not wait
    /// for its lease.
    Release,
}

/// Who made a claim entry: the process whose liveness holds the claimed round, from the
/// moment the entry lands. A claimant watches this process lease
/// ([`crate::Replica::claim`], I15); the entry is the whole lease of its round, and no
/// `orgs/<org>/lease.json` is written for it. Every field is omitted when unset, so a claim
/// without them is byte for byte an entry of an older version, and older readers ignore them
/// (serde skips unknown keys of a claim).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claimer {
    /// The claimer's process instance (`processes/<instance>.json`); empty in claims of older
    /// versions.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub instance: String,
    /// The claimer's lease term in ms ([`crate::Settings::lease_ms`]); 0 in claims of older
    /// versions.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub term_ms: u64,
    /// The claimer's home: the id of the data directory whose exclusive lock it held when it
    /// claimed ([`crate::Replica::claim_from`]), so a restart holding that lock claims at
    /// once. `None` when it held no such lock, and in claims of older versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub home: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// What a snapshot or delta entry stores: its blob, and the commit counter of the database
/// it leads to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stored {
    /// Where the packed bytes are: a blob object (`"blob"`), or inline (`"inline"`).
    #[serde(flatten)]
    pub blob: BlobRef,
    /// sha256 of the uncompressed image or delta body, lowercase hex.
    pub sha256: String,
    /// Uncompressed size in bytes.
    pub bytes: u64,
    /// Packed size in bytes (header + zstd frame), whether in a blob or inline.
    pub compressed_bytes: u64,
    /// The caller's commit counter the database holds at this position.
    pub commit: u64,
}

/// Where a snapshot's or delta's packed bytes (`"idemsnap"` header + zstd frame) are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum BlobRef {
    /// A blob file name inside the org's `snap/` directory (one path segment, checked on
    /// read); `"blob"` on the wire.
    #[serde(rename = "blob")]
    Object(String),
    /// The packed bytes themselves, standard base64 with padding; `"inline"` on the wire,
    /// only in entries of version [`INLINE_ENTRY_VERSION`]. Checked like a blob when read
    /// (size, sha256, I10).
    #[serde(rename = "inline")]
    Inline(String),
    /// The file name (in the org's `snap/` directory) of a segmented snapshot's manifest,
    /// which names its segments; `"manifest"` on the wire, only in snapshot entries of
    /// version [`MANIFEST_ENTRY_VERSION`]. The entry's `sha256` and `bytes` are the whole
    /// image's, its `compressed_bytes` every segment's together.
    #[serde(rename = "manifest")]
    Manifest(String),
}

impl BlobRef {
    /// The object file name (a blob, or a manifest), `None` for an inline body.
    pub fn name(&self) -> Option<&str> {
        match self {
            BlobRef::Object(name) | BlobRef::Manifest(name) => Some(name),
            BlobRef::Inline(_) => None,
        }
    }

    /// True for an inline body.
    pub fn is_inline(&self) -> bool {
        matches!(self, BlobRef::Inline(_))
    }
}

impl From<&str> for BlobRef {
    fn from(name: &str) -> Self {
        BlobRef::Object(name.to_owned())
    }
}

impl From<String> for BlobRef {
    fn from(name: String) -> Self {
        BlobRef::Object(name)
    }
}

/// A delta entry: its blob, and how it links onto the chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeltaLink {
    /// Blob and commit counter.
    #[serde(flatten)]
    pub stored: Stored,
    /// Log position of the entry this delta applies to: the previous snapshot or delta, or
    /// for a compacted delta the chain's snapshot.
    pub base: u64,
    /// Database checksum before the delta (16 hex digits; see [`crate::Delta`]).
    pub base_checksum: String,
    /// Database checksum after the delta.
    pub checksum: String,
    /// Page size in bytes.
    pub page_size: u32,
    /// Database size in pages after the delta.
    pub db_pages: u32,
    /// Pages the delta carries.
    pub changed_pages: u32,
}

impl LogEntry {
    /// Log position of this entry.
    pub fn seq(&self) -> u64 {
        self.header.seq
    }

    /// Round of the writer that created it.
    pub fn round(&self) -> u64 {
        self.header.round
    }

    /// Writer id of its creator.
    pub fn writer(&self) -> &str {
        &self.header.writer
    }

    /// Creation time, ms since the Unix epoch.
    pub fn at_ms(&self) -> u64 {
        self.header.at_ms
    }

    /// True for an entry of a pipelined claim (format version 4).
    pub fn is_pipelined(&self) -> bool {
        self.header.pipeline.is_some()
    }

    /// The ship window of the claim this entry belongs to, clamped to [`MAX_SHIP_WINDOW`]
    /// (a crafted window must not widen what readers accept as strays); 1 for an entry that
    /// is not pipelined.
    pub fn ship_window(&self) -> u64 {
        self.header
            .pipeline
            .map_or(1, |p| p.window.clamp(1, MAX_SHIP_WINDOW))
    }

    /// True when this entry is a stray for the claim of `round` at `claim_seq` (R1,
    /// `docs/design.md` 3e): a pipelined delta of a lower round above that claim, below its
    /// slot plus the delta's window, which the writer the claim fenced had in flight.
    pub fn is_stray_of(&self, round: u64, claim_seq: u64) -> bool {
        self.is_pipelined()
            && self.is_delta()
            && self.round() < round
            && self.seq() > claim_seq
            && self.seq() < claim_seq.saturating_add(self.ship_window())
    }

    /// The lowest slot of its claim unresolved when this entry was issued; its own seq for
    /// an entry that is not pipelined.
    pub fn floor(&self) -> u64 {
        self.header.pipeline.map_or(self.seq(), |p| p.floor)
    }

    /// The blob and commit counter of a snapshot or delta entry.
    pub fn stored(&self) -> Option<&Stored> {
        match &self.body {
            EntryBody::Snapshot(stored) | EntryBody::Delta(DeltaLink { stored, .. }) => {
                Some(stored)
            }
            EntryBody::Claim(_) | EntryBody::Release => None,
        }
    }

    /// The link of a delta entry.
    pub fn delta(&self) -> Option<&DeltaLink> {
        match &self.body {
            EntryBody::Delta(link) => Some(link),
            _ => None,
        }
    }

    /// The blob object a snapshot or delta entry names; `None` for other kinds and for a
    /// body carried inline.
    pub fn blob(&self) -> Option<&str> {
        self.stored().and_then(|s| s.blob.name())
    }

    /// True for a snapshot or delta entry that carries its packed body inline.
    pub fn is_inline(&self) -> bool {
        self.stored().is_some_and(|s| s.blob.is_inline())
    }

    /// Format version this entry is written with: [`JOURNAL_ENTRY_VERSION`] for an entry with
    /// a journal mark, else [`PIPELINED_ENTRY_VERSION`] for an entry
    /// of a pipelined claim, else [`INLINE_ENTRY_VERSION`] when it carries an inline body,
    /// [`MANIFEST_ENTRY_VERSION`] when it names a manifest, else [`ENTRY_VERSION`].
    pub fn version(&self) -> u64 {
        if self.header.journal.is_some() {
            return JOURNAL_ENTRY_VERSION;
        }
        if self.is_pipelined() {
            return PIPELINED_ENTRY_VERSION;
        }
        match self.stored().map(|s| &s.blob) {
            Some(BlobRef::Inline(_)) => INLINE_ENTRY_VERSION,
            Some(BlobRef::Manifest(_)) => MANIFEST_ENTRY_VERSION,
            _ => ENTRY_VERSION,
        }
    }

    /// The manifest a segmented snapshot entry names.
    pub fn manifest(&self) -> Option<&str> {
        match self.stored().map(|s| &s.blob) {
            Some(BlobRef::Manifest(name)) => Some(name),
            _ => None,
        }
    }

    /// The commit counter a snapshot or delta entry holds.
    pub fn commit(&self) -> Option<u64> {
        self.stored().map(|s| s.commit)
    }

    /// True for a claim entry.
    pub fn is_claim(&self) -> bool {
        matches!(self.body, EntryBody::Claim(_))
    }

    /// True for a full snapshot entry.
    pub fn is_snapshot(&self) -> bool {
        matches!(self.body, EntryBody::Snapshot(_))
    }

    /// True for a delta entry.
    pub fn is_delta(&self) -> bool {
        matches!(self.body, EntryBody::Delta(_))
    }

    /// Kind name as stored (`claim`, `snapshot`, `delta`, `release`).
    pub fn kind_name(&self) -> &'static str {
        match self.body {
            EntryBody::Claim(_) => "claim",
            EntryBody::Snapshot(_) => "snapshot",
            EntryBody::Delta(_) => "delta",
            EntryBody::Release => "release",
        }
    }

    /// Serializes with the format version ([`LogEntry::version`]): one JSON object, keys
    /// sorted (`{"at_ms":…,"kind":…,…,"v":1,…}`).
    ///
    /// # Errors
    /// [`Error::Encode`] if serde fails (it does not for these types).
    pub fn encode(&self) -> Result<Vec<u8>, Error> {
        let encode = |source| Error::Encode {
            what: "log entry",
            source,
        };
        // Through a `Value`, whose map keeps keys sorted: the bytes on the wire do not depend
        // on the order of the fields in these types.
        let mut value = serde_json::to_value(self).map_err(encode)?;
        if let Some(map) = value.as_object_mut() {
            map.insert("v".into(), self.version().into());
        }
        serde_json::to_vec(&value).map_err(encode)
    }

    /// Parses an entry read from `object`.
    ///
    /// # Errors
    /// [`Error::JournalRequired`] for an entry of format 5 (a journal mark, K3);
    /// [`Error::UnknownFormat`] for an unknown `v` or `kind`; [`Error::Corrupt`] for anything
    /// that is not a well-formed entry (a key given twice included: no encoder writes one,
    /// and parsers disagree on which to take), whose `seq` differs from `expected_seq`, whose
    /// blob name is not one safe path segment (I12), or whose version does not match its
    /// body (version 2 is exactly the entries with an inline body). An inline body that is
    /// not base64 or not the packed bytes the entry describes is found when it is read
    /// ([`crate::Replica`]'s fetch: [`Error::Corrupt`]), like a damaged blob.
    pub fn decode(
        object: &str,
        bytes: &[u8],
        expected_seq: Option<u64>,
    ) -> Result<LogEntry, Error> {
        Self::decode_as(object, bytes, expected_seq, false)
    }

    /// [`LogEntry::decode`] for the journal's readers: entries of format version 5 (with a
    /// journal mark) are read too, and their mark checked against their kind.
    ///
    /// # Errors
    /// As [`LogEntry::decode`]; [`Error::Corrupt`] for a claim mark on an entry that is not a
    /// claim, a checkpoint mark on one that is not a snapshot or delta, a slot of 0, or a
    /// mark on an entry of a pipelined claim.
    pub fn decode_journal(
        object: &str,
        bytes: &[u8],
        expected_seq: Option<u64>,
    ) -> Result<LogEntry, Error> {
        Self::decode_as(object, bytes, expected_seq, true)
    }

    fn decode_as(
        object: &str,
        bytes: &[u8],
        expected_seq: Option<u64>,
        journal: bool,
    ) -> Result<LogEntry, Error> {
        // The keys the format checks come first, read without building the entry: an
        // inline body is skipped over, not copied (every walk of a takeover reads entries).
        // A derived struct also reads a JSON array, field by field: only an object is one.
        if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return Err(Error::corrupt(object, "not a json object"));
        }
        let probe: Probe = serde_json::from_slice(bytes).map_err(|e| Error::corrupt(object, e))?;
        let version = match probe.v.as_ref().and_then(serde_json::Value::as_u64) {
            Some(
                v @ (ENTRY_VERSION
                | INLINE_ENTRY_VERSION
                | MANIFEST_ENTRY_VERSION
                | PIPELINED_ENTRY_VERSION),
            ) => v,
            Some(JOURNAL_ENTRY_VERSION) if journal => JOURNAL_ENTRY_VERSION,
            Some(JOURNAL_ENTRY_VERSION) => {
                return Err(Error::JournalRequired {
                    object: object.into(),
                });
            }
            other => {
                return Err(Error::UnknownFormat {
                    object: object.into(),
                    detail: format!(
                        "entry version {other:?}, this build reads {ENTRY_VERSION} to {PIPELINED_ENTRY_VERSION}"
                    ),
                });
            }
        };
        if [probe.blob, probe.inline, probe.manifest]
            .iter()
            .filter(|present| **present)
            .count()
            > 1
        {
            return Err(Error::corrupt(
                object,
                "entry names more than one of a blob, a body and a manifest",
            ));
        }
        let kind = probe
            .kind
            .as_ref()
            .and_then(serde_json::Value::as_str)
            .unwrap_or("");
        if !KINDS.contains(&kind) {
            return Err(Error::UnknownFormat {
                object: object.into(),
                detail: format!("entry kind {kind:?}"),
            });
        }
        if let Some(mark) = &probe.journal {
            let role = mark.get("role").and_then(|r| r.as_str()).unwrap_or("");
            if !["claim", "checkpoint"].contains(&role) {
                return Err(Error::UnknownFormat {
                    object: object.into(),
                    detail: format!("journal role {role:?}"),
                });
            }
        }
        let entry: LogEntry =
            serde_json::from_slice(bytes).map_err(|e| Error::corrupt(object, e))?;
        if let Some(seq) = expected_seq
            && entry.seq() != seq
        {
            return Err(Error::corrupt(
                object,
                format!("entry says seq {} but is stored at {seq}", entry.seq()),
            ));
        }
        let valid = match entry.stored().map(|s| &s.blob) {
            Some(BlobRef::Object(name)) => valid_blob_name(name),
            Some(BlobRef::Manifest(name)) => {
                entry.is_snapshot() && crate::format::manifest::manifest_sha(name).is_some()
            }
            _ => true,
        };
        if !valid {
            return Err(Error::corrupt(
                object,
                format!("bad blob or manifest name {:?}", entry.blob()),
            ));
        }
        if let Some(p) = entry.header.pipeline
            && (p.window < 2
                || p.floor > entry.seq()
                || (entry.is_claim() && p.floor != entry.seq()))
        {
            return Err(Error::corrupt(
                object,
                format!(
                    "pipelined entry with window {} and floor {} at seq {}",
                    p.window,
                    p.floor,
                    entry.seq()
                ),
            ));
        }
        if let Some(mark) = &entry.header.journal {
            let fits = match mark {
                JournalMark::Claim { .. } => entry.is_claim(),
                JournalMark::Checkpoint { .. } => entry.stored().is_some(),
            };
            if !fits || mark.slot() == 0 || entry.is_pipelined() {
                return Err(Error::corrupt(
                    object,
                    format!(
                        "a {} entry with the journal mark {mark:?}",
                        entry.kind_name()
                    ),
                ));
            }
        }
        if entry.version() != version {
            return Err(Error::corrupt(
                object,
                format!(
                    "entry version {version} but the entry is written as version {}",
                    entry.version()
                ),
            ));
        }
        Ok(entry)
    }
}

/// The keys of an entry [`LogEntry::decode`] checks before it reads the entry: small values
/// are kept, and the body keys only noted as present (any value, `null` included).
#[derive(Deserialize)]
struct Probe {
    #[serde(default)]
    v: Option<serde_json::Value>,
    #[serde(default)]
    kind: Option<serde_json::Value>,
    /// `Some` for any value, `null` included (not a mark this build reads).
    #[serde(default, deserialize_with = "some")]
    journal: Option<serde_json::Value>,
    #[serde(default, deserialize_with = "present")]
    blob: bool,
    #[serde(default, deserialize_with = "present")]
    inline: bool,
    #[serde(default, deserialize_with = "present")]
    manifest: bool,
}

/// Any value, `null` included, as `Some`.
fn some<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<serde_json::Value>, D::Error> {
    serde_json::Value::deserialize(d).map(Some)
}

/// True for any value: the key is there.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    serde::de::IgnoredAny::deserialize(d).map(|_| true)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_names_its_claimer_and_one_without_reads_and_writes_back_byte_for_byte()
    -> Result<(), Error> {
        let old = br#"{"at_ms":1,"kind":"claim","nonce":"n","round":1,"seq":1,"v":1,"writer":"w"}"#;
        let entry = LogEntry::decode("x", old, Some(1))?;
        assert_eq!(entry.body, EntryBody::Claim(Claimer::default()));
        assert_eq!(entry.encode()?, old.to_vec());
        let new = br#"{"at_ms":1,"instance":"0123456789abcdef0123456789abcdef","kind":"claim","nonce":"n","round":1,"seq":1,"term_ms":3000,"v":1,"writer":"w"}"#;
        let entry = LogEntry::decode("x", new, Some(1))?;
        assert_eq!(
            entry.body,
            EntryBody::Claim(Claimer {
                instance: "0123456789abcdef0123456789abcdef".into(),
                term_ms: 3_000,
                home: None,
            })
        );
        assert_eq!(entry.encode()?, new.to_vec());
        let homed = br#"{"at_ms":1,"home":"h1","instance":"0123456789abcdef0123456789abcdef","kind":"claim","nonce":"n","round":1,"seq":1,"term_ms":3000,"v":1,"writer":"w"}"#;
        let entry = LogEntry::decode("x", homed, Some(1))?;
        assert!(
            matches!(&entry.body, EntryBody::Claim(c) if c.home.as_deref() == Some("h1")),
            "{entry:?}"
        );
        assert_eq!(entry.encode()?, homed.to_vec());
        Ok(())
    }

    #[test]
    fn an_array_or_a_key_given_twice_is_corrupt_whatever_it_holds() {
        let claim =
            r#"{"at_ms":1,"kind":"claim","nonce":"n","round":2,"seq":3,"v":1,"writer":"w"}"#;
        assert!(LogEntry::decode("x", claim.as_bytes(), Some(3)).is_ok());
        for bytes in [
            "[5]",
            " [1]",
            "[]",
            "[99]",
            "5",
            r#"{"at_ms":1,"kind":"claim","nonce":"n","round":2,"seq":3,"v":1,"v":1,"writer":"w"}"#,
            r#"{"at_ms":1,"kind":"claim","nonce":"n","round":2,"seq":3,"seq":3,"v":1,"writer":"w"}"#,
        ] {
            for journal in [false, true] {
                let got = LogEntry::decode_as("x", bytes.as_bytes(), None, journal);
                assert!(
                    matches!(&got, Err(Error::Corrupt { .. })),
                    "{bytes} (journal reader: {journal}): {got:?}"
                );
            }
        }
    }

    const RUN: &str = "0123456789abcdef0123456789abcdef-00000000000000000001";

    fn journal_claim(mark: &str, kind: &str) -> Vec<u8> {
        format!(
            r#"{{"at_ms":1,"journal":{mark},"kind":"{kind}","nonce":"n","round":2,"seq":3,"v":5,"writer":"w"}}"#
        )
        .into_bytes()
    }

    #[test]
    fn a_journal_entry_reads_back_byte_for_byte_and_only_the_journals_reader_reads_it()
    -> Result<(), Error> {
        let bytes = journal_claim(
            &format!(
                r#"{{"after":{{"at":"entry","seq":1}},"from":4,"role":"claim","run":"{RUN}"}}"#
            ),
            "claim",
        );
        let entry = LogEntry::decode_journal("x", &bytes, Some(3))?;
        assert_eq!(entry.version(), JOURNAL_ENTRY_VERSION);
        assert!(matches!(
            &entry.header.journal,
            Some(JournalMark::Claim {
                from: 4,
                after: Some(crate::format::mark::FreePoint::Entry { seq: 1 }),
                ..
            })
        ));
        assert_eq!(entry.encode()?, bytes);
        let refused = LogEntry::decode("x", &bytes, Some(3));
        assert!(
            matches!(&refused, Err(Error::JournalRequired { .. })),
            "{refused:?}"
        );
        Ok(())
    }

    #[test]
    fn a_journal_mark_on_the_wrong_kind_a_slot_of_zero_or_an_unknown_role_is_refused() {
        let claim = format!(r#"{{"from":4,"role":"claim","run":"{RUN}"}}"#);
        let zero = format!(r#"{{"from":0,"role":"claim","run":"{RUN}"}}"#);
        let bad_run = r#"{"from":4,"role":"claim","run":"../x-00000000000000000001"}"#;
        for (mark, kind) in [
            (claim.as_str(), "release"),
            (zero.as_str(), "claim"),
            (bad_run, "claim"),
        ] {
            let refused = LogEntry::decode_journal("x", &journal_claim(mark, kind), Some(3));
            assert!(
                matches!(refused, Err(Error::Corrupt { .. })),
                "{mark} {kind}: {refused:?}"
            );
        }
        let later = journal_claim(r#"{"role":"moved","run":"r"}"#, "claim");
        let refused = LogEntry::decode_journal("x", &later, Some(3));
        assert!(
            matches!(refused, Err(Error::UnknownFormat { .. })),
            "{refused:?}"
        );
        // Version 5 without a mark, or a mark under another version, is not what it says.
        let unmarked =
            br#"{"at_ms":1,"kind":"claim","nonce":"n","round":2,"seq":3,"v":5,"writer":"w"}"#;
        assert!(matches!(
            LogEntry::decode_journal("x", unmarked, Some(3)),
            Err(Error::Corrupt { .. })
        ));
        let v1 = String::from_utf8_lossy(&journal_claim(&claim, "claim"))
            .replace(r#""v":5"#, r#""v":1"#);
        assert!(matches!(
            LogEntry::decode_journal("x", v1.as_bytes(), Some(3)),
            Err(Error::Corrupt { .. })
        ));
    }
}
