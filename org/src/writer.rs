//! The org's writer thread: the one SQLite connection that writes, run off the async runtime.
//!
//! Every write transaction that applies a key also bumps the commit counter in
//! `idem_org_commit`, inside the same transaction, so a snapshot that reads the counter in its
//! own read transaction knows exactly which commits it holds (I6).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use idem::{BoxError, Options, Outcome, Record};
use rusqlite::{Connection, Transaction};
use tokio::sync::oneshot;

use crate::capture::{CaptureError, Captured, Checkpoint, Watch};
use crate::owned::{Opened, OwnedFiles};

/// The boxed `apply` closure of a request.
pub(crate) type ApplyFn =
    Box<dyn FnOnce(&Transaction<'_>) -> Result<Vec<u8>, BoxError> + Send + 'static>;

/// A hook run on the writer connection when an org is opened (application schema).
pub type InitFn = Arc<dyn Fn(&Connection) -> rusqlite::Result<()> + Send + Sync>;

pub(crate) enum Job {
    Once {
        key: String,
        opts: Options,
        apply: ApplyFn,
        reply: oneshot::Sender<Result<(Outcome, u64), idem::Error>>,
    },
    Applied {
        key: String,
        reply: oneshot::Sender<Result<(Option<Record>, u64), idem::Error>>,
    },
    Prune {
        cutoff: SystemTime,
        reply: oneshot::Sender<Result<(u64, u64), idem::Error>>,
    },
    /// `VACUUM` the database, then bump the commit counter.
    Vacuum {
        reply: oneshot::Sender<Result<u64, idem::Error>>,
    },
    /// External-effect work (`crate::effect`).
    Effect(crate::effect::EffectJob),
    /// Copy the WAL for a ship (`crate::capture`), between two transactions.
    Capture {
        from: u64,
        checkpoint: Checkpoint,
        reply: oneshot::Sender<Result<Captured, CaptureError>>,
    },
    /// A read on the writer connection (`Org::read`); answers the commit counter it saw.
    Read {
        read: ReadFn,
        reply: oneshot::Sender<Result<u64, idem::Error>>,
    },
    /// Answers once every job queued before it has run (a drain before a release).
    Barrier { reply: oneshot::Sender<()> },
}

/// A boxed read: runs on the writer connection between two jobs and sends its own typed
/// result (a panic drops the sender). A transaction it leaves open is rolled back.
pub(crate) type ReadFn = Box<dyn FnOnce(&mut Connection) + Send + 'static>;

pub(crate) const COMMIT_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS idem_org_commit (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    n  INTEGER NOT NULL
);
INSERT OR IGNORE INTO idem_org_commit (id, n) VALUES (0, 0);";

/// Reads the commit counter (inside the caller's transaction, if any).
pub(crate) fn read_commit(conn: &Connection) -> rusqlite::Result<u64> {
    let n: i64 = conn
        .prepare_cached("SELECT n FROM idem_org_commit WHERE id = 0")?
        .query_row([], |r| r.get(0))?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// Where a job starts: SQLite's count of changed rows and the commit counter (`committed`
/// equals the database's counter between jobs: every job that moves it raises `committed`
/// before it replies).
fn mark(conn: &Connection, committed: &AtomicU64) -> (u64, u64) {
    (conn.total_changes(), committed.load(Ordering::SeqCst))
}

/// After a job: when it committed something without bumping the counter (a failed attempt
/// counted, a prune), commits one bump, so that state ships before any answer that read it;
/// then raises `committed` to the database's counter, before the job's reply. `total_changes`
/// also counts rolled-back writes, so this may bump once too often — a counter page more in
/// a ship, never a commit missed.
fn counted(conn: &mut Connection, committed: &AtomicU64, (changes, counter): (u64, u64)) {
    let now = read_commit(conn).unwrap_or(0);
    if conn.total_changes() != changes && now <= counter {
        let bumped = conn.transaction().and_then(|tx| {
            let n = bump_commit(&tx)?;
            tx.commit()?;
            Ok(n)
        });
        match bumped {
            Ok(n) => {
                committed.fetch_max(n, Ordering::SeqCst);
            }
            Err(e) => tracing::warn!(error = %e, "could not bump the commit counter after a write"),
        }
    }
    committed.fetch_max(now, Ordering::SeqCst);
}

fn bump_commit(tx: &Transaction<'_>) -> rusqlite::Result<u64> {
    let n: i64 = tx
        .prepare_cached("UPDATE idem_org_commit SET n = n + 1 WHERE id = 0 RETURNING n")?
        .query_row([], |r| r.get(0))?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// Opens the org's writer connection: exclusive locking, WAL, synchronous=NORMAL, no
/// automatic checkpoints, schema, commit counter; then the descriptors the shipper reads
/// through (I13).
///
/// `locking_mode = EXCLUSIVE` is set before the first access, so the WAL index lives in the
/// writer's heap (no `-shm` file) and the first write transaction takes the database's
/// exclusive lock for the connection's lifetime: another process opening the file gets
/// "database is locked" and can neither read, write, checkpoint, nor remove the WAL. The
/// writer takes that lock here, before it serves and before the descriptors are opened.
///
/// synchronous=NORMAL: a local commit is made durable across machines by the ship that
/// acknowledges it, and the local file is discarded on every re-acquire, so an fsync per
/// commit would buy nothing a request is acknowledged on. `wal_autocheckpoint = 0`: only a
/// capture checkpoints, so no frame leaves the WAL before a ship has copied it.
pub(crate) fn open_writer(
    path: &std::path::Path,
    busy_timeout: Duration,
    init: Option<&InitFn>,
) -> Result<Opened, OpenError> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(busy_timeout)?;
    let locking: String = conn.query_row("PRAGMA locking_mode = EXCLUSIVE", [], |r| r.get(0))?;
    let journal: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    if !locking.eq_ignore_ascii_case("exclusive") || !journal.eq_ignore_ascii_case("wal") {
        return Err(OpenError::Mode(format!(
            "locking mode {locking}, journal mode {journal}"
        )));
    }
    conn.execute_batch(
        "PRAGMA synchronous = NORMAL; PRAGMA wal_autocheckpoint = 0; BEGIN IMMEDIATE; COMMIT;",
    )?;
    conn.execute_batch(COMMIT_SCHEMA)?;
    idem::ensure_schema(&conn)?;
    if let Some(init) = init {
        init(&conn)?;
        // The hook may have changed what the writer's ownership rests on (I13): restore it,
        // and refuse a database it took out of exclusive WAL mode.
        conn.execute_batch("PRAGMA wal_autocheckpoint = 0;")?;
        let locking: String = conn.query_row("PRAGMA locking_mode", [], |r| r.get(0))?;
        let journal: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
        if !locking.eq_ignore_ascii_case("exclusive") || !journal.eq_ignore_ascii_case("wal") {
            return Err(OpenError::Mode(format!(
                "the open hook left locking mode {locking}, journal mode {journal}"
            )));
        }
    }
    let files = OwnedFiles::open(path).map_err(OpenError::Files)?;
    Ok(Opened {
        conn,
        files: Arc::new(files),
    })
}

/// Why the writer connection could not be opened.
#[derive(Debug)]
pub(crate) enum OpenError {
    Idem(idem::Error),
    Mode(String),
    Files(std::io::Error),
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

/// Runs jobs until every sender is dropped. `committed` is raised after each commit that
/// bumped the counter, before the reply, so a waiter never waits for less than it committed.
pub(crate) struct WriterCtx {
    pub round: u64,
    pub committed: Arc<AtomicU64>,
    pub clock: Arc<dyn idem::Clock>,
    pub busy: Duration,
}

pub(crate) fn run(
    mut opened: Opened,
    mut watch: Watch,
    ctx: WriterCtx,
    jobs: std::sync::mpsc::Receiver<Job>,
) {
    let WriterCtx {
        round,
        committed,
        clock,
        busy,
    } = ctx;
    // `opened` is used through its fields and dropped whole: the connection closes before
    // the descriptors (I13).
    let conn = &mut opened.conn;
    while let Ok(job) = jobs.recv() {
        match job {
            Job::Once {
                key,
                opts,
                apply,
                reply,
            } => {
                let before = mark(conn, &committed);
                let opts = opts.clock(clock.clone());
                // A panic in apply rolls its transaction back (the Transaction is dropped while
                // unwinding); catching it keeps the org's writer alive for other requests.
                let out = catch_unwind(AssertUnwindSafe(|| {
                    idem::once_with(conn, &key, round, &opts, |tx| {
                        let result = apply(tx)?;
                        bump_commit(tx)?;
                        Ok::<_, BoxError>(result)
                    })
                }))
                .unwrap_or_else(|_| {
                    Err(idem::Error::Apply {
                        key: key.clone(),
                        source: "apply panicked".into(),
                    })
                });
                counted(conn, &committed, before);
                // Every answer waits for every commit so far: a replay's or a refusal's key
                // row is among them.
                let _ = reply.send(out.map(|o| (o, committed.load(Ordering::SeqCst))));
            }
            Job::Applied { key, reply } => {
                let out = idem::applied(conn, &key).map(|r| (r, committed.load(Ordering::SeqCst)));
                let _ = reply.send(out);
            }
            Job::Prune { cutoff, reply } => {
                let before = mark(conn, &committed);
                let out = idem::prune(conn, cutoff);
                counted(conn, &committed, before);
                let n = committed.load(Ordering::SeqCst);
                let _ = reply.send(out.map(|deleted| (deleted, n)));
            }
            Job::Vacuum { reply } => {
                let out = conn
                    .execute_batch("VACUUM")
                    .and_then(|()| {
                        let tx = conn.transaction()?;
                        let n = bump_commit(&tx)?;
                        tx.commit()?;
                        committed.fetch_max(n, Ordering::SeqCst);
                        Ok(n)
                    })
                    .map_err(idem::Error::from);
                let _ = reply.send(out);
            }
            Job::Effect(job) => crate::effect::run_job(conn, &committed, &clock, job),
            Job::Capture {
                from,
                checkpoint,
                reply,
            } => {
                // The database's own counter, not the atomic: a capture must label what the
                // pages hold, and the proof then checks the pages agree.
                let commit = match read_commit(conn) {
                    Ok(n) => {
                        committed.fetch_max(n, Ordering::SeqCst);
                        n
                    }
                    Err(e) => {
                        let _ = reply.send(Err(CaptureError::Io(std::io::Error::other(e))));
                        continue;
                    }
                };
                let out = crate::capture::capture(
                    conn,
                    &opened.files,
                    &mut watch,
                    busy,
                    commit,
                    from,
                    checkpoint,
                );
                let _ = reply.send(out);
            }
            Job::Read { read, reply } => {
                let seen = committed.load(Ordering::SeqCst);
                // A panic in the read drops its result sender: the caller sees it.
                let _ = catch_unwind(AssertUnwindSafe(|| read(conn)));
                if !conn.is_autocommit() {
                    let _ = conn.execute_batch("ROLLBACK");
                }
                let _ = reply.send(Ok(seen));
            }
            Job::Barrier { reply } => {
                let _ = reply.send(());
            }
        }
    }
}
