//! One acquired org: its writer thread, its shipper task and the request API.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use idem::{BoxError, Options, Outcome, Record};
use idem_replica::{Claim, OrgId, Replica};
use rusqlite::{Connection, Transaction};
use tokio::sync::oneshot;

use crate::chain::{ShipCtx, ShipIo, ship_once};
use crate::local::LocalFiles;
use crate::owned::{Opened, OwnedFiles};
use crate::ship::{Counters, Shared, ShipState, Stop, confirm_once};
use crate::writer::{self, ApplyFn, InitFn, Job, ReadFn, WriterCtx};
use crate::{Error, ErrorKind, Settings};

/// A handle on an acquired org: this process is its one writer for one round. Cheap to clone.
///
/// Every method that returns `Ok` for a request does so only after a snapshot holding the
/// request's commit is published under this round (I6). After [`Error::Fenced`] or
/// [`Error::Closed`] the handle refuses everything: acquire the org again.
#[derive(Clone)]
pub struct Org {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Org {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Org")
            .field("org", &self.inner.shared.org)
            .field("round", &self.inner.shared.round)
            .finish()
    }
}

/// Shipping statistics of one org handle.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OrgStats {
    /// The writer's round.
    pub round: u64,
    /// Commit counter of the last local commit.
    pub committed: u64,
    /// Commit counter covered by the last published snapshot.
    pub shipped: u64,
    /// Snapshots and deltas published by this handle.
    pub ships: u64,
    /// Full snapshots among them (the rest are deltas).
    pub full_ships: u64,
    /// Compressed bytes of those full snapshots (part of `bytes_shipped`).
    pub full_bytes: u64,
    /// Compacted deltas among the ships (each supersedes the deltas before it).
    pub compactions: u64,
    /// Ships that failed (other than fenced).
    pub ship_failures: u64,
    /// Compressed bytes uploaded by this handle's ships (blobs; log entries not counted).
    pub bytes_shipped: u64,
    /// Requests acknowledged after waiting for a ship.
    pub acks: u64,
}

struct Inner {
    shared: Arc<Shared>,
    replica: Replica,
    settings: Settings,
    ship: tokio::sync::Mutex<ShipCtx>,
    /// The writer's files, read by the shipper through descriptors that outlive the writer
    /// connection (I13).
    owned: Arc<OwnedFiles>,
    /// The data directory's lock, held while any org of it serves (not only while its
    /// registry lives): it is what tells a restart that this process is gone.
    _home: Arc<crate::local::Home>,
    jobs: Mutex<Option<std::sync::mpsc::Sender<Job>>>,
    /// False once a release began: requests are refused, ships may still run. Read and
    /// written under the `jobs` lock, so no request is queued behind the final capture.
    accepting: std::sync::atomic::AtomicBool,
    writer_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    files: Mutex<Option<LocalFiles>>,
    inflight: AtomicUsize,
    last_used: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Sends a job to the writer thread; false when it has stopped.
pub(crate) fn send_job(jobs: &Mutex<Option<std::sync::mpsc::Sender<Job>>>, job: Job) -> bool {
    lock(jobs).as_ref().is_some_and(|j| j.send(job).is_ok())
}

/// What opening an org needs from its registry.
pub(crate) struct Opening<'a> {
    pub replica: Replica,
    pub data_dir: &'a std::path::Path,
    pub writer_id: &'a str,
    pub home: &'a Arc<crate::local::Home>,
    pub settings: Settings,
    pub clock: Arc<dyn idem::Clock>,
    pub init: Option<InitFn>,
}

static TICK: AtomicU64 = AtomicU64::new(0);

