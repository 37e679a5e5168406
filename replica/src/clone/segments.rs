//! The clone's segments: each one of the source snapshot whose pages the position left as
//! they were is named; each other one is built from the source's pages and the position's
//! changes, and uploaded under the clone's org.

use futures::StreamExt;
use object_store::{ObjectStoreExt, PutPayload};
use sha2::{Digest, Sha256};

use super::rebuild::Rebuilt;
use crate::format::blob::pack;
use crate::format::manifest::{SegmentRef, segment_name};
use crate::format::pages::canonical_page1;
use crate::format::segment::Manifest;
use crate::levels::sparse::Held;
use crate::replica::blocking;
use crate::{Error, OrgId, Replica};

/// One segment of the clone's manifest.
pub(crate) enum Slot {
    /// The source snapshot's segment, as its manifest names it.
    Named(SegmentRef),
    /// A new segment of `pages` pages from `first`: each page's content, or `None` for the
    /// source snapshot's (its segment `index`, fetched when built).
    Built {
        index: usize,
        first: u32,
        pages: Vec<Option<Vec<u8>>>,
    },
}

/// The clone's segments, in order, for the position `rebuilt` of the snapshot `manifest`:
/// a segment is named when it has the same pages as the snapshot's and none of them may
/// differ (none written since, none past a truncation).
pub(crate) fn slots(manifest: &Manifest, rebuilt: &Rebuilt) -> Vec<Slot> {
    let per = manifest.segment_pages.max(1);
    let ps = manifest.page_size as usize;
    let count = rebuilt.db_pages.div_ceil(per) as usize;
    let kept = rebuilt.image.snapshot_pages();
    (0..count)
        .map(|i| {
            let first = i as u32 * per + 1;
            let len = per.min(rebuilt.db_pages - first + 1);
            let last = first + len - 1;
            let same = i < manifest.segments.len()
                && manifest.pages_in(i) == len
                && last <= kept
                && rebuilt.touched.range(first..=last).next().is_none();
            match manifest.segments.get(i) {
                Some(seg) if same => Slot::Named(seg.clone()),
                _ => Slot::Built {
                    index: i,
                    first,
                    pages: (first..=last)
                        .map(|p| match rebuilt.image.held(p) {
                            Held::Page(b) => Some(b.to_vec()),
                            Held::Zero => Some(vec![0; ps]),
                            Held::Snapshot => None,
                        })
                        .collect(),
                },
            }
        })
        .collect()
}

impl Replica {
    /// Uploads the built `slots` under `dst` at `(seq, round)`, `upload_concurrency` at a
    /// time, fetching (and checking, I10) the source's segment for pages the rebuild did not
    /// hold. Returns the clone manifest's segments, the source's named ones as
    /// `<origin>/<segment>`, and the packed bytes uploaded.
    ///
    /// # Errors
    /// [`Error::Store`]; the fetched segment's errors; [`Error::Compress`].
    pub(crate) async fn upload_clone_segments(
        &self,
        src: &OrgId,
        dst: &OrgId,
        (seq, round): (u64, u64),
        manifest: &Manifest,
        slots: Vec<Slot>,
    ) -> Result<(Vec<SegmentRef>, u64), Error> {
        let n = self.inner.settings.upload_concurrency.max(1);
        let level = self.inner.settings.zstd_level;
        let ps = manifest.page_size as usize;
        // Named segments cost nothing; only the built ones go through the bounded stream, so
        // `n` uploads are in flight whatever the mix (named ones would hold places in it).
        let mut segments: Vec<Option<SegmentRef>> = Vec::with_capacity(slots.len());
        let mut built = Vec::new();
        for (k, slot) in slots.into_iter().enumerate() {
            match slot {
                Slot::Named(seg) if seg.origin().is_some() => segments.push(Some(seg)),
                Slot::Named(seg) => {
                    let name = format!("{src}/{}", seg.name());
                    segments.push(Some(SegmentRef(name, seg.compressed_bytes())));
                }
                Slot::Built {
                    index,
                    first,
                    pages,
                } => {
                    segments.push(None);
                    built.push((k, index, first, pages));
                }
            }
        }
        let done: Vec<Result<(usize, SegmentRef), Error>> = futures::stream::iter(built)
            .map(|(k, index, first, pages)| async move {
                let mut buf = vec![0u8; pages.len() * ps];
                if pages.iter().any(Option::is_none) {
                    let seg = manifest.segments.get(index).cloned().ok_or_else(|| {
                        Error::corrupt(src.as_str(), "a snapshot page outside its segments")
                    })?;
                    let shape = (first, manifest.pages_in(index), manifest.page_size);
                    let fetched = self.fetch_segment(src, seg, shape).await?;
                    let n = fetched.bytes.len().min(buf.len());
                    buf[..n].copy_from_slice(&fetched.bytes[..n]);
                }
                for (i, page) in pages.iter().enumerate() {
                    if let Some(page) = page {
                        buf[i * ps..(i + 1) * ps].copy_from_slice(page);
                    }
                }
                let org = dst.to_string();
                let (name, blob) = blocking("packing a clone's segment", move || {
                    if first == 1 {
                        canonical_page1(&mut buf);
                    }
                    let sha = hex::encode(Sha256::digest(&buf));
                    let packed = pack(&org, "segment", &buf, level)?;
                    Ok((segment_name(seq, round, &sha), packed.blob))
                })
                .await?;
                let size = blob.len() as u64;
                let path = self.inner.store.layout.blob(dst, &name);
                self.inner
                    .store
                    .object
                    .put(&path, PutPayload::from(blob))
                    .await
                    .map_err(|e| Error::store("put", &path, e))?;
                Ok((k, SegmentRef(name, size)))
            })
            .buffer_unordered(n)
            .collect()
            .await;
        let mut uploaded = 0;
        for d in done {
            let (k, seg) = d?;
            uploaded += seg.compressed_bytes();
            segments[k] = Some(seg);
        }
        let segments = segments
            .into_iter()
            .collect::<Option<Vec<SegmentRef>>>()
            .ok_or_else(|| Error::corrupt(dst.as_str(), "a clone's segment was not built"))?;
        Ok((segments, uploaded))
    }
}
