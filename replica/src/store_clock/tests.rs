use std::sync::Arc;

use futures::StreamExt;
use object_store::ObjectStore;
use object_store::memory::InMemory;

use crate::{
    Clock, Error, ManualClock, OrgId, Replica, Settings, StoreRequests, StoreTime, SystemClock,
};

type R = Result<(), Box<dyn std::error::Error + Send + Sync>>;

const DAY_MS: u64 = 86_400_000;

async fn open(store: &Arc<dyn ObjectStore>, clock: &Arc<ManualClock>) -> Result<Replica, Error> {
    Replica::open_with(store.clone(), "t", Settings::default(), clock.clone(), None).await
}

fn requests(put: u64, head: u64, delete: u64) -> StoreRequests {
    StoreRequests {
        put,
        head,
        delete,
        ..StoreRequests::default()
    }
}

#[test]
fn the_now_of_a_decision_is_the_earlier_clock() {
    let ahead = StoreTime {
        host_ms: 10_000,
        store_ms: 4_000,
    };
    assert_eq!(
        (ahead.skew_ms(), ahead.now_ms(), ahead.ahead_ms()),
        (6_000, 4_000, 6_000)
    );
    let behind = StoreTime {
        host_ms: 4_000,
        store_ms: 10_000,
    };
    assert_eq!(
        (behind.skew_ms(), behind.now_ms(), behind.ahead_ms()),
        (-6_000, 4_000, 0)
    );
    assert!(ahead.within(6_000) && !ahead.within(5_999) && behind.within(6_000));
}

#[tokio::test]
async fn a_handle_without_a_lease_probes_once_and_leaves_no_probe_behind() -> R {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let clock = Arc::new(ManualClock::new(SystemClock.now_ms()));
    let r = open(&store, &clock).await?;
    let before = r.store_requests();
    let t = r.store_time("prune").await?;
    assert!(t.skew_ms().unsigned_abs() < 5_000, "{t:?}");
    assert_eq!(r.store_requests().since(&before), requests(1, 1, 1));
    let probes = store.list(Some(&"t/probe".into())).count().await;
    assert_eq!(probes, 0, "a probe was left in the store");
    // A reading answers for a while: the next decision costs nothing.
    let before = r.store_requests();
    r.store_time("retention").await?;
    assert_eq!(r.store_requests().since(&before), StoreRequests::default());
    Ok(())
}

#[tokio::test]
async fn a_handle_holding_a_lease_reads_the_stores_clock_with_one_head() -> R {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let clock = Arc::new(ManualClock::new(SystemClock.now_ms()));
    let r = open(&store, &clock).await?;
    r.claim(&OrgId::new("acme")?, "w", false).await?;
    let before = r.store_requests();
    r.store_time("prune").await?;
    assert_eq!(r.store_requests().since(&before), requests(0, 1, 0));
    Ok(())
}

/// The host's clock steps 8 days forward after a measurement from the lease: the reading
/// kept (the store's time moves on by the monotonic clock, not the wall clock) disagrees, a
/// probe confirms it, and the refusal is kept for the decisions that follow, at no cost.
#[tokio::test]
async fn a_step_after_a_measurement_is_refused_after_a_probe_confirms_it() -> R {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let clock = Arc::new(ManualClock::new(SystemClock.now_ms()));
    let r = open(&store, &clock).await?;
    r.claim(&OrgId::new("acme")?, "w", false).await?;
    r.store_time("prune").await?;
    // A step of the wall clock alone: the monotonic clock the reading ages by does not move.
    clock.set(clock.now_ms() + 8 * DAY_MS);
    let before = r.store_requests();
    let err = r.store_time("prune").await.err().ok_or("not refused")?;
    assert!(
        matches!(err, Error::ClockSkew { op: "prune", host_ms, store_ms, max_skew_ms: 300_000 }
            if host_ms - store_ms > 8 * DAY_MS - 60_000),
        "{err:?}"
    );
    assert_eq!(r.store_requests().since(&before), requests(1, 1, 1));
    let before = r.store_requests();
    let again = r.store_time("retention").await;
    assert!(
        matches!(
            again,
            Err(Error::ClockSkew {
                op: "retention",
                ..
            })
        ),
        "{again:?}"
    );
    assert_eq!(r.store_requests().since(&before), StoreRequests::default());
    Ok(())
}

#[tokio::test]
async fn a_host_behind_the_store_is_refused_too() -> R {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let clock = Arc::new(ManualClock::new(SystemClock.now_ms() - 10 * 60_000));
    let r = open(&store, &clock).await?;
    let err = r.store_time("retention").await.err().ok_or("not refused")?;
    assert!(
        err.to_string()
            .starts_with("retention refused: this host's clock is 10m"),
        "{err}"
    );
    assert!(err.to_string().contains("behind the store's"), "{err}");
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_reading_is_taken_again_once_it_is_older_than_remeasure_after() -> R {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let clock = Arc::new(ManualClock::new(SystemClock.now_ms()));
    let r = open(&store, &clock).await?;
    r.store_time("prune").await?;
    // The monotonic clock moves on; the reading's store time moves with it.
    let step = super::REMEASURE_AFTER.as_millis() as u64 + 1_000;
    tokio::time::advance(super::REMEASURE_AFTER + std::time::Duration::from_secs(1)).await;
    clock.advance(step);
    let before = r.store_requests();
    r.store_time("prune").await?;
    assert_eq!(r.store_requests().since(&before), requests(1, 1, 1));
    Ok(())
}

#[tokio::test]
async fn a_read_only_handle_cannot_probe() -> R {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let r = Replica::open_read_only(store, "t", Settings::default())?;
    let err = r
        .store_time("prune")
        .await
        .err()
        .ok_or("a read-only handle wrote")?;
    assert!(matches!(err, Error::ReadOnly { .. }), "{err:?}");
    Ok(())
}
