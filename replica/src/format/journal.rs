//! The journal object format (`docs/design.md` 3g, "Objects"). No I/O.
//!
//! ```text
//! "idemjnl\0" | version u32 LE | header_len u32 LE | sha256(header) 32 bytes
//! header: JSON (JournalHeader), header_len bytes
//! frames: a batch's sections, one zstd frame each, at the offsets its index gives (counted
//!         from the end of the header); each decompresses to a delta body (format/body.rs)
//! ```
//!
//! Every object of a run is one of three kinds, all create-only at
//! `journals/<run>/<slot:020>.jnl`: a **batch** (one group-commit tick of a writer process:
//! a section per org that committed), a **seal** (the run's end: `self`, `adopt` or
//! `release`) or an **exclusion** (one org's tenure fenced by a claimant). The header names
//! its run and slot, so an object moved to another name is refused (I12); its sha256 is in
//! the prefix, and each section's digest in the index binds the frame to its org, run and
//! slot, so a reader may range-GET one org's section alone and still check it (I10).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::Error;

/// Magic bytes that open every journal object.
pub const JOURNAL_MAGIC: [u8; 8] = *b"idemjnl\0";
/// Journal object format version written by this build.
pub const JOURNAL_VERSION: u32 = 1;
/// Bytes before the header JSON: magic, version, header length, header sha256.
pub(crate) const PREFIX: usize = 8 + 4 + 4 + 32;
/// Largest header accepted, bytes (an index of about 20,000 sections).
pub const MAX_JOURNAL_HEADER_BYTES: u64 = 8 << 20;
/// Largest uncompressed section accepted, bytes: a cumulative section above this is
/// checkpointed long before (J5's `section_bytes` is KiB), so one claiming more is crafted.
pub const MAX_SECTION_BYTES: u64 = 64 << 20;

/// A journal: one sequence of appends by one writer process, `<instance>-<run:020>`
/// (`docs/design.md` 3g). The instance is a process lease's (32 lowercase hex digits), so a
/// run name read from any object is one path segment (I12).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RunName {
    instance: String,
    run: u64,
}

impl RunName {
    /// The run numbered `run` of the process `instance`.
    ///
    /// # Errors
    /// [`Error::Corrupt`] (as for a name read from an object) when `instance` is not 32
    /// lowercase hex digits.
    pub fn new(instance: &str, run: u64) -> Result<RunName, Error> {
        if !crate::fence::lease::valid_instance(instance) {
            return Err(Error::corrupt(
                instance,
                "a run's instance is not 32 lowercase hex digits",
            ));
        }
        Ok(RunName {
            instance: instance.to_owned(),
            run,
        })
    }

    /// Parses `<instance>-<run:020>`.
    ///
    /// # Errors
    /// [`Error::Corrupt`] for any other shape.
    pub fn parse(name: &str) -> Result<RunName, Error> {
        let bad = || Error::corrupt(name, "not a run name (<32 hex digits>-<20 digits>)");
        let (instance, run) = name.split_once('-').ok_or_else(bad)?;
        if run.len() != 20 || !run.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        RunName::new(instance, run.parse().map_err(|_| bad())?)
    }

    /// The process instance that writes the run.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// The run's number among its process's runs.
    pub fn number(&self) -> u64 {
        self.run
    }

    /// The same process's next run (what a self-seal names as `continued`).
    pub fn next(&self) -> RunName {
        RunName {
            instance: self.instance.clone(),
            run: self.run + 1,
        }
    }
}

impl fmt::Display for RunName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{:020}", self.instance, self.run)
    }
}

impl Serialize for RunName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for RunName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        RunName::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// `<slot:020>.jnl` → slot; `None` for any other name.
pub(crate) fn parse_slot_name(name: &str) -> Option<u64> {
    let stem = name.strip_suffix(".jnl")?;
    (stem.len() == 20 && stem.bytes().all(|b| b.is_ascii_digit()))
        .then(|| stem.parse().ok())
        .flatten()
        .filter(|&slot| slot != 0 && slot != u64::MAX)
}

