//! The org's writer: the one SQLite connection that writes, its FIFO of jobs, and the handle
//! that queues them. Jobs run off the async runtime on the registry's writer pool
//! ([`crate::pool`]): one at a time per org, in the order queued.
//!
//! Every write transaction also raises the commit sequence in the same transaction
//! ([`crate::commit`]; for `once` and effects through idem's write hook, set in one place by
//! `run`), and every job raises the in-memory [`CommitSeq`] to the database's
//! before it replies, so an answer names exactly the commits it may depend on (I6).

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_replica::sqlite::{
    self, CaptureError, CaptureRequest, Captured, OwnError, Owned, OwnedFiles,
};
use rusqlite::Connection;
use tokio::sync::oneshot;

use crate::commit::CommitSeq;
use crate::pool::{Pool, Scheduled, Task};
use crate::sync::lock;

pub(crate) mod job;
mod run;

pub(crate) use job::{ApplyFn, Job, ParkRefused, ReadFn, Reply};

/// A hook run on the writer connection when an org is opened (application schema).
pub type InitFn = Arc<dyn Fn(&Connection) -> rusqlite::Result<()> + Send + Sync>;

/// Why the writer connection could not be opened.
#[derive(Debug)]
pub(crate) enum OpenError {
    Idem(idem::Error),
    Own(OwnError),
}

impl From<idem::Error> for OpenError {
    fn from(e: idem::Error) -> Self {
        OpenError::Idem(e)
    }
}

impl From<rusqlite::Error> for OpenError {
    fn from(e: rusqlite::Error) -> Self {
        OpenError::Idem(e.into())
    }
}

/// Opens the org's writer connection as the owner of its files (I13; see
/// `idem_replica::sqlite::open_exclusive`), creates the commit sequence and idem's schema,
/// runs the application's hook, sizes SQLite's page cache to `cache_kib` KiB (after the hook,
/// so the registry's memory budget holds whatever the hook set), then takes the descriptors
/// the shipper reads through. `durability` is the file's: `Volatile` for a journal tenure's,
/// which is never kept or resumed. `installed`: the name of an image an install left
/// unchecked, whose `quick_check` is then this connection's first access
/// (`idem_replica::sqlite::open_installed`).
pub(crate) fn open(
    path: &std::path::Path,
    busy: Duration,
    cache_kib: u64,
    init: Option<&InitFn>,
    durability: sqlite::Durability,
    installed: Option<&str>,
) -> Result<Owned, OpenError> {
    let conn = match installed {
        Some(image) => sqlite::open_installed(path, busy, durability, image)?,
        None => sqlite::open_exclusive(path, busy, durability)?,
    };
    prepare(conn, path, busy, cache_kib, init)
}

/// The rest of [`open`] on a connection that holds the database exclusively (the same
/// steps when a parked writer reopens, so its connection is configured the same way).
fn prepare(
    conn: Connection,
    path: &std::path::Path,
    busy: Duration,
    cache_kib: u64,
    init: Option<&InitFn>,
) -> Result<Owned, OpenError> {
    crate::prepare::create(&conn).map_err(OpenError::Idem)?;
    if let Some(init) = init {
        init(&conn)?;
    }
    // A negative cache_size is a size in KiB, whatever the page size.
    conn.execute_batch(&format!("PRAGMA cache_size = -{cache_kib}"))?;
    Ok(Owned::take(conn, path, busy)?)
}

/// An org's writer: its FIFO of jobs and its connection, run by the registry's writer pool
/// ([`crate::pool`]) one job at a time, in order, never two at once.
pub(crate) struct Writer {
    org: Arc<OrgWriter>,
    pool: Pool,
}

/// What the pool runs: the org's queue and the connection its jobs use.
struct OrgWriter {
    queue: Mutex<Queue>,
    /// The connection and its context; `None` once closed. Locked only by the worker that
    /// holds the org (the `scheduled` flag makes that one worker at a time), so a job runs
    /// without blocking anyone who queues the next one.
    runner: Mutex<Option<Runner>>,
    /// True once the connection is closed (its files' descriptors may then be dropped).
    closed: tokio::sync::watch::Sender<bool>,
}

struct Queue {
    jobs: VecDeque<Job>,
    scheduled: Scheduled,
    /// True from the moment a park is queued until an unpark proved the file and the
    /// writer is active again: requests are handed back (`Refused::Parked`) so the caller
    /// unparks first, and no request job ever runs on a parked or unproven connection.
    parked: bool,
    /// False once a drain began: requests are refused, captures still run. Read and written
    /// under this lock, so no request is queued behind the drain.
    accepting: bool,
    /// False once a close began: nothing is queued any more, and the connection closes
    /// after the jobs already queued.
    open: bool,
    /// True once a job panicked outside `apply` and a read: the connection is closed and
    /// every job is refused (`WriterGone` / `Closed`) until the org is closed and acquired
    /// again, as when the org had a thread of its own and it died.
    stopped: bool,
}

