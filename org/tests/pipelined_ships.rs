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
    let org = reg.acquire(&OrgId::new("acme")?).await?;
    // Both tries of the create at slot 4 (the claim is 1) fail before reaching the store
    // and the slot reads back empty: the store refused it, with later ships likely in
    // flight. A slot, not the n-th put: puts of ships in flight interleave.
    faults.inject_times(
        FaultOp::Put,
        "/log/00000000000000000004.json",
        1,
        2,
        Fault::FailBefore,
    );
    let mut acked = Vec::new();
    let mut failed = 0;
    for (key, t) in spawn_arrivals(&org, 96).await {
        match t.await? {
            Ok(_) => acked.push(key),
            Err(_) => failed += 1,
        }
    }
    assert!(
        failed > 0,
        "every request was acknowledged past a failed ship"
    );
    reg.shutdown().await;
    exactly_once(&replica, "acme", &acked, &[], dir.path()).await
}
