//! The warm takeover (I2, I6, I7, I15): two registries over one store. Guards against
//! (1) a rolling upgrade leaving every org of a drained process closed until its next
//! request reaches the successor: after A's shutdown, B holds every org A released without
//! any request to B, A acknowledges nothing after B's claim, and a process started after
//! the drain takes nothing from B; (2) a watcher that takes
//! orgs from a live holder: while A runs and is not draining, B's watcher claims nothing,
//! even for orgs B was asked for; (3) a crashed holder's orgs staying closed until each one's
//! next request: B, refused once per org while A's lease looked live, opens them all
//! without further requests once it has seen A's lease unchanged for a whole watch; (4) a
//! watcher that sees a drain only a third of a lease late: by default it lists
//! `processes/` once a second whatever the lease term, and no more often; (5) a client
//! retrying a refused org in a tight loop making a claim (store requests) per retry: within
//! `retry_ms` of B's clock after a refusal, B refuses again from memory. Each of (1)-(3)
//! ends with the exactly-once oracle on every org; (6) a drain shorter than the successor's
//! poll coming and going between two of its LISTs: the drained process keeps its lease
//! listed for two of its own polls.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{R, effect, registry};
use idem_org::{Registry, RegistrySettings, WarmSettings};
use idem_replica::fault::{Fault, FaultStore, Op};
use idem_replica::{Clock, ManualClock, OrgId, Replica, SystemClock};
use object_store::ObjectStore;
use object_store::memory::InMemory;

const LEASE_MS: u64 = 1_000;
const ORGS: usize = 12;

fn orgs() -> Vec<String> {
    (0..ORGS).map(|i| format!("org{i:02}")).collect()
}

fn warm() -> RegistrySettings {
    RegistrySettings {
        warm: WarmSettings {
            enabled: true,
            poll_ms: 50,
            retry_ms: 20,
            ..WarmSettings::default()
        },
        ..RegistrySettings::default()
    }
}

async fn open(
    store: Arc<dyn ObjectStore>,
    clock: Arc<dyn Clock>,
) -> Result<Replica, common::BoxErr> {
    let settings = idem_replica::Settings {
        lease_ms: LEASE_MS,
        ..idem_replica::Settings::default()
    };
    Ok(Replica::open_with(store, "t", settings, clock, None).await?)
}

