//! The manifest of a segmented snapshot: which content-addressed segment holds each range of
//! pages. Stored as its own object, `<seq:020>-<round>-<sha256>.manifest.json`, named by the
//! sha256 of its bytes, so the log entry that names it authenticates it (I10):
//!
//! ```text
//! {"v":1,"page_size":4096,"pages":262144,"segment_pages":256,
//!  "segments":[["00000000000000000007-3-<sha256 of the pages>.seg.zst",51234], …]}
//! ```
//!
//! Segment `i` holds pages `i·segment_pages + 1 ..` (the last one may be shorter), page 1
//! in canonical form; its name carries the sha256 of those uncompressed bytes, and the log
//! position and round of the snapshot that uploaded it. The number is its packed size, for
//! accounting only: any compression of the same bytes is the same segment.
//!
//! Every field is checked before anything is allocated or downloaded from it: a crafted
//! manifest (sizes, counts, names) is [`Error::Corrupt`], never a panic or an allocation
//! the object's own size does not bound.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::Error;
use crate::format::pages::valid_page_size;

/// Manifest format version of a manifest whose segments are all the org's own.
pub const MANIFEST_VERSION: u64 = 1;
/// Manifest format version of a manifest that names another org's segments (a clone,
/// `docs/design.md` 2e): `<org>/<segment name>`. A reader of an earlier build refuses it
/// ([`Error::UnknownFormat`]) instead of looking for those segments under its own org.
pub const MANIFEST_VERSION_SHARED: u64 = 2;
/// Largest segment in uncompressed bytes a manifest may describe (64 MiB): what one segment
/// download may hold in memory.
pub const MAX_SEGMENT_BYTES: u64 = 64 << 20;
/// Largest manifest object read (64 MiB, about 600 000 segments).
pub const MAX_MANIFEST_BYTES: u64 = 64 << 20;

/// One segment of a manifest: its object name and its packed size in bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentRef(pub String, pub u64);

impl SegmentRef {
    /// The segment's name as the manifest records it: one path segment in the org's
    /// `snap/` directory, or `<org>/<segment name>` for a segment another org uploaded.
    pub fn name(&self) -> &str {
        &self.0
    }

    /// The org that uploaded the segment, when it is not the manifest's own (a clone).
    pub fn origin(&self) -> Option<&str> {
        self.0.split_once('/').map(|(org, _)| org)
    }

    /// The segment's object name in its origin's `snap/` directory.
    pub fn file(&self) -> &str {
        self.0.split_once('/').map_or(&self.0, |(_, file)| file)
    }

    /// Packed size in bytes, as uploaded.
    pub fn compressed_bytes(&self) -> u64 {
        self.1
    }

    /// The sha256 (lowercase hex) of the segment's uncompressed pages, from its name.
    pub fn sha256(&self) -> &str {
        segment_sha(self.file()).unwrap_or("")
    }
}

/// A segmented snapshot's manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Format version ([`MANIFEST_VERSION`]).
    pub v: u64,
    /// Page size in bytes.
    pub page_size: u32,
    /// Pages in the database.
    pub pages: u32,
    /// Pages per segment (the last segment may hold fewer).
    pub segment_pages: u32,
    /// The segments, page 1's first.
    pub segments: Vec<SegmentRef>,
}

impl Manifest {
    /// Size in bytes of the image.
    pub fn bytes(&self) -> u64 {
        u64::from(self.pages) * u64::from(self.page_size)
    }

    /// Pages in segment `i`.
    pub fn pages_in(&self, i: usize) -> u32 {
        let first = (i as u64) * u64::from(self.segment_pages);
        let left = u64::from(self.pages).saturating_sub(first);
        left.min(u64::from(self.segment_pages)) as u32
    }

    /// Offset in the image of segment `i`, in bytes.
    pub fn offset_of(&self, i: usize) -> u64 {
        (i as u64) * u64::from(self.segment_pages) * u64::from(self.page_size)
    }

    /// The version a manifest of `segments` is written with: [`MANIFEST_VERSION_SHARED`]
    /// when one names another org's segment, else [`MANIFEST_VERSION`].
    pub fn version_for(segments: &[SegmentRef]) -> u64 {
        if segments.iter().any(|s| s.origin().is_some()) {
            MANIFEST_VERSION_SHARED
        } else {
            MANIFEST_VERSION
        }
    }

    /// Packed bytes of every segment together.
    pub fn compressed_bytes(&self) -> u64 {
        self.segments.iter().map(SegmentRef::compressed_bytes).sum()
    }

    /// Serializes the manifest and names it by its sha256: `(name, bytes)`.
    ///
    /// # Errors
    /// [`Error::Encode`] if serde fails (it does not for this type).
    pub(crate) fn encode(&self, seq: u64, round: u64) -> Result<(String, Vec<u8>), Error> {
        let bytes = serde_json::to_vec(self).map_err(|source| Error::Encode {
            what: "snapshot manifest",
            source,
        })?;
        let name = manifest_name(seq, round, &hex::encode(Sha256::digest(&bytes)));
        Ok((name, bytes))
    }

