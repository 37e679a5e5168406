//! Hydrate and restore: rebuild a published position from its snapshot and the delta chain
//! after it, prove it with checksums, install it (I8, I10).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::future::Either;
use futures::{StreamExt, TryStreamExt};
use tracing::{info, warn};

use crate::chain::position::{Inherited, Tip};
use crate::chain::{self, Chain, Start, broken};
use crate::fence::log::Window;
use crate::format::blob::{inline_body, unpack};
use crate::format::checksum::PageHashes;
use crate::format::layout::new_nonce;
use crate::live::Durability;
use crate::publish::ship::Shipped;
use crate::rebuild::image::{FileImage, PageImage};
use crate::rebuild::install::{Check, discard, install_file, remove_db, temp_beside};
use crate::replica::blocking;
use crate::{BlobRef, Claim, Error, FailPoint, LogEntry, OrgId, Replica};

/// Result of a hydrate or restore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hydrated {
    /// The snapshot installed; `None` when the org has no snapshot yet (nothing installed).
    pub snapshot: Option<Shipped>,
    /// The commit counter of the installed state (0 when empty).
    pub commit: u64,
    /// Log position of the last entry applied: the snapshot's, or the last delta's.
    pub position: Option<u64>,
    /// Deltas applied on top of the snapshot.
    pub deltas: usize,
}

/// What an install leaves a claim that hydrated: the chain's tip, what the chain weighs, and
/// its snapshot's manifest.
pub(crate) type Installed = (Tip, Inherited, Option<crate::format::segment::Manifest>);

/// A chain rebuilt into an image: the image, what to call it in errors, its page hashes and
/// its snapshot's manifest (for a segmented snapshot).
pub(crate) struct Rebuilt<I> {
    pub(crate) image: I,
    pub(crate) object: String,
    pub(crate) hashes: PageHashes,
    pub(crate) manifest: Option<crate::format::segment::Manifest>,
}

/// Progress of a [`Replica::restore_with_progress`], updated as it runs.
#[derive(Debug, Default)]
pub struct RestoreProgress {
    /// Compressed bytes of the snapshot and deltas to download (0 until the chain is read;
    /// a retry after retention moved the chain sets it again).
    pub total: AtomicU64,
    /// Compressed bytes downloaded so far.
    pub downloaded: AtomicU64,
}

tokio::task_local! {
    /// The progress of the restore running in this task, if one asked for it.
    static PROGRESS: Arc<RestoreProgress>;
}

impl Replica {
    /// Installs at `dest` the newest state published before `claim` (I8): the newest
    /// snapshot, then every delta after it, and leaves `claim` holding that position and
    /// its page hashes as its chain tip, so the claim's first ship can be a delta that
    /// continues the chain ([`Claim::chain_tip`]) instead of a full snapshot.
    ///
    /// Verifies size and sha256 of every blob, the database checksum before and after each
    /// delta, and runs `quick_check` on a temp file in `dest`'s directory before renaming it
    /// into place and fsyncing the directory. Any existing file at `dest` (and its
    /// `-wal`/`-shm`/`-journal`) is replaced: the local file is a cache, never an authority.
    /// With no snapshot yet, `dest` is removed and nothing is created (`snapshot: None,
    /// commit: 0`). `dest` must not be open by anyone: name local files per claim.
    ///
    /// # Errors
    /// [`Error::MissingObject`]/[`Error::Corrupt`]/[`Error::ChainBroken`] when the newest
    /// state cannot be rebuilt exactly; never falls back to an older one (I10).
    /// [`Error::Store`], [`Error::Io`].
    pub async fn hydrate(&self, claim: &mut Claim, dest: &Path) -> Result<Hydrated, Error> {
        self.hydrate_as(claim, dest, Check::Now).await
    }

