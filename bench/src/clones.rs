//! P11b: cloning a tenant (`docs/design.md` 2e). One org of a given size (incompressible
//! rows) with a snapshot and ten deltas after it is cloned at its newest position twice
//! through an S3-shaped store: by reference (`Replica::clone_into`), and as the whole copy
//! `idem clone` falls back to (restore, then ship the file as a full snapshot). The deltas
//! either rewrite rows spread over the whole database (every 997th row: the worst case for
//! sharing) or the newest rows and append (what a tenant's recent activity looks like).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_org::replica::{CloneOutcome, OrgId, Replica, Settings, Snapshot};
use idem_org::rusqlite::{Connection, MAIN_DB};
use idem_replica::latency::{LatencyStore, Op, Recorded, Shapes};

use super::{BenchResult, ms};

/// What one way of cloning cost.
struct Cost {
    requests: usize,
    puts: usize,
    depth: usize,
    uploaded: u64,
    wall: Duration,
}

impl Cost {
    fn of(done: &Recorded, uploaded: u64, wall: Duration) -> Cost {
        Cost {
            requests: done.requests.len(),
            puts: done.requests.iter().filter(|r| r.op == Op::Put).count(),
            depth: done.depth(),
            uploaded,
            wall,
        }
    }

    fn cell(&self) -> String {
        format!(
            "{} requests ({} PUTs), {} round trips, {:.1} MB written, {}",
            self.requests,
            self.puts,
            self.depth,
            self.uploaded as f64 / 1e6,
            ms(self.wall)
        )
    }
}

/// Prints the P11b table.
pub async fn run(dir: &Path, quick: bool) -> BenchResult<()> {
    let sizes: &[u64] = if quick { &[4, 8] } else { &[4, 64] };
    outln!(
        "\nP11b cloning a tenant at its newest position (a snapshot and 10 deltas after it) on S3-shaped latency (p50 28 ms a request)"
    );
    outln!(
        "| database | by reference (names the source's segments) | whole copy (restore, then a full snapshot) | target |"
    );
    outln!("|---|---|---|---|");
    for &spread in &[true, false] {
        for &mib in sizes {
            let (shared, copied) = clone_once(dir, mib, spread).await?;
            let how = if spread {
                "changes spread over every part"
            } else {
                "changes to the newest rows"
            };
            outln!(
                "| {mib} MiB, {how} | {} | {} | cost independent of size |",
                shared.cell(),
                copied.cell()
            );
        }
    }
    Ok(())
}

/// Builds an org of about `mib` MiB and clones it both ways; its ten deltas rewrite rows
/// spread over the database (`spread`) or the newest rows, with a few appended.
async fn clone_once(dir: &Path, mib: u64, spread: bool) -> BenchResult<(Cost, Cost)> {
    let root = dir.join(format!("p11b-{mib}-{spread}"));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root)?;
    let store = Replica::local_store(&root.join("store"))?;
    let writer = Replica::open(store.clone(), "", Settings::default()).await?;
    let src = OrgId::new("source")?;
    let mut conn = Connection::open_in_memory()?;
    conn.execute_batch("PRAGMA page_size = 4096; CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")?;
    conn.execute(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i < ?1) INSERT INTO t SELECT i, randomblob(1000) FROM n",
        [mib as i64 * 1024],
    )?;
    let mut prev = conn.serialize(MAIN_DB)?.to_vec();
    let mut claim = writer.claim(&src, "bench", false).await?;
    writer
        .ship(&mut claim, Snapshot::from_bytes(prev.clone(), 1))
        .await?;
    let rows = mib as i64 * 1024;
    for commit in 2..12u64 {
        if spread {
            conn.execute(
                "UPDATE t SET v = randomblob(1000) WHERE id % 997 = ?1",
                [commit as i64],
            )?;
        } else {
            conn.execute(
                "UPDATE t SET v = randomblob(1000) WHERE id > ?1 - 60 AND id % 3 = ?2 % 3",
                [rows, commit as i64],
            )?;
            conn.execute_batch(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i < 6) INSERT INTO t (v) SELECT randomblob(1000) FROM n",
            )?;
        }
        let next = conn.serialize(MAIN_DB)?.to_vec();
        let delta = super::window::diff(&prev, &next, commit)?;
        writer.ship_delta(&mut claim, delta).await?;
        prev = next;
    }
    writer.release(&mut claim).await?;
    let shaped = Arc::new(LatencyStore::new(store, Shapes::s3(), 5));
    let r = Replica::open(shaped.clone(), "", Settings::default()).await?;

    let dst = OrgId::new("by-reference")?;
    let trace = shaped.trace();
    let t = Instant::now();
    let mut claim = r.claim(&dst, "bench", false).await?;
    let CloneOutcome::Shared(c) = r.clone_into(&mut claim, &src, None).await? else {
        return Err("the bench org was copied, not shared".into());
    };
    r.release(&mut claim).await?;
    let wall = t.elapsed();
    let uploaded = c.snapshot.uploaded_bytes;
    let done = trace.finish();
    let shared = Cost::of(&done, uploaded, wall);

    let dst = OrgId::new("copied")?;
    let file = root.join("copy.db");
    let trace = shaped.trace();
    let t = Instant::now();
    let got = r.restore(&src, None, &file).await?;
    let mut claim = r.claim(&dst, "bench", false).await?;
    let shipped = r.ship_file(&mut claim, &file, got.commit).await?;
    r.release(&mut claim).await?;
    let wall = t.elapsed();
    let copied = Cost::of(&trace.finish(), shipped.uploaded_bytes, wall);
    let _ = std::fs::remove_dir_all(&root);
    Ok((shared, copied))
}