/// The header every journal object carries: where it is and who put it there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalHeader {
    /// The run the object is in (its path's).
    pub run: RunName,
    /// Its slot in the run (its path's), from 1.
    pub slot: u64,
    /// A per-attempt nonce: a re-read finding it is our own landing (I9).
    pub nonce: String,
    /// For a batch: the lowest slot of the run not yet resolved when it was issued. For a
    /// fence: the `f` it was placed by (J3-17). Never the object's own slot.
    pub floor: u64,
    /// What the object is.
    pub object: JournalObject,
}

/// The three kinds of journal object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum JournalObject {
    /// One group-commit tick: a section per org that committed.
    Batch(Batch),
    /// The run's end.
    Seal(Seal),
    /// One org's tenure fenced by a claimant.
    Exclusion(Exclusion),
}

/// A batch's header fields (`docs/design.md` 3g, "Objects").
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    /// Slots the writer may have in flight at once (3e's W1): every slot it issues is below
    /// `floor + window`.
    pub window: u64,
    /// The lowest walk entry into this run its writer knows of (T3): slots below it may go
    /// once older than `keep_ms` by the store's clock.
    pub retain_below: u64,
    /// Claims the writer announced and has not seen superseded (K1.2, T3, J6-1).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claims: Vec<Announced>,
    /// Raised `retain_below` values for earlier runs of its chain or runs it adopted (T3).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub retain: BTreeMap<RunName, u64>,
    /// The orgs attached to the run, when this batch carries the roster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roster: Option<Vec<String>>,
    /// The sections, in frame order.
    pub sections: Vec<SectionIndex>,
}

/// A claim announced in a batch before its create (K1.2): `org`'s claim will name `run`
/// and enter it at `from`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Announced {
    /// The org claimed.
    pub org: String,
    /// The run the claim names.
    pub run: RunName,
    /// The slot walks enter that run at (the writer's floor).
    pub from: u64,
}

/// How a tenure began: the claim in the org's log, or the adopt seal it came through (K2).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "via", rename_all = "snake_case")]
pub enum Via {
    /// A claim at log position `seq`.
    Claim {
        /// The claim's log position.
        seq: u64,
    },
    /// An adopt seal at `slot` of `run`.
    Adopt {
        /// The sealed run.
        run: RunName,
        /// The seal's slot.
        slot: u64,
    },
}

/// The checkpoint a section is cumulative from (J3-6).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Base {
    /// Its log position in the org's log.
    pub seq: u64,
    /// The database checksum there.
    pub checksum: String,
}

/// One org's section in a batch: what it is cumulative from, what it leads to, and where
/// its frame is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SectionIndex {
    /// The org.
    pub org: String,
    /// The tenure's round.
    pub round: u64,
    /// How the tenure began.
    pub via: Via,
    /// The checkpoint the pages are counted from.
    pub base: Base,
    /// The database checksum after the section's pages are applied to its base.
    pub checksum: String,
    /// The caller's commit counter the section holds.
    pub commit: u64,
    /// The org is released by this section (J4): nothing of this tenure follows.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub released: bool,
    /// Offset of the frame, counted from the end of the header, bytes.
    pub offset: u64,
    /// Length of the frame, bytes.
    pub len: u64,
    /// Uncompressed delta body size, bytes.
    pub bytes: u64,
    /// sha256 over `org`, the run, the slot and the frame (NUL-separated), hex.
    pub sha256: String,
}

/// What a seal ends its run as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SealKind {
    /// The writer's own end after a failed put (J3): walks continue in `continued` at 1.
    #[serde(rename = "self")]
    SelfSeal,
    /// A crash takeover (K2): walks continue in `continued` at `from`, round + 1.
    Adopt,
    /// A drained writer (J4): every org whose walk reaches it is free there.
    Release,
}

/// A run's end (`docs/design.md` 3g, "Objects").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seal {
    /// The writer id that placed it.
    pub by: String,
    /// The process instance that placed it.
    pub instance: String,
    /// What kind of end.
    pub seal: SealKind,
    /// The run walks continue in (`self`, `adopt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continued: Option<RunName>,
    /// The slot walks enter `continued` at.
    pub from: u64,
    /// The run's `retain_below` as of the seal (T3).
    pub retain_below: u64,
}

