//! Guards against a key applied twice by 8 real OS processes racing on the same keys, and
//! against a SIGKILL at a random moment leaving a key row without its writes (or the reverse).
//!
//! The test binary re-runs itself as the child (sled's pattern): `child_entry` does nothing
//! unless `IDEM_CHILD` is set, and the parent starts `current_exe() --exact child_entry`.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rusqlite::Connection;

type R = Result<(), Box<dyn std::error::Error + Send + Sync>>;

const KEYS: usize = 40;

fn spawn_child(mode: &str, db: &std::path::Path) -> std::io::Result<Child> {
    Command::new(std::env::current_exe()?)
        .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env("IDEM_CHILD", mode)
        .env("IDEM_CHILD_DB", db)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
}

fn open(db: &std::path::Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open(db)?;
    conn.busy_timeout(Duration::from_secs(30))?;
    conn.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;
         CREATE TABLE IF NOT EXISTS effects (key TEXT NOT NULL, pid INTEGER NOT NULL);",
    )?;
    Ok(conn)
}

/// The child: runs `once` over the keys in a loop; each apply writes one effect row.
#[test]
fn child_entry() -> R {
    let (Ok(mode), Ok(db)) = (std::env::var("IDEM_CHILD"), std::env::var("IDEM_CHILD_DB")) else {
        return Ok(());
    };
    let mut conn = open(db.as_ref())?;
    idem::ensure_schema(&conn)?;
    println!("ready");
    let pid = i64::from(std::process::id());
    let rounds = if mode == "crash" { usize::MAX } else { 1 };
    for i in 0..rounds.saturating_mul(KEYS) {
        let key = format!("key-{}", i % KEYS + (i / KEYS) * KEYS / 2);
        loop {
            let out = idem::once(&mut conn, &key, 1, |tx| {
                tx.execute(
                    "INSERT INTO effects VALUES (?1, ?2)",
                    rusqlite::params![key, pid],
                )?;
                Ok::<_, rusqlite::Error>(pid.to_be_bytes().to_vec())
            });
            match out {
                Err(e) if e.is_retryable() => continue,
                other => {
                    other?;
                    break;
                }
            }
        }
    }
    Ok(())
}

/// Every dedup row has exactly one effect and every effect has its dedup row.
fn check_exactly_once(
    conn: &Connection,
) -> Result<usize, Box<dyn std::error::Error + Send + Sync>> {
    let bad: i64 = conn.query_row(
        "SELECT count(*) FROM (
           SELECT k.key, (SELECT count(*) FROM effects e WHERE e.key = k.key) AS n
           FROM idem_keys k WHERE k.applied = 1) WHERE n != 1",
        [],
        |r| r.get(0),
    )?;
    let orphans: i64 = conn.query_row(
        "SELECT count(*) FROM effects e WHERE NOT EXISTS
           (SELECT 1 FROM idem_keys k WHERE k.key = e.key AND k.applied = 1)",
        [],
        |r| r.get(0),
    )?;
    assert_eq!(
        (bad, orphans),
        (0, 0),
        "keys without exactly one effect / effects without a key"
    );
    let keys: i64 = conn.query_row("SELECT count(*) FROM idem_keys", [], |r| r.get(0))?;
    Ok(keys as usize)
}

#[test]
fn eight_processes_racing_on_the_same_keys_apply_each_key_once() -> R {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("race.db");
    drop(open(&db)?);
    let mut children = (0..8)
        .map(|_| spawn_child("race", &db))
        .collect::<Result<Vec<_>, _>>()?;
    for child in &mut children {
        assert!(child.wait()?.success(), "a racing child failed");
    }
    let conn = open(&db)?;
    assert_eq!(check_exactly_once(&conn)?, KEYS);
    let winners: i64 =
        conn.query_row("SELECT count(DISTINCT pid) FROM effects", [], |r| r.get(0))?;
    assert!(winners >= 1);
    Ok(())
}

#[test]
fn sigkill_at_random_moments_never_splits_key_and_effect() -> R {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("crash.db");
    drop(open(&db)?);
    let kills = std::env::var("IDEM_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let mut rng = idem_base::SeededRng::new(u64::from(std::process::id()));
    for _ in 0..kills {
        let mut child = spawn_child("crash", &db)?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        // libtest prints its own lines first (and "test child_entry ... " before ours); the
        // schema exists once the child says "ready".
        let mut lines = BufReader::new(stdout).lines();
        while !lines
            .next()
            .transpose()?
            .ok_or("child exited before ready")?
            .ends_with("ready")
        {}
        // The kill lands anywhere from before the first commit to mid-loop.
        std::thread::sleep(Duration::from_micros(rng.below(15_000)));
        child.kill()?; // SIGKILL
        child.wait()?;
        check_exactly_once(&open(&db)?)?;
    }
    let keys = check_exactly_once(&open(&db)?)?;
    assert!(
        keys > KEYS,
        "the children made progress between kills ({keys} keys)"
    );
    Ok(())
}
