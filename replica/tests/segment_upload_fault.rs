//! A segment PUT that fails while the reading thread still has segments to hand
//! over must end the ship with the error, not hang it (the reader blocks on a full channel
//! whose receiver nobody polls any more).

use std::sync::Arc;
use std::time::Duration;

use idem_replica::fault::{Fault, FaultStore, Op};
use idem_replica::{OrgId, Replica, Settings};
use object_store::memory::InMemory;

type R = Result<(), Box<dyn std::error::Error + Send + Sync>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_segment_put_ends_the_ship_with_its_error() -> R {
    let dir = tempfile::tempdir()?;
    let src = dir.path().join("tenant.db");
    rusqlite::Connection::open(&src)?.execute_batch(
        "CREATE TABLE t (id INTEGER PRIMARY KEY, b BLOB);
         WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 400)
         INSERT INTO t SELECT i, randomblob(1000) FROM n;",
    )?;
    let store = Arc::new(FaultStore::new(Arc::new(InMemory::new())));
    let settings = Settings {
        segment_bytes: 4096,
        upload_concurrency: 2,
        ..Settings::default()
    };
    let r = Replica::open(store.clone(), "t", settings).await?;
    let org = OrgId::new("acme")?;
    let mut claim = r.claim(&org, "w", false).await?;
    // The third segment PUT fails; ~100 segments are still to come.
    store.inject(Op::Put, ".seg.zst", 3, Fault::FailBefore);
    let shipped = tokio::time::timeout(Duration::from_secs(30), r.ship_file(&mut claim, &src, 1))
        .await
        .map_err(|_| "the ship hung after a segment PUT failed")?;
    assert!(shipped.is_err(), "{shipped:?}");
    // The claim goes on: the next ship uploads everything and lands.
    let again = tokio::time::timeout(Duration::from_secs(30), r.ship_file(&mut claim, &src, 1))
        .await
        .map_err(|_| "the second ship hung")??;
    assert_eq!(again.commit, 1);
    Ok(())
}