/// Decrements the in-flight count when a request ends, however it ends.
struct InFlight<'a>(&'a AtomicUsize);
impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Org {
    /// Claims, hydrates and opens an org (I8): nothing is served before the latest snapshot
    /// published before the claim is installed in a fresh, locked local file.
    pub(crate) async fn open(opening: Opening<'_>, org: OrgId) -> Result<Org, Error> {
        let Opening {
            replica,
            data_dir,
            writer_id,
            home,
            settings,
            clock,
            init,
        } = opening;
        let rerr = |e| Error::replica(org.as_str(), e);
        crate::local::prepare(data_dir, &org)?;
        let claim = replica
            .claim_from(
                &org,
                writer_id,
                Some((home.id.as_str(), home.locked())),
                settings.force_claim,
            )
            .await
            .map_err(rerr)?;
        let files = LocalFiles::create(data_dir, &org, claim.round, &claim.nonce)?;
        let opened = Self::open_files(&replica, &claim, &files, &settings, init).await;
        let (opened, watch) = match opened {
            Ok(v) => v,
            Err(e) => {
                files.remove();
                return Err(e);
            }
        };
        let committed = match writer::read_commit(&opened.conn) {
            Ok(n) => n,
            Err(source) => {
                drop(opened); // the connection closes before its files are removed
                files.remove();
                return Err(Error::Sqlite {
                    org: org.clone(),
                    source,
                });
            }
        };
        let owned = opened.files.clone();
        let shared = Arc::new(Shared {
            org: org.clone(),
            round: claim.round,
            committed: Arc::new(AtomicU64::new(committed)),
            state: Mutex::new(ShipState {
                shipped: committed,
                ..ShipState::default()
            }),
            demand: tokio::sync::Notify::new(),
            counters: Counters::default(),
        });
        let (jobs_tx, jobs_rx) = std::sync::mpsc::channel();
        let ctx = WriterCtx {
            round: claim.round,
            committed: shared.committed.clone(),
            clock,
            busy: Duration::from_millis(settings.busy_timeout_ms),
        };
        let thread = std::thread::Builder::new()
            .name(format!("idem-writer-{org}"))
            .spawn(move || writer::run(opened, watch, ctx, jobs_rx))
            .map_err(|source| Error::Local {
                org: org.to_string(),
                path: files.db.clone(),
                source,
            })?;
        tracing::info!(org = %org, round = claim.round, seq = claim.seq, commit = committed, "acquired");
        let inner = Arc::new(Inner {
            shared,
            replica,
            settings,
            ship: tokio::sync::Mutex::new(ShipCtx::new(claim)),
            owned,
            _home: home.clone(),
            jobs: Mutex::new(Some(jobs_tx)),
            accepting: std::sync::atomic::AtomicBool::new(true),
            writer_thread: Mutex::new(Some(thread)),
            files: Mutex::new(Some(files)),
            inflight: AtomicUsize::new(0),
            last_used: AtomicU64::new(TICK.fetch_add(1, Ordering::Relaxed)),
        });
        tokio::spawn(shipper(inner.clone()));
        Ok(Org { inner })
    }

    async fn open_files(
        replica: &Replica,
        claim: &Claim,
        files: &LocalFiles,
        settings: &Settings,
        init: Option<InitFn>,
    ) -> Result<(Opened, crate::capture::Watch), Error> {
        let org = claim.org.clone();
        replica
            .hydrate(claim, &files.db)
            .await
            .map_err(|e| Error::replica(org.as_str(), e))?;
        let path = files.db.clone();
        let busy = Duration::from_millis(settings.busy_timeout_ms);
        let org2 = org.clone();
        tokio::task::spawn_blocking(move || {
            let local = |source| Error::Local {
                org: org2.to_string(),
                path: path.clone(),
                source,
            };
            let opened = writer::open_writer(&path, busy, init.as_ref()).map_err(|e| match e {
                writer::OpenError::Idem(source) => Error::idem(&org2, source),
                writer::OpenError::Mode(reason) => local(std::io::Error::other(format!(
                    "the writer connection could not take the database exclusively: {reason}"
                ))),
                writer::OpenError::Files(source) => local(source),
            })?;
            let watch = crate::capture::Watch::new(&opened.files).map_err(|e| {
                local(match e {
                    crate::capture::CaptureError::Io(e) => e,
                    crate::capture::CaptureError::Foreign(f) => std::io::Error::other(f.0),
                })
            })?;
            Ok((opened, watch))
        })
        .await
        .map_err(|e| {
            Error::replica(
                org.as_str(),
                idem_replica::Error::Task {
                    op: "open",
                    source: e,
                },
            )
        })?
    }

    /// The org id.
    pub fn id(&self) -> &OrgId {
        &self.inner.shared.org
    }

    /// This writer's round (fencing epoch).
    pub fn round(&self) -> u64 {
        self.inner.shared.round
    }

    /// True until the handle is fenced or closed.
    pub fn is_serving(&self) -> bool {
        self.inner.shared.lock().stop.is_none()
            && lock(&self.inner.jobs).is_some()
            && self.inner.accepting.load(Ordering::SeqCst)
    }

    /// Shipping statistics of this handle.
    pub fn stats(&self) -> OrgStats {
        let c = &self.inner.shared.counters;
        OrgStats {
            round: self.round(),
            committed: self.inner.shared.committed.load(Ordering::SeqCst),
            shipped: self.inner.shared.lock().shipped,
            ships: c.ships.load(Ordering::Relaxed),
            full_ships: c.full_ships.load(Ordering::Relaxed),
            full_bytes: c.full_bytes.load(Ordering::Relaxed),
            compactions: c.compactions.load(Ordering::Relaxed),
            ship_failures: c.ship_failures.load(Ordering::Relaxed),
            bytes_shipped: c.bytes_shipped.load(Ordering::Relaxed),
            acks: c.acks.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn inflight(&self) -> usize {
        self.inner.inflight.load(Ordering::SeqCst)
    }

    pub(crate) fn last_used(&self) -> u64 {
        self.inner.last_used.load(Ordering::Relaxed)
    }

    /// [`Org::once_with`] with default options.
    ///
    /// # Errors
    /// See [`Org::once_with`].
    pub async fn once<F, E>(&self, key: &str, apply: F) -> Result<Outcome, Error>
    where
        F: FnOnce(&Transaction<'_>) -> Result<Vec<u8>, E> + Send + 'static,
        E: Into<BoxError>,
    {
        self.once_with(key, Options::new(), apply).await
    }

    /// Runs `idem::once_with` for `key` with this org's round on the org's writer connection
    /// (a dedicated thread, off the async runtime), then returns only once a snapshot holding
    /// the commit is published (I6). A replay also waits for the ship of every commit made so
    /// far, so a key committed but not yet shipped is never acknowledged early.
    ///
    /// # Errors
    /// [`Error::Idem`] from the dedup transaction (its kind tells retry / rejected / input);
    /// [`Error::ShipFailed`] (retryable: the commit stays local until a later ship);
    /// [`Error::Fenced`] / [`Error::Closed`] / [`Error::WriterGone`]: acquire again.
    pub async fn once_with<F, E>(
        &self,
        key: &str,
        opts: Options,
        apply: F,
    ) -> Result<Outcome, Error>
    where
        F: FnOnce(&Transaction<'_>) -> Result<Vec<u8>, E> + Send + 'static,
        E: Into<BoxError>,
    {
        let apply: ApplyFn = Box::new(move |tx| apply(tx).map_err(Into::into));
        let (out, c) = self
            .call(|reply| Job::Once {
                key: key.to_owned(),
                opts,
                apply,
                reply,
            })
            .await?;
        if out.applied {
            self.inner.shared.wait_shipped(c).await?;
        } else {
            self.inner.shared.wait_confirmed(c).await?;
        }
        Ok(out)
    }

    /// The stored record of `key`, once every commit so far is shipped (so a record returned
    /// here is durable in the store).
    ///
    /// # Errors
    /// As [`Org::once_with`].
    pub async fn applied(&self, key: &str) -> Result<Option<Record>, Error> {
        let (rec, c) = self
            .call(|reply| Job::Applied {
                key: key.to_owned(),
                reply,
            })
            .await?;
        self.inner.shared.wait_confirmed(c).await?;
        Ok(rec)
    }

    /// Runs `read` on the org's writer connection, inside a transaction that is rolled back
    /// afterwards (nothing it writes stays), and returns its result only once every commit
    /// it could see is shipped and a confirmation that started after this call found no
    /// successor (I6, I7): a read never reveals a state the store does not hold.
    ///
    /// This is how an application reads an org's data while it is served: the writer holds
    /// the database file exclusively (I13), so other connections get "database is locked".
    ///
    /// # Errors
    /// [`Error::Read`] when `read` fails or panics — once confirmed like a result, since a
    /// failure ("no such row") depends on the data too; otherwise as [`Org::once_with`].
    pub async fn read<T, F>(&self, read: F) -> Result<T, Error>
    where
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
        T: Send + 'static,
    {
        self.read_mut(move |conn| {
            let tx = conn.transaction()?;
            // Reading first holds the read snapshot, so a checkpoint the closure attempts
            // fails as locked instead of rewriting the database file behind the writer.
            writer::read_commit(&tx)?;
            read(&tx)
        })
        .await
    }

    /// The database image as the writer connection sees it (`sqlite3_serialize`), once it
    /// is shipped and confirmed like [`Org::read`]: for tests that compare it with a restore.
    ///
    /// # Errors
    /// As [`Org::read`].
    #[doc(hidden)]
    pub async fn image(&self) -> Result<Vec<u8>, Error> {
        self.read_mut(|conn| Ok(conn.serialize(rusqlite::MAIN_DB)?.to_vec()))
            .await
    }

    async fn read_mut<T, F>(&self, read: F) -> Result<T, Error>
    where
        F: FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
        T: Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let job: ReadFn = Box::new(move |conn| {
            let _ = tx.send(read(conn));
        });
        let c = self.call(|reply| Job::Read { read: job, reply }).await?;
        let org = self.inner.shared.org.clone();
        let out = match rx.await {
            Ok(Ok(v)) => Ok(v),
            // A read's error ("no such row") depends on the data as much as its result.
            Ok(Err(source)) => Err(Error::Read {
                org,
                source: source.into(),
            }),
            Err(_) => Err(Error::Read {
                org,
                source: "the read panicked".into(),
            }),
        };
        self.inner.shared.wait_confirmed(c).await?;
        out
    }

    /// Deletes keys applied strictly before `cutoff` (see `idem::prune`), then ships, and
    /// returns how many were deleted.
    ///
    /// # Errors
    /// As [`Org::once_with`].
    pub async fn prune(&self, cutoff: SystemTime) -> Result<u64, Error> {
        let (deleted, c) = self.call(|reply| Job::Prune { cutoff, reply }).await?;
        self.inner.shared.wait_shipped(c).await?;
        Ok(deleted)
    }

    /// Rebuilds the database file with `VACUUM` on the writer connection (reclaiming the
    /// space `prune` freed), then returns once the result is shipped. VACUUM rewrites every
    /// page, so the ship after it is as large as the database.
    ///
    /// # Errors
    /// As [`Org::once_with`].
    pub async fn vacuum(&self) -> Result<(), Error> {
        let c = self.call(|reply| Job::Vacuum { reply }).await?;
        self.inner.shared.wait_shipped(c).await
    }

    /// Waits until a ship covering commit `c` is published (I6).
    pub(crate) async fn wait_shipped(&self, c: u64) -> Result<(), Error> {
        self.inner.shared.wait_shipped(c).await
    }

    /// Waits for commit `c` to be shipped and for a confirmation that started after this call
    /// (replays and reads).
    pub(crate) async fn wait_confirmed(&self, c: u64) -> Result<(), Error> {
        self.inner.shared.wait_confirmed(c).await
    }

    pub(crate) async fn call<T>(
        &self,
        job: impl FnOnce(oneshot::Sender<Result<T, idem::Error>>) -> Job,
    ) -> Result<T, Error> {
        let inner = &self.inner;
        inner.inflight.fetch_add(1, Ordering::SeqCst);
        let _guard = InFlight(&inner.inflight);
        inner
            .last_used
            .store(TICK.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
        let stopped = inner.shared.lock().stop.clone();
        if let Some(stop) = stopped {
            return Err(inner.shared.stop_error(stop));
        }
        let (tx, rx) = oneshot::channel();
        let sent = {
            let jobs = lock(&inner.jobs);
            inner.accepting.load(Ordering::SeqCst)
                && jobs.as_ref().is_some_and(|j| j.send(job(tx)).is_ok())
        };
        if !sent {
            return Err(inner.shared.stop_error(Stop::Closed));
        }
        let org = inner.shared.org.clone();
        match rx.await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(source)) => {
                let refused = Error::idem(&org, source);
                // A refusal decided from the database (a fingerprint mismatch, exhausted
                // attempts, an `apply` that failed on what it read, an effect in the wrong
                // state) is an answer too: it waits for the same confirmation as a replay,
                // so it never reveals a commit the store does not hold (I6, I7). Until then
                // the caller gets the confirmation's retryable or fenced error instead. Only
                // bad input, decided without reading anything, is answered at once.
                if refused.kind() != ErrorKind::Input {
                    let seen = inner.shared.committed.load(Ordering::SeqCst);
                    inner.shared.wait_confirmed(seen).await?;
                }
                Err(refused)
            }
            Err(_) => Err(Error::WriterGone { org }),
        }
    }

    /// Graceful handoff: refuses new requests, lets in-flight ones commit, ships what is
    /// unshipped, publishes a Release entry (so the next claim proceeds at once), closes the
    /// database and deletes the local files.
    ///
    /// # Errors
    /// The final ship's or the release's error; the handle is closed either way.
    pub async fn release(&self) -> Result<(), Error> {
        let inner = &self.inner;
        let result = {
            // Wait for a ship in flight first.
            let mut ctx = inner.ship.lock().await;
            // Refuse new requests and queue a barrier behind every request already queued,
            // under one lock: once it answers, `committed` covers them all.
            let drained = {
                let (tx, rx) = oneshot::channel();
                let sent = {
                    let jobs = lock(&inner.jobs);
                    inner.accepting.store(false, Ordering::SeqCst);
                    jobs.as_ref()
                        .is_some_and(|j| j.send(Job::Barrier { reply: tx }).is_ok())
                };
                sent && rx.await.is_ok()
            };
            let stopped = inner.shared.lock().stop.clone();
            let result = match stopped {
                Some(stop) => Err(inner.shared.stop_error(stop)),
                None if !drained => Err(inner.shared.stop_error(Stop::Closed)),
                None => {
                    let committed = inner.shared.committed.load(Ordering::SeqCst);
                    let shipped_to = inner.shared.lock().shipped;
                    let shipped = if committed > shipped_to {
                        let io = ShipIo {
                            shared: &inner.shared,
                            replica: &inner.replica,
                            jobs: &inner.jobs,
                            files: &inner.owned,
                            settings: &inner.settings,
                        };
                        ship_once(&mut ctx, &io).await
                    } else {
                        Ok(())
                    };
                    match shipped {
                        Ok(()) => inner
                            .replica
                            .release(&mut ctx.claim)
                            .await
                            .map_err(|e| Error::replica(inner.shared.org.as_str(), e)),
                        Err(e) => Err(e),
                    }
                }
            };
            // Stop while still holding the ship lock, so a shipper waiting for it finds the
            // org closed instead of shipping on a released claim.
            inner.shared.stop(Stop::Closed);
            result
        };
        inner.close_writer().await;
        inner.discard_files();
        tracing::info!(org = %inner.shared.org, round = inner.shared.round, ok = result.is_ok(), "released");
        result
    }
}

impl Inner {
    /// Stops accepting jobs and waits for the writer thread to finish the queued ones.
    async fn close_writer(&self) {
        drop(lock(&self.jobs).take());
        let thread = lock(&self.writer_thread).take();
        if let Some(t) = thread {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
    }

    /// Deletes the local files (writer already closed).
    fn discard_files(&self) {
        if let Some(files) = lock(&self.files).take() {
            files.remove();
        }
    }
}

/// Renews an idle org's lease; false when the org turned out fenced (and is now discarded).
async fn keep_lease(inner: &Arc<Inner>) -> bool {
    let kept = {
        let mut ctx = inner.ship.lock().await;
        if inner.shared.lock().stop.is_some() {
            return false;
        }
        inner.replica.keep_alive(&mut ctx.claim).await
    };
    match kept {
        Ok(()) => true,
        Err(e) if e.is_fenced() => {
            tracing::warn!(org = %inner.shared.org, round = inner.shared.round, error = %e, "fenced while idle");
            inner.shared.stop(Stop::Fenced);
            inner.close_writer().await;
            inner.discard_files();
            false
        }
        Err(e) => {
            tracing::warn!(org = %inner.shared.org, round = inner.shared.round, error = %e, "lease renewal failed");
            true
        }
    }
}

/// The org's shipper: ships whenever some request waits for an unshipped commit, and keeps
/// the lease of an idle org alive.
async fn shipper(inner: Arc<Inner>) {
    let mut ships_since_retain = 0u64;
    loop {
        loop {
            if inner.shared.lock().stop.is_some() {
                return;
            }
            if inner.shared.has_demand() {
                break;
            }
            let keep_alive = Duration::from_millis((inner.replica.settings().lease_ms / 3).max(1));
            tokio::select! {
                () = inner.shared.demand.notified() => {}
                () = tokio::time::sleep(keep_alive) => {
                    if !keep_lease(&inner).await {
                        return;
                    }
                }
            }
        }
        let (shipped, full) = {
            let mut ctx = inner.ship.lock().await;
            if inner.shared.lock().stop.is_some() {
                return;
            }
            if inner.shared.needs_ship() {
                let before = inner.shared.counters.full_ships.load(Ordering::Relaxed);
                let io = ShipIo {
                    shared: &inner.shared,
                    replica: &inner.replica,
                    jobs: &inner.jobs,
                    files: &inner.owned,
                    settings: &inner.settings,
                };
                let shipped = ship_once(&mut ctx, &io).await;
                let full = inner.shared.counters.full_ships.load(Ordering::Relaxed) > before;
                (shipped, full)
            } else {
                let shipped =
                    confirm_once(&inner.shared, &inner.replica, &mut ctx.claim, &inner.owned).await;
                (shipped, false)
            }
        };
        match shipped {
            Err(Error::Poisoned { .. }) => {
                // I13: nothing was published; end the round so a successor (this process
                // on its next acquire, or another replica) claims at once and hydrates.
                {
                    let mut ctx = inner.ship.lock().await;
                    if let Err(e) = inner.replica.release(&mut ctx.claim).await {
                        tracing::warn!(org = %inner.shared.org, round = inner.shared.round, error = %e, "release after poisoning failed");
                    }
                }
                inner.close_writer().await;
                inner.discard_files();
                return;
            }
            Err(Error::Fenced { .. }) => {
                // I7: a fenced writer acks nothing more and discards its local database.
                inner.close_writer().await;
                inner.discard_files();
                return;
            }
            Ok(()) => {
                ships_since_retain += 1;
                let every = inner.settings.retain_every_ships;
                // Only a new full snapshot makes older entries deletable.
                if every > 0 && full && ships_since_retain >= every {
                    ships_since_retain = 0;
                    if let Err(e) = inner
                        .replica
                        .retain(&inner.shared.org, &inner.settings.retention)
                        .await
                    {
                        tracing::warn!(org = %inner.shared.org, error = %e, "retention failed");
                    }
                }
            }
            Err(_) => {}
        }
        if inner.settings.min_ship_interval_ms > 0 {
            tokio::time::sleep(Duration::from_millis(inner.settings.min_ship_interval_ms)).await;
        }
    }
}
