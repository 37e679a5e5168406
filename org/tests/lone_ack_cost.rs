//! What a lone request's acknowledgement costs on the store (I6, I16). Guards against an
//! acknowledgement that waits for more than the one create-only PUT of its log entry: a full
//! snapshot (segment, manifest and entry: three sequential PUTs) shipped every few
//! acknowledgements because a small database's delta budget runs out after a handful of
//! deltas, a LIST or lease request awaited on the ship path, a delta body put as a blob of
//! its own beside its entry.
//!
//! One client sends requests one after another; the store (a `LatencyStore` with no delay,
//! used for its trace) records every request between a request's call and its answer. The
//! counts do not depend on timing: with one client each request is exactly one ship.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{R, registry};
use idem_org::{RegistrySettings, rusqlite};
use idem_replica::latency::{LatencyStore, Op, Shape, Shapes};
use idem_replica::{OrgId, Replica};
use object_store::ObjectStore;
use object_store::memory::InMemory;

/// More acknowledgements than the default percentage budget alone allowed between two full
/// snapshots of this database, and past a compaction (`compact_every_deltas`, 64).
const ACKS: usize = 150;

fn write(tx: &rusqlite::Transaction<'_>, i: usize) -> rusqlite::Result<Vec<u8>> {
    tx.execute(
        "INSERT INTO effects VALUES (?1, randomblob(50) || zeroblob(50))",
        [format!("k{i}")],
    )?;
    Ok(Vec::new())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_ack_costs_one_entry_put() -> R {
    let dir = tempfile::tempdir()?;
    let shapes = Shapes::all(Shape::Constant(Duration::ZERO));
    let traced = Arc::new(LatencyStore::new(Arc::new(InMemory::new()), shapes, 1));
    let store: Arc<dyn ObjectStore> = traced.clone();
    let replica = Replica::open(store, "t", idem_replica::Settings::default()).await?;
    let reg = registry(dir.path(), replica, "A", RegistrySettings::default())?;
    let org = reg.acquire(&OrgId::new("acme")?).await?;
    // The org's first ship is its first full snapshot: nothing to continue.
    org.once("first", |tx| write(tx, 0)).await?;
    for i in 1..=ACKS {
        let trace = traced.trace();
        org.once(&format!("k{i}"), move |tx| write(tx, i)).await?;
        let recorded = trace.finish();
        // The process lease's renewal runs on its own timer, beside the org's path.
        let org_requests: Vec<_> = recorded
            .requests
            .iter()
            .filter(|r| r.path.starts_with("t/orgs/acme/"))
            .collect();
        assert_eq!(org_requests.len(), 1, "ack {i}: {org_requests:?}");
        let entry = org_requests[0];
        assert_eq!(entry.op, Op::Put, "ack {i}: {entry:?}");
        assert!(
            entry.path.starts_with("t/orgs/acme/log/"),
            "ack {i}: {entry:?}"
        );
    }
    let stats = org.stats();
    assert_eq!(stats.full_ships, 1, "{stats:?}");
    assert!(stats.compactions >= 1, "{stats:?}");
    reg.shutdown().await;
    Ok(())
}
