//! Pipelined ships (`docs/design.md` 3e) through the org layer: a busy org keeps several
//! ships in flight on a store with S3's latency and acknowledges every request exactly once
//! (I2, I6); a ship that fails in the middle of the pipeline ends the tenure, acknowledges
//! nothing issued after it, and a successor serves every acknowledged key (I7, W3).

mod common;

use std::sync::Arc;

use common::oracle::exactly_once;
use common::{R, effect, registry};
use idem_org::RegistrySettings;
use idem_replica::fault::{Fault, FaultStore, Op as FaultOp};
use idem_replica::latency::{LatencyStore, Op, Shapes};
use idem_replica::{OrgId, Replica, SystemClock};
use object_store::ObjectStore;

async fn pipelined(store: Arc<dyn ObjectStore>) -> Result<Replica, common::BoxErr> {
    let settings = idem_replica::Settings {
        ship_window: 4,
        ..idem_replica::Settings::default()
    };
    Ok(Replica::open_with(store, "t", settings, Arc::new(SystemClock), None).await?)
}

/// The most log-entry creates the trace shows in flight at one instant.
fn most_entry_puts_at_once(recorded: &idem_replica::latency::Recorded) -> usize {
    let puts: Vec<_> = recorded
        .requests
        .iter()
        .filter(|r| r.op == Op::Put && r.path.contains("/log/"))
        .collect();
    puts.iter()
        .map(|a| {
            puts.iter()
                .filter(|b| b.start <= a.start && a.start < b.end)
                .count()
        })
        .max()
        .unwrap_or(0)
}

/// Waits for a paused call to arrive, failing (not hanging) after 20 s.
async fn held(reached: tokio::sync::oneshot::Receiver<()>) -> R {
    tokio::time::timeout(std::time::Duration::from_secs(20), reached)
        .await
        .map_err(|_| "the held call never arrived")??;
    Ok(())
}

/// Starts `n` requests, one every 2 ms (open-loop arrivals, as many clients make: commits go
/// on arriving while ships are in flight); returns each key with its task.
async fn spawn_arrivals(
    org: &idem_org::Org,
    n: usize,
) -> Vec<(
    String,
    tokio::task::JoinHandle<Result<idem_org::idem::Outcome, idem_org::Error>>,
)> {
    let mut every = tokio::time::interval(std::time::Duration::from_millis(2));
    let mut tasks = Vec::new();
    for i in 0..n {
        every.tick().await;
        let (org, key) = (org.clone(), format!("k{i}"));
        let k = key.clone();
        tasks.push((
            key,
            tokio::spawn(async move { org.once(&k, effect("acme", &k)).await }),
        ));
    }
    tasks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_org_keeps_several_ships_in_flight_and_acknowledges_every_request_once() -> R {
    let dir = tempfile::tempdir()?;
    let local = Replica::local_store(&dir.path().join("store"))?;
    let latency = Arc::new(LatencyStore::new(local, Shapes::s3(), 7));
    let replica = pipelined(latency.clone()).await?;
    let reg = registry(
        &dir.path().join("data"),
        replica.clone(),
        "A",
        RegistrySettings::default(),
    )?;
    let org = reg.acquire(&OrgId::new("acme")?).await?;
    let trace = latency.trace();
    let mut acked = Vec::new();
    for (key, t) in spawn_arrivals(&org, 128).await {
        assert!(t.await??.applied, "{key} replayed");
        acked.push(key);
    }
    let recorded = trace.finish();
    let most = most_entry_puts_at_once(&recorded);
    assert!(
        most > 1,
        "the ships never overlapped (at most {most} in flight): {:?}",
        org.stats()
    );
    assert!(most <= 4, "{most} ships in flight with a window of 4");
    assert_eq!(org.stats().acks, 128);
    reg.shutdown().await;
    exactly_once(&replica, "acme", &acked, &[], dir.path()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ship_failing_in_the_pipeline_ends_the_tenure_and_loses_no_acknowledged_key() -> R {
    let dir = tempfile::tempdir()?;
    let local = Replica::local_store(&dir.path().join("store"))?;
    let latency: Arc<dyn ObjectStore> = Arc::new(LatencyStore::new(local, Shapes::s3(), 11));
    let faults = Arc::new(FaultStore::new(latency));
    let replica = pipelined(faults.clone()).await?;
    let reg = registry(
        &dir.path().join("data"),
        replica.clone(),
        "A",
        RegistrySettings::default(),
    )?;
    let acme = OrgId::new("acme")?;
    let org = reg.acquire(&acme).await?;
    let ship = |org: &idem_org::Org, key: &str| {
        let (org, key) = (org.clone(), key.to_owned());
        tokio::spawn(async move { org.once(&key, effect("acme", &key)).await })
    };
    assert!(ship(&org, "k0").await??.applied);
    let head = replica.history(&acme).await?.last().map_or(0, |e| e.seq());
    let slot = |seq: u64| format!("/log/{seq:020}.json");
    // The order is held, not hoped for: k1's ship is held in the store at head + 1 while
    // k2's is issued behind it at head + 2, whose create fails on both tries before reaching
    // the store (the slot reads back empty: a refused put); then k1's goes on.
    faults.inject_times(FaultOp::Put, &slot(head + 2), 1, 2, Fault::FailBefore);
    let first = faults.pause_next(FaultOp::Put, &slot(head + 1));
    let k1 = ship(&org, "k1");
    held(first.reached).await?;
    let second = faults.pause_next(FaultOp::Put, &slot(head + 2));
    let k2 = ship(&org, "k2");
    held(second.reached).await?;
    drop(second.resume);
    drop(first.resume);
    let (k1, k2) = (k1.await?, k2.await?);
    assert!(
        k2.is_err(),
        "k2 was acknowledged with its ship refused: {k2:?}"
    );
    let mut acked = vec!["k0".to_owned()];
    if k1.is_ok() {
        acked.push("k1".to_owned());
    }
    reg.shutdown().await;
    exactly_once(&replica, "acme", &acked, &[], dir.path()).await
}
