//! What a clone reads of its source: the chain from a snapshot to the position, rebuilt
//! sparsely (only the snapshot segments its deltas touch are downloaded, `levels/sparse.rs`),
//! and folded into one delta body of whole pages that takes the snapshot to the position.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::chain::{self, Start, broken};
use crate::format::body::DeltaBody;
use crate::format::checksum::PageHashes;
use crate::format::level::LevelFile;
use crate::format::segment::Manifest;
use crate::levels::MAX_LEVEL_BYTES;
use crate::levels::restore::apply_section;
use crate::levels::sparse::SparseImage;
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

/// The position rebuilt on a sparse image of the snapshot.
pub(crate) struct Rebuilt {
    pub(crate) image: SparseImage,
    /// Every page that may differ from the snapshot's (written since, or emptied by a
    /// truncation), at most the position's size.
    pub(crate) touched: BTreeSet<u32>,
    /// The position's size in pages.
    pub(crate) db_pages: u32,
}

/// What [`Replica::clone_image`] found.
pub(crate) enum Patched {
    Rebuilt(Rebuilt),
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
    /// section and delta, I10): the image holds every page the position changed, whole.
    /// Memory is bounded by [`MAX_LEVEL_BYTES`]: beyond it the answer is
    /// [`Patched::TooLarge`], checked before a batch's pages are downloaded.
    ///
    /// # Errors
    /// [`Error::ChainBroken`]; [`Error::Corrupt`]; [`Error::MissingObject`]; [`Error::Store`].
    pub(crate) async fn clone_image(
        &self,
        org: &OrgId,
        plan: &Plan,
        manifest: &Manifest,
    ) -> Result<Patched, Error> {
        let sections = plan.level.as_ref().map_or(0, |(_, k)| *k);
        if sections == 0 && plan.deltas.is_empty() {
            return Ok(Patched::Rebuilt(Rebuilt {
                image: SparseImage::new(manifest),
                touched: BTreeSet::new(),
                db_pages: manifest.pages,
            }));
        }
        let base = match &plan.level {
            Some((file, k)) if *k > 0 => file.header.snapshot_checksum.clone(),
            _ => plan
                .deltas
                .first()
                .and_then(LogEntry::delta)
                .map(|d| d.base_checksum.clone())
                .unwrap_or_default(),
        };
        let sum = u64::from_str_radix(&base, 16)
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
        touched.retain(|p| *p <= db_pages);
        Ok(Patched::Rebuilt(Rebuilt {
            image,
            touched,
            db_pages,
        }))
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
