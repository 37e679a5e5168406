//! Criterion micro-benchmarks of the hot paths: `once` (dedup insert) versus the same one-row
//! effect transaction without the dedup row, on a file database in WAL mode with 100k keys
//! already stored, at `synchronous=FULL` and `NORMAL`; the bare key INSERT (the floor); and the
//! replay lookup. The ratio table with WAL bytes per request is `idem-bench --only p1`.
#![allow(missing_docs, clippy::unwrap_used)]

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::Duration;

use criterion::Criterion;
use rusqlite::{Connection, TransactionBehavior};

const PRELOAD: usize = 100_000;

struct Keys(idem_base::SeededRng);
impl Keys {
    /// A UUID-like random key (32 hex chars), from a seeded generator so runs are repeatable.
    fn next(&mut self) -> String {
        let (high, low) = (self.0.next_u64(), self.0.next_u64());
        format!("{high:016x}{low:016x}")
    }
}

fn setup(dir: &Path, sync: &str) -> (PathBuf, Connection, Keys) {
    static RUN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let run = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = dir.join(format!("bench-{sync}-{run}.db"));
    let mut conn = Connection::open(&path).unwrap();
    conn.execute_batch(&format!(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous={sync}; PRAGMA cache_size=-65536;
         CREATE TABLE effects (id INTEGER PRIMARY KEY, key TEXT NOT NULL, cents INTEGER NOT NULL);"
    ))
    .unwrap();
    idem::ensure_schema(&conn).unwrap();
    let mut keys = Keys(idem_base::SeededRng::new(0x9E37_79B9_7F4A_7C15));
    let tx = conn.transaction().unwrap();
    for _ in 0..PRELOAD {
        let k = keys.next();
        tx.execute(
            "INSERT INTO idem_keys (key, applied, round, attempt, at_ms, result, attempts)
             VALUES (?1, 1, 1, x'00', 0, x'', 0)",
            [&k],
        )
        .unwrap();
        tx.execute("INSERT INTO effects (key, cents) VALUES (?1, 1)", [&k])
            .unwrap();
    }
    tx.commit().unwrap();
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .unwrap();
    (path, conn, keys)
}

fn effect(tx: &rusqlite::Transaction<'_>, key: &str) -> rusqlite::Result<Vec<u8>> {
    tx.prepare_cached("INSERT INTO effects (key, cents) VALUES (?1, 500)")?
        .execute([key])?;
    Ok(b"{\"ok\":true}".to_vec())
}

fn plain(conn: &mut Connection, key: &str) {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .unwrap();
    effect(&tx, key).unwrap();
    tx.commit().unwrap();
}

/// The floor: the effect plus a bare INSERT of the key row, with none of `once`'s checks.
fn bare_key(conn: &mut Connection, key: &str) {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .unwrap();
    let result = effect(&tx, key).unwrap();
    tx.prepare_cached(
        "INSERT INTO idem_keys (key, applied, round, attempt, at_ms, result, attempts)
         VALUES (?1, 1, 1, x'0102030405060708090a0b0c0d0e0f10', 1700000000000, ?2, 0)",
    )
    .unwrap()
    .execute(rusqlite::params![key, result])
    .unwrap();
    tx.commit().unwrap();
}

fn dedup(conn: &mut Connection, key: &str) {
    idem::once(conn, key, 1, |tx| effect(tx, key)).unwrap();
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Criterion::default()
        .configure_from_args()
        .sample_size(20)
        .measurement_time(Duration::from_secs(3));
    for sync in ["FULL", "NORMAL"] {
        let (_p, mut conn, mut keys) = setup(dir.path(), sync);
        let mut g = c.benchmark_group(format!("synchronous={sync}"));
        g.bench_function("effect only", |b| b.iter(|| plain(&mut conn, &keys.next())));
        g.bench_function("once", |b| b.iter(|| dedup(&mut conn, &keys.next())));
        g.bench_function("floor: effect + bare key INSERT", |b| {
            b.iter(|| bare_key(&mut conn, &keys.next()))
        });
        let key = keys.next();
        dedup(&mut conn, &key);
        g.bench_function("replay", |b| {
            b.iter(|| black_box(idem::once(&mut conn, &key, 1, |tx| effect(tx, &key)).unwrap()))
        });
        g.finish();
    }
    c.final_summary();
}
