//! Ship and hydrate throughput vs raw zstd on the same bytes, in one run.
//!
//! `IDEM_BENCH_MB=10,100 cargo bench -p idem-replica --bench ship` (default `1` for a smoke run).
#![allow(clippy::unwrap_used, missing_docs)]

use idem_base::Stopwatch;
use std::sync::Arc;

use idem_replica::{OrgId, Replica, Settings, Snapshot};
use object_store::ObjectStore;

fn build_db(mb: usize) -> Snapshot {
    let conn = rusqlite::Connection::open_in_memory().unwrap();
    conn.execute_batch("CREATE TABLE kv(id INTEGER PRIMARY KEY, k TEXT, v TEXT)")
        .unwrap();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let tx = conn.unchecked_transaction().unwrap();
    let mut i: i64 = 0;
    // Rows look like application data: a key, a JSON-ish value with some entropy.
    while (conn
        .query_row("PRAGMA page_count", [], |r| r.get::<_, i64>(0))
        .unwrap()
        * 4096)
        < (mb as i64) << 20
    {
        for _ in 0..1000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let v = format!(
                "{{\"user\":\"user-{}\",\"amount\":{},\"token\":\"{:016x}{:016x}\",\"status\":\"ok\"}}",
                x % 10_000,
                x % 100_000,
                x,
                x.rotate_left(17)
            );
            tx.execute(
                "INSERT INTO kv(id, k, v) VALUES (?1, ?2, ?3)",
                rusqlite::params![i, format!("key-{i}"), v],
            )
            .unwrap();
            i += 1;
        }
    }
    tx.commit().unwrap();
    Snapshot::take(&conn, |_| Ok(i as u64)).unwrap()
}

fn mbps(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / (1 << 20) as f64 / secs
}

async fn run(
    name: &str,
    store: Arc<dyn ObjectStore>,
    snap: &Snapshot,
    tmp: &std::path::Path,
) -> (f64, f64, u64) {
    let r = Replica::open(store, "bench", Settings::default())
        .await
        .unwrap();
    let org = OrgId::new(&format!("bench-{name}")).unwrap();
    let mut claim = r.claim(&org, "bench", true).await.unwrap();
    let t = Stopwatch::start();
    let shipped = r.ship(&mut claim, snap.clone()).await.unwrap();
    let ship_s = t.elapsed().as_secs_f64();
    let dest = tmp.join(format!("{name}.db"));
    let t = Stopwatch::start();
    r.restore(&org, None, &dest).await.unwrap();
    let hydrate_s = t.elapsed().as_secs_f64();
    (ship_s, hydrate_s, shipped.compressed_bytes)
}

fn main() {
    let sizes: Vec<usize> = std::env::var("IDEM_BENCH_MB")
        .unwrap_or_else(|_| "1".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let tmp = std::env::temp_dir().join(format!("idem-bench-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    println!(
        "| db MB | zstd-3 compress MB/s | zstd decompress MB/s | store | ship MB/s | ship/compress | hydrate MB/s | hydrate/decompress | uploaded bytes/ship | ratio |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for mb in sizes {
        let snap = build_db(mb);
        let len = snap.len();
        let t = Stopwatch::start();
        let z = zstd::bulk::compress(snap.bytes(), 3).unwrap();
        let c_s = t.elapsed().as_secs_f64();
        let t = Stopwatch::start();
        let back = zstd::bulk::decompress(&z, len).unwrap();
        let d_s = t.elapsed().as_secs_f64();
        assert_eq!(back.len(), len);
        let stores: Vec<(&str, Arc<dyn ObjectStore>)> = vec![
            ("memory", Arc::new(object_store::memory::InMemory::new())),
            (
                "localfs",
                Replica::local_store(&tmp.join(format!("store-{mb}"))).unwrap(),
            ),
        ];
        for (name, store) in stores {
            let (ship_s, hyd_s, up) = rt.block_on(run(name, store, &snap, &tmp));
            println!(
                "| {:.1} | {:.0} | {:.0} | {name} | {:.0} | {:.2} | {:.0} | {:.2} | {up} | {:.2} |",
                len as f64 / (1 << 20) as f64,
                mbps(len, c_s),
                mbps(len, d_s),
                mbps(len, ship_s),
                c_s / ship_s,
                mbps(len, hyd_s),
                d_s / hyd_s,
                len as f64 / up as f64,
            );
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
}
