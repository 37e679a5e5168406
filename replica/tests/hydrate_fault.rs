//! A restore whose k-th segment GET fails mid-stream leaves the destination exactly as it
//! was and no temp file beside it; the next attempt installs the snapshot (I10).

use std::path::Path;
use std::sync::Arc;

use idem_replica::fault::{Fault, FaultStore, Op};
use idem_replica::{Error, OrgId, Replica, Settings};
use object_store::memory::InMemory;

type R = Result<(), Box<dyn std::error::Error + Send + Sync>>;

type Rows = Vec<(i64, Vec<u8>)>;

/// A database of ~300 KB of random rows (about 20 segments of 16 KiB); returns its rows.
fn tenant(path: &Path) -> Result<Rows, Box<dyn std::error::Error + Send + Sync>> {
    rusqlite::Connection::open(path)?.execute_batch(
        "CREATE TABLE t (id INTEGER PRIMARY KEY, b BLOB);
         WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300)
         INSERT INTO t SELECT i, randomblob(1000) FROM n;",
    )?;
    rows(path)
}

fn rows(path: &Path) -> Result<Rows, Box<dyn std::error::Error + Send + Sync>> {
    let conn = rusqlite::Connection::open(path)?;
    let rows = conn
        .prepare("SELECT id, b FROM t ORDER BY id")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    Ok(rows)
}

fn names(dir: &Path) -> Result<Vec<String>, Box<dyn std::error::Error + Send + Sync>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        out.push(e?.file_name().to_string_lossy().into_owned());
    }
    out.sort();
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segment_get_failing_mid_restore_leaves_the_destination_untouched() -> R {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(FaultStore::new(Arc::new(InMemory::new())));
    let settings = Settings {
        segment_bytes: 16 << 10,
        ..Settings::default()
    };
    let replica = Replica::open(store.clone(), "", settings).await?;
    let org = OrgId::new("acme")?;
    let source = dir.path().join("source.db");
    let want = tenant(&source)?;
    let mut claim = replica.claim(&org, "w", false).await?;
    let shipped = replica.ship_file(&mut claim, &source, 7).await?;
    assert!(shipped.bytes > 15 * (16 << 10), "many segments");

    let out = dir.path().join("out");
    std::fs::create_dir(&out)?;
    let dest = out.join("org.db");
    std::fs::write(
        &dest,
        b"the previous file, which a failed restore must keep",
    )?;
    let before = std::fs::read(&dest)?;

    store.inject(Op::Get, ".seg.zst", 5, Fault::FailBefore);
    let failed = replica.restore(&org, None, &dest).await;
    assert!(
        matches!(failed, Err(Error::Store { .. })),
        "the injected GET fails the restore: {failed:?}"
    );
    assert_eq!(std::fs::read(&dest)?, before, "the destination was touched");
    assert_eq!(names(&out)?, ["org.db"], "the temp file was not removed");

    store.clear();
    let got = replica.restore(&org, None, &dest).await?;
    assert_eq!((got.position, got.commit), (Some(shipped.seq), 7));
    assert_eq!(rows(&dest)?, want);
    assert_eq!(names(&out)?, ["org.db"]);
    Ok(())
}
