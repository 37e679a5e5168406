//! Shipping one live database under a claim: the claim, the chain's position in the WAL,
//! the cache of shipped page contents and the full/delta/compaction policy, in one owner.
//!
//! ```text
//! embedder (writer thread)            Shipper                                  store
//!   Owned::capture(seq, page, req) ─► prove pages hold seq ─► delta | full ─► blob + log entry
//!                                  ◄─ ShipReport { commit_seq }  (acknowledge every commit ≤ it)
//! ```
//!
//! A claim that hydrated a chain continues it: its first ship is a delta against the
//! previous round's tip, with the budget counters seeded from what the chain weighs. A full
//! snapshot is shipped when the claim has no chain (an empty org), when the WAL
//! position of the chain is lost (a failed capture, a WAL restarted behind our back, a delta
//! the store refused), and when the deltas since the last full snapshot outgrow
//! [`ShipPolicy::delta_budget_percent`] of it, number [`ShipPolicy::max_deltas`], or are
//! older than [`ShipPolicy::snapshot_interval_ms`]: this bounds what a hydrate downloads.
//!
//! Checkpoints run only inside a capture, and a delta capture checkpoints only after every
//! committed frame is copied into the pending pages; a delta that fails to publish keeps its
//! pages pending and they ship with the next delta, against the same base (Litestream's
//! shadow-WAL rule). So no frame leaves the WAL before a ship holds it.

mod pipeline;
mod policy;
mod state;

pub use pipeline::Issued;

use std::collections::BTreeMap;
use std::sync::Arc;

pub use policy::{FLOOR_MAX_DELTAS, ShipPolicy};

use crate::rebuild::resume::ResumePoint;
use state::ShipState;
pub(crate) use state::WalState;

use crate::live::{self, CaptureError, CaptureRequest, Captured, Checkpoint, Foreign, OwnedFiles};
use crate::publish::source::{OwnedSource, PageSource};
use crate::{Claim, Delta, Error, OrgId, Replica};

/// Where a [`Shipper`] gets its captures: the thread that owns the writer connection, which
/// runs [`crate::sqlite::Owned::capture`] between two transactions.
#[async_trait::async_trait]
pub trait CaptureSource: Send + Sync {
    /// Captures per `request` with the database's current commit sequence.
    ///
    /// # Errors
    /// The capture's error; [`CaptureError::Io`] when the writer has stopped.
    async fn capture(&self, request: CaptureRequest) -> Result<Captured, CaptureError>;
}

/// What one ship published.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShipKind {
    /// A full snapshot: the chain restarts from it.
    Full,
    /// A delta of the pages committed since the previous entry.
    Delta,
    /// A compacted delta: every page changed since the chain's snapshot, applied to it.
    Compacted,
}

/// The outcome of a successful [`Shipper::ship`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShipReport {
    /// The commit sequence the published entry holds, proved from its pages: every commit up
    /// to it may be acknowledged (I6).
    pub commit_seq: u64,
    /// Full, delta or compacted.
    pub kind: ShipKind,
    /// Packed bytes uploaded: a delta's body (in a blob or inside its entry), a snapshot's
    /// new segments and its manifest (the entry's own JSON is not counted).
    pub bytes: u64,
    /// Log position of the entry.
    pub seq: u64,
}

/// Ships one live database under one claim; not `Clone`, so exactly one owner publishes
/// under the claim. Dropping it without [`Shipper::release`] leaves the claim to expire.
pub struct Shipper {
    replica: Replica,
    claim: Claim,
    /// The writer's descriptors; `None` while the writer is parked ([`Shipper::park`]).
    files: Option<Arc<OwnedFiles>>,
    /// The database file's path (for errors, also while parked).
    db_path: std::path::PathBuf,
    policy: ShipPolicy,
    chain: ShipState,
    /// The next ship is a full snapshot whatever the policy says ([`Shipper::full_next`]).
    full_requested: bool,
    /// A bound on the page cache shared with other shippers ([`Shipper::share_cache_limit`]).
    cache_limit: Option<Arc<std::sync::atomic::AtomicUsize>>,
    /// The pages each pipelined ship in flight or landed above the newest landed one
    /// captured, by slot (`pipeline.rs`).
    increments: BTreeMap<u64, BTreeMap<u32, Vec<u8>>>,
}

