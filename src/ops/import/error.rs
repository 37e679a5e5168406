//! Why `idem import` could not read a tenant's file: one typed failure per cause, each naming
//! the file (and the directory, the lock or the limit involved), so the operator knows what
//! to fix or whether to retry.

use std::path::PathBuf;
use std::time::Duration;

use idem_org::rusqlite;

/// A failure of reading the tenant's file into the import's private copy. Every variant
/// leaves the tenant's files as they were and nothing in `$TMPDIR` (the copy's directory is
/// removed when the failure returns).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImportError {
    /// The file cannot be looked at (missing, permission denied).
    #[error("{}: {source}", file.display())]
    Stat {
        /// The file named by `--from`.
        file: PathBuf,
        /// The operating system's reason.
        #[source]
        source: std::io::Error,
    },
    /// `--from` names a directory or a device.
    #[error("{}: not a file", file.display())]
    NotAFile {
        /// The file named by `--from`.
        file: PathBuf,
    },
    /// SQLite treats an empty file as an empty database; importing nothing is a mistake.
    #[error("{}: not an SQLite database (the file is empty)", file.display())]
    Empty {
        /// The file named by `--from`.
        file: PathBuf,
    },
    /// No SQLite header, or SQLite refuses to read it.
    #[error("{}: not a readable SQLite database ({why})", file.display())]
    NotSqlite {
        /// The file named by `--from`.
        file: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// The committed state copied fails `PRAGMA integrity_check`.
    #[error(
        "{}: fails SQLite's integrity check ({problems} problems): {shown}",
        file.display()
    )]
    Integrity {
        /// The file named by `--from`.
        file: PathBuf,
        /// How many problems SQLite reported.
        problems: usize,
        /// The first few of them.
        shown: String,
    },
    /// The file could not be copied within `--timeout`.
    #[error(
        "{}: could not copy one committed state within --timeout {} ({why})",
        file.display(),
        humantime::format_duration(*timeout)
    )]
    Timeout {
        /// The file named by `--from`.
        file: PathBuf,
        /// The `--timeout` that passed.
        timeout: Duration,
        /// What the time went on.
        why: Waited,
    },
    /// Reading the database would need a file SQLite creates beside it, in a directory that
    /// is read-only to this process.
    #[error(
        "{}: reading it needs {} and {} is read-only to this process (an application using the database creates it; import never does)",
        file.display(),
        needs.display(),
        dir.display()
    )]
    ReadOnlyDirectory {
        /// The file named by `--from`.
        file: PathBuf,
        /// The missing file SQLite would have to create (`-shm` or `-wal`).
        needs: PathBuf,
        /// The directory holding the file.
        dir: PathBuf,
    },
    /// A running application holds the shared-memory index but the log is gone: something
    /// deleted the WAL from under it, and reading now would create an empty one.
    #[error(
        "{}: {} is in use by a running application but {} is missing (deleted from under it?); refusing to read a database whose log is gone",
        file.display(),
        shm.display(),
        wal.display()
    )]
    WalMissing {
        /// The file named by `--from`.
        file: PathBuf,
        /// The live `-shm`.
        shm: PathBuf,
        /// The missing `-wal`.
        wal: PathBuf,
    },
    /// A rollback journal says a transaction was interrupted; only a writer may roll it back.
    #[error(
        "{}: the rollback journal of an interrupted transaction is beside it; open the database read-write once (as its application does) so SQLite rolls it back, then import",
        file.display()
    )]
    HotJournal {
        /// The file named by `--from`.
        file: PathBuf,
    },
    /// SQLite failed reading the database for another reason.
    #[error("{}: reading the database", file.display())]
    Read {
        /// The file named by `--from`.
        file: PathBuf,
        /// SQLite's error.
        #[source]
        source: rusqlite::Error,
    },
    /// The one-pass copy went back to its first page: the read transaction that fixes its
    /// snapshot was not held. A bug; nothing was imported.
    #[error(
        "{}: the copy restarted although its read transaction was held (a bug in idem import)",
        file.display()
    )]
    Restarted {
        /// The file named by `--from`.
        file: PathBuf,
    },
    /// Reading one of the tenant's files, or writing the private copy, failed.
    #[error("{}: copying {} into {}", file.display(), from.display(), to.display())]
    Copy {
        /// The file named by `--from`.
        file: PathBuf,
        /// The file read (the database or its `-wal`).
        from: PathBuf,
        /// The private copy written.
        to: PathBuf,
        /// The operating system's reason.
        #[source]
        source: std::io::Error,
    },
    /// The private copy's directory could not be created (`$TMPDIR`).
    #[error("creating a temp directory for the copy")]
    TempDir {
        /// The operating system's reason.
        #[source]
        source: std::io::Error,
    },
    /// Making the private copy an org's database failed.
    #[error("preparing the copy of {}", file.display())]
    Prepare {
        /// The file named by `--from`.
        file: PathBuf,
        /// idem's (or SQLite's) error.
        #[source]
        source: idem_org::idem::Error,
    },
}

/// What a copy that ran out of time was waiting for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Waited {
    /// Another process held a lock that excludes readers (an application in exclusive
    /// locking mode, or a rollback-journal writer committing) the whole time.
    Locked,
    /// The one copy pass had copied `copied` of `pages` pages.
    Copying {
        /// Pages copied so far.
        copied: u64,
        /// Pages in the committed state being copied.
        pages: u64,
    },
    /// The copy of the files had copied `copied` of `bytes` bytes.
    CopyingFiles {
        /// Bytes copied so far.
        copied: u64,
        /// Bytes of the file being copied.
        bytes: u64,
    },
    /// Each copy of the files found them changed afterwards (an application started using
    /// the database during the copy, `attempts` times).
    Changing {
        /// Copies made and discarded.
        attempts: u32,
    },
}

impl std::fmt::Display for Waited {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Waited::Locked => write!(
                f,
                "another process held a lock that excludes readers the whole time: an application in exclusive locking mode, or a long rollback-journal write"
            ),
            Waited::Copying { copied, pages } => {
                write!(f, "copied {copied} of {pages} pages in one pass")
            }
            Waited::CopyingFiles { copied, bytes } => {
                write!(f, "copied {copied} of {bytes} bytes")
            }
            Waited::Changing { attempts } => write!(
                f,
                "the files changed during each of {attempts} copies: an application started using the database"
            ),
        }
    }
}

/// What the operator does about an [`ImportError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Kind {
    /// Fix `--from` or the file (wrong path, not a database, corrupt).
    Input,
    /// Nothing is wrong with the file: run the import again (later, or with a longer
    /// `--timeout`).
    Retry,
    /// The environment refused (permissions, a read-only directory, `$TMPDIR`, disk).
    Environment,
}

impl ImportError {
    /// What to do about this failure. Exhaustive: a new variant must choose.
    pub fn kind(&self) -> Kind {
        match self {
            ImportError::Stat { .. }
            | ImportError::NotAFile { .. }
            | ImportError::Empty { .. }
            | ImportError::NotSqlite { .. }
            | ImportError::Integrity { .. }
            | ImportError::WalMissing { .. }
            | ImportError::HotJournal { .. } => Kind::Input,
            ImportError::Timeout { .. } | ImportError::Restarted { .. } => Kind::Retry,
            ImportError::ReadOnlyDirectory { .. }
            | ImportError::Read { .. }
            | ImportError::Copy { .. }
            | ImportError::TempDir { .. }
            | ImportError::Prepare { .. } => Kind::Environment,
        }
    }
}
