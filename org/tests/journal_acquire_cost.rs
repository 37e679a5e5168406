//! What a journal org's acquire costs on the store (I16, `docs/design.md` 3g, "The install
//! beside the claim"). Guards against an acquire whose install (the section's range GET, the
//! base's snapshot and deltas) waits for the announcement, claim, C2 and attach instead of
//! going out beside them, and against an install done twice (its reads counted per
//! request). Measured on a store that delays every request by one constant: the depth is
//! the longest chain of requests each starting after the previous one ended. The delay is
//! long next to the work between requests, so requests sent together always overlap.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::journal::{LEASE_MS, in_store, settings};
use common::{R, effect, registry, replica_with_lease};
use idem_org::Registry;
use idem_replica::fault::{Fault, FaultStore, Op as FaultOp};
use idem_replica::latency::{LatencyStore, Op, Recorded, Shape, Shapes};
use idem_replica::{FailPoint, Failpoints, ManualClock, OrgId, Replica};
use object_store::ObjectStore;
use object_store::memory::InMemory;
use tokio::sync::{Mutex, oneshot};

/// The delay every request takes.
const DELAY: Duration = Duration::from_millis(100);

/// A's registry serves `acme` (a few keys, so its state is a section of A's run) and shuts
/// down; B, another process, then acquires it after one other org of its own (so B's run
/// and process lease exist, as in steady state). Returns B's traced acquire of `acme` and
/// the keys A acknowledged.
async fn b_acquires_acme(
    store: Arc<LatencyStore>,
    dir: &std::path::Path,
) -> Result<Recorded, common::BoxErr> {
    let shared: Arc<dyn ObjectStore> = store.clone();
    let ra = replica_with_lease(shared.clone(), LEASE_MS).await?;
    let a = registry(&dir.join("a"), ra, "wa", settings(64 << 10))?;
    let acme = OrgId::new("acme")?;
    for key in ["k1", "k2", "k3"] {
        assert!(a.once(&acme, key, effect("acme", key)).await?.applied);
    }
    for (o, r) in a.shutdown().await {
        r.map_err(|e| format!("{o}: {e}"))?;
    }
    let rb = replica_with_lease(shared, LEASE_MS).await?;
    let b = registry(&dir.join("b"), rb.clone(), "wb", settings(64 << 10))?;
    let other = OrgId::new("other")?;
    assert!(b.once(&other, "o", effect("other", "o")).await?.applied);
    let trace = store.trace();
    b.acquire(&acme).await?;
    let recorded = trace.finish();
    let keys: Vec<String> = ["k1", "k2", "k3"].map(String::from).to_vec();
    common::journal::replays(&b, &acme, &keys).await?;
    for (o, r) in b.shutdown().await {
        r.map_err(|e| format!("{o}: {e}"))?;
    }
    in_store(&rb, &dir.join("check"), &acme, &keys, &[]).await?;
    Ok(recorded)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_acquire_installs_beside_its_claim() -> R {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(LatencyStore::new(
        Arc::new(InMemory::new()),
        Shapes::all(Shape::Constant(DELAY)),
        0,
    ));
    let recorded = b_acquires_acme(store, dir.path()).await?;
    // The process lease's renewals run on their own schedule, beside whatever is traced.
    let recorded = Recorded {
        requests: recorded
            .requests
            .into_iter()
            .filter(|r| !r.path.contains("/processes/"))
            .collect(),
    };
    // Walk: LIST the log, GET its head entries, LIST the run, GET its headers (4). Then the
    // announcement's batch PUT beside the manifest's and the section's GETs, the claim PUT
    // beside the segment's GET, C2's LIST, the first checkpoint's PUT: 8. Installing after
    // the attach made it 10.
    let depth = recorded.depth();
    assert!(depth <= 8, "depth {depth}: {:#?}", recorded.requests);
    // The install's reads once: 2 log entries, 4 run headers, manifest, section, segment.
    assert_eq!(recorded.count(Op::Get), 9, "{:#?}", recorded.requests);
    Ok(())
}

/// Two processes claim one free org at once: both install beside their claims, one claim
/// lands, and the loser walks again, finds the org held and is refused. The loser's files,
/// installed from a walk its tenure did not come from, are gone; the winner serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_claim_leaves_no_installed_file_behind() -> R {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(LatencyStore::new(
        Arc::new(InMemory::new()),
        Shapes::all(Shape::Constant(Duration::from_millis(20))),
        1,
    ));
    let rb = replica_with_lease(store.clone(), LEASE_MS).await?;
    let rc = replica_with_lease(store, LEASE_MS).await?;
    let b = registry(&dir.path().join("b"), rb, "wb", settings(64 << 10))?;
    let c = registry(&dir.path().join("c"), rc, "wc", settings(64 << 10))?;
    let acme = OrgId::new("acme")?;
    let (by_b, by_c) = tokio::join!(b.acquire(&acme), c.acquire(&acme));
    assert!(
        by_b.is_ok() != by_c.is_ok(),
        "exactly one process takes the org: {by_b:?} {by_c:?}"
    );
    let (winner, loser) = if by_b.is_ok() { (&b, "c") } else { (&c, "b") };
    let left: Vec<String> = std::fs::read_dir(dir.path().join(loser).join("orgs/acme"))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(left.is_empty(), "the loser left {left:?}");
    assert!(winner.once(&acme, "k", effect("acme", "k")).await?.applied);
    for reg in [&b, &c] {
        for (o, r) in reg.shutdown().await {
            r.map_err(|e| format!("{o}: {e}"))?;
        }
    }
    Ok(())
}