impl std::fmt::Debug for Shipper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shipper")
            .field("claim", &self.claim)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

enum Fallback {
    Full,
    Failed(Error),
}

impl Shipper {
    /// A shipper for the database whose files are `files`, publishing under `claim`.
    pub fn new(
        replica: Replica,
        claim: Claim,
        files: Arc<OwnedFiles>,
        policy: ShipPolicy,
    ) -> Shipper {
        let mut chain = ShipState::new(replica.inner.clock.monotonic_ms());
        // A claim that hydrated a chain (or reused a file holding its tip) continues it.
        if let Some((tip, inherited)) = claim.inherited() {
            let age_ms = replica
                .inner
                .clock
                .now_ms()
                .saturating_sub(inherited.snapshot_at_ms);
            let (page_size, pages) = (tip.hashes.page_size(), tip.hashes.pages() as u32);
            let now = replica.inner.clock.monotonic_ms();
            chain.inherit(page_size, pages, inherited, age_ms, now);
        }
        Shipper {
            replica,
            claim,
            db_path: files.db_path().to_owned(),
            files: Some(files),
            policy,
            chain,
            full_requested: false,
            cache_limit: None,
            increments: BTreeMap::new(),
        }
    }

    /// Bounds the cache of shipped pages (see [`ShipPolicy::delta_cache_pages`]) by `limit`
    /// as well, read at every ship: an embedder running many shippers shares one memory
    /// budget among the ones active now, so a lone busy database gets the configured cache
    /// and a thousand share it.
    pub fn share_cache_limit(&mut self, limit: Arc<std::sync::atomic::AtomicUsize>) {
        self.cache_limit = Some(limit);
    }

    /// Makes the next [`Shipper::ship`] a full snapshot whatever the policy says, until one
    /// is published: what an embedder asks for a fresh base, or to measure one.
    pub fn full_next(&mut self) {
        self.full_requested = true;
    }

    /// The writer's descriptors, or an error while parked: nothing reads the files then.
    fn files(&self) -> Result<&Arc<OwnedFiles>, Error> {
        self.files.as_ref().ok_or_else(|| Error::Io {
            path: self.db_path.display().to_string(),
            source: std::io::Error::other("the writer is parked"),
        })
    }

    /// True when the writer may park ([`Shipper::park`]) once every commit is shipped: the
    /// claim holds a chain tip (it published, or hydrated or resumed one), no captured page
    /// waits to be published, and the database file is known to hold nothing but the tip
    /// and the WAL frames after it (a continued chain first ships what its open path wrote
    /// outside the WAL: [`Shipper::inherited_unshipped`]).
    pub fn parkable(&self) -> bool {
        self.claim.tip().is_some()
            && self.chain.pending.is_empty()
            && self.increments.is_empty()
            && !self.chain.diff_file
            && self.chain.proven.is_some()
            && self.files.is_some()
    }

    /// Lets go of the writer's descriptors and the cache of shipped pages: the writer has
    /// closed its connection after [`crate::sqlite::Owned::checkpoint_to_file`], so the database
    /// file holds exactly the chain's tip and no WAL remains (I14: a parked org keeps no
    /// descriptor of its database and no page cache). Call only once the connection is
    /// closed: these may be the last descriptors of its files, and closing one while
    /// SQLite has the file open drops its locks (I13). Until [`Shipper::unpark`], ships and
    /// confirmations fail with [`Error::Io`].
    pub fn park(&mut self) {
        self.files = None;
        self.chain.published = std::collections::HashMap::new();
    }

