//! Regression: `verify` running while retention deleted objects reported "object ... is
//! missing" though a later verify was clean. A failure of an entry retention has retired
//! meanwhile reads the log again, as restore does. The race is ordered by holding verify's
//! first blob download (no sleeps).

use std::sync::Arc;

use idem_replica::conformance::test_snapshot;
use idem_replica::fault::{FaultStore, Op};
use idem_replica::{OrgId, Replica, Retention, Settings};
use object_store::memory::InMemory;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_reads_again_when_retention_retires_what_it_read()
-> Result<(), Box<dyn std::error::Error>> {
    let store = Arc::new(FaultStore::new(Arc::new(InMemory::new())));
    let replica = Replica::open(store.clone(), "", Settings::default()).await?;
    let org = OrgId::new("acme")?;
    let mut claim = replica.claim(&org, "w", false).await?;
    let old = replica.ship(&mut claim, test_snapshot(2)?).await?;
    let new = replica.ship(&mut claim, test_snapshot(3)?).await?;
    let paused = store.pause_next(Op::Get, "/snap/");
    let verify = tokio::spawn({
        let (replica, org) = (replica.clone(), org.clone());
        async move { replica.verify(&org).await }
    });
    paused.reached.await?;
    let policy = Retention {
        keep_snapshots: 1,
        keep_ms: 0,
        window_ms: 0,
        level_ms: 0,
    };
    let retired = replica.retain(&org, &policy).await?;
    assert!(retired.deleted_entries.contains(&old.seq), "{retired:?}");
    let _ = paused.resume.send(());
    let report = verify.await??;
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert_eq!(report.ok, vec![new.seq]);
    Ok(())
}