    /// [`Replica::hydrate`] for a file its writer opens next, and only with
    /// [`crate::sqlite::open_installed`], passing the name returned beside (`None` when
    /// nothing was installed): the image's `quick_check` is that connection's first access,
    /// not a connection of its own, and page 1 already says WAL, so the writer's open costs
    /// no second schema parse and no rollback journal. The file is synced as
    /// [`Replica::hydrate`]'s is.
    ///
    /// # Errors
    /// As [`Replica::hydrate`], except that a damaged SQLite image is reported by
    /// [`crate::sqlite::open_installed`] ([`crate::sqlite::OwnError::Corrupt`]); the caller
    /// must then remove the file (I10).
    pub async fn hydrate_for_writer(
        &self,
        claim: &mut Claim,
        dest: &Path,
    ) -> Result<(Hydrated, Option<String>), Error> {
        let hydrated = self.hydrate_as(claim, dest, Check::ByWriter).await?;
        self.failpoint(FailPoint::HydrateInstalled, claim.org())
            .await?;
        let image = hydrated.position.map(|p| image_name(claim.org(), p));
        Ok((hydrated, image))
    }

    async fn hydrate_as(
        &self,
        claim: &mut Claim,
        dest: &Path,
        check: Check,
    ) -> Result<Hydrated, Error> {
        // The claim's own listing and reads of the log below it (`fence/log/window.rs`):
        // nothing is listed twice, and no entry read twice.
        let below = claim.take_below();
        let prefetched = claim.take_prefetched();
        let log = self.tail_seen(claim.org(), claim.seq(), below).await?;
        let chain = chain::newest(claim.org(), &log, claim.seq())?;
        // An image downloaded beside the claim is installed only if it holds the very chain
        // this hydrate finds below the claim; any other is dropped and the chain downloaded.
        let held = prefetched.filter(|p| chain.as_ref().is_some_and(|c| p.holds(c)));
        let (hydrated, tip) = match held {
            Some(p) => self.install_held(claim.org(), p, dest, check).await?,
            None => self.install_chain(claim.org(), chain, dest, check).await?,
        };
        if let Some((tip, inherited, manifest)) = tip {
            claim.inherit(tip, inherited, manifest.map(Arc::new));
        }
        Ok(hydrated)
    }

    /// Installs any published position of `org` at `dest`: `at: None` = the newest,
    /// `Some(seq)` = the state published by the snapshot or delta entry at that log position
    /// (point-in-time restore). Same checks and atomicity as [`Replica::hydrate`]. An org
    /// whose log holds journal entries (format 5) is read through the journal
    /// (`docs/design.md` 3g): the newest state is its walk's ([`Replica::walk_org`]: the
    /// newest section read on its base, or a checkpoint), and `Some(seq)` is the entry at
    /// `seq` rebuilt by its base links.
    ///
    /// # Errors
    /// As [`Replica::hydrate`]; [`Error::NoSuchSnapshot`] when `at` names no snapshot or
    /// delta entry; the walk's errors ([`Replica::walk_org`]) for a journal org.
    pub async fn restore(
        &self,
        org: &OrgId,
        at: Option<u64>,
        dest: &Path,
    ) -> Result<Hydrated, Error> {
        // A log holding journal entries is read through the journal (K3): the newest state
        // is its walk's (K0), a position is its entry's, rebuilt by its base links.
        match self.restore_per_org(org, at, dest).await {
            Err(Error::JournalRequired { .. }) => self.restore_journal(org, at, dest).await,
            other => other,
        }
    }

