//! Snapshots of every page size, segment sizes that are not a multiple of the
//! page size (or smaller than one page), a one-page database, and a database that shrinks
//! (VACUUM) then grows between snapshots that reuse segments: each restores exactly.

use std::path::Path;
use std::sync::Arc;

use idem_replica::{OrgId, Replica, Settings, Snapshot};
use object_store::memory::InMemory;

type E = Box<dyn std::error::Error + Send + Sync>;
type R = Result<(), E>;

fn dump(path: &Path) -> Result<Vec<(i64, Vec<u8>)>, E> {
    let conn = rusqlite::Connection::open(path)?;
    let ok: String = conn.query_row("PRAGMA integrity_check", [], |r| r.get(0))?;
    assert_eq!(ok, "ok");
    let has_t: i64 = conn.query_row(
        "SELECT count(*) FROM sqlite_master WHERE name = 't'",
        [],
        |r| r.get(0),
    )?;
    if has_t == 0 {
        return Ok(Vec::new());
    }
    let rows = conn
        .prepare("SELECT id, b FROM t ORDER BY id")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    Ok(rows)
}

async fn round_trip(
    r: &Replica,
    claim: &mut idem_replica::Claim,
    org: &OrgId,
    src: &Path,
    out: &Path,
    from_file: bool,
) -> R {
    let want = dump(src)?;
    let shipped = if from_file {
        r.ship_file(claim, src, 1).await?
    } else {
        r.ship(claim, Snapshot::from_bytes(std::fs::read(src)?, 1))
            .await?
    };
    let _ = std::fs::remove_file(out);
    r.restore(org, Some(shipped.seq), out).await?;
    assert_eq!(std::fs::metadata(out)?.len(), std::fs::metadata(src)?.len());
    assert!(dump(out)? == want, "restore differs");
    let report = r.verify(org).await?;
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_size_and_odd_segment_sizes_restore_exactly() -> R {
    let dir = tempfile::tempdir()?;
    let org = OrgId::new("acme")?;
    for page_size in [512u32, 4096, 65536] {
        for segment_bytes in [1usize, 700, 4096, 65535, 65536 + 512, 200_000] {
            let store = Arc::new(InMemory::new());
            let settings = Settings {
                segment_bytes,
                ..Settings::default()
            };
            let r = Replica::open(store, "t", settings).await?;
            let mut claim = r.claim(&org, "w", false).await?;
            let src = dir
                .path()
                .join(format!("src-{page_size}-{segment_bytes}.db"));
            let out = dir.path().join("out.db");
            let conn = rusqlite::Connection::open(&src)?;
            // A one-page database first.
            conn.execute_batch(&format!(
                "PRAGMA page_size = {page_size}; PRAGMA user_version = 7;"
            ))?;
            assert_eq!(std::fs::metadata(&src)?.len(), u64::from(page_size));
            round_trip(&r, &mut claim, &org, &src, &out, true).await?;
            // Grow, ship from memory and from the file.
            conn.execute_batch(
                "CREATE TABLE t (id INTEGER PRIMARY KEY, b BLOB);
                 WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 150)
                 INSERT INTO t SELECT i, randomblob(700) FROM n;",
            )?;
            round_trip(&r, &mut claim, &org, &src, &out, false).await?;
            // Shrink (the file loses pages) and reuse what did not move.
            conn.execute_batch("DELETE FROM t WHERE id > 20; VACUUM;")?;
            round_trip(&r, &mut claim, &org, &src, &out, true).await?;
            // Grow again.
            conn.execute_batch(
                "WITH RECURSIVE n(i) AS (SELECT 21 UNION ALL SELECT i + 1 FROM n WHERE i < 90)
                 INSERT INTO t SELECT i, randomblob(300) FROM n;",
            )?;
            round_trip(&r, &mut claim, &org, &src, &out, false).await?;
            drop(conn);
        }
    }
    Ok(())
}
