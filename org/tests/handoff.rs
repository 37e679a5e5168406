//! I6–I8 across a writer handoff: acknowledged requests replay, unacknowledged ones run once
//! in the successor's history, and the old writer's late ship is fenced.

mod common;

use std::sync::Arc;

use common::{R, registry, replica, scenarios};
use idem_org::{ErrorKind, Settings};
use object_store::memory::InMemory;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handoff_replays_acknowledged_and_runs_unacknowledged_exactly_once() -> R {
    scenarios::handoff(Arc::new(InMemory::new()), "t").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_lets_the_successor_claim_at_once_and_see_everything() -> R {
    scenarios::release(Arc::new(InMemory::new()), "t").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_lease_blocks_a_second_writer_without_force() -> R {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(InMemory::new());
    let a = registry(
        &dir.path().join("a"),
        replica(store.clone(), None).await?,
        "A",
        Settings::default(),
    )?;
    a.acquire(&idem_replica::OrgId::new("acme")?).await?;
    let b = registry(
        &dir.path().join("b"),
        replica(store, None).await?,
        "B",
        Settings::default(),
    )?;
    let err = b
        .acquire(&idem_replica::OrgId::new("acme")?)
        .await
        .err()
        .ok_or("second writer got the org")?;
    assert_eq!(err.kind(), ErrorKind::Retry, "{err:?}");
    a.shutdown().await;
    Ok(())
}
