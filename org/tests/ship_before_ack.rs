//! I6: nothing is acknowledged before a ship covering it; group commit batches requests.

mod common;

use std::sync::Arc;

use common::{R, effect, published, registry, replica};
use idem_org::{Error, ErrorKind, RegistrySettings};
use idem_replica::FailPoint;
use idem_replica::fault::{Fault, FaultStore, Op, PauseAt};
use object_store::memory::InMemory;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_before_any_ship_succeeded_is_not_acknowledged() -> R {
    let dir = tempfile::tempdir()?;
    let faults = Arc::new(FaultStore::new(Arc::new(InMemory::new())));
    let reg = registry(
        dir.path(),
        replica(faults.clone(), None).await?,
        "A",
        RegistrySettings::default(),
    )?;
    let org = reg.acquire(&idem_replica::OrgId::new("acme")?).await?;
    // The next two snapshot uploads fail before reaching the store (a store outage).
    faults.inject_times(Op::Put, "/snap/", 1, 2, Fault::FailBefore);
    let err = org
        .once("k", effect("acme", "k"))
        .await
        .err()
        .ok_or("acked without a ship")?;
    assert!(matches!(err, Error::ShipFailed { .. }), "{err:?}");
    assert_eq!(err.kind(), ErrorKind::Retry);
    // The key is committed locally; the retry (a replay) must still wait for a good ship.
    let err = org
        .once("k", effect("acme", "k"))
        .await
        .err()
        .ok_or("replay acked without a ship")?;
    assert!(matches!(err, Error::ShipFailed { .. }), "{err:?}");
    let out = org.once("k", effect("acme", "k")).await?;
    assert!(!out.applied, "the retry replays the local commit");
    let (effects, keys) = published(reg.replica(), "acme", dir.path()).await?;
    assert_eq!((effects.get("k"), keys), (Some(&1), 1));
    reg.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_requests_share_a_few_ships() -> R {
    let dir = tempfile::tempdir()?;
    let pause = PauseAt::new(FailPoint::ShipBeforeUpload);
    let store = idem_replica::Replica::local_store(&dir.path().join("store"))?;
    let reg = registry(
        &dir.path().join("data"),
        replica(store, Some(pause.clone())).await?,
        "A",
        RegistrySettings::default(),
    )?;
    let org = reg.acquire(&idem_replica::OrgId::new("acme")?).await?;
    // Hold the first ship so the other 63 requests commit while it is in flight.
    let handle = pause.arm().await;
    let mut tasks = Vec::new();
    for i in 0..64 {
        let org = org.clone();
        tasks.push(tokio::spawn(async move {
            let key = format!("k{i}");
            org.once(&key, effect("acme", &key)).await
        }));
    }
    handle.reached.await?;
    common::until(|| org.stats().committed == 64).await?;
    let _ = handle.resume.send(());
    for t in tasks {
        assert!(t.await??.applied);
    }
    let stats = org.stats();
    assert_eq!(stats.acks, 64);
    assert!(stats.ships <= 2, "64 requests took {} ships", stats.ships);
    let (effects, keys) = published(reg.replica(), "acme", dir.path()).await?;
    assert_eq!((effects.len(), keys), (64, 64));
    reg.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_of_unknown_outcome_loses_the_claim_and_is_not_called_fenced() -> R {
    let dir = tempfile::tempdir()?;
    let faults = Arc::new(FaultStore::new(Arc::new(InMemory::new())));
    let reg = registry(
        &dir.path().join("a"),
        replica(faults.clone(), None).await?,
        "A",
        RegistrySettings::default(),
    )?;
    let acme = idem_replica::OrgId::new("acme")?;
    let org = reg.acquire(&acme).await?;
    // The log entry lands but the put reports failure, and every read-back fails: nobody
    // can tell whether the ship was published (I9).
    faults.inject(Op::Put, "/log/", 1, Fault::FailAfter);
    faults.inject_times(Op::Get, "/log/", 1, 100, Fault::FailBefore);
    let err = org
        .once("k", effect("acme", "k"))
        .await
        .err()
        .ok_or("acknowledged a ship of unknown outcome")?;
    assert!(matches!(err, Error::ClaimLost { .. }), "{err:?}");
    assert_eq!(err.kind(), ErrorKind::Reacquire);
    assert!(!org.is_serving(), "the handle is poisoned");
    faults.clear();
    // The entry did land: a successor hydrates it and replays the key without running it.
    let successor = registry(
        &dir.path().join("b"),
        replica(faults.clone(), None).await?,
        "B",
        common::force(),
    )?;
    let out = successor
        .acquire(&acme)
        .await?
        .once("k", effect("acme", "ran again"))
        .await?;
    assert!(!out.applied);
    assert_eq!(out.result, b"k");
    successor.shutdown().await;
    Ok(())
}
