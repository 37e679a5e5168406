//! P1: `once` versus the same effect transaction without the dedup row (file database, WAL),
//! at synchronous FULL and NORMAL, with random UUID-like keys into a table already holding
//! keys; ratios and WAL bytes per request. Targets: <= 1.15x (FULL), <= 1.5x (NORMAL).

use std::path::Path;
use std::time::{Duration, Instant};

use idem_org::rusqlite::{Connection, TransactionBehavior};
use idem_org::{idem, rusqlite};

use super::BenchResult;

struct Keys(u64);

impl Keys {
    fn next(&mut self) -> String {
        let mut word = || {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        };
        format!("{:016x}{:016x}", word(), word())
    }
}

fn effect(tx: &rusqlite::Transaction<'_>, key: &str) -> rusqlite::Result<Vec<u8>> {
    tx.prepare_cached("INSERT INTO effects (key, cents) VALUES (?1, 500)")?
        .execute([key])?;
    Ok(b"{\"ok\":true}".to_vec())
}

fn plain(conn: &mut Connection, key: &str) -> BenchResult<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    effect(&tx, key)?;
    tx.commit()?;
    Ok(())
}

fn dedup(conn: &mut Connection, key: &str) -> BenchResult<()> {
    idem::once(conn, key, 1, |tx| effect(tx, key))?;
    Ok(())
}

/// A database holding `preload` applied keys, each written by `once` as a real request would
/// (through idem's public API: the dedup table is idem's own), at synchronous OFF for speed;
/// the measured runs then use `sync`.
fn setup(path: &Path, sync: &str, preload: usize, keys: &mut Keys) -> BenchResult<Connection> {
    let mut conn = Connection::open(path)?;
    conn.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=OFF;
         CREATE TABLE effects (id INTEGER PRIMARY KEY, key TEXT NOT NULL, cents INTEGER NOT NULL);",
    )?;
    for _ in 0..preload {
        let k = keys.next();
        idem::once(&mut conn, &k, 1, |tx| effect(tx, &k))?;
    }
    conn.execute_batch(&format!(
        "PRAGMA synchronous={sync}; PRAGMA wal_checkpoint(TRUNCATE)"
    ))?;
    Ok(conn)
}

type Op = fn(&mut Connection, &str) -> BenchResult<()>;

/// Mean time and WAL bytes per request over `n` requests (auto-checkpoint off meanwhile).
fn measure(
    path: &Path,
    conn: &mut Connection,
    keys: &mut Keys,
    n: usize,
    op: Op,
) -> BenchResult<(Duration, f64)> {
    conn.execute_batch("PRAGMA wal_autocheckpoint=0; PRAGMA wal_checkpoint(TRUNCATE)")?;
    let wal = path.with_extension("db-wal");
    let before = std::fs::metadata(&wal).map_or(0, |m| m.len());
    let start = Instant::now();
    for _ in 0..n {
        op(conn, &keys.next())?;
    }
    let took = start.elapsed();
    let after = std::fs::metadata(&wal).map_or(0, |m| m.len());
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE); PRAGMA wal_autocheckpoint=1000")?;
    Ok((
        took / n as u32,
        after.saturating_sub(before) as f64 / n as f64,
    ))
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Prints the P1 table.
pub fn run(dir: &Path, quick: bool) -> BenchResult<()> {
    let (preload, n, runs) = if quick {
        (2_000, 50, 3)
    } else {
        (100_000, 400, 5)
    };
    outln!(
        "\nP1 dedup overhead: {preload} keys preloaded, {n} requests per run, median of {runs} interleaved runs"
    );
    outln!(
        "| synchronous | effect only | once | ratio | target | WAL B/req effect | WAL B/req once |"
    );
    outln!("|---|---|---|---|---|---|---|");
    for (sync, target) in [("FULL", 1.15), ("NORMAL", 1.5)] {
        let path = dir.join(format!("p1-{sync}.db"));
        let _ = std::fs::remove_file(&path);
        let mut keys = Keys(0x9E37_79B9_7F4A_7C15);
        let mut conn = setup(&path, sync, preload, &mut keys)?;
        let (mut tp, mut td, mut wp, mut wd) = (Vec::new(), Vec::new(), 0.0, 0.0);
        for _ in 0..runs {
            let (t, w) = measure(&path, &mut conn, &mut keys, n, plain)?;
            tp.push(t);
            wp = w;
            let (t, w) = measure(&path, &mut conn, &mut keys, n, dedup)?;
            td.push(t);
            wd = w;
        }
        let (p, d) = (median(tp), median(td));
        let ratio = d.as_secs_f64() / p.as_secs_f64().max(f64::MIN_POSITIVE);
        outln!(
            "| {sync} | {} | {} | {ratio:.2}x | <= {target}x {} | {wp:.0} | {wd:.0} |",
            super::ms(p),
            super::ms(d),
            if ratio <= target { "met" } else { "MISSED" }
        );
    }
    Ok(())
}
