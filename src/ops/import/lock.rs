//! SQLite's own file locks, taken and probed from outside SQLite: a SHARED lock on a database
//! file (what every SQLite reader holds) and a look at whether any process holds a WAL
//! database's shared-memory index open.
//!
//! These are POSIX record locks, as SQLite's unix VFS takes them (`os_unix.c`): they belong
//! to the process, and closing *any* descriptor of a file drops all of the process's locks on
//! it. So a descriptor opened here on a file that SQLite also has open in this process must
//! stay open until SQLite has closed it (`copy.rs` keeps that order), and the probe of a
//! `-shm` runs only while this process has no SQLite connection on that database.

use std::fs::File;
use std::io;
use std::path::Path;

use nix::fcntl::{FcntlArg, fcntl};
use nix::libc;

/// SQLite's lock bytes in the database file (`PENDING_BYTE` and the SHARED range after it).
const PENDING_BYTE: i64 = 0x4000_0000;
const SHARED_FIRST: i64 = PENDING_BYTE + 2;
const SHARED_SIZE: i64 = 510;

/// The `-shm` byte every connection of a WAL database holds a read lock on while it has the
/// shared-memory index open (`UNIX_SHM_DMS`, the "dead man switch").
const SHM_DMS: i64 = 128;

/// Why a lock was not taken.
#[derive(Debug)]
pub(crate) enum Refused {
    /// Another process holds a conflicting lock (try again later).
    Busy,
    /// The lock call itself failed.
    Io(io::Error),
}

fn record(kind: libc::c_int, start: i64, len: i64) -> libc::flock {
    libc::flock {
        // The lock types and SEEK_SET are small constants (0..=2): they fit in a c_short.
        l_type: kind as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: start,
        l_len: len,
        l_pid: 0,
    }
}

fn set(file: &File, kind: libc::c_int, start: i64, len: i64) -> Result<(), Refused> {
    match fcntl(file, FcntlArg::F_SETLK(&record(kind, start, len))) {
        Ok(_) => Ok(()),
        Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EACCES) => Err(Refused::Busy),
        Err(e) => Err(Refused::Io(e.into())),
    }
}

/// Takes a SHARED lock on the database open as `file`, the way SQLite does (a read lock on the
/// pending byte, so a writer waiting for its exclusive lock is not starved, then on the shared
/// range, then the pending byte is let go). Held until `file` is closed.
///
/// While it is held no process can take SQLite's EXCLUSIVE lock: a rollback-journal writer
/// cannot commit, an application in exclusive locking mode cannot start, and the last
/// connection of a WAL database that closes leaves its `-wal` and `-shm` in place instead of
/// checkpointing and deleting them. Readers and WAL writers go on as usual.
///
/// # Errors
/// [`Refused::Busy`] when another process holds a lock that excludes readers;
/// [`Refused::Io`] when the lock call fails.
pub(crate) fn shared(file: &File) -> Result<(), Refused> {
    set(file, libc::F_RDLCK, PENDING_BYTE, 1)?;
    let got = set(file, libc::F_RDLCK, SHARED_FIRST, SHARED_SIZE);
    let released = set(file, libc::F_UNLCK, PENDING_BYTE, 1);
    got?;
    released
}

/// Whether some process has the WAL database's shared-memory index `shm` open (every SQLite
/// connection to a WAL database holds a read lock on its dead-man-switch byte while it does).
/// Asks the kernel (`F_GETLK`); takes no lock and writes nothing. Locks of this process are
/// not seen, so call it only while this process has no connection to the database.
///
/// # Errors
/// When `shm` cannot be opened for reading or the kernel refuses the question.
pub(crate) fn shm_in_use(shm: &Path) -> io::Result<bool> {
    let file = File::open(shm)?;
    let mut probe = record(libc::F_WRLCK, SHM_DMS, 1);
    fcntl(&file, FcntlArg::F_GETLK(&mut probe))?;
    Ok(i32::from(probe.l_type) != libc::F_UNLCK)
}
