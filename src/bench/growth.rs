//! P3: bytes shipped per acknowledged request as the org database grows (1, 10, 100 MB and
//! 1 GB when asked), with 1 KB writes from 8 clients. A ship is a full snapshot today, so this
//! row grows with the database: it is the honest cost of full snapshots.

use std::path::Path;
use std::time::Duration;

use super::group::{acked_row_with, registry};
use super::{BenchResult, ms};

/// 1 KB of half-random, half-zero bytes: compresses about 2:1, like typical row data.
const ROW: &str = "randomblob(512) || zeroblob(512)";

/// One 1 KB row per request.
fn write_1k(tx: &rusqlite::Transaction<'_>, key: &str) -> rusqlite::Result<Vec<u8>> {
    tx.prepare_cached(&format!("INSERT INTO t VALUES (?1, {ROW})"))?
        .execute([key])?;
    Ok(Vec::new())
}

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
        let row = acked_row_with(&org, clients, time, write_1k).await?;
        reg.shutdown().await;
        let _ = std::fs::remove_dir_all(&work);
        println!(
            "| {mb} MB | {:.0} | {} | {} | {:.0} | {:.0} |",
            row.rps,
            ms(row.p50),
            ms(row.p99),
            row.bytes_shipped as f64 / row.acks.max(1) as f64,
            row.bytes_shipped as f64 / row.ships.max(1) as f64
        );
    }
    Ok(())
}