    /// Parses and checks the manifest read from `object` (named `name`), for an image of
    /// `image_bytes` bytes (the log entry's record).
    ///
    /// # Errors
    /// [`Error::Corrupt`] when the bytes are not the ones the name's sha256 names, do not
    /// parse, or describe another image: a page size SQLite cannot have, another size, a
    /// segment larger than [`MAX_SEGMENT_BYTES`], a segment count that does not cover the
    /// pages exactly, or a segment name that is not one; [`Error::UnknownFormat`] for
    /// another version.
    pub(crate) fn decode(
        object: &str,
        name: &str,
        bytes: &[u8],
        image_bytes: u64,
    ) -> Result<Manifest, Error> {
        let bad = |why: String| Err(Error::corrupt(object, why));
        let sha = hex::encode(Sha256::digest(bytes));
        if manifest_sha(name) != Some(sha.as_str()) {
            return bad(format!("manifest sha256 is {sha}, its name says otherwise"));
        }
        let m: Manifest = serde_json::from_slice(bytes).map_err(|e| Error::corrupt(object, e))?;
        if m.v != MANIFEST_VERSION && m.v != MANIFEST_VERSION_SHARED {
            return Err(Error::UnknownFormat {
                object: object.into(),
                detail: format!("manifest version {}", m.v),
            });
        }
        if !valid_page_size(m.page_size) {
            return bad(format!("page size {}", m.page_size));
        }
        if m.pages == 0 || m.bytes() != image_bytes {
            return bad(format!(
                "{} pages of {} bytes, the log entry says {image_bytes} bytes",
                m.pages, m.page_size
            ));
        }
        let seg_bytes = u64::from(m.segment_pages) * u64::from(m.page_size);
        if m.segment_pages == 0 || seg_bytes > MAX_SEGMENT_BYTES {
            return bad(format!("{} pages per segment", m.segment_pages));
        }
        let want = u64::from(m.pages).div_ceil(u64::from(m.segment_pages));
        if m.segments.len() as u64 != want {
            return bad(format!(
                "{} segments for {} pages of {} per segment (needs {want})",
                m.segments.len(),
                m.pages,
                m.segment_pages
            ));
        }
        // A version 1 manifest names its own org's segments only; version 2 may name another
        // org's, by a valid org id (one path segment, I12).
        let valid = |s: &SegmentRef| match s.name().split_once('/') {
            None => segment_sha(s.name()).is_some(),
            Some((org, file)) => {
                m.v == MANIFEST_VERSION_SHARED
                    && crate::OrgId::new(org).is_ok()
                    && segment_sha(file).is_some()
            }
        };
        if let Some(s) = m.segments.iter().find(|s| !valid(s)) {
            return bad(format!("bad segment name {:?}", s.name()));
        }
        Ok(m)
    }
}

/// `<seq:020>-<round>-<sha256>.seg.zst`: a segment uploaded for the snapshot at `seq` under
/// `round`, holding the pages whose sha256 is `sha256`.
pub(crate) fn segment_name(seq: u64, round: u64, sha256: &str) -> String {
    format!("{seq:020}-{round}-{sha256}.seg.zst")
}

/// `<seq:020>-<round>-<sha256>.manifest.json`.
pub(crate) fn manifest_name(seq: u64, round: u64, sha256: &str) -> String {
    format!("{seq:020}-{round}-{sha256}.manifest.json")
}

/// The sha256 a `<seq:020>-<round>-<sha256><suffix>` name carries, if it is one.
fn named_sha<'a>(name: &'a str, suffix: &str) -> Option<&'a str> {
    let stem = name.strip_suffix(suffix)?;
    let mut parts = stem.splitn(3, '-');
    let (seq, round, sha) = (parts.next()?, parts.next()?, parts.next()?);
    let digits = |s: &str, max: usize| {
        !s.is_empty() && s.len() <= max && s.bytes().all(|b| b.is_ascii_digit())
    };
    let hex64 = sha.len() == 64 && sha.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    (seq.len() == 20 && digits(seq, 20) && digits(round, 20) && hex64).then_some(sha)
}

/// The sha256 a segment name carries; `None` for anything that is not a segment name.
pub(crate) fn segment_sha(name: &str) -> Option<&str> {
    named_sha(name, ".seg.zst")
}

