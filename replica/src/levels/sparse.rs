//! A sparse rebuild of a closed chain for its level file: only the snapshot's segments that
//! hold a page the chain's deltas touch (or truncate away) are downloaded, so a compaction
//! reads what the chain changed, not the whole database (I14, I16).
//!
//! The page-hash checksum is a XOR over pages, so it can follow a chain without every page:
//! the table starts from the snapshot's checksum (the first delta's `base_checksum`, which the
//! level file records and every restore checks against the snapshot it downloads), and each
//! page's snapshot hash is *learned* before a delta changes or removes it. Every delta's
//! checksum after is then compared with its entry, as in any rebuild (`chain::apply`).

use std::collections::{BTreeMap, BTreeSet, HashSet};

use futures::StreamExt;

use crate::format::body::{DeltaBody, WHOLE};
use crate::format::checksum::PageHashes;
use crate::format::segment::Manifest;
use crate::rebuild::image::PageImage;
use crate::{Error, OrgId, Replica};

/// The most snapshot page content a sparse rebuild keeps for bases: 16 MiB.
const CLEAN_BYTES: u64 = 16 << 20;

/// The pages of a closed chain's rebuild: every page a delta wrote, and the snapshot pages the
/// current batch decodes against.
pub(crate) struct SparseImage {
    page_size: u32,
    /// The image's length in pages.
    pages: u32,
    /// Pages at or below this number hold the snapshot's content until written; a
    /// truncation lowers it (pages past it that grow back are carried whole).
    snapshot_pages: u32,
    /// Pages written since the snapshot, as they are now.
    dirty: BTreeMap<u32, Vec<u8>>,
    /// Snapshot pages of the segments downloaded so far, as bases for encoded pages; at
    /// most [`CLEAN_BYTES`], dropped whole beyond it (and downloaded again if needed).
    clean: BTreeMap<u32, Vec<u8>>,
    /// Snapshot pages whose hash the table has learned.
    learned: HashSet<u32>,
}

/// A page of a [`SparseImage`] as the rebuild holds it.
pub(crate) enum Held<'a> {
    /// Its content: written since the snapshot, or the snapshot's, loaded.
    Page(&'a [u8]),
    /// Past what the snapshot still holds (a truncation) and not written since: zeros.
    Zero,
    /// The snapshot's content, not loaded.
    Snapshot,
}

impl SparseImage {
    /// Page `pgno` as the rebuild holds it now.
    pub(crate) fn held(&self, pgno: u32) -> Held<'_> {
        match self.dirty.get(&pgno).or_else(|| self.clean.get(&pgno)) {
            Some(page) => Held::Page(page),
            None if pgno > self.snapshot_pages => Held::Zero,
            None => Held::Snapshot,
        }
    }

    /// Pages at or below this number hold the snapshot's content unless written since.
    pub(crate) fn snapshot_pages(&self) -> u32 {
        self.snapshot_pages
    }

    /// An image of the snapshot `manifest` describes, no page loaded.
    pub(crate) fn new(manifest: &Manifest) -> SparseImage {
        SparseImage {
            page_size: manifest.page_size,
            pages: manifest.pages,
            snapshot_pages: manifest.pages,
            dirty: BTreeMap::new(),
            clean: BTreeMap::new(),
            learned: HashSet::new(),
        }
    }

    fn page(&self, object: &str, at: u64, len: usize) -> Result<u32, Error> {
        let ps = u64::from(self.page_size);
        if len as u64 != ps || !at.is_multiple_of(ps) {
            return Err(Error::corrupt(
                object,
                "a sparse image reads whole pages only",
            ));
        }
        let pgno = u32::try_from(at / ps + 1).map_err(|_| Error::corrupt(object, "page number"))?;
        if pgno > self.pages {
            return Err(Error::corrupt(
                object,
                format!("page {pgno} lies outside the image"),
            ));
        }
        Ok(pgno)
    }

    /// What the snapshot's segments must supply before `batch` (delta bodies in order, each
    /// parsed) applies: pages whose hash must be learned (every page a delta writes or a
    /// truncation removes, while it still holds the snapshot's content) and pages read as
    /// bases (encoded records on pages not written since the snapshot).
    fn needs(&self, batch: &[DeltaBody<'_>]) -> (BTreeSet<u32>, BTreeSet<u32>) {
        let (mut learn, mut base) = (BTreeSet::new(), BTreeSet::new());
        let (mut pages, mut snapshot_pages) = (self.pages, self.snapshot_pages);
        // Pages written in this batch so far, beside those written before it (a delta's
        // records are unique, so its own earlier records are other pages).
        let mut written: BTreeSet<u32> = BTreeSet::new();
        let from_snapshot = |p: u32, snapshot_pages: u32, written: &BTreeSet<u32>| {
            p <= snapshot_pages && !self.dirty.contains_key(&p) && !written.contains(&p)
        };
        for delta in batch {
            if delta.db_pages() < pages {
                for p in delta.db_pages() + 1..=pages.min(snapshot_pages) {
                    if !self.learned.contains(&p) && from_snapshot(p, snapshot_pages, &written) {
                        learn.insert(p);
                    }
                }
                snapshot_pages = snapshot_pages.min(delta.db_pages());
            }
            for (pgno, encoding, _) in delta.records() {
                if from_snapshot(pgno, snapshot_pages, &written) {
                    if !self.learned.contains(&pgno) {
                        learn.insert(pgno);
                    }
                    if encoding != WHOLE && !self.clean.contains_key(&pgno) {
                        base.insert(pgno);
                    }
                }
                written.insert(pgno);
            }
            pages = delta.db_pages();
        }
        (learn, base)
    }
}

