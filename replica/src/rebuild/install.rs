//! Installing a verified image as a local database file, atomically (I8, I10).
//! Synchronous: call on a blocking thread.

use std::path::{Path, PathBuf};

use rusqlite::Connection;

use crate::Error;
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

/// Atomically installs the verified image written and synced at `tmp` (from
/// [`temp_beside`]) at `dest`: `quick_check` on the temp file, remove stale sidecars,
/// rename, fsync the directory. `object` names the image in errors. On any failure nothing
/// is installed and the temp file is removed (I10).
///
/// # Errors
/// [`Error::Corrupt`] when the file fails `quick_check`; [`Error::Io`].
pub(crate) fn install_file(object: &str, tmp: &Path, dest: &Path) -> Result<(), Error> {
    let result = (|| {
        {
            let conn = Connection::open_with_flags(tmp, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
                .map_err(|e| Error::corrupt(object, format!("open: {e}")))?;
            sqlite_check(&conn, "quick_check", object)?;
        }
        for s in sidecars(tmp) {
            remove_if_exists(&s)?;
        }
        for s in sidecars(dest) {
            remove_if_exists(&s)?;
        }
        std::fs::rename(tmp, dest).map_err(|e| Error::io(dest, e))?;
        sync_dir(&parent(dest))
    })();
    if result.is_err() {
        discard(tmp);
    }
    result
}
