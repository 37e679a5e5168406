//! The conformance suite on `InMemory` and on `LocalFileSystem` in a temp dir.

use std::sync::Arc;

use idem_replica::{Error, Replica, conformance};
use object_store::ObjectStore;

fn memory() -> Arc<dyn ObjectStore> {
    Arc::new(object_store::memory::InMemory::new())
}

fn local() -> Arc<dyn ObjectStore> {
    // Each store gets its own directory; it lives for the test process.
    let dir =
        std::env::temp_dir().join(format!("idem-conf-local-{}-{}", std::process::id(), next()));
    match Replica::local_store(&dir) {
        Ok(s) => s,
        Err(e) => panic!("local store: {e}"),
    }
}

fn next() -> u64 {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
}

macro_rules! suite {
    ($($name:ident),* $(,)?) => {
        mod in_memory {
            use super::*;
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() -> Result<(), Error> { conformance::$name(memory()).await })*
        }
        mod local_fs {
            use super::*;
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() -> Result<(), Error> { conformance::$name(local()).await })*
        }
    };
}

suite!(
    probe_accepts_store,
    claim_rounds_strictly_increase,
    concurrent_claims_get_distinct_rounds,
    overlapping_writers_old_ship_is_fenced,
    zombie_after_retention_is_fenced,
    landed_but_error_put_is_settled_by_reread,
    faults_at_every_put_site,
    corrupt_blob_is_refused_and_nothing_installed,
    release_lets_next_claim_through,
    lease_respected_unless_force,
    org_isolation,
    retention_keeps_newest,
    restore_and_verify,
    unknown_entry_format_is_refused,
    snapshot_under_concurrent_writes,
    delta_chain_hydrates_and_restores_every_position,
    broken_delta_chain_is_a_typed_error,
    delta_needs_a_snapshot_and_is_fenced,
    retention_keeps_the_delta_chain,
    zombie_delta_is_fenced_and_collected,
    compacted_delta_supersedes_the_chain,
);

#[tokio::test]
async fn run_all_passes_on_memory() -> Result<(), Error> {
    conformance::run_all(memory).await
}
