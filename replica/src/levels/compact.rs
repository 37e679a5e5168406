//! Writing level files: a closed chain rebuilt from the store, one section per bucket.

use std::collections::BTreeSet;

use object_store::{PutMode, PutPayload};
use tracing::{debug, info, warn};

use super::{LEVEL_MIN_DELTAS, MAX_LEVEL_BYTES};
use crate::chain::{self, Start};
use crate::format::body::{self, DeltaBody, WHOLE};
use crate::format::checksum::{PageHashes, checksum_hex};
use crate::format::entry::{BlobRef, Stored};
use crate::format::level::{self, LevelHeader, Section, SectionBody, level_name};
use crate::format::segment::Manifest;
use crate::levels::sparse::SparseImage;
use crate::rebuild::image::{FileImage, PageImage};
use crate::replica::blocking;
use crate::{Error, LogEntry, OrgId, Replica, Retention};

/// Result of [`Replica::compact_levels`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LevelReport {
    /// Level files this run created (object names in `orgs/<org>/levels/`).
    pub written: Vec<String>,
    /// Closed chains that already had their level file.
    pub present: usize,
    /// Closed chains left at their deltas, with why: fewer than [`super::LEVEL_MIN_DELTAS`]
    /// deltas, a pipelined chain, or sections over [`super::MAX_LEVEL_BYTES`].
    pub skipped: Vec<(u64, &'static str)>,
}

/// The sections of a chain as its deltas are applied.
struct Sections {
    /// Pages changed since the previous section.
    touched: BTreeSet<u32>,
    /// Deltas since the previous section.
    positions: u64,
    /// The database checksum at the previous section (or the snapshot).
    base_checksum: String,
    /// Uncompressed bytes of the sections so far.
    bytes: u64,
    done: Vec<SectionBody>,
}

impl Sections {
    /// Closes a section at `entry`, the last delta of its bucket: every page touched since
    /// the previous one, whole, as `image` holds it now.
    fn close(
        &mut self,
        entry: &LogEntry,
        image: &mut Image,
        hashes: &PageHashes,
    ) -> Result<(), Error> {
        let ps = hashes.page_size();
        let db_pages = hashes.pages() as u32;
        let object = format!("the rebuild of seq {}", entry.seq());
        let mut pages = Vec::new();
        for &pgno in self.touched.iter().filter(|p| **p <= db_pages) {
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
        self.bytes += body.len() as u64;
        let checksum = checksum_hex(hashes.sum());
        self.done.push(SectionBody {
            section: Section {
                seq: entry.seq(),
                round: entry.round(),
                at_ms: entry.at_ms(),
                commit: entry.commit().unwrap_or(0),
                db_pages,
                changed_pages: pages.len() as u32,
                base_checksum: std::mem::replace(&mut self.base_checksum, checksum.clone()),
                checksum,
                positions: std::mem::take(&mut self.positions),
                offset: 0,
                len: 0,
                bytes: 0,
                sha256: String::new(),
            },
            body,
        });
        self.touched.clear();
        Ok(())
    }
}

/// The image a compaction rebuilds a chain in: sparse for a segmented snapshot (the
/// segments its deltas touch), a temp file otherwise (a whole-blob snapshot of an earlier
/// build).
pub(crate) enum Image {
    Sparse(SparseImage),
    File(FileImage),
}

impl PageImage for Image {
    fn set_len(&mut self, bytes: u64) -> Result<(), Error> {
        match self {
            Image::Sparse(i) => i.set_len(bytes),
            Image::File(i) => i.set_len(bytes),
        }
    }
    fn read_at(&mut self, object: &str, at: u64, buf: &mut [u8]) -> Result<(), Error> {
        match self {
            Image::Sparse(i) => i.read_at(object, at, buf),
            Image::File(i) => i.read_at(object, at, buf),
        }
    }
    fn write_at(&mut self, object: &str, at: u64, buf: &[u8]) -> Result<(), Error> {
        match self {
            Image::Sparse(i) => i.write_at(object, at, buf),
            Image::File(i) => i.write_at(object, at, buf),
        }
    }
}

impl Replica {
    /// The image and hash table a compaction of `snapshot`'s chain (`deltas`) starts from:
    /// for a segmented snapshot, a sparse image whose checksum is the first delta's
    /// `base_checksum` (nothing downloaded yet; `levels/sparse.rs`), with its manifest; for a
    /// whole-blob snapshot, the snapshot downloaded into a temp file (kept alive by the
    /// returned directory).
    ///
    /// # Errors
    /// The manifest's or the download's errors; [`Error::ChainBroken`] when the first
    /// delta's base checksum is not a checksum.
    async fn chain_image(
        &self,
        org: &OrgId,
        snapshot: &LogEntry,
        deltas: &[LogEntry],
    ) -> Result<
        (
            Image,
            PageHashes,
            Option<Manifest>,
            Option<tempfile::TempDir>,
        ),
        Error,
    > {
        if let Some(Stored {
            blob: BlobRef::Manifest(name),
            bytes,
            ..
        }) = snapshot.stored()
        {
            let manifest = self.read_manifest(org, name, *bytes).await?;
            let first = deltas.first().and_then(LogEntry::delta);
            let sum = first
                .and_then(|d| u64::from_str_radix(&d.base_checksum, 16).ok())
                .ok_or_else(|| {
                    crate::chain::broken(org, snapshot.seq(), "first delta names no base checksum")
                })?;
            let hashes = PageHashes::sparse(manifest.page_size, manifest.pages as usize, sum);
            let image = Image::Sparse(SparseImage::new(&manifest));
            return Ok((image, hashes, Some(manifest), None));
        }
        let dir = tempfile::Builder::new()
            .prefix("idem-level-")
            .tempdir()
            .map_err(|e| Error::io(&std::env::temp_dir(), e))?;
        let path = dir.path().join("image");
        let file = blocking("creating a scratch file", move || FileImage::create(&path)).await?;
        let (image, _, hashes, _) = self.download_snapshot(org, snapshot, file, false).await?;
        Ok((Image::File(image), hashes, None, Some(dir)))
    }

