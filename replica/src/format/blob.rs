//! Snapshot and delta blobs: `"idemsnap"`, a little-endian u32 format version, then one zstd
//! frame of the uncompressed bytes (an image or a delta body), whose size and sha256 the
//! log entry records (I10). Synchronous: call on a blocking thread.

use std::sync::Mutex;

use sha2::{Digest, Sha256};
use zstd::bulk::Compressor;

use crate::Error;

/// Blob format version written by this build.
pub const BLOB_VERSION: u32 = 1;
/// Magic bytes that open every snapshot and delta blob, followed by a little-endian u32
/// version ([`BLOB_VERSION`]).
pub const BLOB_MAGIC: [u8; 8] = *b"idemsnap";
/// Header bytes before the zstd frame.
const HEADER: usize = 12;

/// The header that opens a blob.
fn header() -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..8].copy_from_slice(&BLOB_MAGIC);
    h[8..].copy_from_slice(&BLOB_VERSION.to_le_bytes());
    h
}

/// Checks the blob header and returns the zstd frame after it.
///
/// # Errors
/// [`Error::Corrupt`] without the magic; [`Error::UnknownFormat`] for another version.
pub(crate) fn frame<'a>(object: &str, blob: &'a [u8]) -> Result<&'a [u8], Error> {
    if blob.len() < HEADER || blob[..8] != BLOB_MAGIC {
        return Err(Error::corrupt(object, "blob header missing"));
    }
    let version = u32::from_le_bytes([blob[8], blob[9], blob[10], blob[11]]);
    if version != BLOB_VERSION {
        return Err(Error::UnknownFormat {
            object: object.into(),
            detail: format!("blob version {version}"),
        });
    }
    Ok(&blob[HEADER..])
}

/// Compression contexts kept between blobs, at most [`KEPT_CONTEXTS`]. A fresh context
/// allocates and zeroes its match tables (about a megabyte at level 3) before its first
/// frame, which for a delta of a few pages costs more than the compression itself; a kept
/// one reuses them. Each keeps the workspace of the largest input it compressed, and only
/// small inputs at low levels are kept ([`KEPT_INPUT_BYTES`], [`KEPT_LEVEL`]), so the pool
/// holds at most about 16 MiB.
static CONTEXTS: Mutex<Vec<Compressor<'static>>> = Mutex::new(Vec::new());

/// Decompression contexts kept between frames, at most [`KEPT_CONTEXTS`]. A fresh context
/// allocates and initializes its entropy tables (about 160 KiB) before its first frame,
/// which for a section or delta of a few pages costs more than the decompression itself (2%
/// of a 1,000-org takeover's CPU in `BENCHMARKS.md`); a kept one is reset and reused. Each
/// keeps the window buffers of the largest frame it read, so one goes back only after a frame
/// of at most [`KEPT_INPUT_BYTES`] read without error ([`DCtx::keep`]): the pool holds a few
/// MiB at most.
static DCONTEXTS: Mutex<Vec<zstd::zstd_safe::DCtx<'static>>> = Mutex::new(Vec::new());

/// A decompression context from [`DCONTEXTS`], or a fresh one.
pub(crate) struct DCtx(zstd::zstd_safe::DCtx<'static>);

impl DCtx {
    /// A kept context when one is free, else a fresh one (zstd panics only when it cannot
    /// allocate one, as an allocation in Rust aborts).
    pub(crate) fn take() -> DCtx {
        // A poisoned pool only means a panic elsewhere mid-push: a fresh context is as good.
        let kept = DCONTEXTS.lock().ok().and_then(|mut kept| kept.pop());
        DCtx(kept.unwrap_or_else(zstd::zstd_safe::DCtx::create))
    }

    /// The context itself, for a streaming decoder or a dictionary patch.
    pub(crate) fn get(&mut self) -> &mut zstd::zstd_safe::DCtx<'static> {
        &mut self.0
    }

    /// One zstd frame decompressed into at most `cap` bytes (its whole content; a frame
    /// larger than `cap` is an error, and `cap` is allocated up front: bound it first).
    pub(crate) fn decompress(&mut self, frame: &[u8], cap: usize) -> std::io::Result<Vec<u8>> {
        let mut out = Vec::with_capacity(cap);
        self.0
            .decompress(&mut out, frame)
            .map_err(|code| std::io::Error::other(zstd::zstd_safe::get_error_name(code)))?;
        Ok(out)
    }

    /// Puts the context back for the next frame, after a frame of at most `read` bytes read
    /// without error; a larger one's buffers are dropped with it.
    pub(crate) fn keep(mut self, read: usize) {
        if read <= KEPT_INPUT_BYTES
            // Whatever a user set (a dictionary a one-shot call referenced included) goes:
            // the next user gets a context as fresh as a new one.
            && self
                .0
                .reset(zstd::zstd_safe::ResetDirective::SessionAndParameters)
                .is_ok()
            && let Ok(mut kept) = DCONTEXTS.lock()
            && kept.len() < KEPT_CONTEXTS
        {
            kept.push(self.0);
        }
    }
}

