//! Reading an org's acknowledged state: restore its newest published snapshot to a temp file.

use std::path::PathBuf;

use idem_org::replica::{Hydrated, OrgId, Replica};
use idem_org::rusqlite;
use tempfile::TempDir;

/// A snapshot restored to a private temporary file, deleted on drop.
#[derive(Debug)]
pub struct Restored {
    _dir: TempDir,
    /// Path of the restored SQLite file.
    pub path: PathBuf,
    /// What was restored.
    pub hydrated: Hydrated,
}

impl Restored {
    /// Opens the restored database read-only.
    ///
    /// # Errors
    /// SQLite errors, as one line.
    pub fn open(&self) -> Result<rusqlite::Connection, String> {
        rusqlite::Connection::open_with_flags(
            &self.path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )
        .map_err(|e| format!("cannot open restored snapshot: {e}"))
    }
}

/// Restores `org` at `at` (`None` = newest snapshot); `Ok(None)` when it has no snapshot.
///
/// # Errors
/// Store, checksum or integrity failures, as one line.
pub async fn restore(
    replica: &Replica,
    org: &OrgId,
    at: Option<u64>,
) -> Result<Option<Restored>, String> {
    let dir = tempfile::tempdir().map_err(|e| format!("cannot create a temp dir: {e}"))?;
    let path = dir.path().join(format!("{org}.db"));
    let hydrated = replica
        .restore(org, at, &path)
        .await
        .map_err(|e| format!("cannot restore org {org}: {}", crate::chain(&e)))?;
    if hydrated.snapshot.is_none() {
        return Ok(None);
    }
    Ok(Some(Restored {
        _dir: dir,
        path,
        hydrated,
    }))
}
