//! I6–I8 across a writer handoff: acknowledged requests replay, unacknowledged ones run once
//! in the successor's history, and the old writer's late ship is fenced.

mod common;

use std::sync::Arc;

use common::{R, registry, replica, scenarios};
use idem_org::{ErrorKind, RegistrySettings};
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
        RegistrySettings::default(),
    )?;
    a.acquire(&idem_replica::OrgId::new("acme")?).await?;
    let b = registry(
        &dir.path().join("b"),
        replica(store, None).await?,
        "B",
        RegistrySettings::default(),
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

/// Regression for rolling upgrades of many orgs: `shutdown` released one org after another,
/// so one slow release held every other org's successor back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_orgs_concurrently() -> R {
    use idem_replica::fault::PauseAt;
    use idem_replica::{FailPoint, OrgId};
    let dir = tempfile::tempdir()?;
    let pause = PauseAt::new(FailPoint::ReleaseBeforePublish);
    let reg = registry(
        dir.path(),
        replica(Arc::new(InMemory::new()), Some(pause.clone())).await?,
        "A",
        RegistrySettings::default(),
    )?;
    let orgs = [OrgId::new("a")?, OrgId::new("b")?];
    for org in &orgs {
        reg.once(org, "k", common::effect(org.as_str(), "k"))
            .await?;
    }
    let held = pause.arm().await;
    let shutdown = tokio::spawn({
        let reg = reg.clone();
        async move { reg.shutdown().await }
    });
    held.reached.await?; // one release waits before publishing its Release entry
    // The other org's Release entry lands while the first is still held.
    let waited = idem_base::Stopwatch::start();
    loop {
        let mut released = 0;
        for org in &orgs {
            let log = reg.replica().history(org).await?;
            released += usize::from(log.last().is_some_and(|e| e.kind_name() == "release"));
        }
        if released == 1 {
            break;
        }
        assert!(released == 0, "both released while one was held");
        assert!(
            waited.elapsed() < std::time::Duration::from_secs(20),
            "the second release waited for the first"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let _ = held.resume.send(());
    let results = shutdown.await?;
    assert_eq!(results.len(), 2);
    assert!(results.iter().all(|(_, r)| r.is_ok()), "{results:?}");
    Ok(())
}
