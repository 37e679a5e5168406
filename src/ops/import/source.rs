//! What is beside the tenant's database, and so how it can be read without creating or
//! changing anything there.
//!
//! SQLite reads a WAL database through its shared-memory index (`FILE-shm`), and any reader,
//! read-only ones included, creates `FILE-wal` and `FILE-shm` when they are missing and leaves
//! them behind (a read-only connection cannot checkpoint, so it never deletes them). So:
//!
//! - a WAL database that some process has open (its `-shm` dead-man-switch byte is locked)
//!   is read through SQLite like any other reader does, which uses the `-wal` and `-shm` that
//!   exist and creates nothing ([`Plan::Sqlite`]);
//! - a WAL database no process has open (no `-shm`, or one nobody holds) is copied file by
//!   file, the database and its `-wal`, into the private directory, where SQLite recovers the
//!   log; the copy counts only if the files are unchanged afterwards ([`Plan::Files`]);
//! - a rollback-journal database without a `-wal` is read through SQLite: its readers create
//!   nothing ([`Plan::Sqlite`]).

use std::fs::{File, Metadata};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::error::ImportError;
use super::lock;

/// How the committed state is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Through SQLite beside the applications using the database: one read transaction for
    /// one copy pass.
    Sqlite,
    /// The database and its `-wal` copied as files (no process has the log open).
    Files,
}

impl Plan {
    /// The name `--json` reports.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Plan::Sqlite => "sqlite",
            Plan::Files => "files",
        }
    }
}

/// The identity and last change of one file: equal stamps before and after a copy mean no
/// one wrote, truncated, replaced or recreated it meanwhile.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl From<&Metadata> for Stamp {
    fn from(m: &Metadata) -> Self {
        Stamp {
            dev: m.dev(),
            ino: m.ino(),
            len: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }
}

/// The database's companions and whether they are in use, as seen at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Seen {
    /// The header says WAL mode (file format versions 2).
    wal_mode: bool,
    db: Stamp,
    wal: Option<Stamp>,
    shm: Option<Stamp>,
    /// Some process has the `-shm` open (its dead-man-switch byte is locked).
    shm_in_use: bool,
}

/// `FILE-wal` or `FILE-shm`.
pub(crate) fn companion(file: &Path, suffix: &str) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

fn stamp_of(path: &Path) -> io::Result<Option<Stamp>> {
    match std::fs::metadata(path) {
        Ok(m) => Ok(Some(Stamp::from(&m))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

impl Seen {
    /// Looks at `file` (open as `db`) and its companions. Opens the `-shm`, if there is one,
    /// only to ask the kernel who holds it: call it while this process has no SQLite
    /// connection to the database (see `lock.rs`).
    ///
    /// # Errors
    /// [`ImportError::NotSqlite`] when `db` has no SQLite header; [`ImportError::Stat`] when a
    /// file cannot be looked at.
    pub(crate) fn look(file: &Path, db: &File) -> Result<Seen, ImportError> {
        let stat = |source| ImportError::Stat {
            file: file.to_owned(),
            source,
        };
        let mut header = [0u8; 100];
        if db.read_exact_at(&mut header, 0).is_err() || !header.starts_with(b"SQLite format 3\0") {
            return Err(ImportError::NotSqlite {
                file: file.to_owned(),
                why: "no SQLite header".into(),
            });
        }
        let shm_path = companion(file, "-shm");
        let shm = stamp_of(&shm_path).map_err(stat)?;
        let shm_in_use = match shm {
            Some(_) => lock::shm_in_use(&shm_path).map_err(stat)?,
            None => false,
        };
        Ok(Seen {
            // Bytes 18 and 19: the write and read format versions, 2 for WAL.
            wal_mode: header[18] == 2 || header[19] == 2,
            db: Stamp::from(&db.metadata().map_err(stat)?),
            wal: stamp_of(&companion(file, "-wal")).map_err(stat)?,
            shm,
            shm_in_use,
        })
    }

    /// How to read what was seen.
    ///
    /// # Errors
    /// [`ImportError::WalMissing`] when a process holds the `-shm` but the `-wal` is gone:
    /// SQLite would create an empty log beside the database.
    pub(crate) fn plan(&self, file: &Path) -> Result<Plan, ImportError> {
        if self.shm_in_use {
            if self.wal.is_none() {
                return Err(ImportError::WalMissing {
                    file: file.to_owned(),
                    shm: companion(file, "-shm"),
                    wal: companion(file, "-wal"),
                });
            }
            return Ok(Plan::Sqlite);
        }
        // SQLite opens the log whenever a `-wal` exists, whatever the header says.
        if self.wal_mode || self.wal.is_some() {
            return Ok(Plan::Files);
        }
        Ok(Plan::Sqlite)
    }

    /// Whether a `-wal` was there to copy.
    pub(crate) fn has_wal(&self) -> bool {
        self.wal.is_some()
    }
}
