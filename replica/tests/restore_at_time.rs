//! Point-in-time restore by wall-clock time (`Replica::position_at_time`): the newest
//! position published at or before a moment, by the `at_ms` its writer recorded; a moment
//! before every kept position is a typed error naming the oldest one.

use std::sync::Arc;

use idem_replica::conformance::test_snapshot;
use idem_replica::{Error, ManualClock, OrgId, Replica, Settings};
use object_store::memory::InMemory;

type R = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// Publishes three snapshots at 1 000 000, 1 060 000 and 1 120 000 ms; returns their seqs.
async fn three_positions(replica: &Replica, clock: &ManualClock) -> Result<Vec<u64>, Error> {
    let org = OrgId::new("acme")?;
    let mut claim = replica.claim(&org, "w", false).await?;
    let mut seqs = Vec::new();
    for n in [3, 5, 7] {
        seqs.push(replica.ship(&mut claim, test_snapshot(n)?).await?.seq);
        clock.advance(60_000);
    }
    Ok(seqs)
}

#[tokio::test]
async fn a_moment_restores_the_newest_position_published_at_or_before_it() -> R {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let store = Arc::new(InMemory::new());
    let replica = Replica::open_with(store, "t", Settings::default(), clock.clone(), None).await?;
    let seqs = three_positions(&replica, &clock).await?;
    let org = OrgId::new("acme")?;
    // Exactly at a position's time, between two, and after the newest.
    assert_eq!(replica.position_at_time(&org, 1_060_000).await?, seqs[1]);
    assert_eq!(replica.position_at_time(&org, 1_119_999).await?, seqs[1]);
    assert_eq!(replica.position_at_time(&org, 9_000_000).await?, seqs[2]);
    assert_eq!(replica.position_at_time(&org, 1_000_000).await?, seqs[0]);
    // The chosen position restores to the state shipped at that moment, byte for byte.
    let dir = tempfile::tempdir()?;
    let dest = dir.path().join("at.db");
    let at = replica.position_at_time(&org, 1_070_000).await?;
    replica.restore(&org, Some(at), &dest).await?;
    assert_eq!(std::fs::read(&dest)?, test_snapshot(5)?.bytes());
    Ok(())
}

#[tokio::test]
async fn a_moment_before_every_kept_position_is_refused_naming_the_oldest() -> R {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let store = Arc::new(InMemory::new());
    let replica = Replica::open_with(store, "t", Settings::default(), clock.clone(), None).await?;
    let seqs = three_positions(&replica, &clock).await?;
    let org = OrgId::new("acme")?;
    match replica.position_at_time(&org, 999_999).await {
        Err(Error::BeforeWindow {
            oldest_seq,
            oldest_ms,
            ..
        }) => assert_eq!((oldest_seq, oldest_ms), (seqs[0], 1_000_000)),
        other => return Err(format!("expected BeforeWindow, got {other:?}").into()),
    }
    // An org with no position at all says so.
    let none = OrgId::new("empty")?;
    assert!(matches!(
        replica.position_at_time(&none, 9_000_000).await,
        Err(Error::NoSuchSnapshot { .. })
    ));
    Ok(())
}