/// Polls `cond` until it holds, failing after `secs`: a liveness bound, never the assertion.
async fn within(secs: u64, mut cond: impl FnMut() -> bool) -> bool {
    let waited = idem_base::Stopwatch::start();
    while !cond() {
        if waited.elapsed() > Duration::from_secs(secs) {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    true
}

/// Sends `keys` first runs to every org through `reg`; returns the acknowledged keys per org.
async fn serve(
    reg: &Registry,
    prefix: &str,
    keys: usize,
) -> Result<Vec<Vec<String>>, common::BoxErr> {
    let mut acked = Vec::new();
    for org in orgs() {
        let id = OrgId::new(&org)?;
        let mut done = Vec::new();
        for k in 0..keys {
            let key = format!("{prefix}-{k}");
            let out = reg.once(&id, &key, effect(&org, &key)).await?;
            assert!(out.applied, "{org}/{key} ran once");
            done.push(key);
        }
        acked.push(done);
    }
    Ok(acked)
}

/// Shuts `a` down (every release must land), then waits until `b` holds every org, each
/// opened by its watcher: a slot is open before its background claim is counted (the
/// claim's eviction and park checks come between), so both are waited for.
async fn drain_and_wait(a: &Registry, b: &Registry) -> R {
    for (org, r) in a.shutdown().await {
        r.map_err(|e| format!("{org}: {e}"))?;
    }
    assert!(
        within(20, || b.open_orgs().len() == ORGS
            && b.warm_claims() == ORGS as u64)
        .await,
        "B opened {} of {ORGS} orgs, {} by its watcher: it never read A's drain",
        b.open_orgs().len(),
        b.warm_claims()
    );
    Ok(())
}

/// Shuts `reg` down, then checks every org exactly once against `acked`.
async fn oracle(
    reg: &Registry,
    replica: &Replica,
    acked: &[Vec<String>],
    dir: &std::path::Path,
) -> R {
    for (_, r) in reg.shutdown().await {
        r?;
    }
    for (org, keys) in orgs().iter().zip(acked) {
        common::oracle::exactly_once(replica, org, keys, &[], &dir.join(org)).await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_a_drain_the_successor_holds_every_released_org_without_a_request() -> R {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let ra = open(store.clone(), Arc::new(SystemClock)).await?;
    // A watches too, as every `idem serve` does: its drain stays listed for two of its polls.
    let a = registry(&dir.path().join("a"), ra, "wa", warm())?;
    let mut acked = serve(&a, "a", 3).await?;
    let rb = open(store.clone(), Arc::new(SystemClock)).await?;
    let b = registry(&dir.path().join("b"), rb.clone(), "wb", warm())?;
    // A handle A keeps past its shutdown: whatever it is asked after B's claim is refused.
    let kept = a.acquire(&OrgId::new("org00")?).await?;

    drain_and_wait(&a, &b).await?;
    assert!(b.open_orgs().iter().all(|o| o.is_serving()));

    // Fencing: A acknowledges nothing after B's claim, through its handle or its registry.
    let late = kept.once("late", effect("org00", "late")).await;
    assert!(late.is_err(), "A acknowledged after B's claim: {late:?}");
    assert!(
        a.once(&OrgId::new("org00")?, "late2", effect("org00", "late2"))
            .await
            .is_err()
    );

    // A process started after the drain (A deleted its lease once every release landed):
    // the orgs are B's now (live), and stay there.
    let rc = open(store.clone(), Arc::new(SystemClock)).await?;
    let c = registry(&dir.path().join("c"), rc, "wc", warm())?;
    let lists = c.replica().store_requests().list;
    assert!(
        within(20, || c.replica().store_requests().list >= lists + 10).await,
        "C's watcher did not run"
    );
    assert!(c.open_orgs().is_empty(), "C took orgs from a live B");
    assert_eq!(c.warm_claims(), 0);
    assert_eq!(b.open_orgs().len(), ORGS);
    drop(c);

    // B replays what A acknowledged and serves new keys.
    for (org, keys) in orgs().iter().zip(&mut acked) {
        let id = OrgId::new(org)?;
        for key in keys.iter() {
            let out = b.once(&id, key, effect(org, key)).await?;
            assert!(!out.applied, "{org}/{key} replayed, not run again");
            assert_eq!(out.result, key.as_bytes());
        }
        let out = b.once(&id, "b-0", effect(org, "b-0")).await?;
        assert!(out.applied);
        keys.push("b-0".into());
    }
    oracle(&b, &rb, &acked, dir.path()).await
}

/// The poll of both registries in the short-drain test, ms: far longer than A's whole drain
/// (a dozen releases on an in-memory store).
const SLOW_POLL_MS: u64 = 1_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drain_shorter_than_the_successors_poll_is_still_seen() -> R {
    let slow = || RegistrySettings {
        warm: WarmSettings {
            enabled: true,
            poll_ms: SLOW_POLL_MS,
            retry_ms: 20,
            ..WarmSettings::default()
        },
        ..RegistrySettings::default()
    };
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let ra = open(store.clone(), Arc::new(SystemClock)).await?;
    let a = registry(&dir.path().join("a"), ra, "wa", slow())?;
    let mut acked = serve(&a, "a", 1).await?;
    let rb = open(store.clone(), Arc::new(SystemClock)).await?;
    let b = registry(&dir.path().join("b"), rb.clone(), "wb", slow())?;
    // Right after one of B's LISTs (B does nothing else): A's drain, its releases and the
    // delete of its lease all land before B's next LIST a poll later, unless A keeps the
    // draining lease listed.
    let lists = rb.store_requests().list;
    assert!(
        within(20, || rb.store_requests().list > lists).await,
        "B's watcher did not list"
    );
    drain_and_wait(&a, &b).await?;
    // The linger ends in the delete: a drained process leaves nothing listed.
    let leases = rb.process_leases().await?;
    assert!(
        leases.iter().all(|l| l.instance != a.replica().instance()),
        "A's lease still listed after its shutdown: {leases:?}"
    );
    for (org, keys) in orgs().iter().zip(&mut acked) {
        let id = OrgId::new(org)?;
        for key in keys.iter() {
            let out = b.once(&id, key, effect(org, key)).await?;
            assert!(!out.applied, "{org}/{key} replayed, not run again");
        }
    }
    oracle(&b, &rb, &acked, dir.path()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_watcher_never_claims_from_a_live_holder_that_is_not_draining() -> R {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let ra = open(store.clone(), Arc::new(SystemClock)).await?;
    let a = registry(
        &dir.path().join("a"),
        ra.clone(),
        "wa",
        RegistrySettings::default(),
    )?;
    let mut acked = serve(&a, "a", 2).await?;
    let rb = open(store.clone(), Arc::new(SystemClock)).await?;
    let b = registry(&dir.path().join("b"), rb, "wb", warm())?;
    // Asked for an org A holds: refused, and remembered.
    let asked = b
        .once(&OrgId::new("org00")?, "b", effect("org00", "b"))
        .await;
    assert!(asked.is_err(), "B took an org from a live A: {asked:?}");

    // The watcher lists processes/ several times, and A renews meanwhile (1 s lease: every
    // 333 ms), past B's first background retry of the refused org (one watch, 1.1 s).
    let lists = b.replica().store_requests().list;
    let renewals = |r: &Replica| r.store_requests().put;
    let puts = renewals(&ra);
    assert!(
        within(20, || b.replica().store_requests().list >= lists + 40
            && renewals(&ra) >= puts + 6)
        .await,
        "the watcher did not run"
    );
    assert!(b.open_orgs().is_empty(), "B claimed from a live A");
    assert_eq!(b.warm_claims(), 0);

    // A still serves every org.
    for (org, keys) in orgs().iter().zip(&mut acked) {
        let out = a
            .once(&OrgId::new(org)?, "a-late", effect(org, "a-late"))
            .await?;
        assert!(out.applied);
        keys.push("a-late".into());
    }
    for (_, r) in b.shutdown().await {
        r?;
    }
    oracle(&a, &ra, &acked, dir.path()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_a_crash_every_refused_org_opens_once_the_holders_lease_lapses() -> R {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    // A's view of the store: once it "dies", its process-lease renewals never land.
    let a_store = Arc::new(FaultStore::new(store.clone()));
    let ra = open(a_store.clone(), Arc::new(SystemClock)).await?;
    let a = registry(&dir.path().join("a"), ra, "wa", RegistrySettings::default())?;
    let acked = serve(&a, "a", 3).await?;
    let kept = a.acquire(&OrgId::new("org00")?).await?;
    a_store.inject_times(Op::Put, "processes/", 1, u64::MAX, Fault::FailBefore);

    // B's clock drives its watch of A's lease (I15): nothing lapses until the test says.
    let clock = Arc::new(ManualClock::new(1_000_000));
    let rb = open(store.clone(), clock.clone()).await?;
    let b = Registry::builder(dir.path().join("b"), rb.clone(), "wb")
        .settings(warm())
        .clock(clock.clone())
        .on_open(|c| c.execute_batch(common::LEDGER))
        .build()?;
    for org in orgs() {
        let asked = b.acquire(&OrgId::new(&org)?).await;
        let err = asked.err().ok_or("B claimed before A's lease lapsed")?;
        assert!(err.retry_after().is_some(), "{org}: {err}");
    }
    assert!(b.open_orgs().is_empty());

    // A whole watch (1.1 s) of B's clock with A's lease unchanged: no request is sent to B.
    // A renewal of A's already in flight when it died may land once; its change restarts
    // the watch, so the clock moves again until every org is open (a liveness bound).
    let mut opened = false;
    for _ in 0..5 {
        clock.advance(LEASE_MS + LEASE_MS / 5);
        if within(5, || b.open_orgs().len() == ORGS).await {
            opened = true;
            break;
        }
    }
    assert!(opened, "B opened {} of {ORGS} orgs", b.open_orgs().len());
    assert_eq!(b.warm_claims(), ORGS as u64);

    // The dead A's ships are fenced: it acknowledges nothing after B's claim.
    let late = kept.once("late", effect("org00", "late")).await;
    assert!(late.is_err(), "A acknowledged after B's claim: {late:?}");
    drop(kept);
    drop(a);
    oracle(&b, &rb, &acked, dir.path()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_watcher_lists_once_a_second_by_default_whatever_the_lease() -> R {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    // A 30 s lease: a watcher polling at the renewal period would list every 10 s.
    let settings = idem_replica::Settings {
        lease_ms: 30_000,
        ..idem_replica::Settings::default()
    };
    let rb = Replica::open_with(store.clone(), "t", settings, Arc::new(SystemClock), None).await?;
    let defaults = RegistrySettings {
        warm: WarmSettings {
            enabled: true,
            ..WarmSettings::default()
        },
        ..RegistrySettings::default()
    };
    assert_eq!(defaults.warm.poll_ms, idem_org::WARM_POLL_MS);
    let began = idem_base::Stopwatch::start();
    let b = registry(&dir.path().join("b"), rb.clone(), "wb", defaults)?;
    // The witness of elapsed time: a live process with a 1 s lease renews every 333 ms, so
    // nine renewals span more than 3 s, in which a 1 s poll lists at least three times.
    let rw = open(store.clone(), Arc::new(SystemClock)).await?;
    let w = registry(
        &dir.path().join("w"),
        rw.clone(),
        "ww",
        RegistrySettings::default(),
    )?;
    w.once(&OrgId::new("witness")?, "k", effect("witness", "k"))
        .await?;
    let puts = rw.store_requests().put;
    assert!(
        within(30, || rw.store_requests().put >= puts + 9).await,
        "the witness did not renew"
    );
    let lists = rb.store_requests().list;
    let elapsed_s = began.elapsed().as_secs();
    assert!(lists >= 3, "B listed {lists} times in 3 s and more");
    // Bounded: one LIST per poll (the first at once, missed ticks not made up).
    assert!(
        lists <= elapsed_s + 2,
        "B listed {lists} times in {elapsed_s} s"
    );
    assert!(b.open_orgs().is_empty());
    drop(b);
    for (org, r) in w.shutdown().await {
        r.map_err(|e| format!("{org}: {e}"))?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refusal_is_repeated_from_memory_for_retry_ms_without_a_store_request() -> R {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let ra = open(store.clone(), Arc::new(SystemClock)).await?;
    let a = registry(&dir.path().join("a"), ra, "wa", RegistrySettings::default())?;
    let acked = serve(&a, "a", 1).await?;
    let clock = Arc::new(ManualClock::new(1_000_000));
    let rb = open(store.clone(), clock.clone()).await?;
    let retry_ms = 200;
    let settings = RegistrySettings {
        warm: WarmSettings {
            enabled: true,
            // Only the first LIST and the one a refusal asks for.
            poll_ms: 3_600_000,
            retry_ms,
            ..WarmSettings::default()
        },
        ..RegistrySettings::default()
    };
    let b = Registry::builder(dir.path().join("b"), rb.clone(), "wb")
        .settings(settings)
        .clock(clock.clone())
        .on_open(|c| c.execute_batch(common::LEDGER))
        .build()?;
    let org = OrgId::new("org00")?;
    // The watcher's first LIST, at start, is awaited before counting: counted from before
    // it, the two LISTs below could be it and the acquire's, and the LIST the refusal asks
    // for would land inside the retries.
    assert!(
        within(20, || rb.store_requests().list >= 1).await,
        "the watcher did not start"
    );
    let lists = rb.store_requests().list;
    let first = b
        .acquire(&org)
        .await
        .err()
        .ok_or("B claimed from a live A")?;
    let wait = first.retry_after().ok_or("not a held lease")?;
    // The LIST of processes/ the refusal asked for (the holder may be draining).
    assert!(
        within(20, || rb.store_requests().list >= lists + 2).await,
        "the watcher did not look"
    );
    let before = rb.store_requests();
    for _ in 0..20 {
        let again = b
            .acquire(&org)
            .await
            .err()
            .ok_or("B claimed from a live A")?;
        let left = again.retry_after().ok_or("not a held lease")?;
        assert!(left <= wait && !left.is_zero(), "{again}");
    }
    assert_eq!(
        rb.store_requests().since(&before).total(),
        0,
        "a retry within retry_ms made store requests"
    );

    // Past retry_ms of B's clock the next request claims again (and A, alive, keeps it).
    clock.advance(retry_ms);
    let before = rb.store_requests();
    assert!(b.acquire(&org).await.is_err(), "B claimed from a live A");
    assert!(
        rb.store_requests().since(&before).total() > 0,
        "no claim attempt"
    );
    assert!(b.open_orgs().is_empty());
    drop(b);
    oracle(&a, &rb, &acked, dir.path()).await
}