/// Most compression contexts [`CONTEXTS`] keeps, and most decompression contexts
/// [`DCONTEXTS`] keeps.
const KEPT_CONTEXTS: usize = 8;

/// A context goes back to [`CONTEXTS`] only after an input of at most this many bytes at a
/// level of at most [`KEPT_LEVEL`]: its workspace (about 2 MiB then) is what it keeps. One
/// used above either is dropped, so the pool never holds a high level's tables for good.
const KEPT_INPUT_BYTES: usize = 1 << 20;

/// Highest zstd level whose contexts [`CONTEXTS`] keeps (the default, 3).
const KEPT_LEVEL: i32 = 3;

/// One zstd frame of `bytes` at `level`, with the content size in its header, through a
/// kept context when one is free. The frame's parameters follow the input's size, as a
/// one-shot compression's do.
///
/// # Errors
/// zstd's error.
pub(crate) fn compress(bytes: &[u8], level: i32) -> std::io::Result<Vec<u8>> {
    // A poisoned pool only means a panic elsewhere mid-push: a fresh context is as good.
    let kept = CONTEXTS.lock().ok().and_then(|mut kept| kept.pop());
    let mut context = match kept {
        Some(context) => context,
        None => Compressor::new(level)?,
    };
    context.set_compression_level(level)?;
    let frame = context.compress(bytes)?;
    if bytes.len() <= KEPT_INPUT_BYTES
        && level <= KEPT_LEVEL
        && let Ok(mut kept) = CONTEXTS.lock()
        && kept.len() < KEPT_CONTEXTS
    {
        kept.push(context);
    }
    Ok(frame)
}

/// A packed blob: header + zstd frame, plus the digest and size of the uncompressed bytes.
pub(crate) struct Packed {
    pub(crate) blob: Vec<u8>,
    /// sha256 of the uncompressed bytes, lowercase hex.
    pub(crate) sha256: String,
    /// Uncompressed size in bytes.
    pub(crate) bytes: u64,
}

/// Hashes and compresses `bytes` (a snapshot image or a delta body of `org`; `what` says
/// which) at zstd `level` into a blob.
///
/// # Errors
/// [`Error::Compress`] when zstd fails.
pub(crate) fn pack(
    org: &str,
    what: &'static str,
    bytes: &[u8],
    level: i32,
) -> Result<Packed, Error> {
    let sha256 = hex::encode(Sha256::digest(bytes));
    let failed = |source| Error::Compress {
        org: org.to_owned(),
        what,
        source,
    };
    let frame = compress(bytes, level).map_err(failed)?;
    let mut blob = Vec::with_capacity(HEADER + frame.len());
    blob.extend_from_slice(&header());
    blob.extend_from_slice(&frame);
    Ok(Packed {
        blob,
        sha256,
        bytes: bytes.len() as u64,
    })
}