impl PageImage for SparseImage {
    fn set_len(&mut self, bytes: u64) -> Result<(), Error> {
        let pages = u32::try_from(bytes / u64::from(self.page_size))
            .map_err(|_| Error::corrupt("sparse image", "length"))?;
        self.pages = pages;
        self.snapshot_pages = self.snapshot_pages.min(pages);
        self.dirty.retain(|p, _| *p <= pages);
        self.clean.retain(|p, _| *p <= pages);
        Ok(())
    }

    fn read_at(&mut self, object: &str, at: u64, buf: &mut [u8]) -> Result<(), Error> {
        let pgno = self.page(object, at, buf.len())?;
        match self.dirty.get(&pgno).or_else(|| self.clean.get(&pgno)) {
            Some(page) => buf.copy_from_slice(page),
            None if pgno > self.snapshot_pages => buf.fill(0),
            None => {
                return Err(Error::corrupt(
                    object,
                    format!("page {pgno} was not loaded for a sparse rebuild"),
                ));
            }
        }
        Ok(())
    }

    fn write_at(&mut self, object: &str, at: u64, buf: &[u8]) -> Result<(), Error> {
        let pgno = self.page(object, at, buf.len())?;
        self.dirty.insert(pgno, buf.to_vec());
        Ok(())
    }
}

impl Replica {
    /// Downloads the snapshot segments `bodies` (the next batch of the chain's delta or level
    /// section bodies, in order) need
    /// on `image` and records them: hashes learned into `hashes`, base pages into the image.
    /// Each segment is checked against its name's sha256 as a hydrate checks it (I10).
    ///
    /// # Errors
    /// [`Error::Corrupt`] for a body that does not parse or a segment that fails its checks;
    /// [`Error::MissingObject`]; [`Error::Store`].
    pub(crate) async fn load_sparse(
        &self,
        org: &OrgId,
        manifest: &Manifest,
        bodies: &[(String, Vec<u8>)],
        image: &mut SparseImage,
        hashes: &mut PageHashes,
    ) -> Result<(), Error> {
        let parsed: Vec<DeltaBody<'_>> = bodies
            .iter()
            .map(|(obj, body)| DeltaBody::parse(obj, body))
            .collect::<Result<_, _>>()?;
        let (learn, base) = image.needs(&parsed);
        let per = manifest.segment_pages.max(1);
        let segments: BTreeSet<usize> = learn
            .iter()
            .chain(&base)
            .map(|p| ((p - 1) / per) as usize)
            .collect();
        let mut wanted = Vec::with_capacity(segments.len());
        for i in segments {
            let Some(seg) = manifest.segments.get(i) else {
                return Err(Error::corrupt(
                    org.as_str(),
                    "a delta page outside the snapshot's segments",
                ));
            };
            let first = i as u32 * per + 1;
            wanted.push((
                seg.clone(),
                (first, manifest.pages_in(i), manifest.page_size),
            ));
        }
        // The segments go out together, `read_concurrency` at a time, as a hydrate's do:
        // a batch costs one round trip per that many segments, not one per segment (I16).
        let n = self.inner.settings.read_concurrency.max(1);
        let mut fetched = futures::stream::iter(wanted)
            .map(|(seg, shape)| async move {
                let first = shape.0;
                self.fetch_segment(org, seg, shape)
                    .await
                    .map(|f| (first, f))
            })
            .buffered(n);
        while let Some(got) = fetched.next().await {
            let (first, fetched) = got?;
            let ps = manifest.page_size as usize;
            if (image.clean.len() + fetched.hashes.len()) as u64 * ps as u64 > CLEAN_BYTES {
                image.clean.clear();
            }
            // Every page of the segment that still holds the snapshot's content is learned
            // and kept as a base: the segment is not downloaded again for the chain's later
            // deltas (unless its bases were dropped for memory).
            for (k, (page, hash)) in fetched.bytes.chunks(ps).zip(&fetched.hashes).enumerate() {
                let pgno = first + k as u32;
                if pgno > image.snapshot_pages || image.dirty.contains_key(&pgno) {
                    continue;
                }
                if image.learned.insert(pgno) {
                    hashes.learn(pgno, *hash);
                }
                image.clean.insert(pgno, page.to_vec());
            }
        }
        Ok(())
    }
}
