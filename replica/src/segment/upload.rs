//! Streaming a full snapshot out as segments: one blocking thread reads a segment's pages,
//! hashes them (page hashes, the segment's sha256, the image's sha256) and compresses the
//! segments the previous snapshot does not already hold, while up to
//! [`Settings::upload_concurrency`](crate::Settings::upload_concurrency) PUTs run. Memory is
//! bounded by the segment size times the uploads in flight, not by the database.

use futures::{StreamExt, TryStreamExt};
use object_store::{ObjectStoreExt, PutPayload};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use tokio::sync::mpsc;

use super::manifest::{MANIFEST_VERSION, Manifest, SegmentRef, segment_name};
use super::source::PageSource;
use crate::blob::pack;
use crate::checksum::{PageHashes, page_hash};
use crate::sqlite::pages::canonical_page1;
use crate::{Error, FailPoint, OrgId, Replica};

/// A streamed snapshot's segments are uploaded; what its entry and the claim's tip need.
pub(crate) struct Streamed {
    pub(crate) manifest: Manifest,
    pub(crate) hashes: PageHashes,
    /// sha256 of the whole (canonical) image, lowercase hex.
    pub(crate) sha256: String,
    /// Packed bytes this snapshot uploaded (new segments only).
    pub(crate) uploaded_bytes: u64,
    /// Segments the previous snapshot already held.
    pub(crate) reused: usize,
}

/// What the reading thread hands the uploader: a packed segment and where it goes.
struct Put {
    name: String,
    blob: Vec<u8>,
}

/// What the reading thread worked out, besides the uploads.
struct Read {
    segments: Vec<SegmentRef>,
    hashes: PageHashes,
    sha256: String,
    uploaded_bytes: u64,
    uploaded: usize,
}

impl Replica {
    /// Streams `source` out as the segments of a snapshot at log position `seq` under
    /// `round`: each segment whose pages hash to a segment of `reuse` (the previous
    /// snapshot's manifest) is named, not uploaded; the others are packed and PUT under
    /// their content names. Nothing is published: the caller writes the manifest and the
    /// entry.
    ///
    /// # Errors
    /// [`Error::Store`] for a failed upload; the source's errors; [`Error::Compress`].
    pub(crate) async fn upload_segments(
        &self,
        org: &OrgId,
        (seq, round): (u64, u64),
        source: Box<dyn PageSource>,
        reuse: Option<&Manifest>,
    ) -> Result<Streamed, Error> {
        let settings = &self.inner.settings;
        let (page_size, pages) = (source.page_size(), source.pages());
        let segment_pages = (settings.segment_bytes / page_size as usize).max(1) as u32;
        let known: HashMap<String, SegmentRef> = reuse
            .filter(|m| m.page_size == page_size)
            .map(|m| {
                m.segments
                    .iter()
                    .map(|s| (s.sha256().to_owned(), s.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let n = settings.upload_concurrency.max(1);
        let (tx, mut rx) = mpsc::channel::<Put>(n);
        let (org_name, level) = (org.to_string(), settings.zstd_level);
        let reading = tokio::task::spawn_blocking(move || {
            read_segments(
                &org_name,
                source,
                (seq, round, segment_pages),
                &known,
                level,
                &tx,
            )
        });
        // The first failed upload ends the stream and drops the receiver with it, so the
        // reading thread's next send fails and it stops. The stream must own the receiver
        // (`move`): if it only borrowed it, the receiver would outlive the stream, a reading
        // thread blocked on a full channel would never wake, and `reading.await` below would
        // wait forever (a ship hung on one failed segment PUT, found by
        // `tests/segment_schedules.rs`).
        let uploaded = futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
            .map(|put| self.put_segment(org, put))
            .buffer_unordered(n)
            .try_for_each(|()| async { Ok(()) })
            .await;
        let read = reading.await.map_err(|source| Error::Task {
            op: "reading a snapshot's segments",
            source,
        });
        uploaded?;
        let read = read??;
        Ok(Streamed {
            reused: read.segments.len() - read.uploaded,
            manifest: Manifest {
                v: MANIFEST_VERSION,
                page_size,
                pages,
                segment_pages,
                segments: read.segments,
            },
            hashes: read.hashes,
            sha256: read.sha256,
            uploaded_bytes: read.uploaded_bytes,
        })
    }

    async fn put_segment(&self, org: &OrgId, put: Put) -> Result<(), Error> {
        let path = self.inner.layout.blob(org, &put.name);
        self.inner
            .store
            .put(&path, PutPayload::from(put.blob))
            .await
            .map_err(|e| Error::store("put", &path, e))?;
        self.failpoint(FailPoint::ShipDuringUpload, org).await
    }
}

/// The reading thread: reads, hashes and packs each segment in order, sending the ones to
/// upload. Returns early (with the error) when the uploader stopped listening.
fn read_segments(
    org: &str,
    mut source: Box<dyn PageSource>,
    (seq, round, segment_pages): (u64, u64, u32),
    known: &HashMap<String, SegmentRef>,
    level: i32,
    tx: &mpsc::Sender<Put>,
) -> Result<Read, Error> {
    let (ps, pages) = (source.page_size() as usize, source.pages());
    let mut image = Sha256::new();
    let mut hashes = Vec::with_capacity(pages as usize);
    let mut segments = Vec::with_capacity(pages.div_ceil(segment_pages) as usize);
    let (mut uploaded_bytes, mut uploaded) = (0u64, 0usize);
    let mut fresh: HashMap<String, SegmentRef> = HashMap::new();
    let mut buf = Vec::new();
    let mut first = 1u32;
    while first <= pages {
        let n = segment_pages.min(pages - first + 1);
        buf.resize(n as usize * ps, 0);
        source.read(first, &mut buf)?;
        if first == 1 {
            canonical_page1(&mut buf);
        }
        for (i, page) in buf.chunks(ps).enumerate() {
            hashes.push(page_hash(first + i as u32, page));
        }
        image.update(&buf);
        let sha = hex::encode(Sha256::digest(&buf));
        // A segment of the previous snapshot, or one this snapshot already uploaded (pages
        // repeated, such as runs of empty pages), is named again rather than uploaded.
        match known.get(&sha).or_else(|| fresh.get(&sha)) {
            Some(seg) => segments.push(seg.clone()),
            None => {
                let packed = pack(org, "segment", &buf, level)?;
                let name = segment_name(seq, round, &sha);
                let seg = SegmentRef(name.clone(), packed.blob.len() as u64);
                segments.push(seg.clone());
                fresh.insert(sha, seg);
                uploaded_bytes += packed.blob.len() as u64;
                uploaded += 1;
                let put = Put {
                    name,
                    blob: packed.blob,
                };
                if tx.blocking_send(put).is_err() {
                    return Err(Error::io(
                        std::path::Path::new(org),
                        std::io::Error::other("the segment uploader stopped"),
                    ));
                }
            }
        }
        first += n;
    }
    source.finish()?;
    Ok(Read {
        segments,
        hashes: PageHashes::from_hashes(ps as u32, hashes),
        sha256: hex::encode(image.finalize()),
        uploaded_bytes,
        uploaded,
    })
}