/// A writer (A) that served `n` orgs and crashed (no release, no seal), and B over `b_store`
/// (which must reach A's store) with a clock past the watch of A's process lease (I15):
/// B's next acquire of A's orgs adopts A's run. Returns B's registry, its replica, the orgs
/// and the path part naming A's runs.
async fn crashed_writer_and_successor(
    memory: Arc<dyn ObjectStore>,
    b_store: Arc<dyn ObjectStore>,
    b_failpoints: Option<Arc<dyn Failpoints>>,
    dir: &std::path::Path,
    n: usize,
) -> Result<(Registry, Replica, Vec<OrgId>, String), common::BoxErr> {
    let ra = replica_with_lease(memory, LEASE_MS).await?;
    let dead_run = format!("/journals/{}-", ra.instance());
    let a = registry(&dir.join("a"), ra.clone(), "wa", settings(64 << 10))?;
    let orgs: Vec<OrgId> = (0..n).map(common::journal::org).collect();
    for o in &orgs {
        assert!(a.once(o, "k", effect(o.as_str(), "k")).await?.applied);
    }
    // The process lease stops being renewed with the last clone of A's replica.
    drop(a);
    drop(ra);
    let clock = Arc::new(ManualClock::new(1_000_000));
    let b_settings = idem_replica::Settings {
        lease_ms: LEASE_MS,
        ..idem_replica::Settings::default()
    };
    let rb = Replica::open_with(b_store, "t", b_settings, clock.clone(), b_failpoints).await?;
    let b = Registry::builder(dir.join("b"), rb.clone(), "wb")
        .settings(settings(64 << 10))
        .clock(clock.clone())
        .on_open(|c| c.execute_batch(common::LEDGER))
        .build()?;
    let first = b.acquire(&orgs[0]).await;
    assert!(first.is_err_and(|e| e.retry_after().is_some()));
    clock.advance(LEASE_MS + LEASE_MS / 10);
    Ok((b, rb, orgs, dead_run))
}

