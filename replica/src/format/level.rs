//! The level file format: one closed chain's positions at a coarser grain (`docs/design.md`
//! 2d). No I/O; synchronous (compression): call on a blocking thread.
//!
//! ```text
//! "idemlvl\0" | version u32 LE | header_len u32 LE | sha256(header) 32 bytes
//! header: JSON (LevelHeader), header_len bytes
//! sections: one zstd frame each, in order, at the offsets the header gives (counted from
//!           the end of the header); each frame decompresses to a delta body (format/body.rs)
//!           of whole pages
//! ```
//!
//! A section stands for the last position of one time bucket of the chain: it carries every
//! page changed since the previous section (or the snapshot), whole, as it is at that
//! position, with the database checksums before and after (I10). The header names its org
//! and its chain (snapshot and last position), so a file moved to another org's or chain's
//! name is refused (I12).

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::Error;

/// Magic bytes that open every level file.
pub const LEVEL_MAGIC: [u8; 8] = *b"idemlvl\0";
/// Level file format version written by this build.
pub const LEVEL_VERSION: u32 = 1;
/// Bytes before the header JSON: magic, version, header length, header sha256.
const PREFIX: usize = 8 + 4 + 4 + 32;
/// Largest header accepted (a closed chain of about 10,000 sections).
const MAX_HEADER_BYTES: usize = 4 << 20;

/// What a level file holds, before its section frames.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LevelHeader {
    /// The org whose chain this is.
    pub org: String,
    /// Log position of the chain's snapshot.
    pub snapshot: u64,
    /// Database checksum of the snapshot (the base of the first section).
    pub snapshot_checksum: String,
    /// Log position of the chain's last position (the last section's).
    pub end: u64,
    /// Width of a bucket in ms: sections stand for the last position of each bucket of
    /// `at_ms / bucket_ms`.
    pub bucket_ms: u64,
    /// Page size of every section, bytes.
    pub page_size: u32,
    /// The sections, ascending by seq.
    pub sections: Vec<Section>,
}

/// One bucket's last position, and where its pages are in the file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Section {
    /// The log position it stands for (a delta of the chain).
    pub seq: u64,
    /// That delta's round.
    pub round: u64,
    /// That delta's time, ms since the Unix epoch (its writer's clock).
    pub at_ms: u64,
    /// The commit counter at that position.
    pub commit: u64,
    /// Database size in pages at that position.
    pub db_pages: u32,
    /// Pages the section carries.
    pub changed_pages: u32,
    /// Database checksum before the section (the previous section's, or the snapshot's).
    pub base_checksum: String,
    /// Database checksum at the position.
    pub checksum: String,
    /// The chain's deltas the section stands for.
    pub positions: u64,
    /// Offset of its zstd frame, counted from the end of the header, bytes.
    pub offset: u64,
    /// Length of its zstd frame, bytes.
    pub len: u64,
    /// Uncompressed delta body size, bytes.
    pub bytes: u64,
    /// sha256 of the uncompressed delta body, lowercase hex.
    pub sha256: String,
}

/// `<snapshot:020>-<end:020>.lvl`, the name of a chain's level file.
pub(crate) fn level_name(snapshot: u64, end: u64) -> String {
    format!("{snapshot:020}-{end:020}.lvl")
}

/// `<snapshot:020>-<end:020>.lvl` → (snapshot, end); `None` for any other name.
pub(crate) fn parse_level_name(name: &str) -> Option<(u64, u64)> {
    let stem = name.strip_suffix(".lvl")?;
    let (a, b) = stem.split_once('-')?;
    let digits = |s: &str| s.len() == 20 && s.bytes().all(|c| c.is_ascii_digit());
    if !digits(a) || !digits(b) {
        return None;
    }
    let (snapshot, end) = (a.parse().ok()?, b.parse().ok()?);
    (snapshot < end).then_some((snapshot, end))
}

/// A section being written: its header fields (offset and len filled in by [`encode`]) and
/// its uncompressed delta body.
pub(crate) struct SectionBody {
    pub(crate) section: Section,
    pub(crate) body: Vec<u8>,
}

