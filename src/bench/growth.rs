//! P3: bytes shipped per acknowledged request as the org database grows (1, 10, 100 MB and
//! 1 GB when asked), with 1 KB writes from 8 clients. A ship is a full snapshot today, so this
//! row grows with the database: it is the honest cost of full snapshots.

use std::path::Path;
use std::time::{Duration, Instant};

use super::group::registry;
use super::{BenchResult, ms, quantile};

/// 1 KB of half-random, half-zero bytes: compresses about 2:1, like typical row data.
const ROW: &str = "randomblob(512) || zeroblob(512)";

/// Prints the P3 table.
pub async fn run(dir: &Path, quick: bool, gigabyte: bool, time: Duration) -> BenchResult<()> {
    let mut sizes: Vec<u64> = if quick { vec![1, 4] } else { vec![1, 10, 100] };
    if gigabyte {
        sizes.push(1024);
    }
    let clients = 8;
    println!(
        "\nP3 bytes shipped per ack vs database size: 1 KB writes, {clients} clients, {:.1} s per row",
        time.as_secs_f64()
    );
    println!(
        "| database | acked req/s | ack p50 | ack p99 | bytes shipped/ack | compressed bytes/ship |"
    );
    println!("|---|---|---|---|---|---|");
    for mb in sizes {
        let work = dir.join(format!("p3-{mb}"));
        let reg = registry(&work).await?;
        let org = reg.acquire("acme").await?;
        let rows = i64::try_from(mb * 1024)?;
        org.once("preload", move |tx| {
            tx.execute(
                &format!(
                    "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < ?1)
                     INSERT INTO t SELECT 'pre' || i, {ROW} FROM c"
                ),
                [rows],
            )?;
            Ok::<_, rusqlite::Error>(Vec::new())
        })
        .await?;
        let before = org.stats();
        let deadline = Instant::now() + time;
        let started = Instant::now();
        let mut tasks = Vec::new();
        for c in 0..clients {
            let org = org.clone();
            tasks.push(tokio::spawn(async move {
                let mut lat = Vec::new();
                for i in 0u64.. {
                    if Instant::now() >= deadline {
                        break;
                    }
                    let key = format!("{c}-{i}");
                    let k = key.clone();
                    let t = Instant::now();
                    org.once(&key, move |tx| {
                        tx.execute(&format!("INSERT INTO t VALUES (?1, {ROW})"), [&k])?;
                        Ok::<_, rusqlite::Error>(Vec::new())
                    })
                    .await?;
                    lat.push(t.elapsed());
                }
                Ok::<_, idem_org::Error>(lat)
            }));
        }
        let mut lat = Vec::new();
        for t in tasks {
            lat.extend(t.await??);
        }
        let elapsed = started.elapsed().as_secs_f64();
        lat.sort();
        let after = org.stats();
        reg.shutdown().await;
        let _ = std::fs::remove_dir_all(&work);
        let (ships, bytes) = (
            after.ships - before.ships,
            after.bytes_shipped - before.bytes_shipped,
        );
        println!(
            "| {mb} MB | {:.0} | {} | {} | {:.0} | {:.0} |",
            lat.len() as f64 / elapsed,
            ms(quantile(&lat, 0.5)),
            ms(quantile(&lat, 0.99)),
            bytes as f64 / lat.len().max(1) as f64,
            bytes as f64 / ships.max(1) as f64
        );
    }
    Ok(())
}
