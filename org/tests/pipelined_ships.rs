//! Pipelined ships (`docs/design.md` 3e) through the org layer: a busy org keeps several
//! ships in flight on a store with S3's latency and acknowledges every request exactly once
//! (I2, I6); a ship that fails in the middle of the pipeline ends the tenure, acknowledges
//! nothing issued after it, and a successor serves every acknowledged key (I7, W3).

mod common;

use std::sync::Arc;

use common::oracle::exactly_once;
use common::{R, effect, registry};
use idem_org::Settings;
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
        Settings::default(),
    )?;
    let org = reg.acquire(&OrgId::new("acme")?).await?;
    let trace = latency.trace();
    let mut tasks = Vec::new();
    for client in 0..32 {
        let org = org.clone();
        tasks.push(tokio::spawn(async move {
            let mut keys = Vec::new();
            for i in 0..4 {
                let key = format!("c{client}-{i}");
                let out = org.once(&key, effect("acme", &key)).await?;
                assert!(out.applied);
                keys.push(key);
            }
            Ok::<_, idem_org::Error>(keys)
        }));
    }
    let mut acked = Vec::new();
    for t in tasks {
        acked.extend(t.await??);
    }
    let recorded = trace.finish();
    let most = most_entry_puts_at_once(&recorded);
    assert!(
        most > 1,
        "the ships never overlapped (at most {most} in flight)"
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
        Settings::default(),
    )?;
    let org = reg.acquire(&OrgId::new("acme")?).await?;
    // The 6th log-entry create from now on fails twice before reaching the store and its
    // slot reads back empty: the store refused it, with later ships likely in flight.
    faults.inject_times(FaultOp::Put, "/log/", 6, 2, Fault::FailBefore);
    let mut tasks = Vec::new();
    for client in 0..16 {
        let org = org.clone();
        tasks.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            for i in 0..6 {
                let key = format!("c{client}-{i}");
                match org.once(&key, effect("acme", &key)).await {
                    Ok(_) => acked.push(key),
                    Err(_) => break,
                }
            }
            acked
        }));
    }
    let mut acked = Vec::new();
    for t in tasks {
        acked.extend(t.await?);
    }
    assert!(
        acked.len() < 96,
        "every request was acknowledged past a failed ship"
    );
    reg.shutdown().await;
    exactly_once(&replica, "acme", &acked, &[], dir.path()).await
}