struct Runner {
    /// The connection and the descriptors captures read; `None` while parked.
    owned: Option<Owned>,
    ctx: WriterCtx,
}

/// Why [`Writer::request`] did not queue a job.
pub(crate) enum Refused {
    /// The writer is draining, closed or stopped.
    Closed,
    /// The writer is parked: the job is handed back to be queued after an unpark.
    Parked(Box<Job>),
}

impl Writer {
    /// Hands `owned` to `pool`: from now on its jobs run on the pool's workers.
    ///
    /// # Errors
    /// The I/O error of starting the pool's first worker thread (`owned` is then dropped,
    /// connection first).
    pub(crate) fn start(owned: Owned, ctx: WriterCtx, pool: &Pool) -> std::io::Result<Writer> {
        pool.ensure_worker()?;
        Ok(Writer {
            org: Arc::new(OrgWriter {
                queue: Mutex::new(Queue {
                    jobs: VecDeque::new(),
                    scheduled: Scheduled::default(),
                    parked: false,
                    accepting: true,
                    open: true,
                    stopped: false,
                }),
                runner: Mutex::new(Some(Runner {
                    owned: Some(owned),
                    ctx,
                })),
                closed: tokio::sync::watch::channel(false).0,
            }),
            pool: pool.clone(),
        })
    }

    /// Queues `job` (a request's only while accepting), scheduling the org on the pool if it
    /// was idle; false when refused. A refused job is dropped after the queue's lock is
    /// released: its reply sender goes with it.
    fn push(&self, job: Job, request: bool) -> bool {
        self.try_push(job, request).is_ok()
    }

    fn try_push(&self, job: Job, request: bool) -> Result<(), Refused> {
        let (refused, schedule) = {
            let mut q = lock(&self.org.queue);
            if !q.open || q.stopped || (request && !q.accepting) {
                (Some(Refused::Closed), false)
            } else if request && q.parked {
                return Err(Refused::Parked(Box::new(job)));
            } else {
                q.jobs.push_back(job);
                (None, q.scheduled.claim())
            }
        };
        if schedule {
            self.pool.schedule(self.org.clone());
        }
        // A refused job is dropped here, after the lock: its reply sender goes with it.
        refused.map_or(Ok(()), Err)
    }

    /// Queues a request's job. Refused while the writer is draining or stopped
    /// ([`Refused::Closed`]) or parked ([`Refused::Parked`], the job handed back).
    pub(crate) fn request(&self, job: Job) -> Result<(), Refused> {
        self.try_push(job, true)
    }

    /// True while the writer is parked or being unparked: requests are handed back.
    pub(crate) fn parked(&self) -> bool {
        lock(&self.org.queue).parked
    }

    /// Parks the writer if it is idle — no job queued or running — and the database holds
    /// commit `shipped`: from now on requests are handed back, then a job checkpoints every
    /// frame into the file and closes the connection. `Ok(false)` when it did not park (busy,
    /// already parked, closing); the writer then serves on.
    ///
    /// # Errors
    /// The reason the files were found changed outside the writer (I13): the org must stop.
    pub(crate) async fn park(&self, shipped: u64) -> Result<bool, String> {
        let (tx, rx) = oneshot::channel();
        {
            let mut q = lock(&self.org.queue);
            if !q.open || q.stopped || !q.accepting || q.parked {
                return Ok(false);
            }
            if !q.jobs.is_empty() || q.scheduled.is_set() {
                return Ok(false);
            }
            q.parked = true;
            q.jobs.push_back(Job::Park { shipped, reply: tx });
            if q.scheduled.claim() {
                drop(q);
                self.pool.schedule(self.org.clone());
            }
        }
        let refused = match rx.await {
            Ok(Ok(())) => return Ok(true),
            Ok(Err(ParkRefused::Foreign(reason))) => return Err(reason),
            Ok(Err(ParkRefused::Busy(reason))) => reason,
            Err(_) => "the writer has stopped".to_owned(),
        };
        tracing::debug!(reason = %refused, "park refused; the writer serves on");
        lock(&self.org.queue).parked = false;
        Ok(false)
    }

    /// Reopens a parked writer's connection on the pool and returns the descriptors of its
    /// files. Requests stay refused until [`Writer::activate`]: the caller first proves the
    /// file is the chain's tip through these descriptors.
    ///
    /// # Errors
    /// Why the connection could not be reopened (the org must stop: the file's state is
    /// unknown).
    pub(crate) async fn unpark(&self) -> Result<Arc<OwnedFiles>, String> {
        let (tx, rx) = oneshot::channel();
        if !self.push(Job::Unpark { reply: tx }, false) {
            return Err("the writer has stopped".into());
        }
        rx.await
            .unwrap_or_else(|_| Err("the writer has stopped".into()))
    }

