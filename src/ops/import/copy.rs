//! Copying one committed state of the tenant's database into the import's private file, in
//! one pass, within `--timeout`, creating and changing nothing beside the tenant's file.
//!
//! Through SQLite ([`Plan::Sqlite`]) the copy runs inside one read transaction held for the
//! whole pass. SQLite's backup restarts from the first page whenever its source changed
//! between two steps *outside* a transaction, so an application that commits more often than
//! a pass takes kept a stepwise backup restarting for ever, and its overlapping short reads
//! kept the WAL from ever being reset while the tenant's `-wal` grew. Inside one transaction
//! the snapshot cannot change: the pass ends after `pages / PAGES_PER_STEP` steps whatever the
//! tenant commits, and the tenant's checkpoints can copy frames back into its database only
//! up to that snapshot, and restart the log only after it, for the length of one pass (the
//! `read_ms` `--json` reports). `VACUUM INTO` would also read in one transaction, but it
//! rebuilds every table (slower, so the log grows longer) and renumbers implicit rowids.
//!
//! As files ([`Plan::Files`]), nothing holds the log open: the database and its `-wal` are
//! copied under SQLite's SHARED lock (so no process can checkpoint-and-delete the log or take
//! an exclusive lock meanwhile), then looked at again; a copy counts only if no file changed
//! and no process opened the shared-memory index meanwhile (an application that starts must
//! create or hold it first), otherwise it is thrown away and the import looks again.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::raw::c_int;
use std::path::Path;
use std::time::Duration;

use idem_org::rusqlite::{self, Connection, OpenFlags, ffi};

use super::deadline::Deadline;
use super::error::{ImportError, Waited};
use super::lock;
use super::source::{Plan, Seen, companion};

/// Pages one backup step copies; the deadline is checked between steps (the read transaction
/// stays open across them, so a step boundary is never a restart).
const PAGES_PER_STEP: c_int = 1024;

/// Bytes copied from a file before the deadline is checked again.
const FILE_CHUNK: u64 = 8 << 20;

/// SQLite's busy timeout is an `int` of milliseconds.
const MAX_BUSY: Duration = Duration::from_millis(i32::MAX as u64);

/// What a copy read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Copied {
    /// How it was read.
    pub plan: Plan,
    /// How long it held the tenant's file: the read transaction (which keeps the tenant's
    /// checkpoints behind its snapshot), or the SHARED lock of a copy of files.
    pub held: Duration,
}

/// Copies one committed state of `file` into `to` (which must not exist; for a copy of files
/// also `to-wal`). `after_step` runs after each step: each backup step of a copy through
/// SQLite, and each copy of files before they are looked at again (a seam for tests that
/// write to the tenant between steps).
///
/// # Errors
/// [`ImportError::Timeout`] when the deadline passes first; otherwise the [`ImportError`]
/// naming what refused. `to` may be left partly written: the caller owns its directory.
pub(crate) fn copy(
    file: &Path,
    to: &Path,
    deadline: &Deadline<'_>,
    after_step: &mut dyn FnMut(),
) -> Result<Copied, ImportError> {
    let out_of_time = |why| ImportError::Timeout {
        file: file.to_owned(),
        timeout: deadline.timeout(),
        why,
    };
    let stat = |source| ImportError::Stat {
        file: file.to_owned(),
        source,
    };
    let mut busy = 0u32;
    let mut discarded = 0u32;
    loop {
        // Dropped (closing the descriptor, which ends the lock) only after SQLite has closed
        // its own descriptor of the file: closing ours first would drop SQLite's locks.
        let db = File::open(file).map_err(stat)?;
        match lock::shared(&db) {
            Ok(()) => {}
            Err(lock::Refused::Busy) => {
                if !deadline.pause(busy) {
                    return Err(out_of_time(Waited::Locked));
                }
                busy += 1;
                continue;
            }
            Err(lock::Refused::Io(e)) => return Err(stat(e)),
        }
        let seen = Seen::look(file, &db)?;
        let plan = seen.plan(file)?;
        let started = deadline.now();
        match plan {
            Plan::Sqlite => match copy_sqlite(file, to, deadline, after_step) {
                Ok(()) => {
                    let held = deadline.now().saturating_sub(started);
                    drop(db);
                    return Ok(Copied { plan, held });
                }
                Err(e) if transient(&e) && deadline.pause(busy) => {
                    drop(db);
                    discard(file, to)?;
                    busy += 1;
                }
                Err(e) => return Err(e),
            },
            Plan::Files => {
                copy_files(file, &db, &seen, to, deadline)?;
                after_step();
                if Seen::look(file, &db)? == seen {
                    let held = deadline.now().saturating_sub(started);
                    return Ok(Copied { plan, held });
                }
                discard(file, to)?;
                discarded += 1;
                if deadline.remaining().is_none() {
                    return Err(out_of_time(Waited::Changing {
                        attempts: discarded,
                    }));
                }
            }
        }
    }
}

