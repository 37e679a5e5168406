//! The org's writer: the one SQLite connection that writes, on its own thread, off the async
//! runtime, and the handle that queues jobs to it.
//!
//! Every write transaction also raises the commit sequence in the same transaction
//! ([`crate::commit`]), and every job raises the in-memory [`CommitSeq`] to the database's
//! before it replies, so an answer names exactly the commits it may depend on (I6).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use idem::{BoxError, Options, Outcome, Record};
use idem_replica::sqlite::{self, CaptureError, CaptureRequest, Captured, OwnError, Owned};
use rusqlite::{Connection, Transaction};
use tokio::sync::oneshot;

use crate::commit::{self, Answer, CommitSeq};

/// The boxed `apply` closure of a request.
pub(crate) type ApplyFn =
    Box<dyn FnOnce(&Transaction<'_>) -> Result<Vec<u8>, BoxError> + Send + 'static>;

/// A hook run on the writer connection when an org is opened (application schema).
pub type InitFn = Arc<dyn Fn(&Connection) -> rusqlite::Result<()> + Send + Sync>;

/// Where a job sends its answer.
pub(crate) type Reply<T> = oneshot::Sender<Result<Answer<T>, idem::Error>>;

/// A boxed read: runs on the writer connection between two jobs and sends its own typed
/// result (a panic drops the sender). A transaction it leaves open is rolled back.
pub(crate) type ReadFn = Box<dyn FnOnce(&mut Connection) + Send + 'static>;

pub(crate) enum Job {
    Once {
        key: String,
        opts: Options,
        apply: ApplyFn,
        reply: Reply<Outcome>,
    },
    Applied {
        key: String,
        reply: Reply<Option<Record>>,
    },
    Prune {
        cutoff: SystemTime,
        reply: Reply<u64>,
    },
    /// `VACUUM` the database, then raise the commit sequence.
    Vacuum { reply: Reply<()> },
    /// External-effect work (`crate::effect`).
    Effect(crate::effect::EffectJob),
    /// Copy what the next ship publishes, between two transactions.
    Capture {
        request: CaptureRequest,
        reply: oneshot::Sender<Result<Captured, CaptureError>>,
    },
    /// A read on the writer connection (`Org::read`).
    Read { read: ReadFn, reply: Reply<()> },
    /// Answers once every job queued before it has run: the drain before a release.
    Drain { reply: oneshot::Sender<()> },
}

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
/// runs the application's hook, then takes the descriptors the shipper reads through.
pub(crate) fn open(
    path: &std::path::Path,
    busy: Duration,
    init: Option<&InitFn>,
) -> Result<Owned, OpenError> {
    let conn = sqlite::open_exclusive(path, busy)?;
    conn.execute_batch(commit::SCHEMA)?;
    idem::ensure_schema(&conn)?;
    if let Some(init) = init {
        init(&conn)?;
    }
    Ok(Owned::take(conn, path, busy)?)
}

/// The handle on the writer thread: its job queue, whether it still accepts requests, and
/// the thread to join.
pub(crate) struct Writer {
    jobs: Mutex<Option<Sender<Job>>>,
    /// False once a drain began: requests are refused, captures still run. Read and written
    /// under the `jobs` lock, so no request is queued behind the drain.
    accepting: AtomicBool,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Writer {
    /// Starts the writer thread on `owned`.
    pub(crate) fn spawn(name: String, owned: Owned, ctx: WriterCtx) -> std::io::Result<Writer> {
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || run(owned, ctx, rx))?;
        Ok(Writer {
            jobs: Mutex::new(Some(tx)),
            accepting: AtomicBool::new(true),
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Queues a request's job; false when the writer is draining or stopped.
    pub(crate) fn request(&self, job: Job) -> bool {
        let jobs = lock(&self.jobs);
        self.accepting.load(Ordering::SeqCst) && jobs.as_ref().is_some_and(|j| j.send(job).is_ok())
    }

    /// Queues a shipper's job (captures run while draining); false when stopped. Never holds
    /// the sender across an await.
    fn internal(&self, job: Job) -> bool {
        lock(&self.jobs)
            .as_ref()
            .is_some_and(|j| j.send(job).is_ok())
    }

    /// True while requests are accepted.
    pub(crate) fn accepting(&self) -> bool {
        self.accepting.load(Ordering::SeqCst) && lock(&self.jobs).is_some()
    }

    /// Refuses new requests and waits until every request queued before runs: after it, the
    /// commit sequence covers them all. False when the writer had stopped.
    pub(crate) async fn drain(&self) -> bool {
        let (tx, rx) = oneshot::channel();
        let sent = {
            let jobs = lock(&self.jobs);
            self.accepting.store(false, Ordering::SeqCst);
            jobs.as_ref()
                .is_some_and(|j| j.send(Job::Drain { reply: tx }).is_ok())
        };
        sent && rx.await.is_ok()
    }

    /// Stops accepting jobs and waits for the thread to finish the queued ones (the
    /// connection closes before its descriptors, I13).
    pub(crate) async fn close(&self) {
        drop(lock(&self.jobs).take());
        let thread = lock(&self.thread).take();
        if let Some(t) = thread {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
    }
}

#[async_trait::async_trait]
impl idem_replica::CaptureSource for Writer {
    async fn capture(&self, request: CaptureRequest) -> Result<Captured, CaptureError> {
        let (tx, rx) = oneshot::channel();
        let sent = self.internal(Job::Capture { request, reply: tx });
        match if sent { rx.await.ok() } else { None } {
            Some(out) => out,
            None => Err(CaptureError::Io(std::io::Error::other(
                "the writer thread has stopped",
            ))),
        }
    }
}

/// What the writer thread needs besides its connection.
pub(crate) struct WriterCtx {
    pub round: u64,
    pub commit_seq: Arc<CommitSeq>,
    pub clock: Arc<dyn idem::Clock>,
}

/// After a job: when it committed something without raising the sequence (a failed attempt
/// counted, a prune), commits one bump, so that state ships before any answer that read it;
/// then raises `seq` to the database's, before the job's reply. `total_changes` also counts
/// rolled-back writes, so this may bump once too often — a page more in a ship, never a
/// commit missed. Returns the sequence the reply carries: every commit so far.
fn settle(conn: &mut Connection, seq: &CommitSeq, changes_before: u64, seq_before: u64) -> u64 {
    let now = commit::read(conn).unwrap_or(0);
    if conn.total_changes() != changes_before && now <= seq_before {
        let bumped = conn.transaction().and_then(|tx| {
            let n = commit::bump(&tx)?;
            tx.commit()?;
            Ok(n)
        });
        match bumped {
            Ok(n) => {
                seq.raise(n);
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not raise the commit sequence after a write")
            }
        }
    }
    seq.raise(now)
}

fn answer<T>(out: Result<T, idem::Error>, commit_seq: u64) -> Result<Answer<T>, idem::Error> {
    out.map(|value| Answer { value, commit_seq })
}

/// Runs jobs until every sender is dropped.
fn run(mut owned: Owned, ctx: WriterCtx, jobs: Receiver<Job>) {
    let WriterCtx {
        round,
        commit_seq: seq,
        clock,
    } = ctx;
    while let Ok(job) = jobs.recv() {
        // Where the job starts: SQLite's count of changed rows and the sequence (equal to the
        // database's between jobs: every job that moves it raises `seq` before it replies).
        let (changes, before) = (owned.conn.total_changes(), seq.get());
        let conn = &mut owned.conn;
        match job {
            Job::Once {
                key,
                opts,
                apply,
                reply,
            } => {
                let opts = opts.clock(clock.clone());
                // A panic in apply rolls its transaction back (the Transaction is dropped while
                // unwinding); catching it keeps the org's writer alive for other requests.
                let out = catch_unwind(AssertUnwindSafe(|| {
                    idem::once_with(conn, &key, round, &opts, |tx| {
                        let result = apply(tx)?;
                        commit::bump(tx)?;
                        Ok::<_, BoxError>(result)
                    })
                }))
                .unwrap_or_else(|_| {
                    Err(idem::Error::Apply {
                        key: key.clone(),
                        source: "apply panicked".into(),
                    })
                });
                // Every answer waits for every commit so far: a replay's or a refusal's key
                // row is among them.
                let _ = reply.send(answer(out, settle(conn, &seq, changes, before)));
            }
            Job::Applied { key, reply } => {
                let _ = reply.send(answer(idem::applied(conn, &key), seq.get()));
            }
            Job::Prune { cutoff, reply } => {
                let out = idem::prune(conn, cutoff);
                let _ = reply.send(answer(out, settle(conn, &seq, changes, before)));
            }
            Job::Vacuum { reply } => {
                let out = conn
                    .execute_batch("VACUUM")
                    .and_then(|()| {
                        let tx = conn.transaction()?;
                        let n = commit::bump(&tx)?;
                        tx.commit()?;
                        Ok(seq.raise(n))
                    })
                    .map(|n| Answer {
                        value: (),
                        commit_seq: n,
                    })
                    .map_err(idem::Error::from);
                let _ = reply.send(out);
            }
            Job::Effect(job) => crate::effect::run_job(conn, &seq, &clock, job),
            Job::Capture { request, reply } => {
                // The database's own sequence, not the in-memory one: a capture labels what
                // the pages hold, and the shipper checks the pages agree.
                let labels = commit::read(conn).and_then(|n| Ok((n, commit::root_page(conn)?)));
                let out = match labels {
                    Ok((n, page)) => {
                        seq.raise(n);
                        owned.capture(n, page, request)
                    }
                    Err(e) => Err(CaptureError::Io(std::io::Error::other(e))),
                };
                let _ = reply.send(out);
            }
            Job::Read { read, reply } => {
                let seen = seq.get();
                // A panic in the read drops its result sender: the caller sees it.
                let _ = catch_unwind(AssertUnwindSafe(|| read(conn)));
                if !conn.is_autocommit() {
                    let _ = conn.execute_batch("ROLLBACK");
                }
                let _ = reply.send(answer(Ok(()), seen));
            }
            Job::Drain { reply } => {
                let _ = reply.send(());
            }
        }
    }
}
