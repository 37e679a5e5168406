//! Ship latency and acknowledged requests per second on the local-directory store (fsync)
//! and on the S3 API server named by `IDEM_S3_ENDPOINT` (moto on loopback via
//! `scripts/s3-server -- cargo bench -p idem-org --bench s3_vs_local`), in one run.
//!
//! Per store: p50/p99 of `Replica::ship` for a small database (`IDEM_BENCH_SHIPS`, default
//! 100 ships), then one org through `idem_org` at 1 and 64 concurrent clients for
//! `IDEM_BENCH_SECS` seconds each (default 3): acknowledged requests/s and ack p50/p99.
#![allow(missing_docs, clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use idem_base::{Clock, Stopwatch, SystemClock};

use idem_org::{Registry, RegistrySettings};
use idem_replica::{OrgId, Replica, conformance};
use object_store::ObjectStore;

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn unique(tag: &str) -> String {
    let nanos = SystemClock
        .now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("bench-{tag}-{}-{nanos}", std::process::id())
}

/// Ship latency of `n` successive ships of a 200-row database by one claim.
async fn ships(store: Arc<dyn ObjectStore>, n: usize) -> Ships {
    let r = Replica::open(store, &unique("ship"), idem_replica::Settings::default())
        .await
        .unwrap();
    let org = OrgId::new("acme").unwrap();
    let mut claim = r.claim(&org, "bench", false).await.unwrap();
    let mut lat = Vec::with_capacity(n);
    let mut bytes = 0;
    for _ in 0..n {
        let snap = conformance::test_snapshot(200).unwrap();
        let start = Stopwatch::start();
        let s = r.ship(&mut claim, snap).await.unwrap();
        lat.push(start.elapsed());
        bytes = s.compressed_bytes;
    }
    // Every ship re-reads the log above its slot; show how its cost follows log length.
    let k = n.clamp(1, 10);
    let mut early = lat[..k].to_vec();
    let mut late = lat[n - k..].to_vec();
    early.sort();
    late.sort();
    lat.sort();
    Ships {
        p50: pct(&lat, 0.5),
        p99: pct(&lat, 0.99),
        early_p50: pct(&early, 0.5),
        late_p50: pct(&late, 0.5),
        bytes,
    }
}

struct Ships {
    p50: Duration,
    p99: Duration,
    early_p50: Duration,
    late_p50: Duration,
    bytes: u64,
}

/// Acked requests/s and ack p50/p99 for one org at `clients` concurrent clients.
async fn acks(store: Arc<dyn ObjectStore>, clients: usize, secs: f64) -> (f64, Duration, Duration) {
    let dir = tempfile::tempdir().unwrap();
    let replica = Replica::open(store, &unique("org"), idem_replica::Settings::default())
        .await
        .unwrap();
    let reg = Registry::builder(dir.path().join("data"), replica, "bench")
        .settings(RegistrySettings::default())
        .on_open(|c| c.execute_batch("CREATE TABLE IF NOT EXISTS t (k TEXT, v BLOB)"))
        .build()
        .unwrap();
    let org = reg
        .acquire(&idem_replica::OrgId::new("acme").unwrap())
        .await
        .unwrap();
    let run_for = Duration::from_secs_f64(secs);
    let started = Stopwatch::start();
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let org = org.clone();
            tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut i = 0u64;
                while started.elapsed() < run_for {
                    let key = format!("{c}-{i}");
                    i += 1;
                    let k2 = key.clone();
                    let start = Stopwatch::start();
                    org.once(&key, move |tx| {
                        tx.execute("INSERT INTO t VALUES (?1, zeroblob(100))", [&k2])?;
                        Ok::<_, rusqlite::Error>(vec![])
                    })
                    .await
                    .unwrap();
                    lat.push(start.elapsed());
                }
                lat
            })
        })
        .collect();
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.unwrap());
    }
    let elapsed = started.elapsed().as_secs_f64();
    reg.shutdown().await;
    lat.sort();
    (lat.len() as f64 / elapsed, pct(&lat, 0.5), pct(&lat, 0.99))
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let secs: f64 = env_or("IDEM_BENCH_SECS", 3.0);
    let n: usize = env_or("IDEM_BENCH_SHIPS", 100);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let local_dir = tempfile::tempdir().unwrap();
    let mut stores: Vec<(&str, Arc<dyn ObjectStore>)> = vec![(
        "local directory (fsync)",
        Replica::local_store(local_dir.path()).unwrap(),
    )];
    match conformance::s3_store_from_env().unwrap() {
        Some(s3) => stores.push(("S3 API: moto on loopback", s3)),
        None => eprintln!("skipped S3 row: IDEM_S3_ENDPOINT not set (run under scripts/s3-server)"),
    }
    println!(
        "one org; {n} ships of a 200-row database; {secs} s per client count; 2 worker threads"
    );
    println!(
        "| store | ship p50 | ship p99 | acked req/s, 1 client | ack p50, 1 client | acked req/s, 64 clients | ack p50, 64 | ack p99, 64 |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let mut ship_rows = Vec::new();
    for (name, store) in stores {
        let s = rt.block_on(ships(store.clone(), n));
        let (rps1, p50_1, _) = rt.block_on(acks(store.clone(), 1, secs));
        let (rps64, p50_64, p99_64) = rt.block_on(acks(store, 64, secs));
        println!(
            "| {name} | {:.2?} | {:.2?} | {rps1:.0} | {p50_1:.2?} | {rps64:.0} | {p50_64:.2?} | {p99_64:.2?} |",
            s.p50, s.p99
        );
        ship_rows.push(format!(
            "| {name} | {:.2?} | {:.2?} | {} |",
            s.early_p50, s.late_p50, s.bytes
        ));
    }
    println!();
    println!("ship p50 by log length (no retention during the {n} ships)");
    println!("| store | first 10 ships | last 10 ships | bytes per blob |");
    println!("|---|---|---|---|");
    for row in ship_rows {
        println!("{row}");
    }
}