    /// Takes the descriptors of a reopened writer ([`crate::sqlite::reopen_exclusive`], then
    /// [`crate::sqlite::Owned::take`]) after proving, before anything is served from it, that the
    /// database file is still exactly the chain's tip: every page's hash (page 1 in
    /// canonical form, as [`Replica::resume`] and the first delta of a continued chain
    /// compare them) equals the tip's and the file has the tip's size. Reads the file once
    /// through `files` (local, no store request). The chain then goes on from the tip with
    /// a fresh WAL, as after a hydrate; whatever the open path wrote into the WAL since
    /// (an application hook) ships with the next delta.
    ///
    /// # Errors
    /// [`Error::FilesChanged`] when the file is not the tip (it was changed, replaced or
    /// truncated while parked) or the claim holds no tip: the org must stop, and nothing
    /// may be answered from the file; [`Error::Io`] reading it.
    pub async fn unpark(&mut self, files: Arc<OwnedFiles>) -> Result<(), Error> {
        let Some(tip) = self.claim.tip().cloned() else {
            return Err(self.files_changed(&Foreign(
                "the parked claim holds no chain tip to check its file against".into(),
            )));
        };
        let reader = files.clone();
        let hashes = tip.hashes.clone();
        let read = off_thread(move || live::file_is(&reader, &hashes)).await?;
        if !read.map_err(|e| self.capture_error(e))? {
            return Err(self.files_changed(&Foreign(
                "the parked database file is not the chain's tip".into(),
            )));
        }
        let wal = files.wal_len().map_err(|e| self.capture_error(e.into()))?;
        self.files = Some(files);
        self.chain.wal = WalState::Fresh;
        self.chain.db_pages = tip.hashes.pages() as u32;
        // The open path wrote into the WAL (an application hook): those pages ship with
        // the next delta, and a park first ships them ([`Shipper::inherited_unshipped`]).
        self.chain.diff_file = wal > 0;
        Ok(())
    }

    /// True when the database file differs from the chain's tip although this shipper has
    /// nothing to publish for its own commits: it continues a chain from before its claim,
    /// published nothing yet, and the open path wrote outside the WAL (SQLite's switch to
    /// WAL mode rewrote page 1's change counter) or into it. A writer that wants its file to
    /// match the published position ([`Shipper::resume_point`]) ships once first. Reads the
    /// file once (local, no store request); call between captures.
    ///
    /// # Errors
    /// [`Error::FilesChanged`] when the files were changed outside the writer; [`Error::Io`].
    pub async fn inherited_unshipped(&mut self) -> Result<bool, Error> {
        if !self.chain.diff_file {
            return Ok(false);
        }
        let tip_pages = self.claim.tip().map(|t| t.hashes.pages());
        if !self.take_file_changes().await? {
            // Another page size: only a full snapshot can follow.
            self.chain.wal = WalState::Lost;
            return Ok(true);
        }
        let wal = self
            .files()?
            .wal_len()
            .map_err(|e| self.capture_error(e.into()))?;
        Ok(!self.chain.pending.is_empty()
            || tip_pages != Some(self.chain.db_pages as usize)
            || wal > 0)
    }

    /// Where a later claim on this host can resume from this shipper's file, after its claim
    /// was released: the chain's tip (log position and database checksum) and what the chain
    /// weighs. `None` when the claim holds no tip it published or inherited, or when the
    /// file may differ from it ([`Shipper::inherited_unshipped`]). The file matches only once
    /// the writer connection has closed (SQLite then checkpoints the WAL into it); a later
    /// [`Replica::resume`] checks it against the store before trusting it.
    pub fn resume_point(&self) -> Option<ResumePoint> {
        let tip = self.claim.tip()?;
        if self.chain.diff_file || !self.chain.pending.is_empty() || !self.increments.is_empty() {
            return None;
        }
        let commit = self.chain.proven?;
        Some(ResumePoint::new(
            tip.seq,
            tip.hashes.sum(),
            self.chain.weight(commit),
        ))
    }

    /// The claim published under.
    pub fn claim(&self) -> &Claim {
        &self.claim
    }

    fn org(&self) -> &OrgId {
        self.claim.org()
    }

