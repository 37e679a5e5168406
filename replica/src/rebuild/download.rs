//! Streaming a full snapshot in: its manifest, then its segments, up to
//! [`Settings::read_concurrency`](crate::Settings::read_concurrency) at a time, each checked
//! against the sha256 its name carries and its pages hashed on the blocking pool, then
//! written at its offset, in order, by a short blocking task per segment. Memory is bounded by
//! the segment size times the downloads in flight, not by the database; no blocking task
//! waits for a download (see [`crate::publish::upload`] for why).

use bytes::Bytes;
use futures::{StreamExt, TryFutureExt, TryStreamExt};
use object_store::path::Path;
use sha2::{Digest, Sha256};

use crate::format::blob::unpack;
use crate::format::checksum::{PageHashes, page_hash};
use crate::format::manifest::{MAX_MANIFEST_BYTES, Manifest, SegmentRef};
use crate::rebuild::image::PageImage;
use crate::replica::blocking;
use crate::{BlobRef, Error, FailPoint, LogEntry, OrgId, Replica};

/// zstd's worst case for `raw` bytes, plus the blob header: no honest segment is larger.
fn packed_bound(raw: u64) -> u64 {
    raw + raw / 128 + (64 << 10)
}

impl Replica {
    /// Reads the manifest a snapshot entry names and checks it against the entry.
    ///
    /// # Errors
    /// [`Error::MissingObject`]; [`Error::Corrupt`] for a manifest that is not the one named
    /// or does not describe the entry's image; [`Error::Store`].
    pub(crate) async fn read_manifest(
        &self,
        org: &OrgId,
        name: &str,
        image_bytes: u64,
    ) -> Result<Manifest, Error> {
        let path = self.inner.store.layout.blob(org, name);
        let object = path.to_string();
        let bytes = self.get_capped(&path, MAX_MANIFEST_BYTES).await?;
        Manifest::decode(&object, name, &bytes, image_bytes)
    }