/// Compresses each section's body at zstd `level`, fills in offsets, lengths, sizes and
/// digests, and writes the file.
///
/// # Errors
/// [`Error::Compress`] when zstd fails; [`Error::Encode`] when the header does not encode.
pub(crate) fn encode(
    org: &str,
    mut header: LevelHeader,
    sections: Vec<SectionBody>,
    level: i32,
) -> Result<Vec<u8>, Error> {
    let mut frames = Vec::new();
    header.sections.clear();
    for SectionBody { mut section, body } in sections {
        let frame = super::blob::compress(&body, level).map_err(|source| Error::Compress {
            org: org.to_owned(),
            what: "level section",
            source,
        })?;
        section.offset = frames.len() as u64;
        section.len = frame.len() as u64;
        section.bytes = body.len() as u64;
        section.sha256 = hex::encode(Sha256::digest(&body));
        frames.extend_from_slice(&frame);
        header.sections.push(section);
    }
    let json = serde_json::to_vec(&header).map_err(|source| Error::Encode {
        what: "level header",
        source,
    })?;
    let mut out = Vec::with_capacity(PREFIX + json.len() + frames.len());
    out.extend_from_slice(&LEVEL_MAGIC);
    out.extend_from_slice(&LEVEL_VERSION.to_le_bytes());
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(&Sha256::digest(&json));
    out.extend_from_slice(&json);
    out.extend_from_slice(&frames);
    Ok(out)
}

/// A level file read back: its header, checked against its name and org, and its bytes.
pub(crate) struct LevelFile {
    pub(crate) object: String,
    pub(crate) header: LevelHeader,
    bytes: bytes::Bytes,
    frames_at: usize,
}

