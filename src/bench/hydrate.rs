//! P5: hydrate of a 100 MB database (download, zstd decompress, sha256, write + fsync,
//! quick_check, rename) versus raw zstd decompress + copy of the same blob.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use idem_replica::{OrgId, Replica, Snapshot};
use object_store::ObjectStoreExt;

use super::BenchResult;

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
    let replica = Replica::open(store.clone(), "", idem_replica::Settings::default()).await?;
    let org = OrgId::new("acme")?;
    let mut claim = replica.claim(&org, "bench-a", false).await?;
    let snap = Snapshot::take(&conn, |_| Ok(1))?;
    let shipped = replica.ship(&mut claim, snap).await?;
    replica.release(&mut claim).await?;

    let next = replica.claim(&org, "bench-b", false).await?;
    let t = Instant::now();
    replica.hydrate(&next, &work.join("hydrated.db")).await?;
    let hydrate = t.elapsed();

    let t = Instant::now();
    let blob = store
        .get(&object_store::path::Path::from(shipped.blob.as_str()))
        .await?
        .bytes()
        .await?;
    // The blob is a 12-byte header ("idemsnap" + u32 version) before the zstd frame.
    let raw = zstd::decode_all(blob.get(12..).ok_or("short blob")?)?;
    let mut out = std::fs::File::create(work.join("raw.db"))?;
    out.write_all(&raw)?;
    out.sync_all()?;
    let baseline = t.elapsed();
    let _ = std::fs::remove_dir_all(&work);

    println!(
        "\nP5 hydrate vs raw decompress + copy: {:.1} MB database, {:.1} MB blob",
        shipped.bytes as f64 / 1e6,
        shipped.compressed_bytes as f64 / 1e6
    );
    println!("| path | time | MB/s (uncompressed) |");
    println!("|---|---|---|");
    let mbs = |d: std::time::Duration| {
        shipped.bytes as f64 / 1e6 / d.as_secs_f64().max(f64::MIN_POSITIVE)
    };
    println!(
        "| hydrate (verify sha256 + quick_check, atomic install) | {} | {:.0} |",
        super::ms(hydrate),
        mbs(hydrate)
    );
    println!(
        "| raw get + zstd decompress + write + fsync | {} | {:.0} |",
        super::ms(baseline),
        mbs(baseline)
    );
    println!(
        "hydrate/raw ratio {:.2}x",
        hydrate.as_secs_f64() / baseline.as_secs_f64().max(f64::MIN_POSITIVE)
    );
    Ok(())
}
