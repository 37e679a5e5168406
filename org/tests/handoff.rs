//! I6–I8 across a writer handoff: acknowledged requests replay, unacknowledged ones run once
//! in the successor's history, and the old writer's late ship is fenced.

mod common;

use std::sync::Arc;

use common::{R, effect, force, published, registry, replica};
use idem_org::{Error, ErrorKind, Settings};
use idem_replica::FailPoint;
use idem_replica::conformance::PauseAt;
use object_store::memory::InMemory;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handoff_replays_acknowledged_and_runs_unacknowledged_exactly_once() -> R {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(InMemory::new());
    let pause = PauseAt::new(FailPoint::ShipAfterUpload);
    let a = registry(
        &dir.path().join("a"),
        replica(store.clone(), Some(pause.clone())).await?,
        "A",
        Settings::default(),
    )?;
    let org_a = a.acquire("acme").await?;
    for i in 0..5 {
        org_a
            .once(&format!("acked-{i}"), effect("acme", &format!("acked-{i}")))
            .await?;
    }
    // A's next ship stops after its blob upload; requests committed meanwhile wait for it.
    let handle = pause.arm().await;
    let mut inflight = Vec::new();
    for i in 0..5 {
        let org = org_a.clone();
        let key = format!("inflight-{i}");
        inflight.push(tokio::spawn(async move {
            org.once(&key, effect("acme", &key)).await
        }));
    }
    handle.reached.await?;
    common::until(|| org_a.stats().committed == 10).await?;

    // Rolling deploy overlap: B claims (force: A's lease is live), which fences A.
    let b = registry(
        &dir.path().join("b"),
        replica(store.clone(), None).await?,
        "B",
        force(),
    )?;
    let org_b = b.acquire("acme").await?;
    assert!(org_b.round() > org_a.round());
    let _ = handle.resume.send(());
    for task in inflight {
        let err = task
            .await?
            .err()
            .ok_or("A acknowledged after being fenced")?;
        assert!(matches!(err, Error::Fenced { .. }), "{err:?}");
        assert_eq!(err.kind(), ErrorKind::Reacquire);
    }
    // A is poisoned: later calls fail fast and never reach its database.
    let err = org_a
        .once("late", effect("acme", "late"))
        .await
        .err()
        .ok_or("fenced A served")?;
    assert!(matches!(err, Error::Fenced { .. }), "{err:?}");

    // Clients retry everything on B with the same keys.
    for i in 0..5 {
        let out = org_b
            .once(&format!("acked-{i}"), effect("acme", "never"))
            .await?;
        assert!(!out.applied, "an acknowledged request replays");
        assert_eq!(out.result, format!("acked-{i}").into_bytes());
        assert_eq!(out.round, org_a.round());
        let out = org_b
            .once(
                &format!("inflight-{i}"),
                effect("acme", &format!("inflight-{i}")),
            )
            .await?;
        assert!(out.applied, "an unacknowledged request runs in B's history");
        assert_eq!(out.round, org_b.round());
    }
    let (effects, keys) = published(b.replica(), "acme", dir.path()).await?;
    assert_eq!(keys, 10);
    assert_eq!(effects.len(), 10);
    assert!(effects.values().all(|n| *n == 1), "{effects:?}");
    assert!(!effects.contains_key("late") && !effects.contains_key("never"));
    b.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_lets_the_successor_claim_at_once_and_see_everything() -> R {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(InMemory::new());
    let a = registry(
        &dir.path().join("a"),
        replica(store.clone(), None).await?,
        "A",
        Settings::default(),
    )?;
    let org = a.acquire("acme").await?;
    org.once("k1", effect("acme", "k1")).await?;
    for (_, r) in a.shutdown().await {
        r?;
    }
    let err = org
        .once("k2", effect("acme", "k2"))
        .await
        .err()
        .ok_or("released handle served")?;
    assert!(matches!(err, Error::Closed { .. }), "{err:?}");
    // No force: the Release entry lets B through although A's lease has not lapsed.
    let b = registry(
        &dir.path().join("b"),
        replica(store, None).await?,
        "B",
        Settings::default(),
    )?;
    let out = b
        .once("acme", "k1", idem::Options::new(), effect("acme", "x"))
        .await?;
    assert!(!out.applied);
    b.shutdown().await;
    Ok(())
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
    a.acquire("acme").await?;
    let b = registry(
        &dir.path().join("b"),
        replica(store, None).await?,
        "B",
        Settings::default(),
    )?;
    let err = b
        .acquire("acme")
        .await
        .err()
        .ok_or("second writer got the org")?;
    assert_eq!(err.kind(), ErrorKind::Retry, "{err:?}");
    a.shutdown().await;
    Ok(())
}
