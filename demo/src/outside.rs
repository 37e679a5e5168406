//! The demo's outside reader: what an operator running `sqlite3 <data>/orgs/<org>/<claim>.db`
//! on the host does while a replica serves. This process is not the writer, so it opens the
//! replicas' database files with SQLite as any other program would; every open must be
//! refused ("database is locked"), and the audit then shows nothing acknowledged was lost.

use idem_org::rusqlite;
use std::path::Path;
use std::time::Duration;

/// What the outside reader saw.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct OutsideReads {
    /// Served database files it tried to read.
    pub files: usize,
    /// Reads refused with "database is locked".
    pub refused: usize,
    /// Files it could read (each a violation of I13).
    pub opened: Vec<String>,
}

enum Read {
    Refused,
    Opened,
    /// Gone or not a database yet (a claim's files being created or removed).
    Neither,
}

/// Tries to read every org database under `data`. A file whose writer is still opening it
/// (hydrated, not yet locked) may be readable for a moment, so a read that succeeds is
/// retried a few times before it counts as opened.
pub async fn read_all(data: &Path) -> OutsideReads {
    let data = data.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut out = OutsideReads::default();
        for db in served_files(&data) {
            let mut last = Read::Neither;
            for _ in 0..5 {
                last = read_once(&db);
                if !matches!(last, Read::Opened) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            match last {
                Read::Refused => out.refused += 1,
                Read::Opened => out.opened.push(db.display().to_string()),
                Read::Neither => continue,
            }
            out.files += 1;
        }
        out
    })
    .await
    .unwrap_or_default()
}

fn read_once(db: &Path) -> Read {
    // Never creates a file a claim just removed.
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE;
    let read = rusqlite::Connection::open_with_flags(db, flags).and_then(|conn| {
        // The sqlite3 shell's default: no busy wait.
        conn.busy_timeout(Duration::ZERO)?;
        conn.query_row("SELECT count(*) FROM transfers", [], |r| r.get::<_, i64>(0))
    });
    match read {
        Ok(_) => Read::Opened,
        Err(e) if e.to_string().contains("database is locked") => Read::Refused,
        Err(_) => Read::Neither,
    }
}

fn served_files(data: &Path) -> Vec<std::path::PathBuf> {
    let Ok(orgs) = std::fs::read_dir(data.join("orgs")) else {
        return Vec::new();
    };
    let mut files: Vec<_> = orgs
        .flatten()
        .filter_map(|o| std::fs::read_dir(o.path()).ok())
        .flat_map(|d| d.flatten())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "db"))
        .collect();
    files.sort();
    files
}
