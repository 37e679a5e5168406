//! Streaming a full snapshot in: its manifest, then its segments, up to
//! [`Settings::read_concurrency`](crate::Settings::read_concurrency) at a time, each checked
//! against the sha256 its name carries and written at its offset by one blocking thread as
//! it arrives, which also hashes the pages and the whole image in order (I10). Memory is
//! bounded by the segment size times the downloads in flight, not by the database.

use bytes::Bytes;
use futures::{StreamExt, TryFutureExt, TryStreamExt};
use object_store::ObjectStoreExt;
use object_store::path::Path;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use super::manifest::{MAX_MANIFEST_BYTES, Manifest, SegmentRef};
use crate::blob::unpack;
use crate::checksum::{PageHashes, page_hash};
use crate::image::PageImage;
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
        let path = self.inner.layout.blob(org, name);
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
        let object = self.inner.layout.blob(org, name).to_string();
        let n = self.inner.settings.read_concurrency.max(1);
        let (tx, rx) = mpsc::channel::<(usize, Fetched)>(n);
        let m = manifest.clone();
        let want = whole_image.then(|| stored.sha256.clone());
        let obj = object.clone();
        let writing = tokio::task::spawn_blocking(move || {
            write_segments(&obj, &m, image, rx, want.as_deref())
        });
        // Futures are made as the stream pulls them (only `n` exist at a time, whatever the
        // segment count a manifest claims), from indices: a closure over `&SegmentRef` items
        // would make the future's `Send` bound higher-ranked, which callers' `tokio::spawn`
        // cannot prove.
        let m = &manifest;
        let fetches = futures::stream::iter(0..m.segments.len()).map(move |i| {
            let first = (m.offset_of(i) / u64::from(m.page_size)) as u32 + 1;
            let shape = (first, m.pages_in(i), m.page_size);
            self.fetch_segment(org, m.segments[i].clone(), shape)
                .map_ok(move |b| (i, b))
        });
        // `Err(None)`: the writer stopped (its error is the one reported), so the downloads
        // stop too instead of fetching every remaining segment for nothing.
        let fetched = fetches
            .buffered(n)
            .map_err(Some)
            .try_for_each(|item| {
                let tx = tx.clone();
                async move { tx.send(item).await.map_err(|_| None) }
            })
            .await;
        drop(tx);
        let written = writing.await.map_err(|source| Error::Task {
            op: "writing a snapshot's segments",
            source,
        })?;
        if let Err(Some(e)) = fetched {
            return Err(e);
        }
        let (image, hashes) = written?;
        Ok((image, object, hashes, Some(manifest)))
    }

    /// Downloads one segment (`pages` pages of `page_size` bytes from page `first`), checks
    /// it against its name and hashes its pages, on the blocking pool: the segments in
    /// flight decompress and hash in parallel.
    async fn fetch_segment(
        &self,
        org: &OrgId,
        seg: SegmentRef,
        (first, pages, page_size): (u32, u32, u32),
    ) -> Result<Fetched, Error> {
        let raw = u64::from(pages) * u64::from(page_size);
        let path = self.inner.layout.blob(org, seg.name());
        let data = self.get_capped(&path, packed_bound(raw)).await?;
        crate::hydrate::downloaded(data.len() as u64);
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
        let missing = || Error::MissingObject {
            path: path.to_string(),
        };
        let got = match self.inner.store.get(path).await {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => return Err(missing()),
            Err(e) => return Err(Error::store("get", path, e)),
        };
        if got.meta.size > max {
            return Err(Error::corrupt(
                path.as_ref(),
                format!("{} bytes, at most {max} expected", got.meta.size),
            ));
        }
        let mut stream = got.into_stream();
        let mut out = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = match chunk {
                Ok(c) => c,
                Err(object_store::Error::NotFound { .. }) => return Err(missing()),
                Err(e) => return Err(Error::store("get", path, e)),
            };
            if (out.len() + chunk.len()) as u64 > max {
                return Err(Error::corrupt(
                    path.as_ref(),
                    format!("more than the {max} bytes expected"),
                ));
            }
            out.extend_from_slice(&chunk);
        }
        metrics::counter!(crate::metrics::DOWNLOADED_BYTES).increment(out.len() as u64);
        Ok(Bytes::from(out))
    }
}

/// A downloaded segment, checked: its pages and their hashes.
struct Fetched {
    bytes: Vec<u8>,
    hashes: Vec<u64>,
}

/// The writing thread: writes each segment at its offset in order, collecting page hashes,
/// and with `want_sha256` checks the whole image's sha256.
fn write_segments<I: PageImage>(
    object: &str,
    m: &Manifest,
    mut image: I,
    mut rx: mpsc::Receiver<(usize, Fetched)>,
    want_sha256: Option<&str>,
) -> Result<(I, PageHashes), Error> {
    image.set_len(0)?;
    image.set_len(m.bytes())?;
    // Not `m.pages`: a crafted manifest may claim 2^32 pages within every other bound (32 GiB
    // of hashes, an abort); the table grows with the verified segments that arrive.
    let mut hashes = Vec::with_capacity((m.pages as usize).min(1 << 20));
    let mut sha = want_sha256.map(|_| Sha256::new());
    let mut next = 0usize;
    while let Some((i, seg)) = rx.blocking_recv() {
        if i != next {
            return Err(Error::corrupt(object, "segments arrived out of order"));
        }
        image.write_at(object, m.offset_of(i), &seg.bytes)?;
        hashes.extend_from_slice(&seg.hashes);
        if let Some(sha) = sha.as_mut() {
            sha.update(&seg.bytes);
        }
        next += 1;
    }
    if next != m.segments.len() {
        // The download stopped early; its error is the one reported.
        return Err(Error::corrupt(object, "the download stopped"));
    }
    if let (Some(sha), Some(want)) = (sha, want_sha256) {
        let got = hex::encode(sha.finalize());
        if got != want {
            return Err(Error::corrupt(
                object,
                format!("image sha256 {got} does not match log {want}"),
            ));
        }
    }
    Ok((image, PageHashes::from_hashes(m.page_size, hashes)))
}