    /// Publishes everything committed so far: a delta of the WAL frames since the previous
    /// ship, or a full snapshot when the chain must restart (see the module docs). The
    /// captured pages must hold exactly the commit sequence the capture reported (I13).
    ///
    /// # Errors
    /// [`Error::FilesChanged`] when the files were changed outside the writer (nothing was
    /// published; the claim must end); [`Error::Fenced`] or [`Error::PublishUnknown`] (the
    /// claim is lost: [`Error::is_claim_lost`]); a store or local error (nothing acknowledged; the next ship retries, with
    /// the pages captured so far still pending).
    pub async fn ship(&mut self, source: &dyn CaptureSource) -> Result<ShipReport, Error> {
        if self.full_requested
            || self.chain.wants_full(
                &self.claim,
                &self.policy,
                self.replica.inner.clock.monotonic_ms(),
            )
        {
            let shipped = self.ship_full(source).await;
            self.full_requested &= shipped.is_err();
            return shipped;
        }
        match self.ship_delta(source).await {
            Ok(report) => Ok(report),
            Err(Fallback::Full) => self.ship_full(source).await,
            Err(Fallback::Failed(e)) => Err(e),
        }
    }

    /// Confirms, without shipping, that no successor appended to the log since this claim's
    /// last entry and that the files are still the writer's own, unchanged since its last
    /// checkpoint (I7, I13): what an answer that ships nothing (a replay, a read) waits for.
    ///
    /// # Errors
    /// [`Error::FilesChanged`]; [`Error::Fenced`]; store errors (retry).
    pub async fn confirm(&mut self) -> Result<(), Error> {
        self.replica.confirm(&mut self.claim).await?;
        self.files()?
            .check_unchanged()
            .map_err(|f| self.files_changed(&f))
    }

    /// Publishes the claim's Release entry, so a successor claims at once.
    ///
    /// # Errors
    /// As [`Replica::release`].
    pub async fn release(&mut self) -> Result<(), Error> {
        self.replica.release(&mut self.claim).await
    }

    fn files_changed(&self, f: &Foreign) -> Error {
        Error::FilesChanged {
            org: self.org().clone(),
            round: self.claim.round(),
            reason: f.to_string(),
        }
    }

    fn capture_error(&self, e: CaptureError) -> Error {
        match e {
            CaptureError::Io(source) => Error::Io {
                path: self.db_path.display().to_string(),
                source,
            },
            CaptureError::Foreign(f) => self.files_changed(&f),
        }
    }

    async fn ship_full(&mut self, source: &dyn CaptureSource) -> Result<ShipReport, Error> {
        self.chain.restart();
        // A full snapshot holds every page: nothing captured before it is pending any more.
        self.increments.clear();
        let request = CaptureRequest {
            from: 0,
            checkpoint: Checkpoint::Before,
        };
        let cap = source
            .capture(request)
            .await
            .map_err(|e| self.capture_error(e))?;
        let files = self.files()?.clone();
        let who = (self.org().clone(), self.claim.round());
        // The pages stream from the file the capture left (with any WAL frames over it) into
        // the segments: the counter page is proved before anything is uploaded.
        let built = off_thread(move || {
            let frames = live::wal::read(&cap.head, &cap.tail, None)
                .map_err(|e| Foreign(format!("the WAL cannot be read: {}", e.0)))?;
            let ps = u64::from(cap.page_size);
            let db_pages = match frames.db_pages {
                Some(n) => n,
                None => u32::try_from(cap.db.len() / ps).map_err(std::io::Error::other)?,
            };
            let mut source = OwnedSource::new(
                (files, cap.db),
                (cap.page_size, db_pages),
                frames.pages,
                who,
            );
            let mut counter = vec![0u8; ps as usize];
            if cap.counter_page >= 1 && cap.counter_page <= db_pages {
                source
                    .read(cap.counter_page, &mut counter)
                    .map_err(|e| Foreign(e.to_string()))?;
                prove(Some(&counter), cap.counter_page, cap.commit, None)?;
            } else {
                prove(None, cap.counter_page, cap.commit, None)?;
            }
            Ok::<_, CaptureError>((source, cap.page_size, db_pages, frames.end, cap.commit))
        })
        .await?;
        let (source, page_size, db_pages, end, commit) =
            built.map_err(|e| self.capture_error(e))?;
        self.chain.proven = Some(commit);
        let shipped = self
            .replica
            .ship_source(&mut self.claim, Box::new(source), commit)
            .await?;
        self.chain.full_shipped(
            end.map_or(WalState::Fresh, WalState::At),
            page_size,
            db_pages,
            shipped.compressed_bytes,
            self.replica.inner.clock.now_ms(),
            self.replica.inner.clock.monotonic_ms(),
        );
        Ok(ShipReport {
            commit_seq: commit,
            kind: ShipKind::Full,
            bytes: shipped.uploaded_bytes,
            seq: shipped.seq,
        })
    }