/// The backup of `file` into `to` inside one read transaction, calling `after_step` after
/// each step.
///
/// # Errors
/// [`ImportError::Timeout`] past the deadline; [`ImportError::Restarted`] if the pass went back
/// to its first page; otherwise SQLite's refusal as the [`ImportError`] that explains it.
pub(super) fn copy_sqlite(
    file: &Path,
    to: &Path,
    deadline: &Deadline<'_>,
    after_step: &mut dyn FnMut(),
) -> Result<(), ImportError> {
    let read = |e| read_error(file, deadline, e);
    let src = Connection::open_with_flags(
        file,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(read)?;
    // Another process's lock (a WAL recovery, a rollback-journal commit) is waited for until
    // the deadline, no longer.
    let left = deadline.remaining().unwrap_or_default().min(MAX_BUSY);
    src.busy_timeout(left).map_err(read)?;
    // The first read starts the transaction; its snapshot is the state copied.
    src.execute_batch("BEGIN").map_err(read)?;
    src.query_row("SELECT count(*) FROM sqlite_schema", [], |r| {
        r.get::<_, i64>(0)
    })
    .map_err(read)?;
    let mut dest = Connection::open(to).map_err(|e| prepare_error(file, e))?;
    {
        let backup = rusqlite::backup::Backup::new(&src, &mut dest).map_err(read)?;
        let mut copied = 0u64;
        let mut busy = 0u32;
        loop {
            let step = backup.step(PAGES_PER_STEP).map_err(read)?;
            let p = backup.progress();
            let pages = u64::try_from(p.pagecount).unwrap_or(0);
            let now = pages.saturating_sub(u64::try_from(p.remaining).unwrap_or(0));
            match step {
                rusqlite::backup::StepResult::Done => break,
                // Each step of one pass copies pages the pass had not: anything else is a
                // restart from the first page.
                rusqlite::backup::StepResult::More if now <= copied => {
                    return Err(ImportError::Restarted {
                        file: file.to_owned(),
                    });
                }
                rusqlite::backup::StepResult::More => {
                    copied = now;
                    busy = 0;
                }
                // Busy or Locked: the step can be retried.
                _ => {
                    if !deadline.pause(busy) {
                        return Err(ImportError::Timeout {
                            file: file.to_owned(),
                            timeout: deadline.timeout(),
                            why: Waited::Locked,
                        });
                    }
                    busy += 1;
                    continue;
                }
            }
            after_step();
            if deadline.remaining().is_none() {
                return Err(ImportError::Timeout {
                    file: file.to_owned(),
                    timeout: deadline.timeout(),
                    why: Waited::Copying { copied, pages },
                });
            }
        }
    }
    src.execute_batch("COMMIT").map_err(read)?;
    dest.close().map_err(|(_, e)| prepare_error(file, e))?;
    src.close().map_err(|(_, e)| read(e))
}

/// `file` (open as `db`, under its SHARED lock) and its `-wal` copied into `to` and `to-wal`.
fn copy_files(
    file: &Path,
    db: &File,
    seen: &Seen,
    to: &Path,
    deadline: &Deadline<'_>,
) -> Result<(), ImportError> {
    copy_file(file, file, db, to, deadline)?;
    if seen.has_wal() {
        let wal = companion(file, "-wal");
        // A descriptor of our own on the -wal is harmless: SQLite locks the database file and
        // the -shm, never the -wal.
        let src = File::open(&wal).map_err(copy_error(file, &wal, &companion(to, "-wal")))?;
        copy_file(file, &wal, &src, &companion(to, "-wal"), deadline)?;
    }
    Ok(())
}

/// Copies `src` (open, at offset 0) into a new file `to`, checking the deadline every
/// `FILE_CHUNK` bytes.
fn copy_file(
    file: &Path,
    from: &Path,
    src: &File,
    to: &Path,
    deadline: &Deadline<'_>,
) -> Result<(), ImportError> {
    let fail = copy_error(file, from, to);
    let bytes = src.metadata().map_err(&fail)?.len();
    let mut out = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(to)
        .map_err(&fail)?;
    let mut copied = 0u64;
    loop {
        let n = io::copy(&mut io::Read::take(src, FILE_CHUNK), &mut out).map_err(&fail)?;
        if n == 0 {
            return Ok(());
        }
        copied += n;
        if deadline.remaining().is_none() {
            return Err(ImportError::Timeout {
                file: file.to_owned(),
                timeout: deadline.timeout(),
                why: Waited::CopyingFiles { copied, bytes },
            });
        }
    }
}

/// Removes a copy of files found stale, so the next attempt starts from nothing.
fn discard(file: &Path, to: &Path) -> Result<(), ImportError> {
    for path in [to.to_owned(), companion(to, "-wal")] {
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(copy_error(file, file, &path)(e)),
        }
    }
    Ok(())
}

