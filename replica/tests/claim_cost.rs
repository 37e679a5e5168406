//! A claim costs the same few store requests whatever the length of the log (I14): one LIST
//! and one GET of the head entry to choose the next round, the lease, the create, the LIST
//! proving it landed at the head, and the org lease — never a GET per entry.

use std::sync::Arc;

use idem_replica::conformance::test_snapshot;
use idem_replica::{OrgId, Replica, Settings, StoreRequests};
use object_store::ObjectStore;
use object_store::memory::InMemory;

type R = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// What a fresh process's claim of an org whose log holds `entries` snapshots costs.
async fn claim_cost(
    store: Arc<dyn ObjectStore>,
    org: &str,
    entries: u64,
) -> Result<StoreRequests, Box<dyn std::error::Error + Send + Sync>> {
    let writer = Replica::open(store.clone(), "", Settings::default()).await?;
    let org = OrgId::new(org)?;
    let mut claim = writer.claim(&org, "a", false).await?;
    for n in 0..entries {
        writer.ship(&mut claim, test_snapshot(n)?).await?;
    }
    writer.release(&mut claim).await?;
    let successor = Replica::open(store, "", Settings::default()).await?;
    let before = successor.store_requests();
    let next = successor.claim(&org, "b", false).await?;
    assert_eq!(next.round(), 2);
    Ok(successor.store_requests().since(&before))
}

#[tokio::test]
async fn a_claim_reads_the_head_of_the_log_not_every_entry() -> R {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let short = claim_cost(store.clone(), "short", 1).await?;
    let long = claim_cost(store, "long", 60).await?;
    assert_eq!(short, long, "a longer log made the claim dearer");
    // LIST + GET head, GET lease, PUT process lease, PUT claim, LIST, PUT org lease.
    assert_eq!((long.list, long.get, long.put), (2, 2, 3), "{long:?}");
    Ok(())
}
