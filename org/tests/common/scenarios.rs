//! The writer-handoff scenarios, written once over any store: run on `InMemory` by
//! `handoff.rs` and on a real S3 API by `s3_handoff.rs`.

use std::sync::Arc;

use idem_org::{Error, ErrorKind, RegistrySettings};
use idem_replica::FailPoint;
use idem_replica::fault::PauseAt;
use object_store::ObjectStore;

use super::{R, effect, force, published, registry, replica_at};

/// Replica A acknowledges some requests and has others in flight when B claims (force);
/// A's late ship is fenced; retries on B replay the acknowledged ones and run the others once.
pub async fn handoff(store: Arc<dyn ObjectStore>, prefix: &str) -> R {
    let dir = tempfile::tempdir()?;
    let pause = PauseAt::new(FailPoint::ShipAfterUpload);
    let a = registry(
        &dir.path().join("a"),
        replica_at(store.clone(), prefix, Some(pause.clone())).await?,
        "A",
        RegistrySettings::default(),
    )?;
    let org_a = a.acquire(&idem_replica::OrgId::new("acme")?).await?;
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
    super::until(|| org_a.stats().committed == 10).await?;

    // Rolling deploy overlap: B claims (force: A's lease is live), which fences A.
    let b = registry(
        &dir.path().join("b"),
        replica_at(store.clone(), prefix, None).await?,
        "B",
        force(),
    )?;
    let org_b = b.acquire(&idem_replica::OrgId::new("acme")?).await?;
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

/// A graceful release lets the successor claim at once (no force) and see everything.
pub async fn release(store: Arc<dyn ObjectStore>, prefix: &str) -> R {
    let dir = tempfile::tempdir()?;
    let a = registry(
        &dir.path().join("a"),
        replica_at(store.clone(), prefix, None).await?,
        "A",
        RegistrySettings::default(),
    )?;
    let org = a.acquire(&idem_replica::OrgId::new("acme")?).await?;
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
        replica_at(store, prefix, None).await?,
        "B",
        RegistrySettings::default(),
    )?;
    let out = b
        .once(
            &idem_replica::OrgId::new("acme")?,
            "k1",
            effect("acme", "x"),
        )
        .await?;
    assert!(!out.applied);
    b.shutdown().await;
    Ok(())
}
