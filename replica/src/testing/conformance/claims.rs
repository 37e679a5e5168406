//! Claims, fencing, leases and tenant isolation (I7, I12).

use std::sync::Arc;

use object_store::ObjectStore;

use super::{CaseResult, open, org, prefix, test_snapshot};
use crate::testing::fault::FaultStore;
use crate::{Error, LogEntry, ManualClock, Replica, Retention, Settings};

/// The store honours create-only puts, and a store that ignores them is refused.
pub(super) async fn probe_accepts_store(store: Arc<dyn ObjectStore>) -> CaseResult {
    let p = prefix()?;
    open(store.clone(), &p).await?;
    let unsafe_store = Arc::new(FaultStore::new(store));
    unsafe_store.ignore_create_condition(true);
    let r = open(unsafe_store, &p).await;
    assert!(
        matches!(r, Err(Error::UnsafeStore { .. })),
        "unsafe store accepted: {r:?}"
    );
    Ok(())
}

/// Claims by successive writers get rounds 1, 2, 3…; the log is linear.
pub(super) async fn claim_rounds_strictly_increase(store: Arc<dyn ObjectStore>) -> CaseResult {
    let r = open(store, &prefix()?).await?;
    let o = org("acme");
    let mut last = 0;
    for i in 0..4 {
        let c = r.claim(&o, &format!("w{i}"), true).await?;
        assert!(c.round() > last, "round {} after {last}", c.round());
        last = c.round();
    }
    let h = r.history(&o).await?;
    assert_eq!(
        h.iter().map(LogEntry::seq).collect::<Vec<_>>(),
        vec![1, 2, 3, 4]
    );
    Ok(())
}

/// Concurrent claimers get distinct, increasing rounds and only the newest can ship.
pub(super) async fn concurrent_claims_get_distinct_rounds(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let settings = Settings {
        claim_retries: 64,
        ..Settings::default()
    };
    let r = Replica::open(store, &prefix()?, settings).await?;
    let o = org("acme");
    let claims = futures::future::join_all((0..4).map(|i| {
        let (r, o) = (r.clone(), o.clone());
        async move { r.claim(&o, &format!("w{i}"), true).await }
    }))
    .await;
    let mut claims: Vec<_> = claims.into_iter().collect::<Result<_, _>>()?;
    claims.sort_by_key(|c| c.round());
    let rounds: Vec<u64> = claims.iter().map(|c| c.round()).collect();
    let mut dedup = rounds.clone();
    dedup.dedup();
    assert_eq!(rounds, dedup, "duplicate rounds");
    let n = claims.len();
    for (i, c) in claims.iter_mut().enumerate() {
        let res = r.ship(c, test_snapshot(3)?).await;
        if i + 1 == n {
            assert!(res.is_ok(), "newest claim could not ship: {res:?}");
        } else {
            assert!(
                matches!(res, Err(Error::Fenced { .. })),
                "older claim shipped: {res:?}"
            );
        }
    }
    Ok(())
}

/// Rolling deploy: the old writer's ship is fenced; one linear history.
pub(super) async fn overlapping_writers_old_ship_is_fenced(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let r = open(store, &prefix()?).await?;
    let o = org("acme");
    let mut a = r.claim(&o, "a", false).await?;
    r.ship(&mut a, test_snapshot(1)?).await?;
    let mut b = r.claim(&o, "b", true).await?;
    let res = r.ship(&mut a, test_snapshot(2)?).await;
    match res {
        Err(Error::Fenced { ours, theirs, .. }) => {
            assert_eq!((ours, theirs), (a.round(), b.round()))
        }
        other => panic!("old writer not fenced: {other:?}"),
    }
    assert!(matches!(
        r.ship(&mut a, test_snapshot(2)?).await,
        Err(Error::ClaimUnusable { .. })
    ));
    let s = r.ship(&mut b, test_snapshot(5)?).await?;
    let h = r.history(&o).await?;
    let seqs: Vec<u64> = h.iter().map(LogEntry::seq).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "history not linear"
    );
    let last_snap = h.iter().rev().find(|e| e.is_snapshot());
    assert_eq!(
        last_snap.map(|e| (e.seq(), e.round())),
        Some((s.seq, b.round()))
    );
    Ok(())
}

