//! Acknowledged requests per second for one org at 1, 8, 64 and 256 concurrent clients on
//! the local-directory store (fsync'd), with ack latency p50/p99, ships per second and bytes
//! shipped per ack, all in one run. `IDEM_BENCH_SECS` sets seconds per row (default 3).
#![allow(missing_docs, clippy::unwrap_used)]

use std::time::{Duration, Instant};

use idem_org::{Registry, Settings};
use idem_replica::Replica;

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

async fn row(clients: usize, secs: f64) -> (f64, Duration, Duration, f64, f64) {
    let dir = tempfile::tempdir().unwrap();
    let store = Replica::local_store(&dir.path().join("store")).unwrap();
    let replica = Replica::open(store, "", idem_replica::Settings::default())
        .await
        .unwrap();
    let reg = Registry::builder(dir.path().join("data"), replica, "bench")
        .settings(Settings::default())
        .on_open(|c| c.execute_batch("CREATE TABLE IF NOT EXISTS t (k TEXT, v BLOB)"))
        .build()
        .unwrap();
    let org = reg.acquire("acme").await.unwrap();
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for c in 0..clients {
        let org = org.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut i = 0u64;
            while Instant::now() < deadline {
                let key = format!("{c}-{i}");
                i += 1;
                let start = Instant::now();
                let k2 = key.clone();
                org.once(&key, move |tx| {
                    tx.execute("INSERT INTO t VALUES (?1, zeroblob(100))", [&k2])?;
                    Ok::<_, rusqlite::Error>(vec![])
                })
                .await
                .unwrap();
                lat.push(start.elapsed());
            }
            lat
        }));
    }
    let started = Instant::now();
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.unwrap());
    }
    let elapsed = started.elapsed().as_secs_f64();
    lat.sort();
    let stats = org.stats();
    reg.shutdown().await;
    let acks = lat.len() as f64;
    (
        acks / elapsed,
        pct(&lat, 0.5),
        pct(&lat, 0.99),
        stats.ships as f64 / elapsed,
        stats.bytes_shipped as f64 / acks,
    )
}

fn main() {
    let secs: f64 = std::env::var("IDEM_BENCH_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3.0);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!("one org, local-directory store (fsync), {secs} s per row");
    println!("| clients | acked req/s | ack p50 | ack p99 | ships/s | bytes shipped/ack |");
    println!("|---|---|---|---|---|---|");
    let mut first = 0.0;
    let mut rows = Vec::new();
    for clients in [1usize, 8, 64, 256] {
        let (rps, p50, p99, sps, bpa) = rt.block_on(row(clients, secs));
        if clients == 1 {
            first = rps;
        }
        rows.push((clients, rps));
        println!("| {clients} | {rps:.0} | {p50:.2?} | {p99:.2?} | {sps:.0} | {bpa:.0} |");
    }
    for (clients, rps) in rows.iter().skip(1) {
        println!(
            "{clients}:1 throughput ratio {:.1}x",
            rps / first.max(f64::MIN_POSITIVE)
        );
    }
}
