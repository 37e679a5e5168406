//! An outside process on the host with the real SQLite library: Python's `sqlite3` module (its
//! own build of SQLite, in its own process), opening an org's database file and doing one
//! thing to it, as an operator's script or a backup tool would.

use std::path::Path;
use std::process::Command;

use super::{BoxErr, R};

/// The outsider: opens the database with no busy wait (the sqlite3 shell's default; the
/// writer never lets go), does `action` `times` times, and prints `ok <value>` or
/// `error <message>` for each attempt.
const OUTSIDER: &str = r#"
import sqlite3, sys
action, db, times = sys.argv[1], sys.argv[2], int(sys.argv[3])
for i in range(times):
    try:
        conn = sqlite3.connect(db, timeout=0, isolation_level=None)
        try:
            if action == "read":
                v = conn.execute("SELECT count(*) FROM idem_keys").fetchone()[0]
            elif action == "write":
                v = conn.execute("INSERT INTO effects (key, org) VALUES ('outsider', 'acme')").rowcount
            elif action == "write-and-die":
                # Commits into the WAL and exits without closing: the WAL keeps its frames
                # and the database file is untouched (a crashed outsider).
                conn.execute("INSERT INTO effects (key, org) VALUES ('outsider', 'acme')")
                print("ok 1", flush=True)
                __import__("os")._exit(0)
            elif action == "backup":
                v = "%s.backup-%d-%d" % (db, __import__("os").getpid(), i)
                conn.execute("VACUUM INTO ?", (v,))
            else:
                v = conn.execute("PRAGMA wal_checkpoint(%s)" % action).fetchone()[0]
        finally:
            conn.close()
        print("ok %s" % v, flush=True)
    except sqlite3.Error as e:
        print("error %s" % e, flush=True)
"#;

/// Runs the outsider to completion and returns its per-attempt lines.
pub fn outside(action: &str, db: &Path, times: u32) -> Result<Vec<String>, BoxErr> {
    let out = Command::new("python3")
        .args(["-c", OUTSIDER, action])
        .arg(db)
        .arg(times.to_string())
        .output()?;
    if !out.status.success() {
        return Err(format!(
            "outsider {action} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    let lines: Vec<String> = String::from_utf8(out.stdout)?
        .lines()
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
