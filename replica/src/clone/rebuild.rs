//! What a clone reads of its source: the chain from a snapshot to the position, rebuilt
//! sparsely (only the snapshot segments its deltas touch are downloaded, `levels/sparse.rs`),
//! and folded into one delta body of whole pages that takes the snapshot to the position.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::chain::{self, Start, broken};
use crate::format::body::{self, DeltaBody, WHOLE};
use crate::format::checksum::{PageHashes, checksum_hex};
use crate::format::level::LevelFile;
use crate::format::segment::Manifest;
use crate::levels::MAX_LEVEL_BYTES;
use crate::levels::restore::apply_section;
use crate::levels::sparse::SparseImage;
use crate::rebuild::image::PageImage;
use crate::replica::blocking;
use crate::{Error, LogEntry, OrgId, Replica};

/// The way from a snapshot of the source to the position cloned.
pub(crate) struct Plan {
    pub(crate) snapshot: LogEntry,
    /// A level file and how many of its sections lead towards the position.
    pub(crate) level: Option<(Arc<LevelFile>, usize)>,
    /// Deltas after the snapshot (or after the last section), up to the position.
    pub(crate) deltas: Vec<LogEntry>,
    pub(crate) position: u64,
    /// The commit counter at the position.
    pub(crate) commit: u64,
}

/// The pages that differ between the snapshot and the position, whole.
pub(crate) struct Patch {
    pub(crate) body: Vec<u8>,
    pub(crate) page_size: u32,
    pub(crate) db_pages: u32,
    pub(crate) changed_pages: u32,
    /// Database checksum of the snapshot, and at the position (16 hex digits each).
    pub(crate) base_checksum: String,
    pub(crate) checksum: String,
}

/// What [`Replica::clone_patch`] found.
pub(crate) enum Patched {
    /// The position is the snapshot itself.
    Unchanged,
    Patch(Patch),
    /// The pages changed since the snapshot pass [`MAX_LEVEL_BYTES`].
    TooLarge,
}

impl Replica {
    /// The plan that reaches `at` of `org` (its newest position for `None`): through a level
    /// file when the position lies in a closed chain that has one, as a restore goes.
    ///
    /// # Errors
    /// [`Error::NoSuchSnapshot`] when `at` is no snapshot or delta (or `org` has no
    /// snapshot, seq 0); [`Error::PositionNotKept`]; [`Error::ChainBroken`] for a position
    /// on no chain; the log's and the level file's read errors.
    pub(crate) async fn clone_plan(&self, org: &OrgId, at: Option<u64>) -> Result<Plan, Error> {
        let limit = at.map_or(u64::MAX, |s| s.saturating_add(1));
        let log = self.tail(org, limit).await?;
        if let Some(seq) = at {
            match self.level_plan(org, &log, seq).await {
                Ok(Some(plan)) => {
                    return Ok(Plan {
                        snapshot: plan.snapshot,
                        level: Some((Arc::new(plan.file), plan.sections)),
                        deltas: plan.tail,
                        position: plan.position,
                        commit: plan.commit,
                    });
                }
                Ok(None) => {}
                // A damaged level file: the log may still hold the position (as a restore).
                Err(
                    Error::Corrupt { .. }
                    | Error::UnknownFormat { .. }
                    | Error::MissingObject { .. },
                ) if log.iter().any(|e| e.seq() == seq) => {}
                Err(e) => return Err(e),
            }
            if !log
                .iter()
                .any(|e| e.seq() == seq && (e.is_snapshot() || e.is_delta()))
            {
                return Err(Error::NoSuchSnapshot {
                    org: org.to_string(),
                    seq,
                });
            }
        }
        let Some(chain) = chain::newest(org, &log, limit)? else {
            return Err(Error::NoSuchSnapshot {
                org: org.to_string(),
                seq: at.unwrap_or(0),
            });
        };
        let position = chain.position();
        if at.is_some_and(|seq| seq != position) {
            return Err(broken(
                org,
                position,
                "delta is not on the chain of any snapshot",
            ));
        }
        let last = chain.deltas.last().unwrap_or(&chain.snapshot);
        let commit = last.commit().unwrap_or(0);
        Ok(Plan {
            snapshot: chain.snapshot,
            level: None,
            deltas: chain.deltas,
            position,
            commit,
        })
    }