    /// Writes the level file of every closed chain of `org` that has none yet: a chain
    /// whose snapshot has a newer snapshot above it, so its deltas never change again. The
    /// chain is rebuilt from the store with every check of a restore (sha256 of each
    /// object, the database checksum before and after each delta, I10), and each bucket of
    /// `policy.level_ms` (by the deltas' `at_ms`) becomes one section: the pages changed in
    /// the bucket, whole, at its last position. The file is created create-only under a
    /// name fixed by the chain (`<snapshot>-<end>.lvl`), so two compactors write the same
    /// positions and the second finds the first's file. Nothing is fenced: a level file
    /// holds only positions of a verified chain, which no writer changes once it is
    /// closed (`docs/design.md` 2d).
    ///
    /// Reads each chain as a restore would (its snapshot's segments and its deltas, inline
    /// ones from their entries) into a temp file under `$TMPDIR`; memory holds the sections
    /// being written, at most [`super::MAX_LEVEL_BYTES`].
    ///
    /// # Errors
    /// [`Error::ReadOnly`]; [`Error::Store`]; [`Error::Corrupt`] or [`Error::ChainBroken`]
    /// when a chain does not rebuild (nothing is written for it). A chain whose objects
    /// retention deleted meanwhile is skipped.
    pub async fn compact_levels(
        &self,
        org: &OrgId,
        policy: &Retention,
    ) -> Result<LevelReport, Error> {
        self.writable("compaction")?;
        let mut report = LevelReport::default();
        if policy.level_ms == 0 {
            return Ok(report);
        }
        let (log, _) = self.inner.log.history_known(org).await?;
        let existing = self.level_names(org).await?;
        let snaps: Vec<usize> = (0..log.len()).filter(|i| log[*i].is_snapshot()).collect();
        for w in snaps.windows(2) {
            let snapshot = &log[w[0]];
            if existing.iter().any(|l| l.snapshot == snapshot.seq()) {
                report.present += 1;
                continue;
            }
            let deltas = chain::after(snapshot, &log[w[0] + 1..]);
            let why = if deltas.len() < LEVEL_MIN_DELTAS {
                Some("fewer deltas than a level file is worth")
            } else if deltas.iter().any(LogEntry::is_pipelined) {
                Some("a pipelined chain")
            } else {
                None
            };
            if let Some(why) = why {
                report.skipped.push((snapshot.seq(), why));
                continue;
            }
            let skip_key = format!("level-skip:{org}/{}", snapshot.seq());
            if self.inner.segment_refs.get(&skip_key).is_some() {
                report
                    .skipped
                    .push((snapshot.seq(), "left at its deltas by an earlier run"));
                continue;
            }
            // Bounded across orgs: each compaction holds a temp image and its sections.
            let permit = self.inner.compactions.acquire().await;
            let compacted = self
                .compact_chain(org, snapshot, &deltas, policy.level_ms)
                .await;
            drop(permit);
            match compacted {
                Ok(Some(name)) => report.written.push(name),
                Ok(None) => {
                    // Closed chains do not change: this handle does not rebuild it again.
                    self.inner
                        .segment_refs
                        .insert(&skip_key, std::sync::Arc::new(Vec::new()));
                    report.skipped.push((snapshot.seq(), "sections too large"));
                }
                Err(Error::MissingObject { path }) => {
                    debug!(%org, seq = snapshot.seq(), path, "chain retired while compacting");
                }
                // A chain that does not rebuild keeps its deltas (verify reports it); the
                // org's later chains still get their level files.
                Err(e @ (Error::Corrupt { .. } | Error::ChainBroken { .. })) => {
                    warn!(%org, seq = snapshot.seq(), error = %e, "chain left at its deltas");
                    self.inner
                        .segment_refs
                        .insert(&skip_key, std::sync::Arc::new(Vec::new()));
                    report.skipped.push((snapshot.seq(), "does not rebuild"));
                }
                Err(e) => return Err(e),
            }
        }
        if !report.written.is_empty() {
            info!(%org, written = report.written.len(), "level files written");
        }
        Ok(report)
    }

