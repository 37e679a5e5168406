//! The live database (public as `idem_replica::sqlite`): the writer's exclusive ownership of
//! a database and its WAL (I13), WAL frames, captures of committed state, the commit counter
//! ([`commit`]) and the proof a capture makes from its own pages; page 1 and page-size rules
//! (`pages`); and the [`crate::Shipper`] that publishes captures (`shipper/`). Checking and
//! installing an image a hydrate rebuilt is `rebuild/` (`check.rs`, `install.rs`).
//!
//! An embedder that ships a live database does three things here, in order:
//! 1. [`open_exclusive`] opens the one writer connection and takes the database's lock;
//! 2. after its own schema work, [`Owned::take`] opens the descriptors the shipper reads
//!    through and starts watching the files;
//! 3. between two of its transactions, on the thread that owns the connection, it answers a
//!    [`crate::Shipper`]'s [`CaptureRequest`] with [`Owned::capture`].

mod capture;
pub mod commit;
mod owned;
pub(crate) mod proof;
pub(crate) mod shipper;
pub(crate) mod wal;

use std::sync::Arc;
use std::time::Duration;

use rusqlite::Connection;

pub use capture::{CaptureError, CaptureRequest, Captured, Checkpoint};
pub(crate) use capture::{file_changes, file_is, read_pages};
pub(crate) use owned::DbState;
pub use owned::{Foreign, OwnedFiles};