/// A crash takeover's acquires meet the dead writer's run together. One adopt seal fences
/// every org of it (K2), so one acquire adopts the run and the others wait for that and walk
/// again: the dead run is listed a few times in all, not once or more per org, and it is
/// adopted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_of_a_dead_writers_orgs_together_adopt_its_run_once() -> R {
    let dir = tempfile::tempdir()?;
    let memory: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let store = Arc::new(LatencyStore::new(
        memory.clone(),
        Shapes::all(Shape::Constant(Duration::from_millis(20))),
        2,
    ));
    let (b, _rb, orgs, dead_run) =
        crashed_writer_and_successor(memory, store.clone(), None, dir.path(), 16).await?;

    let trace = store.trace();
    let acquired = futures::future::join_all(orgs.iter().map(|o| b.acquire(o))).await;
    let recorded = trace.finish();
    for (o, r) in orgs.iter().zip(acquired) {
        r.map_err(|e| format!("{o}: {e}"))?;
    }
    let of_dead = |op: Op| {
        recorded
            .requests
            .iter()
            .filter(|r| r.op == op && r.path.contains(&dead_run))
            .count()
    };
    // The walks list the run (together), the adopter lists it before and after placing its
    // seal, and the others' walks again meet the seal: 6 here. With each acquire adopting on
    // its own, 22 for these 16 orgs, growing with them.
    assert!(
        of_dead(Op::List) <= 8,
        "{} LISTs of the dead run",
        of_dead(Op::List)
    );
    assert_eq!(of_dead(Op::Put), 1, "{:#?}", recorded.requests);
    for o in &orgs {
        assert!(!b.once(o, "k", effect(o.as_str(), "never")).await?.applied);
    }
    b.shutdown().await;
    Ok(())
}

/// Signals once an acquire is about to wait for another's adoption.
#[derive(Debug, Default)]
struct Awaited(Mutex<Option<oneshot::Sender<()>>>);

#[async_trait::async_trait]
impl Failpoints for Awaited {
    async fn hit(&self, point: FailPoint, _org: &OrgId) -> Result<(), String> {
        if point == FailPoint::AdoptionAwaited
            && let Some(tx) = self.0.lock().await.take()
        {
            let _ = tx.send(());
        }
        Ok(())
    }
}

/// Regression (review): the adopting acquire fails after its seal landed (its second
/// listing of the run errs). Its waiter must not just walk again, meeting our seal and
/// attaching as if the adoption were done: nothing would hold the floor for the seal or
/// learn the run's other orgs, which then never open before their requests (K2.5). It
/// adopts on its own, meets our seal, and finishes the adoption. Ordered without sleeps:
/// the leader is held at its seal's PUT until the waiter is about to wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adoption_cut_short_after_its_seal_is_finished_by_a_waiter() -> R {
    let dir = tempfile::tempdir()?;
    let memory: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let faults = Arc::new(FaultStore::new(memory.clone()));
    let awaited = Arc::new(Awaited::default());
    let (b, _rb, orgs, dead_run) =
        crashed_writer_and_successor(memory, faults.clone(), Some(awaited.clone()), dir.path(), 4)
            .await?;

    let seal = faults.pause_next(FaultOp::Put, &dead_run);
    let (waiting_tx, waiting) = oneshot::channel();
    *awaited.0.lock().await = Some(waiting_tx);
    let (b0, o0) = (b.clone(), orgs[0].clone());
    let leader = tokio::spawn(async move { b0.acquire(&o0).await.map(|_| ()) });
    seal.reached.await?;
    let (b1, o1) = (b.clone(), orgs[1].clone());
    let waiter = tokio::spawn(async move { b1.acquire(&o1).await.map(|_| ()) });
    waiting.await?;
    // The seal lands; the adopter's next listing of the run fails.
    faults.inject(FaultOp::List, &dead_run, 1, Fault::FailBefore);
    let _ = seal.resume.send(());
    let led = leader.await?;
    assert!(led.is_err(), "the adopter was to fail: {led:?}");
    waiter.await??;
    common::until(|| orgs[2..].iter().all(|o| b.serving(o).is_some())).await?;
    for o in &orgs {
        assert!(!b.once(o, "k", effect(o.as_str(), "never")).await?.applied);
    }
    b.shutdown().await;
    Ok(())
}