    /// Serves requests again after an unpark whose file was proven.
    pub(crate) fn activate(&self) {
        lock(&self.org.queue).parked = false;
    }

    /// True while requests are accepted.
    pub(crate) fn accepting(&self) -> bool {
        let q = lock(&self.org.queue);
        q.accepting && q.open
    }

    /// Refuses new requests from now on ([`Refused::Closed`]); the jobs already queued still
    /// run. For a stop that cannot wait ([`crate::Registry`]'s drop).
    pub(crate) fn refuse(&self) {
        lock(&self.org.queue).accepting = false;
    }

    /// Refuses new requests and waits until every request queued before runs: after it, the
    /// commit sequence covers them all. False when the writer had stopped.
    pub(crate) async fn drain(&self) -> bool {
        let (tx, rx) = oneshot::channel();
        lock(&self.org.queue).accepting = false;
        // Queued as an internal job: captures may still follow it.
        let sent = self.push(Job::Drain { reply: tx }, false);
        sent && rx.await.is_ok()
    }

    /// Stops accepting jobs and waits until the ones queued have run and the connection is
    /// closed (before its descriptors, I13).
    pub(crate) async fn close(&self) {
        let schedule = {
            let mut q = lock(&self.org.queue);
            q.open = false;
            q.accepting = false;
            // An idle org is scheduled once more, so a worker closes its connection.
            q.scheduled.claim()
        };
        if schedule {
            self.pool.schedule(self.org.clone());
        }
        let mut closed = self.org.closed.subscribe();
        let _ = closed.wait_for(|c| *c).await;
    }
}

impl Task for OrgWriter {
    fn run_batch(&self, budget: usize) -> bool {
        let mut runner = lock(&self.runner);
        for _ in 0..budget {
            let job = {
                let mut q = lock(&self.queue);
                match q.jobs.pop_front() {
                    Some(job) => job,
                    None => {
                        if !q.open {
                            drop(q);
                            self.finish(&mut runner);
                            q = lock(&self.queue);
                        }
                        q.scheduled.release();
                        return false;
                    }
                }
            };
            let Some(r) = runner.as_mut() else {
                // Stopped after a panic: the job's reply sender is dropped (`WriterGone`).
                drop(job);
                continue;
            };
            // `apply` and reads catch their own panics; anything else that panics leaves
            // this connection in a state nobody checked, so the org's writer stops (as its
            // own thread used to die) and the worker goes on with other orgs.
            if catch_unwind(AssertUnwindSafe(|| r.run(job))).is_err() {
                tracing::error!(
                    round = r.ctx.round,
                    "a writer job panicked; the org's writer stops"
                );
                let dropped = {
                    let mut q = lock(&self.queue);
                    q.stopped = true;
                    std::mem::take(&mut q.jobs)
                };
                drop(dropped);
                self.finish(&mut runner);
            }
        }
        let mut q = lock(&self.queue);
        if q.jobs.is_empty() && q.open {
            q.scheduled.release();
            false
        } else {
            // More jobs, or a close to finish: the pool runs this org again in turn.
            true
        }
    }
}

impl OrgWriter {
    /// Closes the connection (it drops before the descriptors it owns, I13) and tells
    /// `close` it is done.
    fn finish(&self, runner: &mut Option<Runner>) {
        drop(runner.take());
        self.closed.send_replace(true);
    }
}

#[async_trait::async_trait]
impl idem_replica::CaptureSource for Writer {
    async fn capture(&self, request: CaptureRequest) -> Result<Captured, CaptureError> {
        let (tx, rx) = oneshot::channel();
        // Captures run while draining; the sender is never held across an await.
        let sent = self.push(Job::Capture { request, reply: tx }, false);
        match if sent { rx.await.ok() } else { None } {
            Some(out) => out,
            None => Err(CaptureError::Io(std::io::Error::other(
                "the writer has stopped",
            ))),
        }
    }
}

/// What the writer thread needs besides its connection.
pub(crate) struct WriterCtx {
    pub round: u64,
    pub commit_seq: Arc<CommitSeq>,
    pub clock: Arc<dyn idem::Clock>,
    /// How to reopen the connection after a park, as it was opened.
    pub reopen: Reopen,
}

/// The arguments of [`open`], kept to reopen a parked writer the same way.
pub(crate) struct Reopen {
    pub path: std::path::PathBuf,
    pub busy: Duration,
    pub cache_kib: u64,
    pub init: Option<InitFn>,
    pub durability: sqlite::Durability,
}
