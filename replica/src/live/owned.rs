//! The writer's own files (I13): the org database and its WAL, held exclusively by the writer
//! connection and read by the shipper through descriptors that outlive it.
//!
//! SQLite's locks are POSIX advisory locks. They belong to the process and the inode, and
//! closing *any* descriptor of the inode in the process drops *all* of them ("How To Corrupt
//! An SQLite Database File", section 2.2). So:
//!
//! - the writer connection runs with `locking_mode = EXCLUSIVE` and takes its write lock when
//!   it opens: another process that opens the database gets "database is locked" and can
//!   neither read, write, checkpoint, nor delete the WAL on close (there is no `-shm`: the
//!   WAL index lives in the writer's heap);
//! - the shipper reads the database and WAL through the two descriptors opened here, right
//!   after the writer connection took its lock. They are closed only after the connection is
//!   closed ([`super::Owned`] drops the connection first, and every [`OwnedFiles`] clone is
//!   dropped after it), so a read never drops a lock SQLite holds. No other code in the
//!   serving process opens these files;
//! - since the paths can still be unlinked or renamed over, and the bytes written by a process
//!   that ignores locks, every capture checks that the names still lead to these inodes and
//!   that the database file is exactly as the writer's last checkpoint left it (in WAL mode
//!   only a checkpoint writes it). Anything else is [`Foreign`]: the org is poisoned.

use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Another process (or a file operation outside SQLite) changed the org's files; what was
/// seen. The org must stop serving: nothing captured from these files may be acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Foreign(pub(crate) String);

impl std::fmt::Display for Foreign {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The state of the database file that only the writer's own checkpoints change: inode,
/// size and change times (nanoseconds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DbState {
    ino: u64,
    len: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl DbState {
    /// The file's length in bytes.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    fn of(m: &std::fs::Metadata) -> DbState {
        DbState {
            ino: m.ino(),
            len: m.len(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
            ctime_ns: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
        }
    }
}

/// Read-only descriptors of the writer's database and WAL, opened while the writer holds
/// its exclusive lock and never closed before the writer connection (see the module docs).
#[derive(Debug)]
pub struct OwnedFiles {
    db_path: PathBuf,
    wal_path: PathBuf,
    db: File,
    wal: File,
    ids: [(u64, u64); 2],
    /// The database file as the writer's last checkpoint left it (kept by the writer
    /// thread's `Watch`), so a confirmation can check it too.
    expected: std::sync::Mutex<Option<DbState>>,
}

fn id(m: &std::fs::Metadata) -> (u64, u64) {
    (m.dev(), m.ino())
}

/// The WAL file's path for a database path.
pub(crate) fn wal_path(db: &Path) -> PathBuf {
    let mut p = db.as_os_str().to_owned();
    p.push("-wal");
    PathBuf::from(p)
}

impl OwnedFiles {
    /// Opens the descriptors. Call only once the writer connection holds its exclusive lock
    /// and has created the WAL.
    ///
    /// # Errors
    /// The I/O error of opening either file (a missing WAL included).
    pub(crate) fn open(db_path: &Path) -> std::io::Result<OwnedFiles> {
        // The WAL first: SQLite keeps no lock on it, so dropping it on an error is harmless.
        // The database descriptor is opened last, after every fallible step, so no error path
        // closes it while the connection is open.
        let wal_path = wal_path(db_path);
        let wal = File::open(&wal_path)?;
        let wal_id = id(&wal.metadata()?);
        let db_id = id(&std::fs::metadata(db_path)?);
        let db = File::open(db_path)?;
        let ids = [db_id, wal_id];
        Ok(OwnedFiles {
            db_path: db_path.to_owned(),
            wal_path,
            db,
            wal,
            ids,
            expected: std::sync::Mutex::new(None),
        })
    }

    /// Records the database file's state after the writer's own open or checkpoint.
    pub(crate) fn expect(&self, state: DbState) {
        *idem_base::lock(&self.expected) = Some(state);
    }

    /// The checks a capture makes on the files, for answers that ship nothing (replays,
    /// reads, refusals): the names lead to the writer's inodes and the database file is as
    /// its last checkpoint left it. Callers hold the org's ship lock, so no checkpoint runs
    /// meanwhile.
    pub(crate) fn check_unchanged(&self) -> Result<(), Foreign> {
        self.check_names()?;
        let expected = *idem_base::lock(&self.expected);
        match expected {
            Some(state) => self.check_db(state),
            None => Ok(()),
        }
    }

    /// The database file's path.
    pub fn db_path(&self) -> &Path {
        &self.db_path
    }

    /// Checks that both paths still name the files the writer has open (`stat` only: no
    /// descriptor is opened).
    pub(crate) fn check_names(&self) -> Result<(), Foreign> {
        for (path, want, what) in [
            (&self.db_path, self.ids[0], "database"),
            (&self.wal_path, self.ids[1], "WAL"),
        ] {
            match std::fs::metadata(path) {
                Ok(m) if id(&m) == want => {}
                Ok(_) => return Err(Foreign(format!("the {what} file was replaced"))),
                Err(e) => return Err(Foreign(format!("the {what} file is gone ({e})"))),
            }
        }
        Ok(())
    }

    /// The database file's current state.
    ///
    /// # Errors
    /// The I/O error of `fstat`.
    pub(crate) fn db_state(&self) -> std::io::Result<DbState> {
        Ok(DbState::of(&self.db.metadata()?))
    }

    /// Checks the database file is still in `want` (as the writer's last checkpoint left it).
    pub(crate) fn check_db(&self, want: DbState) -> Result<(), Foreign> {
        match self.db_state() {
            Ok(now) if now == want => Ok(()),
            Ok(now) => Err(Foreign(format!(
                "the database file changed outside the writer's checkpoints \
                 ({} bytes, was {})",
                now.len, want.len
            ))),
            Err(e) => Err(Foreign(format!(
                "the database file cannot be examined ({e})"
            ))),
        }
    }

    /// The WAL file's current length in bytes.
    ///
    /// # Errors
    /// The I/O error of `fstat`.
    pub(crate) fn wal_len(&self) -> std::io::Result<u64> {
        Ok(self.wal.metadata()?.len())
    }

    /// Reads the WAL bytes `[from, to)`.
    ///
    /// # Errors
    /// The I/O error of the read (a WAL shorter than `to` included).
    pub(crate) fn read_wal(&self, from: u64, to: u64) -> std::io::Result<Vec<u8>> {
        read_range(&self.wal, from, to)
    }

    /// Reads the database file bytes `[from, to)`.
    ///
    /// # Errors
    /// The I/O error of the read (a file shorter than `to` included).
    pub(crate) fn read_db(&self, from: u64, to: u64) -> std::io::Result<Vec<u8>> {
        read_range(&self.db, from, to)
    }
}

fn read_range(f: &File, from: u64, to: u64) -> std::io::Result<Vec<u8>> {
    let len = usize::try_from(to.saturating_sub(from)).map_err(std::io::Error::other)?;
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, from)?;
    Ok(buf)
}