/// One org's tenure fenced (K1.3): `org`'s tenures of a round below `round` end here.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exclusion {
    /// The org.
    pub org: String,
    /// The claim in `org`'s log the exclusion is placed for.
    pub claim: u64,
    /// That claim's round.
    pub round: u64,
    /// The claim's run: walks continue there.
    pub continued: RunName,
    /// The claim's `from`: walks enter `continued` there.
    pub from: u64,
    /// The writer id that placed it.
    pub by: String,
}

/// The digest a section's index entry carries: sha256 over `org`, NUL, the run, NUL, the
/// slot (decimal), NUL and the frame, so a frame moved to another org, run or slot fails.
pub(crate) fn section_digest(org: &str, run: &RunName, slot: u64, frame: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(org.as_bytes());
    h.update([0]);
    h.update(run.to_string().as_bytes());
    h.update([0]);
    h.update(slot.to_string().as_bytes());
    h.update([0]);
    h.update(frame);
    hex::encode(h.finalize())
}

/// A section being written: its index entry (offset, len, bytes and sha256 filled in by
/// [`encode`]) and its frame, already compressed.
pub(crate) struct SectionFrame {
    pub(crate) index: SectionIndex,
    pub(crate) frame: Vec<u8>,
    /// The frame's uncompressed size, bytes.
    pub(crate) bytes: u64,
}

/// Writes a journal object: a batch's sections' frames after its header, offsets and
/// digests filled in; a seal or an exclusion as its header alone.
///
/// # Errors
/// [`Error::Encode`] when the header does not encode; [`Error::InvalidSettings`] when a
/// batch is given no sections list to fill or a seal is given frames.
pub(crate) fn encode(
    mut header: JournalHeader,
    frames: Vec<SectionFrame>,
) -> Result<Vec<u8>, Error> {
    let mut body = Vec::new();
    match &mut header.object {
        JournalObject::Batch(batch) => {
            batch.sections.clear();
            for SectionFrame {
                mut index,
                frame,
                bytes,
            } in frames
            {
                index.offset = body.len() as u64;
                index.len = frame.len() as u64;
                index.bytes = bytes;
                index.sha256 = section_digest(&index.org, &header.run, header.slot, &frame);
                body.extend_from_slice(&frame);
                batch.sections.push(index);
            }
        }
        _ if !frames.is_empty() => {
            return Err(Error::InvalidSettings {
                reason: "only a batch carries sections".into(),
            });
        }
        _ => {}
    }
    let json = serde_json::to_vec(&header).map_err(|source| Error::Encode {
        what: "journal header",
        source,
    })?;
    let mut out = Vec::with_capacity(PREFIX + json.len() + body.len());
    out.extend_from_slice(&JOURNAL_MAGIC);
    out.extend_from_slice(&JOURNAL_VERSION.to_le_bytes());
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(&Sha256::digest(&json));
    out.extend_from_slice(&json);
    out.extend_from_slice(&body);
    Ok(out)
}

/// The length of the header JSON that follows the prefix, after the magic and version are
/// checked: what a reader that fetched only the first bytes needs to fetch the rest.
///
/// # Errors
/// [`Error::Corrupt`] for a missing prefix or a header above
/// [`MAX_JOURNAL_HEADER_BYTES`]; [`Error::UnknownFormat`] for another version.
pub(crate) fn header_len(object: &str, prefix: &[u8]) -> Result<usize, Error> {
    if prefix.len() < PREFIX || prefix[..8] != JOURNAL_MAGIC {
        return Err(Error::corrupt(object, "journal object prefix missing"));
    }
    let version = u32::from_le_bytes([prefix[8], prefix[9], prefix[10], prefix[11]]);
    if version != JOURNAL_VERSION {
        return Err(Error::UnknownFormat {
            object: object.into(),
            detail: format!("journal object version {version}"),
        });
    }
    let len = u32::from_le_bytes([prefix[12], prefix[13], prefix[14], prefix[15]]) as u64;
    if len > MAX_JOURNAL_HEADER_BYTES {
        return Err(Error::corrupt(
            object,
            "journal header longer than a header may be",
        ));
    }
    Ok(len as usize)
}

