//! Liveness is the process's (I14): one process lease, renewed on a timer, keeps every claim
//! of a live writer, idle or busy, so a second writer cannot claim without `force`; an idle
//! org issues no store request at all; a process paused past its lease loses its orgs to a
//! successor and, resumed, acknowledges nothing more (I7).
//!
//! Paused runtime time and a manual replica clock advance together, so the watch a successor
//! keeps and the renewal timer are deterministic; a "paused process" is the manual clock
//! advancing while runtime time (the renewal timer) does not.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{R, effect, registry};
use idem_org::{ErrorKind, Registry, RegistrySettings};
use idem_replica::{ManualClock, OrgId, Replica};
use object_store::ObjectStore;
use object_store::memory::InMemory;

const LEASE_MS: u64 = 1_000;

fn settings() -> idem_replica::Settings {
    idem_replica::Settings {
        lease_ms: LEASE_MS,
        ..idem_replica::Settings::default()
    }
}

async fn open(
    store: &Arc<dyn ObjectStore>,
    clock: &Arc<ManualClock>,
    data: &std::path::Path,
    writer: &str,
) -> Result<(Replica, Registry), common::BoxErr> {
    let replica = Replica::open_with(store.clone(), "t", settings(), clock.clone(), None).await?;
    let registry = registry(data, replica.clone(), writer, RegistrySettings::default())?;
    Ok((replica, registry))
}

/// Advances the replica clock and runtime time together by `ms`, in steps of 100 ms, letting
/// timers that fall due run.
async fn live_for(clock: &ManualClock, ms: u64) {
    for _ in 0..ms / 100 {
        clock.advance(100);
        tokio::time::advance(Duration::from_millis(100)).await;
        for _ in 0..5 {
            tokio::task::yield_now().await;
        }
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_idle_writer_keeps_its_lease_and_is_not_claimed_away() -> R {
    let dir = tempfile::tempdir()?;
    let clock = Arc::new(ManualClock::new(1_000_000));
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let (_, a) = open(&store, &clock, &dir.path().join("a"), "A").await?;
    let org = a.acquire(&OrgId::new("acme")?).await?;
    // B asks every half lease for three lease lengths: it sees the idle writer's process
    // lease renewed each time, so it never claims.
    let (_, b) = open(&store, &clock, &dir.path().join("b"), "B").await?;
    for _ in 0..6 {
        let err = b
            .acquire(&OrgId::new("acme")?)
            .await
            .err()
            .ok_or("B claimed the org of a live, idle writer")?;
        assert_eq!(err.kind(), ErrorKind::Retry, "{err:?}");
        live_for(&clock, LEASE_MS / 2).await;
    }
    assert!(org.is_serving());
    assert!(org.once("k", effect("acme", "k")).await?.applied);
    a.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn idle_orgs_issue_no_store_requests_only_the_process_lease_is_renewed() -> R {
    let dir = tempfile::tempdir()?;
    let clock = Arc::new(ManualClock::new(1_000_000));
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let (replica, a) = open(&store, &clock, &dir.path().join("a"), "A").await?;
    let mut orgs = Vec::new();
    for i in 0..100 {
        let id = format!("org-{i}");
        let org = a.acquire(&OrgId::new(&id)?).await?;
        assert!(org.once("k", effect(&id, "k")).await?.applied);
        orgs.push(org);
    }
    let before = replica.store_requests();
    // One idle minute: 60 s / (lease / 3) renewals of the one process lease.
    live_for(&clock, 60_000).await;
    let idle = replica.store_requests().since(&before);
    // The renewal period (LEASE_MS / 3 ms) does not divide 60 s: the window holds the floor
    // or the ceiling of 60 s / period ticks, depending on where the timer's phase falls.
    let period = LEASE_MS / 3;
    let renewals = 60_000 / period..=60_000u64.div_ceil(period);
    assert!(renewals.contains(&idle.put), "{idle:?}");
    assert_eq!(
        idle.total(),
        idle.put,
        "an idle org read or listed something: {idle:?}"
    );
    // Every org is still held: its claim is alive through the process lease, which B sees
    // renewed when it asks again two lease lengths after its first sighting.
    let (_, b) = open(&store, &clock, &dir.path().join("b"), "B").await?;
    for round in 0..2 {
        for i in [0, 57, 99] {
            let err = b
                .acquire(&OrgId::new(&format!("org-{i}"))?)
                .await
                .err()
                .ok_or("an idle org of a live process was claimed")?;
            assert_eq!(err.kind(), ErrorKind::Retry, "{err:?}");
        }
        if round == 0 {
            live_for(&clock, 2 * LEASE_MS).await;
        }
    }
    for org in &orgs {
        assert!(org.is_serving());
    }
    a.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_process_paused_past_its_lease_loses_its_orgs_and_acknowledges_nothing_more() -> R {
    let dir = tempfile::tempdir()?;
    let clock = Arc::new(ManualClock::new(1_000_000));
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let (_, a) = open(&store, &clock, &dir.path().join("a"), "A").await?;
    let acme = OrgId::new("acme")?;
    let org = a.acquire(&acme).await?;
    assert!(org.once("k1", effect("acme", "k1")).await?.applied);
    // A is paused: its renewal timer does not run while B's clock passes. B's first sighting
    // of A's process lease starts its watch; a whole watch later it claims.
    let (_, b) = open(&store, &clock, &dir.path().join("b"), "B").await?;
    let first = b
        .acquire(&acme)
        .await
        .err()
        .ok_or("B claimed at its first sighting of a lease")?;
    assert_eq!(first.kind(), ErrorKind::Retry, "{first:?}");
    clock.advance(LEASE_MS + LEASE_MS / 10);
    let successor = b.acquire(&acme).await?;
    assert!(!successor.once("k1", effect("acme", "k1")).await?.applied);
    // A resumes: a new request's ship is fenced, a replay's confirmation too.
    let err = org
        .once("k2", effect("acme", "k2"))
        .await
        .err()
        .ok_or("a fenced writer acknowledged a first run")?;
    assert_eq!(err.kind(), ErrorKind::Reacquire, "{err:?}");
    assert!(org.once("k1", effect("acme", "k1")).await.is_err());
    assert!(successor.once("k2", effect("acme", "k2")).await?.applied);
    b.shutdown().await;
    a.shutdown().await;
    Ok(())
}
