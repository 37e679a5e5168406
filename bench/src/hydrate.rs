//! P5: hydrate of a 100 MB database (download, zstd decompress, sha256, write + fsync,
//! quick_check, rename) versus raw GET + zstd decompress + copy of the same segments; P5b: hydrate
//! after a delta chain versus one full snapshot of the same database.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use idem_org::object_store::ObjectStoreExt;
use idem_org::replica::{LogEntry, OrgId, Replica, Snapshot};
use idem_org::{object_store, replica, rusqlite};

use super::BenchResult;
use super::group::{acked_row_with, registry, registry_with};

/// Prints the P5 table.
pub async fn run(dir: &Path, quick: bool) -> BenchResult<()> {
    let mb: u64 = if quick { 4 } else { 100 };
    let work = dir.join("p5");
    std::fs::create_dir_all(&work)?;
    let db = work.join("source.db");
    let conn = rusqlite::Connection::open(&db)?;
    conn.execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE t (k TEXT, v BLOB)")?;
    conn.execute(
        "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < ?1)
         INSERT INTO t SELECT 'r' || i, randomblob(512) || zeroblob(512) FROM c",
        [i64::try_from(mb * 1024)?],
    )?;
    let store = Replica::local_store(&work.join("store"))?;
    let replica = Replica::open(store.clone(), "", replica::Settings::default()).await?;
    let org = OrgId::new("acme")?;
    let mut claim = replica.claim(&org, "bench-a", false).await?;
    let snap = Snapshot::take(&conn, |_| Ok(1))?;
    let shipped = replica.ship(&mut claim, snap).await?;
    replica.release(&mut claim).await?;

    let mut next = replica.claim(&org, "bench-b", false).await?;
    let t = Instant::now();
    replica
        .hydrate(&mut next, &work.join("hydrated.db"))
        .await?;
    let hydrate = t.elapsed();

    let t = Instant::now();
    raw_copy(&store, &shipped.blob, &work.join("raw.db")).await?;
    let baseline = t.elapsed();
    let _ = std::fs::remove_dir_all(&work);

    outln!(
        "\nP5 hydrate vs raw decompress + copy: {:.1} MB database, {:.1} MB of segments",
        shipped.bytes as f64 / 1e6,
        shipped.compressed_bytes as f64 / 1e6
    );
    outln!("| path | time | MB/s (uncompressed) |");
    outln!("|---|---|---|");
    let mbs = |d: std::time::Duration| {
        shipped.bytes as f64 / 1e6 / d.as_secs_f64().max(f64::MIN_POSITIVE)
    };
    outln!(
        "| hydrate (verify sha256 + quick_check, atomic install) | {} | {:.0} |",
        super::ms(hydrate),
        mbs(hydrate)
    );
    outln!(
        "| raw get of the segments + zstd decompress + write + fsync | {} | {:.0} |",
        super::ms(baseline),
        mbs(baseline)
    );
    outln!(
        "hydrate/raw ratio {:.2}x",
        hydrate.as_secs_f64() / baseline.as_secs_f64().max(f64::MIN_POSITIVE)
    );
    Ok(())
}

/// The floor a hydrate is measured against: GET the snapshot's manifest, then its segments
/// (16 at a time, as a hydrate reads them), zstd-decompress each and write it in order, fsync.
/// No hashing, no checks.
async fn raw_copy(
    store: &std::sync::Arc<dyn object_store::ObjectStore>,
    manifest: &str,
    out: &Path,
) -> BenchResult<()> {
    use futures::StreamExt;
    let get = |path: String| async move {
        let bytes = store
            .get(&object_store::path::Path::from(path.as_str()))
            .await?
            .bytes()
            .await?;
        // A packed segment is a 12-byte header ("idemsnap" + u32 version) before the frame.
        let raw = tokio::task::spawn_blocking(move || {
            zstd::decode_all(bytes.get(12..).unwrap_or_default())
        })
        .await??;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(raw)
    };
    let m: serde_json::Value = serde_json::from_slice(
        &store
            .get(&object_store::path::Path::from(manifest))
            .await?
            .bytes()
            .await?,
    )?;
    let dir = manifest.rsplit_once('/').map_or("", |(d, _)| d);
    let paths: Vec<String> = m["segments"]
        .as_array()
        .ok_or("manifest has no segments")?
        .iter()
        .filter_map(|s| s[0].as_str().map(|n| format!("{dir}/{n}")))
        .collect();
    let mut file = std::fs::File::create(out)?;
    let mut segments = futures::stream::iter(paths.into_iter().map(get)).buffered(16);
    while let Some(raw) = segments.next().await {
        file.write_all(&raw?)?;
    }
    file.sync_all()?;
    Ok(())
}

/// 32 random 1 KB row updates per request over the preloaded rows: the worst case for a
/// delta chain (scattered pages, little overlap between ships), and large enough that the
/// chain reaches the policy's budget within the bench's time.
pub(crate) fn update_1k(tx: &rusqlite::Transaction<'_>, _key: &str) -> rusqlite::Result<Vec<u8>> {
    tx.prepare_cached(&format!(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 32)
         UPDATE t SET v = {} WHERE rowid IN (SELECT 1 + abs(random()) % (SELECT max(rowid) FROM t) FROM n)",
        super::growth::ROW
    ))?
    .execute([])?;
    Ok(Vec::new())
}