impl LevelFile {
    /// Parses `bytes` (the object at `object`, which must be the level file of `org` for
    /// the chain `snapshot..=end` its name says): magic, version, the header's sha256, then
    /// the header's own shape (sections ascending inside the chain, the last one at `end`,
    /// frames inside the file, one after another).
    ///
    /// # Errors
    /// [`Error::Corrupt`] for any other shape; [`Error::UnknownFormat`] for another version.
    pub(crate) fn parse(
        object: &str,
        bytes: bytes::Bytes,
        org: &str,
        snapshot: u64,
        end: u64,
    ) -> Result<LevelFile, Error> {
        let bad = |why: &str| Error::corrupt(object, why);
        if bytes.len() < PREFIX || bytes[..8] != LEVEL_MAGIC {
            return Err(bad("level file header missing"));
        }
        let version = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
        if version != LEVEL_VERSION {
            return Err(Error::UnknownFormat {
                object: object.into(),
                detail: format!("level file version {version}"),
            });
        }
        let len = u32::from_le_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]) as usize;
        if len > MAX_HEADER_BYTES || PREFIX + len > bytes.len() {
            return Err(bad("level file header length outside the file"));
        }
        let json = &bytes[PREFIX..PREFIX + len];
        if Sha256::digest(json).as_slice() != &bytes[16..48] {
            return Err(bad("level file header sha256 mismatch"));
        }
        let header: LevelHeader =
            serde_json::from_slice(json).map_err(|e| bad(&format!("level header: {e}")))?;
        if header.org != org || header.snapshot != snapshot || header.end != end {
            return Err(bad("level file names another org or chain than its path"));
        }
        let frames = bytes.len() - PREFIX - len;
        let (mut last, mut next_offset, mut total) = (snapshot, 0u64, 0u64);
        for s in &header.sections {
            // A compactor never writes more (`MAX_LEVEL_BYTES`): a header claiming more is
            // crafted or damaged, and decompressing it would reserve what it claims.
            total = total.saturating_add(s.bytes);
            if total > crate::MAX_LEVEL_BYTES {
                return Err(bad("level sections larger than a level file holds"));
            }
            if s.seq <= last || s.seq > end {
                return Err(bad("level sections out of order or outside the chain"));
            }
            if s.offset != next_offset || s.offset.saturating_add(s.len) > frames as u64 {
                return Err(bad("level section frame outside the file"));
            }
            (last, next_offset) = (s.seq, s.offset + s.len);
        }
        if last != end || next_offset != frames as u64 || header.bucket_ms == 0 {
            return Err(bad("level sections do not end the chain at the file's end"));
        }
        Ok(LevelFile {
            object: object.into(),
            header,
            bytes,
            frames_at: PREFIX + len,
        })
    }

    /// The uncompressed delta body of section `i`, its size and sha256 checked.
    ///
    /// # Errors
    /// [`Error::Corrupt`] when it does not decompress to its size and digest.
    pub(crate) fn body(&self, i: usize) -> Result<Vec<u8>, Error> {
        let bad = |why: String| Error::corrupt(&self.object, why);
        let s = self
            .header
            .sections
            .get(i)
            .ok_or_else(|| bad(format!("no section {i}")))?;
        let at = self.frames_at + s.offset as usize;
        let frame = &self.bytes[at..at + s.len as usize];
        let cap = usize::try_from(s.bytes).map_err(|_| bad("section size".into()))?;
        let mut context = super::blob::DCtx::take();
        let body = context
            .decompress(frame, cap)
            .map_err(|e| bad(format!("section {} does not decompress: {e}", s.seq)))?;
        context.keep(body.len());
        if body.len() as u64 != s.bytes || hex::encode(Sha256::digest(&body)) != s.sha256 {
            return Err(bad(format!("section {} size or sha256 mismatch", s.seq)));
        }
        Ok(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(seq: u64) -> SectionBody {
        SectionBody {
            section: Section {
                seq,
                round: 1,
                at_ms: seq * 1000,
                commit: seq,
                db_pages: 1,
                changed_pages: 0,
                base_checksum: "00".into(),
                checksum: "11".into(),
                positions: 2,
                offset: 0,
                len: 0,
                bytes: 0,
                sha256: String::new(),
            },
            body: vec![seq as u8; 100],
        }
    }

    fn header() -> LevelHeader {
        LevelHeader {
            org: "acme".into(),
            snapshot: 3,
            snapshot_checksum: "00".into(),
            end: 9,
            bucket_ms: 60_000,
            page_size: 4096,
            sections: Vec::new(),
        }
    }

    #[test]
    fn a_level_file_reads_back_only_under_its_own_name_and_org() -> Result<(), Error> {
        let bytes = bytes::Bytes::from(encode("acme", header(), vec![section(5), section(9)], 3)?);
        let file = LevelFile::parse("x", bytes.clone(), "acme", 3, 9)?;
        assert_eq!(file.header.sections.len(), 2);
        assert_eq!(file.body(1)?, vec![9u8; 100]);
        for (org, snap, end) in [("acme2", 3, 9), ("acme", 2, 9), ("acme", 3, 8)] {
            assert!(matches!(
                LevelFile::parse("x", bytes.clone(), org, snap, end),
                Err(Error::Corrupt { .. })
            ));
        }
        Ok(())
    }

    #[test]
    fn any_flipped_byte_is_corrupt_or_caught_by_the_section_digest() -> Result<(), Error> {
        let good = encode("acme", header(), vec![section(5), section(9)], 3)?;
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x40;
            let parsed = LevelFile::parse("x", bytes::Bytes::from(bad), "acme", 3, 9);
            let caught = match parsed {
                Err(_) => true,
                Ok(f) => f.body(0).is_err() || f.body(1).is_err(),
            };
            assert!(caught, "a flip at byte {i} went unnoticed");
        }
        Ok(())
    }

    #[test]
    fn names_parse_only_in_their_own_shape() {
        assert_eq!(parse_level_name(&level_name(3, 9)), Some((3, 9)));
        for bad in [
            "3-9.lvl",
            "00000000000000000009-00000000000000000003.lvl",
            "00000000000000000003-00000000000000000009.db",
            "../00000000000000000003-00000000000000000009.lvl",
        ] {
            assert_eq!(parse_level_name(bad), None, "{bad}");
        }
    }
}
