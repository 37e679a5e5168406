//! The writer handoff (I6–I8) on a real S3 API: replica A acknowledges, B claims with force,
//! A's late ship is fenced, and clients' retries on B replay or run exactly once.
//!
//! `scripts/s3-server -- cargo test` starts moto's S3 server on loopback and sets
//! `IDEM_S3_ENDPOINT`; without it the tests pass after printing
//! "skipped: IDEM_S3_ENDPOINT not set".

mod common;

use std::sync::Arc;

use common::{BoxErr, R, effect, force, published, registry};
use idem_org::{Error, ErrorKind, Settings};
use idem_replica::conformance::{self, PauseAt};
use idem_replica::{FailPoint, Failpoints, Replica};
use object_store::ObjectStore;

fn s3() -> Option<Arc<dyn ObjectStore>> {
    match conformance::s3_store_from_env() {
        Ok(Some(store)) => Some(store),
        Ok(None) => {
            eprintln!(
                "skipped: {} not set (run under scripts/s3-server)",
                conformance::S3_ENDPOINT_ENV
            );
            None
        }
        Err(e) => panic!("building the S3 store: {e}"),
    }
}

/// A replica under a prefix of its own in the shared bucket.
async fn replica(
    store: Arc<dyn ObjectStore>,
    prefix: &str,
    failpoints: Option<Arc<dyn Failpoints>>,
) -> Result<Replica, BoxErr> {
    Ok(Replica::open_with(
        store,
        prefix,
        idem_replica::Settings::default(),
        Arc::new(idem_replica::SystemClock),
        failpoints,
    )
    .await?)
}

fn unique(tag: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("s3org-{tag}-{}-{nanos}", std::process::id())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handoff_on_s3_replays_acknowledged_and_runs_unacknowledged_exactly_once() -> R {
    let Some(store) = s3() else { return Ok(()) };
    let prefix = unique("handoff");
    let dir = tempfile::tempdir()?;
    let pause = PauseAt::new(FailPoint::ShipAfterUpload);
    let a = registry(
        &dir.path().join("a"),
        replica(store.clone(), &prefix, Some(pause.clone())).await?,
        "A",
        Settings::default(),
    )?;
    let org_a = a.acquire("acme").await?;
    for i in 0..5 {
        let out = org_a
            .once(&format!("acked-{i}"), effect("acme", &format!("acked-{i}")))
            .await?;
        assert!(out.applied);
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

    // Rolling deploy overlap: B claims with force (A's lease is live), which fences A.
    let b = registry(
        &dir.path().join("b"),
        replica(store.clone(), &prefix, None).await?,
        "B",
        force(),
    )?;
    let org_b = b.acquire("acme").await?;
    assert!(org_b.round() > org_a.round());
    // A's late ship reaches S3 now: its conditional put collides with B's claim.
    let _ = handle.resume.send(());
    for task in inflight {
        let err = task
            .await?
            .err()
            .ok_or("A acknowledged after being fenced")?;
        assert!(matches!(err, Error::Fenced { .. }), "{err:?}");
        assert_eq!(err.kind(), ErrorKind::Reacquire);
    }
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
async fn release_on_s3_lets_the_successor_claim_at_once_and_see_everything() -> R {
    let Some(store) = s3() else { return Ok(()) };
    let prefix = unique("release");
    let dir = tempfile::tempdir()?;
    let a = registry(
        &dir.path().join("a"),
        replica(store.clone(), &prefix, None).await?,
        "A",
        Settings::default(),
    )?;
    let org = a.acquire("acme").await?;
    org.once("k1", effect("acme", "k1")).await?;
    for (_, r) in a.shutdown().await {
        r?;
    }
    // No force: the Release entry lets B through although A's lease has not lapsed.
    let b = registry(
        &dir.path().join("b"),
        replica(store, &prefix, None).await?,
        "B",
        Settings::default(),
    )?;
    let out = b
        .once("acme", "k1", idem::Options::new(), effect("acme", "x"))
        .await?;
    assert!(!out.applied);
    assert_eq!(out.result, b"k1");
    b.shutdown().await;
    Ok(())
}
