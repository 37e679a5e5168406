//! `idem import ORG --from FILE`: an existing SQLite database becomes a new org's first
//! snapshot, so a tenant migrates without writing code.
//!
//! The user's file is only read, and nothing is created or changed beside it, even while its
//! application keeps writing: one committed state is copied in one pass within `--timeout`
//! (`copy.rs`: through SQLite in one read transaction beside a running application, or as
//! files when no process has the log open, as `source.rs` decides) into a private temp
//! directory (`$TMPDIR`, which needs room for one copy and, when copied as files, the
//! `-wal`), removed on every failure. The copy must pass `PRAGMA integrity_check`, gets the
//! tables an org's writer creates on open, and is shipped from the file
//! (`Replica::ship_file`). Every step streams pages: memory is bounded by SQLite's page cache
//! and the replica's segment settings, never by the database.

mod copy;
mod deadline;
mod error;
mod lock;
mod source;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use idem_org::replica::{OrgId, Replica};
use idem_org::rusqlite::Connection;
use serde_json::json;

use super::{ImportArgs, about, org_id, print_json};
use error::{ImportError, Kind};

/// The writer id recorded in the import's claim, snapshot and release.
const WRITER: &str = "idem-import";

/// The writer id recorded in `idem clone`'s claim, snapshot and release.
pub(super) const WRITER_CLONE: &str = "idem-clone";

/// The prepared copy and what it holds; the copy lives as long as `_dir`.
struct Image {
    _dir: tempfile::TempDir,
    path: PathBuf,
    bytes: u64,
    page_size: u64,
    commit: u64,
    read: copy::Copied,
}

