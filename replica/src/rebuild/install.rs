//! Installing a verified image as a local database file, atomically (I8, I10).
//! Synchronous: call on a blocking thread.

use std::path::{Path, PathBuf};

use rusqlite::Connection;

use crate::Error;
use crate::live::Durability;
use crate::rebuild::check::sqlite_check;

/// Sidecar files SQLite keeps next to a database.
fn sidecars(dest: &Path) -> Vec<PathBuf> {
    ["-wal", "-shm", "-journal"]
        .iter()
        .map(|s| {
            let mut p = dest.as_os_str().to_owned();
            p.push(s);
            PathBuf::from(p)
        })
        .collect()
}

fn remove_if_exists(p: &Path) -> Result<(), Error> {
    match std::fs::remove_file(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(p, e)),
    }
}

/// Removes `dest` and its sidecars: the local file is a cache, never an authority (I8).
///
/// # Errors
/// [`Error::Io`] when a file exists but cannot be removed.
pub(crate) fn remove_db(dest: &Path) -> Result<(), Error> {
    for s in sidecars(dest) {
        remove_if_exists(&s)?;
    }
    remove_if_exists(dest)
}

fn sync_dir(dir: &Path) -> Result<(), Error> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(dir, e))
}

/// The temp file an install of `dest` builds its image in: in dest's directory (created if
/// missing), so the rename is atomic, and named `.<dest>.hydrate-<nonce>`, so nothing opens
/// it as a database and a crash leaves nothing at `dest`.
///
/// # Errors
/// [`Error::Io`] when the directory cannot be created or `dest` has no file name.
pub(crate) fn temp_beside(dest: &Path, nonce: &str) -> Result<PathBuf, Error> {
    let dir = parent(dest);
    let name = dest
        .file_name()
        .ok_or_else(|| Error::io(dest, std::io::Error::other("destination has no file name")))?;
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    Ok(dir.join(format!(".{}.hydrate-{nonce}", name.to_string_lossy())))
}

fn parent(dest: &Path) -> PathBuf {
    match dest.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Removes a temp file and any sidecars SQLite left beside it (best effort: a failed
/// install's error is the one reported).
pub(crate) fn discard(tmp: &Path) {
    let _ = remove_if_exists(tmp);
    for s in sidecars(tmp) {
        let _ = remove_if_exists(&s);
    }
}

/// Who runs an installed image's `quick_check` (I10).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Check {
    /// The install, on the temp file before the rename: the file may then be opened by
    /// anyone (a restore, [`crate::Replica::hydrate`]).
    Now,
    /// The writer's connection, as its first access ([`crate::sqlite::open_installed`], the
    /// only way such a file is opened): one SQLite open and schema parse per acquire instead
    /// of two, and nothing serves or writes the file before the check passed. Page 1 is
    /// marked WAL (bytes 18–19 = 2), so the writer's switch to WAL writes nothing and
    /// creates no rollback journal; the image's pages, as hashed and shipped, keep page 1
    /// canonical ([`crate::format::pages::canonical_page1`]).
    ByWriter,
}

/// Atomically installs the verified image written (and, when `durability` is
/// [`Durability::Synced`], synced) at `tmp` (from [`temp_beside`]) at `dest`: the check
/// `check` names, remove stale sidecars, rename, and for a synced install fsync the
/// directory. `object` names the image in errors. On any failure nothing is installed and
/// the temp file is removed (I10).
///
/// A [`Durability::Volatile`] install is a writer's cache for this process's lifetime (no
/// fsync), always [`Check::ByWriter`]. A synced [`Check::ByWriter`] install is a per-org
/// tenure's file: the file is only kept for a later resume once the writer that checked it
/// released it, so an unchecked file never outlives a crash as a resumable one.
///
/// # Errors
/// [`Error::Corrupt`] when a [`Check::Now`] file fails `quick_check`; [`Error::Io`].
pub(crate) fn install_file(
    object: &str,
    tmp: &Path,
    dest: &Path,
    durability: Durability,
    check: Check,
) -> Result<(), Error> {
    let result = (|| {
        match check {
            Check::Now => {
                let conn =
                    Connection::open_with_flags(tmp, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
                        .map_err(|e| Error::corrupt(object, format!("open: {e}")))?;
                sqlite_check(&conn, "quick_check", object)?;
            }
            Check::ByWriter => wal_header(tmp)?,
        }
        for s in sidecars(tmp) {
            remove_if_exists(&s)?;
        }
        for s in sidecars(dest) {
            remove_if_exists(&s)?;
        }
        std::fs::rename(tmp, dest).map_err(|e| Error::io(dest, e))?;
        match durability {
            Durability::Synced => sync_dir(&parent(dest)),
            Durability::Volatile => Ok(()),
        }
    })();
    if result.is_err() {
        discard(tmp);
    }
    result
}

/// Marks the database at `path` as in WAL mode (page 1 bytes 18–19 = 2, as SQLite leaves a
/// WAL database it closed); a file too short to hold a header is left alone (no database
/// image is that short; the writer's `quick_check` judges it).
fn wal_header(path: &Path) -> Result<(), Error> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| Error::io(path, e))?;
    let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    if len < 100 {
        return Ok(());
    }
    file.write_all_at(&[2, 2], 18)
        .map_err(|e| Error::io(path, e))
}
