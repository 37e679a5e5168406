//! `idem import ORG --from FILE`: an existing SQLite database becomes a new org's first
//! snapshot, so a tenant migrates without writing code.
//!
//! The user's file is only read: its pages are copied with SQLite's backup API (so a WAL
//! file's committed frames are included) into a private temp directory (`$TMPDIR`, which
//! needs room for one copy), the copy gets the tables an org's writer creates on open, and
//! the copy is shipped from the file (`Replica::ship_file`). Every step streams pages:
//! memory is bounded by SQLite's page cache and the replica's segment settings, never by
//! the database.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use idem_org::replica::{OrgId, Replica};
use idem_org::rusqlite::{Connection, OpenFlags};
use serde_json::json;

use super::{ImportArgs, about, org_id, print_json};

/// The writer id recorded in the import's claim, snapshot and release.
const WRITER: &str = "idem-import";

/// Pages the backup copies per step (between steps SQLite's cache is all it holds).
const BACKUP_PAGES_PER_STEP: std::os::raw::c_int = 1024;

/// The prepared copy and what it holds; the copy lives as long as `_dir`.
struct Image {
    _dir: tempfile::TempDir,
    path: PathBuf,
    bytes: u64,
    page_size: u64,
    commit: u64,
}

/// Runs `idem import`.
///
/// # Errors
/// Bad org id or store URL; FILE missing, not an SQLite database, or failing its integrity
/// check; the org already has a log in the store; store failures.
pub async fn import(a: ImportArgs) -> Result<ExitCode, String> {
    let org = org_id(&a.org)?;
    let from = a.from.clone();
    let image = tokio::task::spawn_blocking(move || prepare(&from))
        .await
        .map_err(|e| format!("preparing the image: {e}"))??;
    let replica = super::open(&a.store).await?;
    refuse_existing(&replica, &org).await?;
    let shipped = publish(&replica, &org, &image.path, image.commit).await?;
    let bytes = image.bytes;
    let pages = bytes / image.page_size.max(1);
    if a.json {
        print_json(&json!({
            "org": org.as_str(), "from": a.from.display().to_string(), "bytes": bytes,
            "pages": pages, "page_size": image.page_size, "commit": image.commit,
            "snapshot_seq": shipped.seq, "round": shipped.round,
            "compressed_bytes": shipped.compressed_bytes,
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

/// Checks `from` and returns the org image made from a copy of it; `from` is never written.
fn prepare(from: &Path) -> Result<Image, String> {
    let name = from.display();
    let meta = std::fs::metadata(from).map_err(|e| format!("{name}: {e}"))?;
    if !meta.is_file() {
        return Err(format!("{name}: not a file"));
    }
    // SQLite treats an empty file as an empty database; an import of nothing is a mistake.
    if meta.len() == 0 {
        return Err(format!(
            "{name}: not an SQLite database (the file is empty)"
        ));
    }
    let src = Connection::open_with_flags(
        from,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| format!("{name}: cannot open as an SQLite database: {e}"))?;
    integrity(&src).map_err(|why| format!("{name}: {why}"))?;
    let dir = tempfile::tempdir().map_err(|e| format!("creating a temp directory: {e}"))?;
    let path = dir.path().join("import.db");
    let fail =
        |e: &dyn std::error::Error| format!("preparing the copy of {name}: {}", crate::chain(e));
    let mut conn = Connection::open(&path).map_err(|e| fail(&e))?;
    {
        // Each step reads under its own shared lock; when another connection commits to
        // the source between steps, SQLite restarts the copy, so the copy holds the pages of
        // one committed state.
        let backup = rusqlite::backup::Backup::new(&src, &mut conn)
            .map_err(|e| format!("{name}: reading the database: {e}"))?;
        backup
            .run_to_completion(BACKUP_PAGES_PER_STEP, std::time::Duration::ZERO, None)
            .map_err(|e| format!("{name}: reading the database: {e}"))?;
    }
    drop(src);
    // Rollback-journal mode, so the file alone is the whole image once the connection closes.
    conn.query_row("PRAGMA journal_mode = DELETE", [], |r| {
        r.get::<_, String>(0)
    })
    .map_err(|e| fail(&e))?;
    let commit = idem_org::prepare_database(&conn).map_err(|e| fail(&e))?;
    let page_size: i64 = conn
        .query_row("PRAGMA page_size", [], |r| r.get(0))
        .map_err(|e| fail(&e))?;
    integrity(&conn).map_err(|why| format!("the prepared copy of {name}: {why}"))?;
    conn.close().map_err(|(_, e)| fail(&e))?;
    let bytes = std::fs::metadata(&path)
        .map_err(|e| format!("reading {}: {e}", path.display()))?
        .len();
    Ok(Image {
        _dir: dir,
        path,
        bytes,
        page_size: u64::try_from(page_size).unwrap_or(4096),
        commit,
    })
}

/// `PRAGMA integrity_check` must answer exactly `ok`.
fn integrity(conn: &Connection) -> Result<(), String> {
    let rows: Vec<String> = conn
        .prepare("PRAGMA integrity_check")
        .and_then(|mut s| {
            s.query_map([], |r| r.get::<_, String>(0))?
                .collect::<Result<_, _>>()
        })
        .map_err(|e| format!("not a readable SQLite database: {e}"))?;
    if rows.len() == 1 && rows[0] == "ok" {
        return Ok(());
    }
    let shown: Vec<&str> = rows.iter().take(3).map(String::as_str).collect();
    Err(format!(
        "fails SQLite's integrity check ({} problems): {}",
        rows.len(),
        shown.join("; ")
    ))
}

/// Refuses an org that already has any log entry: an import never overwrites a tenant.
async fn refuse_existing(replica: &Replica, org: &OrgId) -> Result<(), String> {
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

/// Claims the org, ships the prepared file as its first snapshot (streamed from the file)
/// and releases it, so a server claims at once.
async fn publish(
    replica: &Replica,
    org: &OrgId,
    image: &Path,
    commit: u64,
) -> Result<idem_org::replica::Shipped, String> {
    let step = |what: &'static str| {
        move |e: idem_org::replica::Error| about(org, &format!("{what}: {}", crate::chain(&e)))
    };
    let mut claim = replica
        .claim(org, WRITER, false)
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