    /// Downloads the snapshot `entry` describes into `image` (emptied first): a segmented
    /// snapshot streams in segment by segment; a snapshot stored as one blob (written by
    /// earlier builds) is downloaded whole. Returns the image, the object it came from (for
    /// errors), its page hashes and, for a segmented snapshot, its manifest. Each segment is
    /// checked against the sha256 its name carries, and the manifest against its own name,
    /// which the entry holds: together they authenticate the image. `whole_image` also
    /// checks the image's sha256 against the entry's (a second pass over every byte, in
    /// order: verify does it, a hydrate does not need to).
    ///
    /// # Errors
    /// [`Error::MissingObject`] for a missing manifest or segment; [`Error::Corrupt`] for one
    /// that does not match its name or the entry (size, sha256 of the image);
    /// [`Error::Store`]; [`Error::Io`] writing the image.
    pub(crate) async fn download_snapshot<I: PageImage + Send + 'static>(
        &self,
        org: &OrgId,
        entry: &LogEntry,
        mut image: I,
        whole_image: bool,
    ) -> Result<(I, String, PageHashes, Option<Manifest>), Error> {
        let Some(stored) = entry.stored().filter(|_| entry.is_snapshot()) else {
            return Err(Error::NoSuchSnapshot {
                org: org.to_string(),
                seq: entry.seq(),
            });
        };
        let BlobRef::Manifest(name) = &stored.blob else {
            let (object, bytes) = self.fetch(org, entry).await?;
            return blocking("writing a snapshot", move || {
                let hashes = PageHashes::of_image(&object, &bytes)?;
                image.set_len(0)?;
                image.set_len(bytes.len() as u64)?;
                image.write_at(&object, 0, &bytes)?;
                Ok((image, object, hashes, None))
            })
            .await;
        };
        let manifest = self.read_manifest(org, name, stored.bytes).await?;
        let object = self.inner.store.layout.blob(org, name).to_string();
        let n = self.inner.settings.read_concurrency.max(1);
        // The image is set to its size once, then each segment is written, in order, by a
        // short task on the blocking pool; no blocking task waits for a download (a thread
        // of that pool parked on a channel while the decompression it waits for needs a
        // thread deadlocks once enough hydrates run at once).
        let (obj, bytes) = (object.clone(), manifest.bytes());
        let image = blocking("sizing a snapshot's file", move || {
            image.set_len(0)?;
            image.set_len(bytes)?;
            Ok(image)
        })
        .await?;
        // Not `m.pages`: a crafted manifest may claim 2^32 pages within every other bound (32
        // GiB of hashes, an abort); the table grows with the verified segments that arrive.
        // A clone's snapshot (a version 2 manifest) may record no whole-image sha256: its
        // manifest, named by its sha256, names every segment by its pages' (2e).
        let unrecorded = stored.sha256.is_empty()
            && manifest.v == crate::format::segment::MANIFEST_VERSION_SHARED;
        let written = Written {
            image,
            hashes: Vec::with_capacity((manifest.pages as usize).min(1 << 20)),
            sha: (whole_image && !unrecorded).then(Sha256::new),
        };
        // Futures are made as the stream pulls them (only `n` exist at a time, whatever the
        // segment count a manifest claims), from indices: a closure over `&SegmentRef` items
        // would make the future's `Send` bound higher-ranked, which callers' `tokio::spawn`
        // cannot prove. The first failure, a download's or a write's, ends the stream.
        let m = &manifest;
        let written = futures::stream::iter(0..m.segments.len())
            .map(move |i| {
                let first = (m.offset_of(i) / u64::from(m.page_size)) as u32 + 1;
                let shape = (first, m.pages_in(i), m.page_size);
                self.fetch_segment(org, m.segments[i].clone(), shape)
                    .map_ok(move |b| (m.offset_of(i), b))
            })
            .buffered(n)
            .try_fold(written, |mut w, (at, seg)| {
                let obj = obj.clone();
                blocking("writing a segment", move || {
                    w.image.write_at(&obj, at, &seg.bytes)?;
                    w.hashes.extend_from_slice(&seg.hashes);
                    if let Some(sha) = w.sha.as_mut() {
                        sha.update(&seg.bytes);
                    }
                    Ok(w)
                })
            })
            .await?;
        if let Some(sha) = written.sha {
            let (got, want) = (hex::encode(sha.finalize()), &stored.sha256);
            if got != *want {
                return Err(Error::corrupt(
                    &object,
                    format!("image sha256 {got} does not match log {want}"),
                ));
            }
        }
        let hashes = PageHashes::from_hashes(manifest.page_size, written.hashes);
        Ok((written.image, object, hashes, Some(manifest)))
    }

    /// Downloads one segment (`pages` pages of `page_size` bytes from page `first`), checks
    /// it against its name and hashes its pages, on the blocking pool: the segments in
    /// flight decompress and hash in parallel.
    pub(crate) async fn fetch_segment(
        &self,
        org: &OrgId,
        seg: SegmentRef,
        (first, pages, page_size): (u32, u32, u32),
    ) -> Result<Fetched, Error> {
        let raw = u64::from(pages) * u64::from(page_size);
        let path = self.inner.store.layout.segment(org, &seg)?;
        let data = self.get_capped(&path, packed_bound(raw)).await?;
        crate::rebuild::hydrate::downloaded(data.len() as u64);
        self.failpoint(FailPoint::HydrateAfterDownload, org).await?;
        let (object, sha) = (path.to_string(), seg.sha256().to_owned());
        blocking("decompressing a segment", move || {
            let bytes = unpack(&object, &data, raw, &sha)?;
            let hashes = bytes
                .chunks(page_size as usize)
                .enumerate()
                .map(|(k, page)| page_hash(first + k as u32, page))
                .collect();
            Ok(Fetched { bytes, hashes })
        })
        .await
    }

    /// GETs `path` whole, refusing a body above `max` bytes as it streams in (a store that
    /// lies about an object cannot make this process hold more).
    ///
    /// # Errors
    /// [`Error::MissingObject`]; [`Error::Corrupt`] above `max`; [`Error::Store`].
    pub(crate) async fn get_capped(&self, path: &Path, max: u64) -> Result<Bytes, Error> {
        let bytes = self
            .inner
            .store
            .get_bytes(path, max)
            .await?
            .ok_or_else(|| Error::MissingObject {
                path: path.to_string(),
            })?;
        metrics::counter!(crate::metrics::DOWNLOADED_BYTES).increment(bytes.len() as u64);
        Ok(bytes)
    }
}

/// A downloaded segment, checked: its pages and their hashes.
pub(crate) struct Fetched {
    pub(crate) bytes: Vec<u8>,
    pub(crate) hashes: Vec<u64>,
}

/// What a download has written so far: the image, the page hashes of the segments written,
/// and, when the whole image is checked, its running sha256.
struct Written<I> {
    image: I,
    hashes: Vec<u64>,
    sha: Option<Sha256>,
}
