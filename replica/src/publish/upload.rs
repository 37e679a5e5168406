//! Streaming a full snapshot out as segments and its manifest: a segment at a time, a short task on the
//! blocking pool reads its pages, hashes them (page hashes, the segment's sha256, the image's
//! sha256) and packs it unless the previous snapshot already holds it, while up to
//! [`Settings::upload_concurrency`](crate::Settings::upload_concurrency) PUTs run. Memory is
//! bounded by the segment size times the uploads in flight, not by the database.
//!
//! No blocking task ever waits for an upload: a thread of the blocking pool parked on a
//! full channel, while the store's own I/O (object_store's local directory runs on that
//! pool) waits for a thread, deadlocks once enough snapshots stream at once.

use std::collections::HashMap;

use futures::TryStreamExt;
use object_store::{ObjectStoreExt, PutPayload};
use sha2::{Digest, Sha256};

use super::source::PageSource;
use crate::format::blob::pack;
use crate::format::checksum::{PageHashes, page_hash};
use crate::format::manifest::{Manifest, SegmentRef, segment_name};
use crate::format::pages::canonical_page1;
use crate::replica::blocking;
use crate::{Error, FailPoint, OrgId, Replica};

/// A streamed snapshot's segments are uploaded; what its entry and the claim's tip need.
pub(crate) struct Streamed {
    pub(crate) manifest: Manifest,
    /// The manifest's object name and encoded length: it is uploaded too.
    pub(crate) manifest_name: String,
    pub(crate) manifest_len: u64,
    pub(crate) hashes: PageHashes,
    /// sha256 of the whole (canonical) image, lowercase hex.
    pub(crate) sha256: String,
    /// Packed bytes this snapshot uploaded (new segments only).
    pub(crate) uploaded_bytes: u64,
    /// Segments the previous snapshot already held.
    pub(crate) reused: usize,
}

/// A packed segment and where it goes.
struct Put {
    name: String,
    blob: Vec<u8>,
}

/// What one step of the reader yields, in order.
enum Step {
    /// A segment to upload.
    Put(Put),
    /// A segment named, not uploaded (the previous snapshot, or this one, holds it).
    Named,
    /// Every page was read: the reader, to finish.
    Done(Box<Reader>),
}

/// The state of reading a source segment by segment; moved onto the blocking pool for each
/// step and back.
struct Reader {
    org: String,
    source: Box<dyn PageSource>,
    seq: u64,
    round: u64,
    segment_pages: u32,
    level: i32,
    /// Segments of the previous snapshot, by sha256.
    known: HashMap<String, SegmentRef>,
    /// Segments this snapshot uploaded, by sha256 (pages repeated, such as runs of empty
    /// pages, upload once).
    fresh: HashMap<String, SegmentRef>,
    image: Sha256,
    hashes: Vec<u64>,
    segments: Vec<SegmentRef>,
    uploaded_bytes: u64,
    uploaded: usize,
    /// The first page of the next segment.
    next: u32,
    buf: Vec<u8>,
}

impl Reader {
    /// Reads, hashes and (unless it is named) packs the next segment; `Done` after the last.
    fn step(mut self: Box<Self>) -> Result<(Option<Box<Self>>, Step), Error> {
        let (ps, pages) = (self.source.page_size() as usize, self.source.pages());
        if self.next > pages {
            return Ok((None, Step::Done(self)));
        }
        let first = self.next;
        let n = self.segment_pages.min(pages - first + 1);
        let mut buf = std::mem::take(&mut self.buf);
        buf.resize(n as usize * ps, 0);
        self.source.read(first, &mut buf)?;
        if first == 1 {
            canonical_page1(&mut buf);
        }
        for (i, page) in buf.chunks(ps).enumerate() {
            self.hashes.push(page_hash(first + i as u32, page));
        }
        self.image.update(&buf);
        self.next = first + n;
        let sha = hex::encode(Sha256::digest(&buf));
        let step = match self.known.get(&sha).or_else(|| self.fresh.get(&sha)) {
            Some(seg) => {
                self.segments.push(seg.clone());
                Step::Named
            }
            None => {
                let packed = pack(&self.org, "segment", &buf, self.level)?;
                let name = segment_name(self.seq, self.round, &sha);
                let seg = SegmentRef(name.clone(), packed.blob.len() as u64);
                self.segments.push(seg.clone());
                self.fresh.insert(sha, seg);
                self.uploaded_bytes += packed.blob.len() as u64;
                self.uploaded += 1;
                Step::Put(Put {
                    name,
                    blob: packed.blob,
                })
            }
        };
        self.buf = buf;
        Ok((Some(self), step))
    }
}