/// A refusal that passes by itself: a reader whose `-shm` is read-only (a read-only
/// directory) found the index mid-update or no read mark it can use until the application's
/// next transaction sets one.
fn transient(e: &ImportError) -> bool {
    let ImportError::Read {
        source: rusqlite::Error::SqliteFailure(f, _),
        ..
    } = e
    else {
        return false;
    };
    matches!(
        f.extended_code,
        ffi::SQLITE_READONLY_CANTINIT | ffi::SQLITE_READONLY_RECOVERY
    )
}

fn copy_error(file: &Path, from: &Path, to: &Path) -> impl Fn(io::Error) -> ImportError {
    let (file, from, to) = (file.to_owned(), from.to_owned(), to.to_owned());
    move |source| ImportError::Copy {
        file: file.clone(),
        from: from.clone(),
        to: to.clone(),
        source,
    }
}

fn prepare_error(file: &Path, e: rusqlite::Error) -> ImportError {
    ImportError::Prepare {
        file: file.to_owned(),
        source: e.into(),
    }
}

/// SQLite's failure reading the tenant's file, as the [`ImportError`] that says what to do.
fn read_error(file: &Path, deadline: &Deadline<'_>, e: rusqlite::Error) -> ImportError {
    let file = file.to_owned();
    let Some(code) = e.sqlite_error_code() else {
        return ImportError::Read { file, source: e };
    };
    let extended = match &e {
        rusqlite::Error::SqliteFailure(f, _) => f.extended_code,
        _ => 0,
    };
    match code {
        rusqlite::ErrorCode::DatabaseBusy => ImportError::Timeout {
            file,
            timeout: deadline.timeout(),
            why: Waited::Locked,
        },
        rusqlite::ErrorCode::NotADatabase | rusqlite::ErrorCode::DatabaseCorrupt => {
            ImportError::NotSqlite {
                file,
                why: e.to_string(),
            }
        }
        rusqlite::ErrorCode::ReadOnly if extended == ffi::SQLITE_READONLY_ROLLBACK => {
            ImportError::HotJournal { file }
        }
        rusqlite::ErrorCode::ReadOnly
            if matches!(
                extended,
                ffi::SQLITE_READONLY_CANTINIT | ffi::SQLITE_READONLY_RECOVERY
            ) =>
        {
            ImportError::Read { file, source: e }
        }
        rusqlite::ErrorCode::CannotOpen | rusqlite::ErrorCode::ReadOnly => {
            match read_only_dir(&file) {
                Some((needs, dir)) => ImportError::ReadOnlyDirectory { file, needs, dir },
                None => ImportError::Read { file, source: e },
            }
        }
        _ => ImportError::Read { file, source: e },
    }
}

/// The companion SQLite would have had to create, and the directory that is read-only to this
/// process, when that explains a refusal to open.
fn read_only_dir(file: &Path) -> Option<(std::path::PathBuf, std::path::PathBuf)> {
    let dir = match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => std::path::PathBuf::from("."),
    };
    let writable = nix::unistd::access(&dir, nix::unistd::AccessFlags::W_OK).is_ok();
    if writable {
        return None;
    }
    ["-shm", "-wal"]
        .into_iter()
        .map(|s| companion(file, s))
        .find(|p| !p.exists())
        .map(|needs| (needs, dir))
}