/// The sha256 a manifest name carries; `None` for anything that is not a manifest name.
pub(crate) fn manifest_sha(name: &str) -> Option<&str> {
    named_sha(name, ".manifest.json")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(pages: u32, segment_pages: u32, n: usize) -> Manifest {
        let seg = segment_name(3, 1, &"ab".repeat(32));
        Manifest {
            v: MANIFEST_VERSION,
            page_size: 4096,
            pages,
            segment_pages,
            segments: vec![SegmentRef(seg, 10); n],
        }
    }

    fn roundtrip(m: &Manifest, image_bytes: u64) -> Result<Manifest, Error> {
        let (name, bytes) = m.encode(3, 1)?;
        Manifest::decode("m", &name, &bytes, image_bytes)
    }

    #[test]
    fn a_manifest_decodes_only_for_its_image_and_its_name() -> Result<(), Error> {
        let m = manifest(10, 4, 3);
        assert_eq!(roundtrip(&m, 40960)?, m);
        assert_eq!((m.pages_in(2), m.offset_of(2)), (2, 8 * 4096));
        let (name, mut bytes) = m.encode(3, 1)?;
        assert!(Manifest::decode("m", &name, &bytes, 40960 + 4096).is_err());
        bytes.push(b' ');
        assert!(matches!(
            Manifest::decode("m", &name, &bytes, 40960),
            Err(Error::Corrupt { .. })
        ));
        Ok(())
    }

    #[test]
    fn crafted_sizes_counts_and_names_are_corrupt_not_a_panic() -> Result<(), Error> {
        let cases = [
            (manifest(10, 4, 2), 40960), // too few segments
            (manifest(10, 4, 4), 40960), // too many
            (manifest(10, 0, 3), 40960), // zero pages per segment
            (manifest(0, 4, 0), 0),      // no pages
            (
                manifest(u32::MAX, 1 << 20, 4096),
                u64::from(u32::MAX) * 4096,
            ), // huge segments
            (manifest(u32::MAX, 16, 1), u64::from(u32::MAX) * 4096), // count far off
            (
                Manifest {
                    page_size: 1000,
                    ..manifest(10, 4, 3)
                },
                10000,
            ),
            (
                Manifest {
                    segments: vec![SegmentRef("../../x.seg.zst".into(), 1); 3],
                    ..manifest(10, 4, 3)
                },
                40960,
            ),
        ];
        for (m, bytes) in cases {
            assert!(
                matches!(roundtrip(&m, bytes), Err(Error::Corrupt { .. })),
                "{m:?}"
            );
        }
        let future = Manifest {
            v: 9,
            ..manifest(10, 4, 3)
        };
        assert!(matches!(
            roundtrip(&future, 40960),
            Err(Error::UnknownFormat { .. })
        ));
        Ok(())
    }

    #[test]
    fn another_orgs_segment_is_named_only_by_a_shared_manifest_and_a_valid_org() -> Result<(), Error>
    {
        let seg = segment_name(3, 1, &"ab".repeat(32));
        let shared = |name: String| Manifest {
            segments: vec![SegmentRef(name, 10); 3],
            ..manifest(10, 4, 3)
        };
        let ok = shared(format!("acme/{seg}"));
        assert_eq!(Manifest::version_for(&ok.segments), MANIFEST_VERSION_SHARED);
        let ok = Manifest {
            v: MANIFEST_VERSION_SHARED,
            ..ok
        };
        let back = roundtrip(&ok, 40960)?;
        assert_eq!(back.segments[0].origin(), Some("acme"));
        assert_eq!(back.segments[0].file(), seg);
        assert_eq!(back.segments[0].sha256(), "ab".repeat(32));
        // Version 1 never names another org's segment; version 2 only by a valid org id.
        let v1 = Manifest {
            v: MANIFEST_VERSION,
            ..shared(format!("acme/{seg}"))
        };
        assert!(matches!(roundtrip(&v1, 40960), Err(Error::Corrupt { .. })));
        for bad in [
            format!("../{seg}"),
            format!("Acme/{seg}"),
            format!("acme/x/{seg}"),
            format!("/{seg}"),
            "acme/x.seg.zst".to_owned(),
        ] {
            let m = Manifest {
                v: MANIFEST_VERSION_SHARED,
                ..shared(bad.clone())
            };
            assert!(
                matches!(roundtrip(&m, 40960), Err(Error::Corrupt { .. })),
                "{bad}"
            );
        }
        Ok(())
    }

    #[test]
    fn names_carry_their_sha256_and_nothing_else_parses() {
        let sha = "0f".repeat(32);
        assert_eq!(segment_sha(&segment_name(1, 2, &sha)), Some(sha.as_str()));
        assert_eq!(manifest_sha(&manifest_name(1, 2, &sha)), Some(sha.as_str()));
        for bad in [
            "00000000000000000001-2-0f.seg.zst",
            "1-2-x.seg.zst",
            &segment_name(1, 2, &sha).replace(".seg.zst", ".db.zst"),
            &format!("00000000000000000001--{sha}.seg.zst"),
            &format!("00000000000000000001-2-{}.seg.zst", "0F".repeat(32)),
        ] {
            assert_eq!(segment_sha(bad), None, "{bad}");
        }
    }
}
