//! `restore_with_progress` reports the chain's compressed size, and by the end has
//! downloaded exactly that: what the command line's progress bar shows.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use idem_replica::conformance::test_snapshot;
use idem_replica::{OrgId, Replica, RestoreProgress, Settings};
use object_store::memory::InMemory;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_ends_at_the_chains_compressed_size() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let replica = Replica::open(Arc::new(InMemory::new()), "", Settings::default()).await?;
    let org = OrgId::new("acme")?;
    let mut claim = replica.claim(&org, "w", false).await?;
    replica.ship(&mut claim, test_snapshot(2)?).await?;
    let newest = replica.ship(&mut claim, test_snapshot(40)?).await?;
    let progress = Arc::new(RestoreProgress::default());
    let got = replica
        .restore_with_progress(&org, None, &dir.path().join("r.db"), progress.clone())
        .await?;
    assert_eq!(got.position, Some(newest.seq));
    let total = progress.total.load(Ordering::Relaxed);
    assert_eq!(
        total, newest.compressed_bytes,
        "the newest snapshot is the chain"
    );
    assert_eq!(progress.downloaded.load(Ordering::Relaxed), total);
    Ok(())
}