    async fn ship_delta(&mut self, source: &dyn CaptureSource) -> Result<ShipReport, Fallback> {
        if self.chain.diff_file && !self.take_file_changes().await.map_err(Fallback::Failed)? {
            return Err(Fallback::Full);
        }
        let from = match self.chain.wal {
            WalState::At(pos) => Some(pos),
            WalState::Fresh => None,
            WalState::Lost => return Err(Fallback::Full),
        };
        // A compaction reads pages from the database file, so it checkpoints every time: after
        // it the file holds exactly the captured state, and stays so until the next capture.
        let compact = self.chain.wants_compaction(&self.policy);
        let bound = if compact {
            0
        } else {
            self.policy.wal_checkpoint_bytes
        };
        let request = CaptureRequest {
            from: from.map_or(0, |p| p.offset),
            checkpoint: Checkpoint::AfterIfOver(bound),
        };
        let cap = match source.capture(request).await {
            Ok(cap) => cap,
            Err(e) => {
                // A capture that failed may have checkpointed first: the position is ours but
                // unknown, so the next ship is a full snapshot (never a read of a moved WAL).
                self.chain.wal = WalState::Lost;
                return Err(Fallback::Failed(self.capture_error(e)));
            }
        };
        let (commit, reset, db_state) = (cap.commit, cap.reset, cap.db);
        let previous = self.chain.proven;
        let frames = proved_frames(cap.head, cap.tail, cap.counter_page, commit, from, previous)
            .await
            .map_err(Fallback::Failed)?
            .map_err(|f| Fallback::Failed(self.files_changed(&f)))?;
        self.chain.proven = Some(commit);
        if let Some(pos) = frames.end
            && pos.page_size != self.chain.page_size
        {
            return Err(Fallback::Full);
        }
        // Every committed frame is now pending; the WAL may be reset behind it.
        let db_pages = self.chain.take_frames(frames, reset);
        let delta = if compact && reset {
            match self.compacted_delta(commit, db_state).await {
                Ok(d) => d,
                Err(e @ Error::FilesChanged { .. }) => return Err(Fallback::Failed(e)),
                Err(e) => {
                    tracing::warn!(org = %self.org(), error = %e, "compaction failed; shipping a full snapshot");
                    return Err(Fallback::Full);
                }
            }
        } else {
            let pending = self.chain.pending.clone();
            let published = &self.chain.published;
            Delta::new(self.chain.page_size, db_pages, pending, commit)
                .map_err(Fallback::Failed)?
                .encode_against(|p| published.get(&p).map(Vec::as_slice))
        };
        let compacted = delta.is_compacted();
        match self.replica.ship_delta(&mut self.claim, delta).await {
            Ok(shipped) => {
                let shared = self
                    .cache_limit
                    .as_ref()
                    .map_or(usize::MAX, |l| l.load(std::sync::atomic::Ordering::Relaxed));
                let cap = self.policy.delta_cache_pages.min(shared);
                self.chain
                    .delta_shipped(compacted, shipped.compressed_bytes, cap);
                Ok(ShipReport {
                    commit_seq: commit,
                    kind: if compacted {
                        ShipKind::Compacted
                    } else {
                        ShipKind::Delta
                    },
                    bytes: shipped.uploaded_bytes,
                    seq: shipped.seq,
                })
            }
            Err(Error::NoChainTip { .. }) => Err(Fallback::Full),
            // The store refused the delta as inconsistent with the chain (a compaction missing
            // a page changed since the snapshot, or a page encoded against content the tip
            // does not hold): nothing was published; a full snapshot restarts the chain, and
            // the page cache with it, instead of retrying the same delta.
            Err(e @ Error::DeltaRefused { .. }) => {
                tracing::warn!(org = %self.org(), error = %e, compacted, "delta refused; shipping a full snapshot");
                Err(Fallback::Full)
            }
            Err(e) => Err(Fallback::Failed(e)),
        }
    }