    async fn restore_per_org(
        &self,
        org: &OrgId,
        at: Option<u64>,
        dest: &Path,
    ) -> Result<Hydrated, Error> {
        let Some(seq) = at else {
            // The newest state may be retired by retention (a newer snapshot landed) between
            // reading the log and downloading its blobs: read the log again, a few times,
            // before reporting a missing blob.
            let mut attempt = 0;
            loop {
                attempt += 1;
                let log = self.tail(org, u64::MAX).await?;
                let chain = chain::newest(org, &log, u64::MAX)?;
                match self.install_chain(org, chain, dest, Check::Now).await {
                    Err(Error::MissingObject { .. }) if attempt < 4 => continue,
                    other => return other.map(|(h, _)| h),
                }
            }
        };
        // The entries from the newest snapshot below the position up to it, read from the
        // position down: a restore reads its chain, not the whole log (2d, I16).
        let log = self.tail(org, seq.saturating_add(1)).await?;
        // A position of a closed chain with a level file: its sections, then what the log
        // still holds after them (2d).
        match self.level_plan(org, &log, seq).await {
            Ok(None) => {}
            Ok(Some(plan)) => match self.install_level_plan(org, plan, dest).await {
                // A damaged level file: the log may still hold the position itself, which
                // the chain rules below verify on their own (never an older state, I10).
                Err(
                    e @ (Error::Corrupt { .. }
                    | Error::ChainBroken { .. }
                    | Error::MissingObject { .. }),
                ) if log.iter().any(|x| x.seq() == seq) => {
                    warn!(%org, seq, error = %e, "level file unusable; restoring from the log");
                }
                other => return other,
            },
            Err(
                e @ (Error::Corrupt { .. }
                | Error::UnknownFormat { .. }
                | Error::MissingObject { .. }),
            ) if log.iter().any(|x| x.seq() == seq) => {
                warn!(%org, seq, error = %e, "level file unusable; restoring from the log");
            }
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
        let chain = chain::newest(org, &log, seq.saturating_add(1))?;
        if chain.as_ref().map(Chain::position) != Some(seq) {
            return Err(broken(
                org,
                seq,
                "delta is not on the chain of any snapshot",
            ));
        }
        Ok(self.install_chain(org, chain, dest, Check::Now).await?.0)
    }

    /// [`Replica::restore`], reporting into `progress` as it goes: the chain's total
    /// compressed bytes once it is known, then the bytes downloaded so far (for a progress
    /// bar; read it from another task while this one runs).
    ///
    /// # Errors
    /// As [`Replica::restore`].
    pub async fn restore_with_progress(
        &self,
        org: &OrgId,
        at: Option<u64>,
        dest: &Path,
        progress: Arc<RestoreProgress>,
    ) -> Result<Hydrated, Error> {
        PROGRESS.scope(progress, self.restore(org, at, dest)).await
    }

    /// The entries a hydrate of the newest state below `limit` needs, read from the head
    /// down: every entry after the newest snapshot, or after the newest compacted delta plus
    /// that delta's snapshot. One LIST, then one GET per entry of that tail, `read_concurrency`
    /// at a time — not per entry of
    /// the log, which keeps every delta a kept snapshot still has for point-in-time restore.
    pub(crate) async fn tail(&self, org: &OrgId, limit: u64) -> Result<Vec<LogEntry>, Error> {
        self.tail_seen(org, limit, None).await
    }

    /// [`Replica::tail`], whose first attempt takes its listing, and whatever entries it
    /// holds, from `seen` (a claim's [`Window`] of the log below it) instead of the store.
    /// A later attempt (an entry vanished) lists afresh.
    pub(crate) async fn tail_seen(
        &self,
        org: &OrgId,
        limit: u64,
        mut seen: Option<Window>,
    ) -> Result<Vec<LogEntry>, Error> {
        const ATTEMPTS: u32 = 4;
        for attempt in 1..=ATTEMPTS {
            let window = seen.take();
            let last = attempt == ATTEMPTS;
            if let Some(tail) = self
                .try_tail(org, limit, last, window.as_ref(), false)
                .await?
            {
                return Ok(tail);
            }
        }
        Err(Error::LogChanged {
            org: org.to_string(),
            attempts: ATTEMPTS,
        })
    }

    /// The tail [`Replica::tail_seen`] would return on its first attempt from `seen`, when
    /// `seen` holds every entry of it: no store request. `None` when an entry it needs was
    /// not read into `seen`.
    pub(crate) async fn tail_held(
        &self,
        org: &OrgId,
        limit: u64,
        seen: &Window,
    ) -> Option<Vec<LogEntry>> {
        self.try_tail(org, limit, false, Some(seen), true)
            .await
            .ok()
            .flatten()
    }

    /// One attempt of [`Replica::tail`]; `None` when a listed entry vanished before it was
    /// read (retention deleting what this read still needed): skipping it could leave an
    /// older state, or none, looking like the newest (I10). On the `last` attempt a compacted
    /// delta whose snapshot is still missing is returned without it, which `chain::newest` reports
    /// as a broken chain (damage, not a race). With `held_only`, an entry `seen` does not
    /// hold counts as vanished instead of being read.
    async fn try_tail(
        &self,
        org: &OrgId,
        limit: u64,
        last: bool,
        seen: Option<&Window>,
        held_only: bool,
    ) -> Result<Option<Vec<LogEntry>>, Error> {
        let listed = match seen {
            Some(w) => w.seqs.clone(),
            None => self.inner.log.seqs(org).await?,
        };
        let seqs: Vec<u64> = listed.into_iter().filter(|s| *s < limit).collect();
        let read = |seq: u64| {
            let held = seen.and_then(|w| w.entry(seq)).cloned();
            async move {
                match held {
                    Some(e) => Ok(Some(e)),
                    None if held_only => Ok(None),
                    None => self.inner.log.read_entry(org, seq).await,
                }
            }
        };
        let n = self.inner.settings.read_concurrency.max(1);
        let mut down: Vec<LogEntry> = Vec::new();
        let mut end = seqs.len();
        while end > 0 {
            let start = end.saturating_sub(n);
            let reads: Vec<_> = seqs[start..end].iter().map(|s| read(*s)).collect();
            let batch: Vec<Option<LogEntry>> = futures::stream::iter(reads)
                .buffered(n)
                .try_collect()
                .await?;
            for e in batch.into_iter().rev() {
                let Some(e) = e else { return Ok(None) };
                if e.is_snapshot() {
                    down.push(e);
                    down.reverse();
                    return Ok(Some(down));
                }
                // A compacted delta: its base is the chain's snapshot, and the deltas
                // between are superseded.
                let Some(base) = chain::compaction_base(&e) else {
                    down.push(e);
                    continue;
                };
                match read(base).await? {
                    Some(s) if s.is_snapshot() && chain::compacts(&s, &e) => {
                        down.push(e);
                        down.push(s);
                    }
                    // Not a snapshot of its round: not a compaction; `chain::newest` judges
                    // it against the newest snapshot, which the read goes on to find.
                    Some(_) => {
                        down.push(e);
                        continue;
                    }
                    None if last => down.push(e),
                    None => return Ok(None),
                }
                down.reverse();
                return Ok(Some(down));
            }
            end = start;
        }
        down.reverse();
        Ok(Some(down))
    }

    pub(crate) fn shipped(&self, org: &OrgId, entry: &LogEntry) -> Option<Shipped> {
        Shipped::from_entry(entry, |b| match b {
            Some(b) => self.inner.store.layout.blob(org, b).to_string(),
            None => self.inner.store.layout.log(org, entry.seq()).to_string(),
        })
    }

    /// Downloads a snapshot's or delta's blob (or decodes the body carried inline in its
    /// entry) and returns its object path (the entry's, for an inline body) and its verified
    /// uncompressed bytes: the same size and sha256 checks either way (I10).
    ///
    /// # Errors
    /// [`Error::MissingObject`], [`Error::Corrupt`] (also for an inline body that is not
    /// base64, or whose packed size is not the entry's `compressed_bytes`), [`Error::Store`];
    /// [`Error::NoSuchSnapshot`] for an entry that names no blob.
    pub(crate) async fn fetch(
        &self,
        org: &OrgId,
        entry: &LogEntry,
    ) -> Result<(String, Vec<u8>), Error> {
        let Some(stored) = entry.stored() else {
            return Err(Error::NoSuchSnapshot {
                org: org.to_string(),
                seq: entry.seq(),
            });
        };
        let (bytes, sha256) = (stored.bytes, stored.sha256.clone());
        let (object, data) = match &stored.blob {
            BlobRef::Object(name) => {
                let path = self.inner.store.layout.blob(org, name);
                let object = path.to_string();
                // A delta's body, or a whole snapshot of an earlier build: both are held in
                // memory, the delta bounded by the ship policy. The entry records the blob's
                // size: a larger object is not it, and is not held.
                let data = self.get_capped(&path, stored.compressed_bytes).await?;
                (object, data.to_vec())
            }
            BlobRef::Manifest(_) => {
                return Err(Error::corrupt(
                    self.inner.store.layout.log(org, entry.seq()).as_ref(),
                    "a segmented snapshot is read through its manifest",
                ));
            }
            BlobRef::Inline(text) => {
                let object = self.inner.store.layout.log(org, entry.seq()).to_string();
                let data = inline_body(&object, text, stored.compressed_bytes)?;
                (object, data)
            }
        };
        downloaded(data.len() as u64);
        self.failpoint(FailPoint::HydrateAfterDownload, org).await?;
        let obj = object.clone();
        let out = blocking("decompressing a blob", move || {
            unpack(&obj, &data, bytes, &sha256)
        })
        .await?;
        Ok((object, out))
    }

    /// Fetches the blobs of `entries`, `n` at a time, in order.
    pub(crate) async fn fetch_batch(
        &self,
        org: &OrgId,
        entries: &[LogEntry],
        n: usize,
    ) -> Result<Vec<(String, Vec<u8>)>, Error> {
        // Collected first: a stream over a closure taking `&LogEntry` makes the future's
        // `Send` bound higher-ranked, which callers' `tokio::spawn` cannot prove.
        let fetches: Vec<_> = entries.iter().map(|e| self.fetch(org, e)).collect();
        futures::stream::iter(fetches)
            .buffered(n)
            .try_collect()
            .await
    }

    /// Rebuilds the image of a chain into `image`: the snapshot streamed in, then each delta
    /// after checking the database checksum before it and after it. Delta bodies are
    /// fetched concurrently.
    pub(crate) async fn rebuild<I: PageImage + Send + 'static>(
        &self,
        org: &OrgId,
        chain: &Chain,
        image: I,
    ) -> Result<Rebuilt<I>, Error> {
        let (image, _, hashes, manifest) = self
            .download_snapshot(org, &chain.snapshot, image, false)
            .await?;
        let n = self.inner.settings.read_concurrency.max(1);
        let mut state = (image, hashes);
        // Deltas are fetched `n` at a time (download, decompress, sha256), and each batch is
        // applied in order while exactly the next one is fetched: memory holds at most two
        // batches of bodies. An apply error returns at once (the fetch is dropped); when both
        // fail, the apply's error, earlier in the chain, wins.
        let start = Start {
            seq: chain.snapshot.seq(),
            checksum: state.1.sum(),
        };
        let mut batches = chain.deltas.chunks(n);
        let mut next = match batches.next() {
            Some(entries) => Some((entries, self.fetch_batch(org, entries, n).await?)),
            None => None,
        };
        while let Some((entries, bodies)) = next {
            let batch: Vec<(LogEntry, (String, Vec<u8>))> =
                entries.iter().cloned().zip(bodies).collect();
            let org_id = org.clone();
            let applying = blocking("applying deltas", move || {
                let (mut image, mut hashes) = state;
                for (entry, (obj, body)) in &batch {
                    chain::apply(&org_id, start, entry, obj, body, &mut image, &mut hashes)?;
                }
                Ok((image, hashes))
            });
            let Some(following) = batches.next() else {
                state = applying.await?;
                break;
            };
            let applying = std::pin::pin!(applying);
            let fetching = std::pin::pin!(self.fetch_batch(org, following, n));
            next = match futures::future::select(applying, fetching).await {
                Either::Left((applied, fetching)) => {
                    state = applied?;
                    Some((following, fetching.await?))
                }
                Either::Right((fetched, applying)) => {
                    state = applying.await?;
                    Some((following, fetched?))
                }
            };
        }
        Ok(Rebuilt {
            image: state.0,
            object: image_name(org, chain.position()),
            hashes: state.1,
            manifest,
        })
    }