/// A Release entry lets the next claim through at once, despite a live lease.
pub(super) async fn release_lets_next_claim_through(store: Arc<dyn ObjectStore>) -> CaseResult {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let r = Replica::open_with(store, &prefix()?, Settings::default(), clock, None).await?;
    let o = org("acme");
    let mut a = r.claim(&o, "a", false).await?;
    r.ship(&mut a, test_snapshot(3)?).await?;
    assert!(matches!(
        r.claim(&o, "b", false).await,
        Err(Error::LeaseHeld { .. })
    ));
    r.release(&mut a).await?;
    assert!(matches!(
        r.ship(&mut a, test_snapshot(4)?).await,
        Err(Error::ClaimUnusable { .. })
    ));
    let mut b = r.claim(&o, "b", false).await?;
    assert!(b.round() > a.round());
    let tmp = tempfile::tempdir()?;
    assert_eq!(r.hydrate(&mut b, &tmp.path().join("db")).await?.commit, 3);
    Ok(())
}

/// A lease blocks other writers unless `force` until the claimant has seen it unchanged for
/// a whole watch (the term plus a tenth) on its own monotonic clock; a step of the wall clock
/// counts for nothing (I15).
pub(super) async fn lease_respected_unless_force(store: Arc<dyn ObjectStore>) -> CaseResult {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let settings = Settings {
        lease_ms: 30_000,
        ..Settings::default()
    };
    let r = Replica::open_with(store, &prefix()?, settings, clock.clone(), None).await?;
    let o = org("acme");
    let a = r.claim(&o, "a", false).await?;
    match r.claim(&o, "b", false).await {
        Err(Error::LeaseHeld {
            holder,
            retry_after_ms,
            ..
        }) => assert_eq!((holder.as_str(), retry_after_ms), ("a", 33_000)),
        other => panic!("lease ignored: {other:?}"),
    }
    let b = r.claim(&o, "b", true).await?;
    assert!(b.round() > a.round());
    assert_eq!(r.lease(&o).await?.map(|l| l.writer), Some("b".to_string()));
    // The wall clock jumps a day ahead: nothing was seen unchanged for longer.
    clock.set(1_000_000 + 86_400_000);
    assert!(matches!(
        r.claim(&o, "c", false).await,
        Err(Error::LeaseHeld { .. })
    ));
    // No renewal runs here (the renewal timer's runtime time does not pass): one watch of
    // the monotonic clock after the first sighting, the lease is taken for lapsed.
    clock.advance(32_999);
    assert!(matches!(
        r.claim(&o, "c", false).await,
        Err(Error::LeaseHeld {
            retry_after_ms: 1,
            ..
        })
    ));
    clock.advance(1);
    let c = r.claim(&o, "c", false).await?;
    assert!(c.round() > b.round());
    Ok(())
}

/// `acme` never sees `acme2`'s objects (I12).
pub(super) async fn org_isolation(store: Arc<dyn ObjectStore>) -> CaseResult {
    let r = open(store, &prefix()?).await?;
    let (acme, acme2) = (org("acme"), org("acme2"));
    let mut c2 = r.claim(&acme2, "w", false).await?;
    r.ship(&mut c2, test_snapshot(7)?).await?;
    assert!(r.history(&acme).await?.is_empty());
    assert!(r.lease(&acme).await?.is_none());
    let mut c = r.claim(&acme, "w", false).await?;
    assert_eq!(c.round(), 1);
    let tmp = tempfile::tempdir()?;
    let h = r.hydrate(&mut c, &tmp.path().join("db")).await?;
    assert_eq!(
        h,
        crate::Hydrated {
            snapshot: None,
            commit: 0,
            position: None,
            deltas: 0,
        }
    );
    assert!(!tmp.path().join("db").exists());
    r.retain(
        &acme,
        &Retention {
            keep_snapshots: 1,
            keep_ms: 0,
            window_ms: 0,
            level_ms: 0,
        },
    )
    .await?;
    assert_eq!(r.history(&acme2).await?.len(), 2);
    assert_eq!(r.orgs().await?, vec![acme, acme2]);
    Ok(())
}