impl Replica {
    /// Streams `source` out as the segments of a snapshot at log position `seq` under
    /// `round`: each segment whose pages hash to a segment of `reuse` (the previous
    /// snapshot's manifest) is named, not uploaded; the others are packed and PUT under
    /// their content names; once every page is read the manifest is PUT too, beside the
    /// uploads still in flight. Nothing is published: the caller creates the entry, after
    /// this returns (every object it names has landed).
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
        let reader = Box::new(Reader {
            org: org.to_string(),
            source,
            seq,
            round,
            segment_pages,
            level: settings.zstd_level,
            known,
            fresh: HashMap::new(),
            image: Sha256::new(),
            hashes: Vec::with_capacity(pages as usize),
            segments: Vec::with_capacity(pages.div_ceil(segment_pages) as usize),
            uploaded_bytes: 0,
            uploaded: 0,
            next: 1,
            buf: Vec::new(),
        });
        let n = settings.upload_concurrency.max(1);
        // Segments are read in order, one step at a time; their uploads run up to `n` at
        // once, and the stream reads ahead only as far as that allows. The first error ends
        // it (the reader is dropped with it).
        let steps = futures::stream::try_unfold(Some(reader), |reader| async move {
            let Some(reader) = reader else {
                return Ok(None);
            };
            let (next, step) = blocking("reading a segment", move || reader.step()).await?;
            Ok(Some((step, next)))
        });
        // The manifest goes out as soon as every page was read, beside the segment uploads
        // still in flight: nothing names it until the entry, which the caller creates only
        // after this returns, so every object the entry names has landed by then (I10),
        // and a ship that fails leaves at most unnamed objects, as a failed segment does.
        let done = steps
            .map_ok(|step| async move {
                match step {
                    Step::Put(put) => self.put_segment(org, put).await.map(|()| None),
                    Step::Named => Ok(None),
                    Step::Done(reader) => {
                        let layout = (page_size, pages, segment_pages);
                        self.put_manifest(org, (seq, round), layout, reader)
                            .await
                            .map(Some)
                    }
                }
            })
            .try_buffer_unordered(n)
            .try_fold(None, |done, step| async move { Ok(step.or(done)) })
            .await?;
        done.ok_or_else(|| {
            Error::io(
                std::path::Path::new(org.as_str()),
                std::io::Error::other("the snapshot's segments ended early"),
            )
        })
    }

    /// Finishes the read of a snapshot whose pages were all read (the source's own last
    /// check), builds its manifest from the segments named and uploads it.
    async fn put_manifest(
        &self,
        org: &OrgId,
        (seq, round): (u64, u64),
        (page_size, pages, segment_pages): (u32, u32, u32),
        mut reader: Box<Reader>,
    ) -> Result<Streamed, Error> {
        let mut reader = blocking("finishing a snapshot's read", move || {
            reader.source.finish()?;
            Ok(reader)
        })
        .await?;
        let reused = reader.segments.len() - reader.uploaded;
        let manifest = Manifest {
            v: Manifest::version_for(&reader.segments),
            page_size,
            pages,
            segment_pages,
            segments: std::mem::take(&mut reader.segments),
        };
        let (manifest_name, body) = manifest.encode(seq, round)?;
        let path = self.inner.store.layout.blob(org, &manifest_name);
        let manifest_len = body.len() as u64;
        self.inner
            .store
            .object
            .put(&path, PutPayload::from(body))
            .await
            .map_err(|e| Error::store("put", &path, e))?;
        Ok(Streamed {
            reused,
            manifest,
            manifest_name,
            manifest_len,
            hashes: PageHashes::from_hashes(page_size, std::mem::take(&mut reader.hashes)),
            sha256: hex::encode(std::mem::take(&mut reader.image).finalize()),
            uploaded_bytes: reader.uploaded_bytes,
        })
    }

    async fn put_segment(&self, org: &OrgId, put: Put) -> Result<(), Error> {
        let path = self.inner.store.layout.blob(org, &put.name);
        self.inner
            .store
            .object
            .put(&path, PutPayload::from(put.blob))
            .await
            .map_err(|e| Error::store("put", &path, e))?;
        self.failpoint(FailPoint::ShipDuringUpload, org).await
    }
}