/// P5b: hydrate of a snapshot plus the longest delta chain the default policy lets build up
/// (deltas until their compressed bytes reach `delta_budget_percent` of the snapshot's, or
/// 4096 of them) against hydrate of one full snapshot of the same database. Both through
/// `restore`, the same path as a writer's hydrate. Compaction is off: a compaction restarts
/// the budget, so the longest chain is the one a workload that never compacts builds.
pub async fn chain(dir: &Path, quick: bool) -> BenchResult<()> {
    // The cap only matters with a raised budget: at the default the chain is complete in
    // seconds.
    let mb: u64 = if quick { 4 } else { 100 };
    let cap = Duration::from_secs(if quick { 3 } else { 300 });
    let work = dir.join("p5-chain");
    let settings = idem_org::RegistrySettings {
        ship: replica::ShipPolicy {
            compact_every_deltas: 0,
            ..replica::ShipPolicy::default()
        },
        ..idem_org::RegistrySettings::default()
    };
    let budget = settings.ship.delta_budget_percent;
    let reg = registry_with(&work, settings).await?;
    let org = reg.acquire(&OrgId::new("acme")?).await?;
    super::growth::preload(&org, mb).await?;
    let started = Instant::now();
    // Writes until the policy ships its next full snapshot (the chain before it is the
    // longest the policy allows), or until the time cap.
    while org.stats().full_ships < 2 && started.elapsed() < cap {
        acked_row_with(&org, 8, Duration::from_millis(250), update_1k).await?;
    }
    let replica = reg.replica().clone();
    let id = org.id().clone();
    let log = replica.history(&id).await?;
    let snaps: Vec<u64> = log
        .iter()
        .filter(|e| e.is_snapshot())
        .map(LogEntry::seq)
        .collect();
    let (chain_at, full_at) = match snaps.as_slice() {
        [_, .., second] => (second - 1, *second),
        _ => {
            // The cap came first: the next writer's first ship is a full snapshot of the
            // same database, right after the chain's last delta.
            reg.shutdown().await;
            let reg2 = registry(&work).await?;
            let org2 = reg2.acquire(&OrgId::new("acme")?).await?;
            org2.once("after", |tx| update_1k(tx, "after")).await?;
            reg2.shutdown().await;
            let log = replica.history(&id).await?;
            let last_delta = log
                .iter()
                .rfind(|e| e.is_delta())
                .map(LogEntry::seq)
                .ok_or("no delta shipped")?;
            let full = log
                .iter()
                .rfind(|e| e.is_snapshot())
                .map(LogEntry::seq)
                .ok_or("no snapshot")?;
            (last_delta, full)
        }
    };
    reg.shutdown().await;
    let log = replica.history(&id).await?;
    let base = log
        .iter()
        .rfind(|e| e.is_snapshot() && e.seq() < chain_at)
        .ok_or("no base snapshot")?;
    let deltas: Vec<&LogEntry> = log
        .iter()
        .filter(|e| e.is_delta() && e.seq() > base.seq() && e.seq() <= chain_at)
        .collect();
    let stored = |e: &LogEntry| e.stored().map_or(0, |s| s.compressed_bytes);
    let delta_bytes: u64 = deltas.iter().map(|e| stored(e)).sum();
    // Five alternating restores of each, medians: the machine is shared and noisy.
    let (mut chain_times, mut full_times, mut applied) = (Vec::new(), Vec::new(), 0);
    for _ in 0..5 {
        let t = Instant::now();
        let h = replica
            .restore(&id, Some(chain_at), &work.join("chain.db"))
            .await?;
        chain_times.push(t.elapsed());
        applied = h.deltas;
        let t = Instant::now();
        replica
            .restore(&id, Some(full_at), &work.join("full.db"))
            .await?;
        full_times.push(t.elapsed());
    }
    chain_times.sort();
    full_times.sort();
    let (chain_time, full_time) = (chain_times[2], full_times[2]);
    if std::env::var_os("IDEM_BENCH_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&work);
    }
    if applied != deltas.len() {
        return Err(format!(
            "restore applied {applied} deltas, the chain has {}",
            deltas.len()
        )
        .into());
    }
    outln!(
        "\nP5b hydrate after the longest delta chain the policy allows (delta_budget_percent {budget}, compaction off; {:.1} MB database, {:.0} s of random 1 KB updates; medians of 5 alternating restores)",
        base.stored().map_or(0.0, |s| s.bytes as f64 / 1e6),
        started.elapsed().as_secs_f64()
    );
    outln!("| hydrate of | objects | stored MB | time |");
    outln!("|---|---|---|---|");
    outln!(
        "| snapshot + {} deltas | {} | {:.1} | {} |",
        deltas.len(),
        deltas.len() + 1,
        (stored(base) + delta_bytes) as f64 / 1e6,
        super::ms(chain_time)
    );
    outln!(
        "| one full snapshot of the same database | 1 | {:.1} | {} |",
        log.iter().find(|e| e.seq() == full_at).map_or(0, stored) as f64 / 1e6,
        super::ms(full_time)
    );
    outln!(
        "chain/full hydrate ratio {:.2}x",
        chain_time.as_secs_f64() / full_time.as_secs_f64().max(f64::MIN_POSITIVE)
    );
    Ok(())
}