    /// Takes into the pending pages every page of the database file that differs from the
    /// inherited tip (before the first capture: the file holds the tip plus whatever the open
    /// path wrote outside the WAL), so the first delta holds every change since the tip.
    /// False when the file's page size is not the tip's: the chain cannot go on (ship full).
    async fn take_file_changes(&mut self) -> Result<bool, Error> {
        let Some(tip) = self.claim.tip().cloned() else {
            return Ok(false);
        };
        let files = self.files()?.clone();
        let read = off_thread(move || live::file_changes(&files, &tip.hashes)).await?;
        let Some((db_pages, pages)) = read.map_err(|e| self.capture_error(e))? else {
            return Ok(false);
        };
        if !pages.is_empty() || db_pages != self.chain.db_pages {
            tracing::debug!(org = %self.org(), pages = pages.len(), db_pages, "file differs from the inherited tip");
        }
        self.chain.db_pages = db_pages;
        self.chain.pending.extend(pages);
        self.chain.diff_file = false;
        Ok(true)
    }

    /// Builds a compacted delta after a capture whose checkpoint emptied the WAL: every page
    /// changed since the snapshot (pending ones included), read from the database file, which
    /// now holds exactly the captured state.
    async fn compacted_delta(&self, commit: u64, db: live::DbState) -> Result<Delta, Error> {
        let wanted = self.chain.compaction_pages();
        let (files, ps, db_pages) = (
            self.files()?.clone(),
            self.chain.page_size,
            self.chain.db_pages,
        );
        let read = off_thread(move || live::read_pages(&files, db, ps, db_pages, &wanted)).await?;
        let pages: BTreeMap<u32, Vec<u8>> = read.map_err(|e| self.capture_error(e))?;
        Ok(Delta::new(ps, db_pages, pages, commit)?.compacted())
    }
}

/// Runs file reads, WAL parsing and image building on the blocking pool.
async fn off_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, Error> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|source| Error::Task {
            op: "preparing a ship",
            source,
        })
}

/// Reads a delta capture's committed frames from the chain's WAL position `from` and proves
/// them (I13: the newest counter page holds `commit`, or `previous` when they leave it alone),
/// off the async runtime. Only this writer restarts its WAL, and it tracks where: frames that
/// cannot be read from the chain's position mean someone else rewrote the WAL.
pub(crate) async fn proved_frames(
    head: Vec<u8>,
    tail: Vec<u8>,
    counter_page: u32,
    commit: u64,
    from: Option<live::wal::WalPos>,
    previous: Option<u64>,
) -> Result<Result<live::wal::Frames, Foreign>, Error> {
    off_thread(move || {
        let frames = live::wal::read(&head, &tail, from).map_err(|e| {
            Foreign(format!(
                "the WAL cannot be read from the chain's position: {}",
                e.0
            ))
        })?;
        let counter = frames.pages.get(&counter_page).map(Vec::as_slice);
        prove(counter, counter_page, commit, previous)?;
        Ok::<_, Foreign>(frames)
    })
    .await
}

/// Checks a capture against its own pages (I13): the newest captured version of the
/// counter page holds `commit`, or, when the new frames leave that page alone, the
/// sequence is the one the previous capture proved.
fn prove(
    counter: Option<&[u8]>,
    counter_page: u32,
    commit: u64,
    previous: Option<u64>,
) -> Result<(), Foreign> {
    let found = match counter {
        Some(page) => Some(
            live::proof::commit_counter(page, counter_page).map_err(|e| {
                Foreign(format!("the captured counter page is not the counter: {e}"))
            })?,
        ),
        None => previous,
    };
    match found {
        Some(n) if n == commit => Ok(()),
        Some(n) => Err(Foreign(format!(
            "the captured pages hold commit {n}, the writer committed {commit}"
        ))),
        None => Err(Foreign(format!(
            "the captured pages do not show commit {commit}"
        ))),
    }
}