    /// Rebuilds `chain` and installs it at `dest` (checked as `check` says), or, with no
    /// chain (nothing published), removes `dest` and its sidecars. Returns what was
    /// installed and, for a chain, its tip (position and page hashes) and what the chain
    /// weighs.
    async fn install_chain(
        &self,
        org: &OrgId,
        chain: Option<Chain>,
        dest: &Path,
        check: Check,
    ) -> Result<(Hydrated, Option<Installed>), Error> {
        let dest_buf = dest.to_path_buf();
        let Some(chain) = chain else {
            blocking("clearing the destination", move || remove_db(&dest_buf)).await?;
            info!(%org, "hydrated empty: no snapshot published yet");
            let empty = Hydrated {
                snapshot: None,
                commit: 0,
                position: None,
                deltas: 0,
            };
            return Ok((empty, None));
        };
        let _ = PROGRESS.try_with(|p| {
            let total = std::iter::once(&chain.snapshot)
                .chain(&chain.deltas)
                .filter_map(|e| e.stored().map(|s| s.compressed_bytes))
                .sum();
            p.total.store(total, Ordering::Relaxed);
            p.downloaded.store(0, Ordering::Relaxed);
        });
        // The image is rebuilt in a temp file beside `dest` and renamed over it only once
        // every check passed: a failure or a crash leaves nothing at `dest` (I10).
        let nonce = new_nonce()?;
        let tmp = temp_beside(dest, &nonce)?;
        let file = FileImage::create(&tmp)?;
        let rebuilt = self.rebuild(org, &chain, file).await;
        self.install_rebuilt(org, chain, move || rebuilt, tmp, dest, check)
            .await
    }