/// Why the writer connection could not be opened as the files' owner.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OwnError {
    /// SQLite refused a step of the open.
    #[error("sqlite")]
    Sqlite(#[from] rusqlite::Error),
    /// The connection is not in exclusive WAL mode (a hook changed it, or the file system
    /// cannot give it).
    #[error("the writer connection does not hold the database exclusively: {0}")]
    Mode(String),
    /// Opening the descriptors or reading the files' state failed.
    #[error("the writer's files")]
    Io(#[from] std::io::Error),
    /// An installed image failed `quick_check` ([`open_installed`]): nothing was written to
    /// it, and it must not be served.
    #[error("the installed image")]
    Corrupt(#[source] Box<crate::Error>),
}

/// How much of a writer's local file must survive the host (not the process): the store is
/// the authority either way (I8), so this only decides what a crash of the host costs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// `synchronous = NORMAL`: the WAL and the file are fsynced at checkpoints, so a file
    /// kept at release survives the host for a later acquire to resume from.
    #[default]
    Synced,
    /// A cache for this process's lifetime, never kept at release nor resumed (a journal
    /// tenure's file, `docs/design.md` 3g): `synchronous = OFF`, set before the switch to
    /// WAL, so neither that switch, nor a checkpoint, nor a commit fsyncs. The OS page cache
    /// keeps every reader in this process consistent; a host crash leaves at most a torn
    /// file, which the next acquire on the host deletes before it hydrates.
    Volatile,
}

/// Opens `path` as its one writer: `locking_mode = EXCLUSIVE` before the first access, WAL,
/// `synchronous` by `durability`, `wal_autocheckpoint = 0`, and takes the write lock at once.
///
/// With exclusive locking the WAL index lives in this connection's heap (no `-shm` file) and
/// the lock is held for the connection's lifetime: another process opening the file gets
/// "database is locked" and can neither read, write, checkpoint nor remove the WAL.
/// `synchronous = NORMAL` at most ([`Durability`]): a commit is made durable across machines
/// by the ship that acknowledges it, and the local file is a per-claim cache. `wal_autocheckpoint = 0`: only
/// a capture checkpoints, so no frame leaves the WAL before a ship has copied it.
///
/// # Errors
/// [`OwnError::Sqlite`] when SQLite refuses (the lock is held elsewhere included);
/// [`OwnError::Mode`] when the connection is not in exclusive WAL mode.
pub fn open_exclusive(
    path: &std::path::Path,
    busy: Duration,
    durability: Durability,
) -> Result<Connection, OwnError> {
    exclusive(Connection::open(path)?, busy, durability, None)
}

/// [`open_exclusive`] on an image a hydrate installed without checking it (a
/// [`Durability::Volatile`] install, [`crate::journal::JournalShipper::install`]): the
/// connection runs `quick_check` once it holds the file exclusively and before anything
/// writes to it (the switch to WAL included), so the check is the install's own (I10) on
/// the connection that serves the file, not on one opened only for it. `what` names the
/// image in the error.
///
/// # Errors
/// [`OwnError::Corrupt`] ([`crate::Error::Corrupt`] inside) when `quick_check` finds
/// anything, the file then unchanged; as [`open_exclusive`].
pub fn open_installed(
    path: &std::path::Path,
    busy: Duration,
    durability: Durability,
    what: &str,
) -> Result<Connection, OwnError> {
    use rusqlite::OpenFlags;
    // No CREATE flag: the install put the file there; a missing one is an error.
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_URI
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    exclusive(
        Connection::open_with_flags(path, flags)?,
        busy,
        durability,
        Some(what),
    )
}

/// Reopens the closed database at `path` as its one writer, as [`open_exclusive`] does,
/// after a writer of this claim closed it ([`Owned::checkpoint_to_file`]): the file must
/// still exist (it is never created), and once the connection holds its lock the WAL must
/// be empty. A WAL with frames was written by someone else while no connection held the
/// file, and SQLite would show its frames to this connection without them ever touching
/// the database file, so the caller's check of the file against the chain's tip
/// ([`crate::Shipper::unpark`], [`crate::journal::JournalShipper::unpark`]) could not see
/// them.
///
/// # Errors
/// [`ReopenError::Foreign`] for a missing database file or a WAL with frames;
/// [`ReopenError::Own`] when SQLite refuses the open (the lock is held elsewhere
/// included).
pub fn reopen_exclusive(
    path: &std::path::Path,
    busy: Duration,
    durability: Durability,
) -> Result<Connection, ReopenError> {
    use rusqlite::OpenFlags;
    // No CREATE flag: a missing file is an error, never a new empty database.
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_URI
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = match Connection::open_with_flags(path, flags) {
        Ok(conn) => conn,
        Err(_) if !path.exists() => {
            return Err(ReopenError::Foreign(Foreign(
                "the parked database file is gone".into(),
            )));
        }
        Err(e) => return Err(ReopenError::Own(e.into())),
    };
    let conn = exclusive(conn, busy, durability, None).map_err(ReopenError::Own)?;
    match std::fs::metadata(owned::wal_path(path)) {
        Ok(m) if m.len() > 0 => Err(ReopenError::Foreign(Foreign(format!(
            "a WAL of {} bytes appeared beside the parked database file",
            m.len()
        )))),
        _ => Ok(conn),
    }
}

/// Why a parked database could not be reopened by [`reopen_exclusive`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReopenError {
    /// The files were changed while no connection held them: the org must stop.
    #[error("{0}")]
    Foreign(Foreign),
    /// The open itself failed.
    #[error("reopening the database")]
    Own(#[source] OwnError),
}

/// `check`: run `quick_check` (naming the image so) as the first access to the file.
fn exclusive(
    conn: Connection,
    busy: Duration,
    durability: Durability,
    check: Option<&str>,
) -> Result<Connection, OwnError> {
    conn.busy_timeout(busy)?;
    let synchronous = match durability {
        Durability::Synced => "NORMAL",
        Durability::Volatile => "OFF",
    };
    // Exclusive locking before anything else: a first access in shared mode opens a `-shm`
    // index beside a file already in WAL mode (a reopened parked file), and keeps its
    // descriptor. Then `synchronous`, before the switch to WAL, which writes page 1 through
    // a rollback journal when the file is in rollback mode. An install's check is the
    // first access: it only reads, and nothing has written yet.
    let locking: String = conn.query_row("PRAGMA locking_mode = EXCLUSIVE", [], |r| r.get(0))?;
    conn.execute_batch(&format!("PRAGMA synchronous = {synchronous}"))?;
    if let Some(what) = check {
        quick_check(&conn, what)?;
    }
    let journal: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    check_mode(&locking, &journal)?;
    conn.execute_batch("PRAGMA wal_autocheckpoint = 0; BEGIN IMMEDIATE; COMMIT;")?;
    Ok(conn)
}

/// `quick_check` on a connection that holds the file exclusively: a finding, or an error
/// SQLite gives for a damaged file (`SQLITE_CORRUPT`, `SQLITE_NOTADB`, at the schema read
/// or the check), is [`OwnError::Corrupt`] naming `what`; any other error (a lock held
/// elsewhere, I/O, memory) is [`OwnError::Sqlite`], as on any other step of the open.
fn quick_check(conn: &Connection, what: &str) -> Result<(), OwnError> {
    use rusqlite::ErrorCode::{DatabaseCorrupt, NotADatabase};
    let corrupt = |reason: String| OwnError::Corrupt(Box::new(crate::Error::corrupt(what, reason)));
    let rows: rusqlite::Result<Vec<String>> = conn
        .prepare("PRAGMA quick_check")
        .and_then(|mut stmt| stmt.query_map([], |r| r.get(0))?.collect());
    match rows {
        Ok(rows) if rows.len() == 1 && rows[0] == "ok" => Ok(()),
        Ok(rows) => Err(corrupt(format!("quick_check: {}", rows.join("; ")))),
        Err(e) if matches!(e.sqlite_error_code(), Some(DatabaseCorrupt | NotADatabase)) => {
            Err(corrupt(format!("quick_check: {e}")))
        }
        Err(e) => Err(OwnError::Sqlite(e)),
    }
}

fn check_mode(locking: &str, journal: &str) -> Result<(), OwnError> {
    if locking.eq_ignore_ascii_case("exclusive") && journal.eq_ignore_ascii_case("wal") {
        Ok(())
    } else {
        Err(OwnError::Mode(format!(
            "locking mode {locking}, journal mode {journal}"
        )))
    }
}

/// The writer connection and what captures read. Fields drop in declaration order: the
/// connection closes (releasing its locks) before the descriptors (I13).
pub struct Owned {
    /// The writer connection: the only connection that writes the database.
    pub conn: Connection,
    capturer: capture::Capturer,
}

impl Owned {
    /// Takes ownership of the files of `conn` (opened with [`open_exclusive`]) after the
    /// embedder's schema work: re-checks exclusive WAL mode (a hook may have changed it),
    /// turns automatic checkpoints off again, opens the descriptors the shipper reads
    /// through (the database's last, after every step that can fail) and records the files'
    /// state, so every later capture can tell the writer's changes from anyone else's.
    ///
    /// # Errors
    /// [`OwnError::Mode`] for a connection no longer in exclusive WAL mode; SQLite or I/O
    /// errors; a damaged WAL header is [`OwnError::Io`].
    pub fn take(
        conn: Connection,
        path: &std::path::Path,
        busy: Duration,
    ) -> Result<Owned, OwnError> {
        conn.execute_batch("PRAGMA wal_autocheckpoint = 0;")?;
        let locking: String = conn.query_row("PRAGMA locking_mode", [], |r| r.get(0))?;
        let journal: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
        check_mode(&locking, &journal)?;
        let files = Arc::new(OwnedFiles::open(path)?);
        let capturer = capture::Capturer::new(files, busy).map_err(|e| match e {
            CaptureError::Io(e) => OwnError::Io(e),
            CaptureError::Foreign(f) => OwnError::Io(std::io::Error::other(f.0)),
        })?;
        Ok(Owned { conn, capturer })
    }

    /// The descriptors the shipper reads through; clones must not outlive this value's
    /// connection by being dropped before it (they are read-only and closed last).
    pub fn files(&self) -> &Arc<OwnedFiles> {
        self.capturer.files()
    }

    /// Checkpoints every frame of the WAL into the database file (`TRUNCATE`) after the
    /// checks a capture makes (names, the file as the last checkpoint left it, the WAL's
    /// generation), so that once this value is dropped (the connection closes before the
    /// descriptors) the database file alone holds the state and no WAL remains: what a
    /// writer does before it parks. Run it only when every committed frame was shipped.
    ///
    /// # Errors
    /// [`CaptureError::Foreign`] when the files are not as the writer left them;
    /// [`CaptureError::Io`] when the checkpoint left frames in the WAL or an I/O step failed
    /// (the connection stays usable).
    pub fn checkpoint_to_file(&mut self) -> Result<(), CaptureError> {
        self.capturer.checkpoint_all(&self.conn)
    }

    /// Captures what the next ship publishes, between two transactions of the writer
    /// connection. The capture takes the commit counter ([`commit::read`]) and the root page
    /// of its table ([`commit::root_page`]) from the connection it holds, so the label is
    /// what the database holds now; the shipper reads the counter back from the captured
    /// pages before it publishes (I13).
    ///
    /// # Errors
    /// [`CaptureError::Foreign`] when the files are not as the writer left them;
    /// [`CaptureError::Io`] for a local failure, including a database without the counter
    /// table.
    pub fn capture(&mut self, request: CaptureRequest) -> Result<Captured, CaptureError> {
        let label = |e: rusqlite::Error| CaptureError::Io(std::io::Error::other(e));
        let commit_seq = commit::read(&self.conn).map_err(label)?;
        let counter_page = commit::root_page(&self.conn).map_err(label)?;
        self.capturer
            .capture(&self.conn, commit_seq, counter_page, request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reopened file is already in WAL mode: a first access in shared locking would open a
    /// `-shm` index and keep its descriptor for the connection's life (one more descriptor
    /// per active org). Exclusive locking comes first, so no `-shm` is ever created.
    #[test]
    fn a_reopened_wal_file_gets_no_shm_index() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("db");
        let busy = Duration::from_millis(100);
        for durability in [Durability::Synced, Durability::Volatile] {
            let conn = open_exclusive(&path, busy, durability)?;
            conn.execute_batch("CREATE TABLE IF NOT EXISTS t(x); INSERT INTO t VALUES (1);")?;
            conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")?;
            drop(conn);
            let conn = reopen_exclusive(&path, busy, durability)?;
            let n: i64 = conn.query_row("SELECT count(*) FROM t", [], |r| r.get(0))?;
            assert!(n >= 1);
            let shm = dir.path().join("db-shm");
            assert!(
                !shm.exists(),
                "{durability:?}: a -shm index beside {path:?}"
            );
        }
        Ok(())
    }

    /// An image installed unchecked (a volatile install) is checked by the writer's own
    /// connection before anything writes to it: a structurally damaged one is a typed
    /// `Corrupt` error, and the file is left byte for byte as installed, with no WAL.
    #[test]
    fn an_installed_image_is_checked_before_anything_writes_it()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("db");
        {
            let conn = Connection::open(&path)?;
            conn.execute_batch(
                "PRAGMA page_size = 4096; CREATE TABLE t(x);
                 WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300)
                 INSERT INTO t SELECT randomblob(200) FROM n;",
            )?;
        }
        // Page 1 in WAL mode, as a volatile install leaves it.
        let mut image = std::fs::read(&path)?;
        image[18] = 2;
        image[19] = 2;
        std::fs::write(&path, &image)?;
        let busy = Duration::from_millis(100);
        let good = open_installed(&path, busy, Durability::Volatile, "the good image")?;
        let n: i64 = good.query_row("SELECT count(*) FROM t", [], |r| r.get(0))?;
        assert_eq!(n, 300);
        drop(good);
        assert!(
            !dir.path().join("db-shm").exists(),
            "a -shm index beside a checked open"
        );
        let _ = std::fs::remove_file(dir.path().join("db-wal"));
        // Page 2 is t's root: its cell pointers now point past the page.
        let mut damaged = std::fs::read(&path)?;
        for b in &mut damaged[4096 + 12..4096 + 64] {
            *b = 0xff;
        }
        std::fs::write(&path, &damaged)?;
        match open_installed(&path, busy, Durability::Volatile, "the damaged image") {
            Err(OwnError::Corrupt(e)) => {
                assert!(
                    matches!(*e, crate::Error::Corrupt { ref path, .. } if path == "the damaged image"),
                    "{e:?}"
                );
            }
            other => panic!("expected a Corrupt error, got {:?}", other.map(|_| ())),
        }
        assert_eq!(
            std::fs::read(&path)?,
            damaged,
            "the damaged file was written"
        );
        let wal = dir.path().join("db-wal");
        assert!(
            !wal.exists() || std::fs::metadata(&wal)?.len() == 0,
            "a WAL with frames beside the damaged file"
        );
        Ok(())
    }
}