    /// Rebuilds one closed chain and creates its level file; `None` when its sections
    /// would pass [`super::MAX_LEVEL_BYTES`].
    async fn compact_chain(
        &self,
        org: &OrgId,
        snapshot: &LogEntry,
        deltas: &[LogEntry],
        bucket_ms: u64,
    ) -> Result<Option<String>, Error> {
        let (image, hashes, manifest, _dir) = self.chain_image(org, snapshot, deltas).await?;
        let start = Start {
            seq: snapshot.seq(),
            checksum: hashes.sum(),
        };
        let page_size = hashes.page_size();
        let mut sections = Sections {
            touched: BTreeSet::new(),
            positions: 0,
            base_checksum: checksum_hex(start.checksum),
            bytes: 0,
            done: Vec::new(),
        };
        let bucket = |e: &LogEntry| e.at_ms() / bucket_ms;
        let mut state = (image, hashes);
        // Every page a delta of the chain changed so far: the sparse image holds them, and
        // the sections hold at most them once each.
        let mut chain_pages: BTreeSet<u32> = BTreeSet::new();
        let n = self.inner.settings.read_concurrency.max(1);
        for (b, batch) in deltas.chunks(n).enumerate() {
            let entries = self.with_bodies(org, batch).await?;
            let bodies = self.fetch_batch(org, &entries, n).await?;
            // The bound is checked before anything is downloaded for or built from these
            // deltas: the pages the chain changed so far plus theirs, whole, must fit.
            for (obj, body) in &bodies {
                chain_pages.extend(DeltaBody::parse(obj, body)?.records().map(|(p, _, _)| p));
            }
            if chain_pages.len() as u64 * u64::from(page_size) + sections.bytes > MAX_LEVEL_BYTES {
                return Ok(None);
            }
            let (mut image, mut hashes) = state;
            if let (Image::Sparse(sparse), Some(m)) = (&mut image, manifest.as_ref()) {
                self.load_sparse(org, m, &bodies, sparse, &mut hashes)
                    .await?;
            }
            state = (image, hashes);
            let closes: Vec<bool> = (0..entries.len())
                .map(|i| {
                    let next = deltas.get(b * n + i + 1);
                    next.is_none_or(|d| bucket(d) != bucket(&entries[i]))
                })
                .collect();
            let org_id = org.clone();
            let (image, hashes) = state;
            let mut secs = sections;
            (state, sections) = blocking("compacting a chain", move || {
                let (mut image, mut hashes) = (image, hashes);
                for ((entry, (obj, body)), closes) in entries.iter().zip(&bodies).zip(closes) {
                    chain::apply(&org_id, start, entry, obj, body, &mut image, &mut hashes)?;
                    let parsed = DeltaBody::parse(obj, body)?;
                    secs.touched
                        .extend(parsed.records().map(|(pgno, _, _)| pgno));
                    secs.positions += 1;
                    if closes {
                        secs.close(entry, &mut image, &hashes)?;
                    }
                }
                Ok(((image, hashes), secs))
            })
            .await?;
        }
        let end = deltas.last().map_or(snapshot.seq(), LogEntry::seq);
        let header = LevelHeader {
            org: org.to_string(),
            snapshot: snapshot.seq(),
            snapshot_checksum: checksum_hex(start.checksum),
            end,
            bucket_ms,
            page_size,
            sections: Vec::new(),
        };
        let (org_name, zstd) = (org.to_string(), self.inner.settings.zstd_level);
        let done = sections.done;
        let bytes = blocking("encoding a level file", move || {
            level::encode(&org_name, header, done, zstd)
        })
        .await?;
        let name = level_name(snapshot.seq(), end);
        let path = self.inner.store.layout.level(org, &name);
        let put = self
            .inner
            .store
            .object
            .put_opts(&path, PutPayload::from(bytes), PutMode::Create.into())
            .await;
        match put {
            // Another compactor wrote this chain's file first: the same positions.
            Ok(_) | Err(object_store::Error::AlreadyExists { .. }) => Ok(Some(name)),
            Err(e) => Err(Error::store("put", &path, e)),
        }
    }
}