    /// Finishes the image at `tmp` (`finish`, on the same blocking thread as the rest: a
    /// held image is written there, a downloaded one returned as it is), syncs it, checks it
    /// (as `check` says) and renames it over `dest`, or removes `tmp` on any failure (I10).
    pub(crate) async fn install_rebuilt(
        &self,
        org: &OrgId,
        chain: Chain,
        finish: impl FnOnce() -> Result<Rebuilt<FileImage>, Error> + Send + 'static,
        tmp: std::path::PathBuf,
        dest: &Path,
        check: Check,
    ) -> Result<(Hydrated, Option<Installed>), Error> {
        let dest_buf = dest.to_path_buf();
        let t = tmp.clone();
        let installed = blocking("installing a snapshot", move || {
            let mut r = finish()?;
            r.image.sync()?;
            install_file(&r.object, &t, &dest_buf, Durability::Synced, check)?;
            Ok((r.hashes, r.manifest))
        })
        .await;
        let (hashes, manifest) = match installed {
            Ok(h) => h,
            Err(e) => {
                blocking("removing a temp file", move || {
                    discard(&tmp);
                    Ok(())
                })
                .await?;
                return Err(e);
            }
        };
        let last = chain.deltas.last().unwrap_or(&chain.snapshot);
        let commit = last.commit().unwrap_or(0);
        let position = Some(last.seq());
        info!(%org, seq = chain.snapshot.seq(), position, deltas = chain.deltas.len(),
              round = chain.snapshot.round(), commit, "hydrated");
        let hydrated = Hydrated {
            snapshot: self.shipped(org, &chain.snapshot),
            commit,
            position,
            deltas: chain.deltas.len(),
        };
        let inherited = chain.inherited(commit, hashes.page_size());
        let tip = Tip {
            seq: last.seq(),
            hashes: Arc::new(hashes),
        };
        Ok((hydrated, Some((tip, inherited, manifest))))
    }
}

/// What errors and [`crate::sqlite::open_installed`] call the image of `org`'s state at log
/// position `position`.
fn image_name(org: &OrgId, position: u64) -> String {
    format!("{org}@{position}")
}

/// Counts `bytes` downloaded into the progress of the restore running in this task, if any.
pub(crate) fn downloaded(bytes: u64) {
    let _ = PROGRESS.try_with(|p| p.downloaded.fetch_add(bytes, Ordering::Relaxed));
}