/// Parses the header of the object at `object`, which must be slot `slot` of `run`, from
/// its first bytes (at least the prefix and the header). `total` is the object's size as
/// the store gave it: a batch's frames must fit inside it.
///
/// # Errors
/// [`Error::Corrupt`] when the header's digest, shape, run or slot does not match, or its
/// frames are not one after another inside the object; [`Error::UnknownFormat`].
pub(crate) fn parse_header(
    object: &str,
    head: &[u8],
    run: &RunName,
    slot: u64,
    total: u64,
) -> Result<JournalHeader, Error> {
    let bad = |why: &str| Error::corrupt(object, why);
    let len = header_len(object, head)?;
    let json = head
        .get(PREFIX..PREFIX + len)
        .ok_or_else(|| bad("journal header cut short"))?;
    if Sha256::digest(json).as_slice() != &head[16..48] {
        return Err(bad("journal header sha256 mismatch"));
    }
    let header: JournalHeader =
        serde_json::from_slice(json).map_err(|e| bad(&format!("journal header: {e}")))?;
    if header.run != *run || header.slot != slot || slot == 0 || slot == u64::MAX {
        return Err(bad(
            "journal object names another run or slot than its path",
        ));
    }
    // A batch's floor is the lowest slot unresolved when it was issued, a fence's the `f`
    // it was placed at or above: never above the object's own slot. A floor above it would
    // move every later fence out of the holder's reach (P).
    if header.floor > slot {
        return Err(bad("journal object's floor above its own slot"));
    }
    let frames = total.saturating_sub((PREFIX + len) as u64);
    match &header.object {
        JournalObject::Batch(batch) => {
            let mut next = 0u64;
            for s in &batch.sections {
                if s.offset != next || s.bytes > MAX_SECTION_BYTES {
                    return Err(bad("journal section frames out of order or oversized"));
                }
                next = s.offset.saturating_add(s.len);
            }
            if next != frames {
                return Err(bad("journal sections do not end at the object's end"));
            }
            let mut orgs: Vec<&str> = batch.sections.iter().map(|s| s.org.as_str()).collect();
            orgs.sort_unstable();
            if orgs.windows(2).any(|w| w[0] == w[1]) {
                return Err(bad("a batch holds two sections of one org"));
            }
        }
        _ if frames != 0 => return Err(bad("a seal or exclusion with bytes after its header")),
        _ => {}
    }
    Ok(header)
}

/// Where section `index`'s frame is in its object: a byte range for a range GET.
/// Saturating: a range past any object's end, which the caller refuses, never a panic.
pub(crate) fn frame_range(header_len: usize, index: &SectionIndex) -> std::ops::Range<u64> {
    let at = ((PREFIX + header_len) as u64).saturating_add(index.offset);
    at..at.saturating_add(index.len)
}

/// The uncompressed delta body of a section, from its frame: digest, then size.
///
/// # Errors
/// [`Error::Corrupt`] when the frame's digest, decompression or size does not match.
pub(crate) fn section_body(
    object: &str,
    run: &RunName,
    slot: u64,
    index: &SectionIndex,
    frame: &[u8],
) -> Result<Vec<u8>, Error> {
    let bad = |why: String| Error::corrupt(object, why);
    if frame.len() as u64 != index.len
        || section_digest(&index.org, run, slot, frame) != index.sha256
    {
        return Err(bad(format!("section of {} fails its digest", index.org)));
    }
    let cap = usize::try_from(index.bytes.min(MAX_SECTION_BYTES))
        .map_err(|_| bad("section size".into()))?;
    let mut context = super::blob::DCtx::take();
    let body = context
        .decompress(frame, cap)
        .map_err(|e| bad(format!("section of {} does not decompress: {e}", index.org)))?;
    context.keep(body.len());
    if body.len() as u64 != index.bytes {
        return Err(bad(format!("section of {} has the wrong size", index.org)));
    }
    Ok(body)
}

#[cfg(test)]
mod tests;
