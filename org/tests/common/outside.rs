//! An outside process on the host with the real SQLite library: the test binary re-run as a
//! child (`outsider` test), opening an org's database file and doing one thing to it.

use std::path::Path;
use std::process::Command;

use super::{BoxErr, R};

/// Starts each line the outsider reports (the test harness prints around it).
const MARK: &str = "outsider: ";

/// The child: opens the database with SQLite, does one thing `IDEM_OUTSIDER_TIMES` times,
/// and prints `ok <value>` or `error <message>` for each. A test file that uses [`outside`]
/// calls this from a `#[test] fn outsider()`; without the environment it does nothing.
pub fn child() -> R {
    let Ok(action) = std::env::var("IDEM_OUTSIDER") else {
        return Ok(());
    };
    let db = std::env::var("IDEM_OUTSIDER_DB")?;
    let times: u32 = std::env::var("IDEM_OUTSIDER_TIMES")?.parse()?;
    for i in 0..times {
        let run = || -> rusqlite::Result<String> {
            let conn = rusqlite::Connection::open(&db)?;
            // No busy wait (the sqlite3 shell's default): the writer never lets go.
            conn.busy_timeout(std::time::Duration::ZERO)?;
            match action.as_str() {
                "read" => conn
                    .query_row("SELECT count(*) FROM idem_keys", [], |r| r.get::<_, i64>(0))
                    .map(|n| n.to_string()),
                "write" => conn
                    .execute(
                        "INSERT INTO effects (key, org) VALUES ('outsider', 'acme')",
                        [],
                    )
                    .map(|n| n.to_string()),
                "backup" => {
                    let to = format!("{db}.backup-{}-{i}", std::process::id());
                    conn.execute("VACUUM INTO ?1", [&to]).map(|_| to)
                }
                mode => conn
                    .query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
                        r.get::<_, i64>(0)
                    })
                    .map(|n| n.to_string()),
            }
        };
        match run() {
            Ok(v) => println!("\n{MARK}ok {v}"),
            Err(e) => println!("\n{MARK}error {e}"),
        }
    }
    Ok(())
}

/// Runs the outsider to completion and returns its per-attempt lines.
pub fn outside(action: &str, db: &Path, times: u32) -> Result<Vec<String>, BoxErr> {
    let out = Command::new(std::env::current_exe()?)
        .args(["--exact", "outsider", "--nocapture", "--test-threads=1"])
        .env("IDEM_OUTSIDER", action)
        .env("IDEM_OUTSIDER_DB", db)
        .env("IDEM_OUTSIDER_TIMES", times.to_string())
        .output()?;
    let lines: Vec<String> = String::from_utf8(out.stdout)?
        .lines()
        .filter_map(|l| l.strip_prefix(MARK))
        .map(str::to_owned)
        .collect();
    if lines.len() != times as usize {
        return Err(format!("outsider {action}: {} of {times} lines", lines.len()).into());
    }
    Ok(lines)
}

/// Every attempt of an outsider was refused with SQLite's "database is locked".
pub fn all_locked(action: &str, lines: &[String]) -> R {
    for l in lines {
        if !l.contains("database is locked") {
            return Err(format!("outsider {action} was not refused: {l}").into());
        }
    }
    Ok(())
}

/// The database file org `acme`'s writer serves under the data directory `data`.
pub fn served_db(data: &Path) -> Result<std::path::PathBuf, BoxErr> {
    let dir = data.join("orgs").join("acme");
    for e in std::fs::read_dir(&dir)? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "db") {
            return Ok(p);
        }
    }
    Err("no local database".into())
}