/// The packed bytes of a body carried inline in the log entry `object`: `text` decoded from
/// standard base64, checked to be `compressed_bytes` long (the entry's own record of it).
/// Decoding allocates at most the text's own length (the entry was already read whole).
///
/// # Errors
/// [`Error::Corrupt`] for text that is not base64 or decodes to another length.
pub(crate) fn inline_body(
    object: &str,
    text: &str,
    compressed_bytes: u64,
) -> Result<Vec<u8>, Error> {
    use base64::Engine;
    let data = base64::prelude::BASE64_STANDARD
        .decode(text)
        .map_err(|e| Error::corrupt(object, format!("inline body is not base64: {e}")))?;
    if data.len() as u64 != compressed_bytes {
        return Err(Error::corrupt(
            object,
            format!(
                "inline body is {} bytes, the entry says {compressed_bytes}",
                data.len()
            ),
        ));
    }
    Ok(data)
}

/// Unpacks the blob stored at `object` and checks its size and sha256 against the log
/// entry's `bytes` and `sha256` (I10).
///
/// # Errors
/// [`Error::Corrupt`] for a bad header, a damaged frame, another size or another digest;
/// [`Error::UnknownFormat`] for another blob version.
pub(crate) fn unpack(
    object: &str,
    blob: &[u8],
    bytes: u64,
    sha256: &str,
) -> Result<Vec<u8>, Error> {
    let frame = frame(object, blob)?;
    let cap = usize::try_from(bytes)
        .map_err(|_| Error::corrupt(object, "size does not fit in memory"))?;
    // The log's size field is not trusted for allocation: a corrupt entry claiming terabytes
    // would abort the process (allocation failure is not a panic). Preallocate at most what a
    // generous compression ratio allows; the copy below grows as needed up to `bytes + 1`.
    let mut out = Vec::with_capacity(cap.min(frame.len().saturating_mul(16)));
    let mut context = DCtx::take();
    let input = std::io::BufReader::with_capacity(zstd::zstd_safe::DCtx::in_size(), frame);
    let mut dec = zstd::stream::read::Decoder::with_context(input, context.get());
    // Read at most one byte more than expected so a bloated blob cannot exhaust memory.
    let read = std::io::copy(
        &mut std::io::Read::take(&mut dec, bytes.saturating_add(1)),
        &mut out,
    );
    drop(dec);
    read.map_err(|e| Error::corrupt(object, format!("zstd: {e}")))?;
    context.keep(out.len());
    if out.len() as u64 != bytes {
        return Err(Error::corrupt(
            object,
            format!("{} bytes after decompression, log says {bytes}", out.len()),
        ));
    }
    let got = hex::encode(Sha256::digest(&out));
    if got != sha256 {
        return Err(Error::corrupt(
            object,
            format!("sha256 {got} does not match log {sha256}"),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_header_version_is_checked() {
        let mut b = header().to_vec();
        b.extend_from_slice(b"frame");
        assert!(matches!(frame("x", &b), Ok(f) if f == b"frame"));
        b[8] = 9;
        assert!(matches!(frame("x", &b), Err(Error::UnknownFormat { .. })));
        assert!(matches!(frame("x", b"short"), Err(Error::Corrupt { .. })));
    }

    #[test]
    fn an_inline_body_that_is_not_base64_or_has_another_length_is_corrupt() -> Result<(), Error> {
        use base64::Engine;
        let packed = pack("acme", "delta", b"some bytes", 3)?;
        let text = base64::prelude::BASE64_STANDARD.encode(&packed.blob);
        let n = packed.blob.len() as u64;
        assert_eq!(inline_body("x", &text, n)?, packed.blob);
        for (text, n) in [("not base64!", n), ("AAEC=", n), (text.as_str(), n + 1)] {
            assert!(
                matches!(inline_body("x", text, n), Err(Error::Corrupt { .. })),
                "{text} {n}"
            );
        }
        Ok(())
    }

    #[test]
    fn a_packed_blob_unpacks_only_with_its_size_and_digest() -> Result<(), Error> {
        let packed = pack("acme", "snapshot", b"some bytes", 3)?;
        assert_eq!(
            unpack("x", &packed.blob, packed.bytes, &packed.sha256)?,
            b"some bytes"
        );
        assert!(matches!(
            unpack("x", &packed.blob, packed.bytes + 1, &packed.sha256),
            Err(Error::Corrupt { .. })
        ));
        assert!(matches!(
            unpack("x", &packed.blob, packed.bytes, "00"),
            Err(Error::Corrupt { .. })
        ));
        Ok(())
    }

    /// Kept decompression contexts carry nothing from one blob to the next: blobs of
    /// different sizes, with damaged, truncated and bloated ones between them (whose
    /// contexts fail mid-frame), each unpack to their own bytes, on one thread so the same
    /// few contexts are reused.
    #[test]
    fn kept_decompression_contexts_carry_nothing_between_blobs() -> Result<(), Error> {
        let big: Vec<u8> = (0..400_000u32).map(|i| (i * 13 % 241) as u8).collect();
        let sizes = [10usize, 4096, 300_000, 1, 70_000];
        for round in 0..3 {
            for (i, n) in sizes.iter().enumerate() {
                let bytes = &big[i..i + n + round];
                let packed = pack("acme", "section", bytes, 3)?;
                let mut damaged = packed.blob.clone();
                let at = damaged.len() / 2;
                damaged[at] ^= 0x5a;
                let truncated = &packed.blob[..packed.blob.len() - 3];
                for bad in [&damaged[..], truncated] {
                    assert!(unpack("x", bad, packed.bytes, &packed.sha256).is_err());
                }
                // Claims fewer bytes than the frame holds: stops one byte past the claim.
                let short = packed.bytes.saturating_sub(2);
                assert!(unpack("x", &packed.blob, short, &packed.sha256).is_err());
                assert_eq!(
                    unpack("x", &packed.blob, packed.bytes, &packed.sha256)?,
                    bytes,
                    "round {round}, blob {i}"
                );
                // A one-shot frame (a journal section) and a patch against a dictionary (a
                // delta's page) on kept contexts, which go back afterwards.
                let frame = zstd::bulk::compress(bytes, 3).map_err(|e| Error::corrupt("x", e))?;
                let mut context = DCtx::take();
                let body = context
                    .decompress(&frame, bytes.len())
                    .map_err(|e| Error::corrupt("x", e))?;
                assert_eq!(body, bytes);
                assert!(context.decompress(&frame, bytes.len() / 2).is_err() || bytes.len() < 2);
                context.keep(bytes.len());
                let dict = &big[..4096];
                let mut patch = Vec::with_capacity(4096);
                zstd::zstd_safe::CCtx::create()
                    .compress_using_dict(&mut patch, &big[7..4103], dict, 3)
                    .map_err(|c| Error::corrupt("x", zstd::zstd_safe::get_error_name(c)))?;
                let mut context = DCtx::take();
                let mut page = Vec::with_capacity(4096);
                let got = context.get().decompress_using_dict(&mut page, &patch, dict);
                assert!(matches!(got, Ok(4096)), "{got:?}");
                assert_eq!(page, &big[7..4103]);
                context.keep(4096);
            }
        }
        Ok(())
    }

    /// Kept contexts move between levels and sizes: every blob unpacks to its bytes, and a
    /// blob of an earlier build (a streamed frame, no content size in its header) still does.
    #[test]
    fn kept_contexts_pack_any_level_and_size_and_old_blobs_still_unpack() -> Result<(), Error> {
        let big: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        for (level, bytes) in [
            (19, &big[..]),
            (1, b"tiny"),
            (3, &big[..5000]),
            (3, &big[..]),
        ] {
            let packed = pack("acme", "segment", bytes, level)?;
            assert_eq!(
                unpack("x", &packed.blob, packed.bytes, &packed.sha256)?,
                bytes
            );
        }
        let mut old = header().to_vec();
        let mut enc =
            zstd::stream::Encoder::new(&mut old, 3).map_err(|e| Error::corrupt("x", e))?;
        std::io::Write::write_all(&mut enc, &big).map_err(|e| Error::corrupt("x", e))?;
        enc.finish().map_err(|e| Error::corrupt("x", e))?;
        let sha = hex::encode(Sha256::digest(&big));
        assert_eq!(unpack("x", &old, big.len() as u64, &sha)?, big);
        Ok(())
    }
}