/// Runs `idem import`.
///
/// # Errors
/// Bad org id or store URL; FILE missing, not an SQLite database, failing its integrity
/// check, or not copied within `--timeout` ([`ImportError`]); the org already has a log in
/// the store; store failures.
pub async fn import(a: ImportArgs) -> Result<ExitCode, String> {
    let org = org_id(&a.org)?;
    let from = a.from.clone();
    let timeout = a.timeout;
    let image = tokio::task::spawn_blocking(move || prepare(&from, timeout))
        .await
        .map_err(|e| format!("preparing the image: {e}"))?
        .map_err(|e| explain(&e))?;
    let replica = super::open(&a.store).await?;
    refuse_existing(&replica, &org).await?;
    let shipped = publish(&replica, &org, &image.path, image.commit, WRITER).await?;
    let bytes = image.bytes;
    let pages = bytes / image.page_size.max(1);
    if a.json {
        print_json(&json!({
            "org": org.as_str(), "from": a.from.display().to_string(), "bytes": bytes,
            "pages": pages, "page_size": image.page_size, "commit": image.commit,
            "snapshot_seq": shipped.seq, "round": shipped.round,
            "compressed_bytes": shipped.compressed_bytes,
            "read": image.read.plan.name(), "read_ms": image.read.held.as_millis() as u64,
        }));
    } else {
        outln!(
            "imported {} into org {org}: {bytes} bytes, {pages} pages of {} bytes, commit {}; snapshot seq {} (round {}, {} bytes stored), released",
            a.from.display(),
            image.page_size,
            image.commit,
            shipped.seq,
            shipped.round,
            shipped.compressed_bytes
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Parses `--timeout`: a humantime duration of more than zero.
///
/// # Errors
/// Not a duration, or zero.
pub(super) fn parse_timeout(s: &str) -> Result<Duration, String> {
    match humantime::parse_duration(s) {
        Ok(d) if d.is_zero() => Err("must be more than 0".into()),
        Ok(d) => Ok(d),
        Err(e) => Err(e.to_string()),
    }
}

/// The one line an [`ImportError`] ends the command with.
fn explain(e: &ImportError) -> String {
    let line = crate::chain(e);
    match e.kind() {
        Kind::Retry => {
            format!("{line}; nothing was imported: run it again, or with a longer --timeout")
        }
        Kind::Input | Kind::Environment => line,
    }
}

/// Checks `from` and returns the org image made from one committed state of it, read within
/// `timeout`; nothing beside `from` is created or changed.
///
/// # Errors
/// The [`ImportError`] naming what refused; the private copy is removed.
fn prepare(from: &Path, timeout: Duration) -> Result<Image, ImportError> {
    let file = || from.to_owned();
    let meta = std::fs::metadata(from).map_err(|source| ImportError::Stat {
        file: file(),
        source,
    })?;
    if !meta.is_file() {
        return Err(ImportError::NotAFile { file: file() });
    }
    if meta.len() == 0 {
        return Err(ImportError::Empty { file: file() });
    }
    // SQLite names the -wal and -shm after the file a link points to: so does the import.
    let real = std::fs::canonicalize(from).map_err(|source| ImportError::Stat {
        file: file(),
        source,
    })?;
    let dir = tempfile::Builder::new()
        .prefix("idem-import-")
        .tempdir()
        .map_err(|source| ImportError::TempDir { source })?;
    let path = dir.path().join("import.db");
    let clock = deadline::Monotonic::start();
    let read = copy::copy(
        &real,
        &path,
        &deadline::Deadline::new(&clock, timeout),
        &mut || {},
    )?;
    let (commit, page_size) = finish_image(from, &path)?;
    let bytes = std::fs::metadata(&path)
        .map_err(|source| ImportError::Copy {
            file: file(),
            from: path.clone(),
            to: path.clone(),
            source,
        })?
        .len();
    Ok(Image {
        _dir: dir,
        path,
        bytes,
        page_size,
        commit,
        read,
    })
}

/// Checks the private copy at `path` of `from` and makes it an org's database: integrity,
/// rollback-journal mode (so the file alone is the whole image once closed), the tables an
/// org's writer creates. Returns its commit sequence and page size.
pub(super) fn finish_image(from: &Path, path: &Path) -> Result<(u64, u64), ImportError> {
    let fail = |e: idem_org::idem::Error| ImportError::Prepare {
        file: from.to_owned(),
        source: e,
    };
    let conn = Connection::open(path).map_err(|e| fail(e.into()))?;
    integrity(from, &conn)?;
    conn.query_row("PRAGMA journal_mode = DELETE", [], |r| {
        r.get::<_, String>(0)
    })
    .map_err(|e| fail(e.into()))?;
    let commit = idem_org::prepare_database(&conn).map_err(fail)?;
    let page_size: i64 = conn
        .query_row("PRAGMA page_size", [], |r| r.get(0))
        .map_err(|e| fail(e.into()))?;
    conn.close().map_err(|(_, e)| fail(e.into()))?;
    Ok((commit, u64::try_from(page_size).unwrap_or(4096)))
}

/// `PRAGMA integrity_check` of the copy must answer exactly `ok`; a failure names `from`,
/// whose committed state the copy is, page for page.
fn integrity(from: &Path, conn: &Connection) -> Result<(), ImportError> {
    let rows: Vec<String> = conn
        .prepare("PRAGMA integrity_check")
        .and_then(|mut s| {
            s.query_map([], |r| r.get::<_, String>(0))?
                .collect::<Result<_, _>>()
        })
        .map_err(|e| ImportError::NotSqlite {
            file: from.to_owned(),
            why: e.to_string(),
        })?;
    if rows.len() == 1 && rows[0] == "ok" {
        return Ok(());
    }
    let shown: Vec<&str> = rows.iter().take(3).map(String::as_str).collect();
    Err(ImportError::Integrity {
        file: from.to_owned(),
        problems: rows.len(),
        shown: shown.join("; "),
    })
}

/// Refuses an org that already has any log entry: an import never overwrites a tenant.
pub(super) async fn refuse_existing(replica: &Replica, org: &OrgId) -> Result<(), String> {
    let log = replica
        .history(org)
        .await
        .map_err(|e| about(org, &crate::chain(&e)))?;
    if log.is_empty() {
        return Ok(());
    }
    Err(format!(
        "org {org} already exists in the store ({} log entries); import only creates new orgs, nothing was changed",
        log.len()
    ))
}

/// Claims the org as `writer`, ships the prepared file as its first snapshot (streamed from
/// the file) and releases it, so a server claims at once.
pub(super) async fn publish(
    replica: &Replica,
    org: &OrgId,
    image: &Path,
    commit: u64,
    writer: &str,
) -> Result<idem_org::replica::Shipped, String> {
    let step = |what: &'static str| {
        move |e: idem_org::replica::Error| about(org, &format!("{what}: {}", crate::chain(&e)))
    };
    let mut claim = replica
        .claim(org, writer, false)
        .await
        .map_err(step("claim"))?;
    // Another writer created the org between the check and the claim: leave it theirs.
    if claim.round() != 1 {
        let _ = replica.release(&mut claim).await;
        return Err(format!(
            "org {org} was created in the store while importing (claimed round {}); nothing was imported",
            claim.round()
        ));
    }
    let shipped = match replica.ship_file(&mut claim, image, commit).await {
        Ok(s) => s,
        Err(e) => {
            let _ = replica.release(&mut claim).await;
            return Err(step("ship")(e));
        }
    };
    replica
        .release(&mut claim)
        .await
        .map_err(step("release (the snapshot is published)"))?;
    Ok(shipped)
}