    /// Rebuilds `plan` on a sparse image of its snapshot (`manifest`) with every check of
    /// a restore (each object's sha256, the database checksum before and after each
    /// section and delta, I10) and returns the pages it changed, whole, as one delta body
    /// that takes the snapshot to the position. Memory is bounded by [`MAX_LEVEL_BYTES`]:
    /// beyond it the answer is [`Patched::TooLarge`], checked before a batch's pages are
    /// downloaded.
    ///
    /// # Errors
    /// [`Error::ChainBroken`]; [`Error::Corrupt`]; [`Error::MissingObject`]; [`Error::Store`].
    pub(crate) async fn clone_patch(
        &self,
        org: &OrgId,
        plan: &Plan,
        manifest: &Manifest,
    ) -> Result<Patched, Error> {
        let sections = plan.level.as_ref().map_or(0, |(_, k)| *k);
        if sections == 0 && plan.deltas.is_empty() {
            return Ok(Patched::Unchanged);
        }
        let base_checksum = match &plan.level {
            Some((file, k)) if *k > 0 => file.header.snapshot_checksum.clone(),
            _ => plan
                .deltas
                .first()
                .and_then(LogEntry::delta)
                .map(|d| d.base_checksum.clone())
                .unwrap_or_default(),
        };
        let sum = u64::from_str_radix(&base_checksum, 16)
            .map_err(|_| broken(org, plan.snapshot.seq(), "the chain names no base checksum"))?;
        let ps = manifest.page_size;
        let mut hashes = PageHashes::sparse(ps, manifest.pages as usize, sum);
        let mut image = SparseImage::new(manifest);
        // Every page a section or delta wrote, and the fewest pages the database had.
        let mut touched: BTreeSet<u32> = BTreeSet::new();
        let mut low = manifest.pages;
        let mut note = |bodies: &[(String, Vec<u8>)]| -> Result<bool, Error> {
            for (obj, body) in bodies {
                let parsed = DeltaBody::parse(obj, body)?;
                touched.extend(parsed.records().map(|(p, _, _)| p));
                low = low.min(parsed.db_pages());
            }
            Ok(touched.len() as u64 * u64::from(ps) <= MAX_LEVEL_BYTES)
        };
        if let Some((file, k)) = &plan.level {
            for i in 0..*k {
                let bodies = vec![(file.object.clone(), file.body(i)?)];
                if !note(&bodies)? {
                    return Ok(Patched::TooLarge);
                }
                self.load_sparse(org, manifest, &bodies, &mut image, &mut hashes)
                    .await?;
                let (o, f) = (org.clone(), Arc::clone(file));
                (image, hashes) = blocking("applying a level section", move || {
                    let (mut image, mut hashes) = (image, hashes);
                    apply_section(&o, &f, i, &bodies[0].1, &mut image, &mut hashes)?;
                    Ok((image, hashes))
                })
                .await?;
            }
        }
        let start = Start {
            seq: plan.snapshot.seq(),
            checksum: sum,
        };
        let n = self.inner.settings.read_concurrency.max(1);
        for batch in plan.deltas.chunks(n) {
            let entries = self.with_bodies(org, batch).await?;
            let bodies = self.fetch_batch(org, &entries, n).await?;
            if !note(&bodies)? {
                return Ok(Patched::TooLarge);
            }
            self.load_sparse(org, manifest, &bodies, &mut image, &mut hashes)
                .await?;
            let o = org.clone();
            (image, hashes) = blocking("applying deltas", move || {
                let (mut image, mut hashes) = (image, hashes);
                for (entry, (obj, body)) in entries.iter().zip(&bodies) {
                    chain::apply(&o, start, entry, obj, body, &mut image, &mut hashes)?;
                }
                Ok((image, hashes))
            })
            .await?;
        }
        let db_pages = hashes.pages() as u32;
        // Pages the snapshot holds above the smallest size the database had: a truncation
        // emptied them, so the snapshot's content must not show through.
        touched.extend(low.saturating_add(1)..=db_pages.min(manifest.pages));
        if touched.len() as u64 * u64::from(ps) > MAX_LEVEL_BYTES {
            return Ok(Patched::TooLarge);
        }
        let checksum = checksum_hex(hashes.sum());
        let object = format!("the clone of {org}@{}", plan.position);
        blocking("folding a chain into one delta", move || {
            let mut pages = Vec::new();
            for &pgno in touched.iter().filter(|p| **p <= db_pages) {
                let mut page = vec![0u8; ps as usize];
                image.read_at(&object, (u64::from(pgno) - 1) * u64::from(ps), &mut page)?;
                pages.push((pgno, page));
            }
            let body = body::write(
                ps,
                db_pages,
                pages.len(),
                pages.iter().map(|(p, b)| (*p, WHOLE, b.as_slice())),
            );
            Ok(Patched::Patch(Patch {
                body,
                page_size: ps,
                db_pages,
                changed_pages: pages.len() as u32,
                base_checksum,
                checksum,
            }))
        })
        .await
    }

    /// `batch` with every inline delta read again from its entry: the known-entries cache
    /// drops inline bodies.
    ///
    /// # Errors
    /// [`Error::MissingObject`] for an entry deleted meanwhile; [`Error::Store`].
    pub(crate) async fn with_bodies(
        &self,
        org: &OrgId,
        batch: &[LogEntry],
    ) -> Result<Vec<LogEntry>, Error> {
        let mut entries = Vec::with_capacity(batch.len());
        for e in batch {
            entries.push(match e.stored() {
                Some(s) if s.blob.is_inline() => self
                    .inner
                    .log
                    .read_entry(org, e.seq())
                    .await?
                    .ok_or_else(|| Error::MissingObject {
                        path: self.inner.store.layout.log(org, e.seq()).to_string(),
                    })?,
                _ => e.clone(),
            });
        }
        Ok(entries)
    }
}
