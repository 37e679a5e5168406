//! A registry dropped without `shutdown` stops its orgs as a crashed process would (I7, I14,
//! I15): nothing more is shipped or acknowledged, its tasks end, and once no clone of its
//! replica handle remains its process lease is renewed no more, so a successor takes every
//! org after one watch. Guards against dropped registries whose org tasks kept the replica
//! alive, and with it the lease renewals, so their orgs stayed held for as long as the
//! process lived.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{R, effect, registry, replica_with_lease, witness, witness_puts};
use idem_org::{ErrorKind, RegistrySettings, WarmSettings};
use idem_replica::{OrgId, Replica};
use object_store::ObjectStore;
use object_store::memory::InMemory;

const LEASE_MS: u64 = 1_000;

/// The version (ETag) of A's process lease as the store lists it, `None` when absent.
async fn renewals(observer: &Replica, instance: &str) -> Result<Option<String>, common::BoxErr> {
    Ok(observer
        .process_leases()
        .await?
        .into_iter()
        .find(|l| l.instance == instance)
        .map(|l| l.version))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dropped_registry_stops_its_orgs_and_its_lease_lapses() -> R {
    dropped(RegistrySettings::default()).await
}

/// The same with the warm takeover's watcher running in A: it holds the registry only
/// weakly, so it does not keep the orgs (or the lease) alive either.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dropped_registry_with_its_watcher_running_stops_too() -> R {
    dropped(RegistrySettings {
        warm: WarmSettings {
            enabled: true,
            poll_ms: 50,
            ..WarmSettings::default()
        },
        ..RegistrySettings::default()
    })
    .await
}

async fn dropped(settings: RegistrySettings) -> R {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let ra = replica_with_lease(store.clone(), LEASE_MS).await?;
    let instance = ra.instance().to_owned();
    let a = registry(&dir.path().join("a"), ra, "wa", settings)?;
    let orgs = ["org0", "org1", "org2"];
    for org in orgs {
        assert!(
            a.once(&OrgId::new(org)?, "k", effect(org, "k"))
                .await?
                .applied
        );
    }
    // An org handle the embedder kept answers, after the drop, that the org is closed.
    let kept = a.acquire(&OrgId::new("org0")?).await?;
    drop(a);
    let after = kept.once("k2", effect("org0", "k2")).await;
    assert!(
        matches!(&after, Err(e) if e.kind() == ErrorKind::Reacquire || e.kind() == ErrorKind::Retry),
        "a kept handle of a dropped registry acknowledged: {after:?}"
    );
    drop(kept);

    // The witness renews every third of its lease; six of its renewals are two of A's
    // renewal periods. A renewal A had in flight at the drop may land in the first two.
    let (rw, w) = witness(&dir.path().join("w"), store.clone(), LEASE_MS).await?;
    witness_puts(&rw, 3).await?;
    let before = renewals(&rw, &instance).await?;
    witness_puts(&rw, 6).await?;
    assert_eq!(
        renewals(&rw, &instance).await?,
        before,
        "the dropped registry's process lease was still renewed"
    );

    // A successor takes every org once it has watched A's lease unchanged for a watch, and
    // replays what A acknowledged.
    let rb = replica_with_lease(store.clone(), LEASE_MS).await?;
    let b = registry(&dir.path().join("b"), rb, "wb", RegistrySettings::default())?;
    for org in orgs {
        let id = OrgId::new(org)?;
        let waited = idem_base::Stopwatch::start();
        let out = loop {
            match b.once(&id, "k", effect(org, "k")).await {
                Ok(out) => break out,
                Err(e) if e.kind() == ErrorKind::Retry && waited.elapsed().as_secs() < 20 => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => return Err(format!("{org}: {e}").into()),
            }
        };
        assert!(!out.applied, "{org}/k replayed, not run again");
    }
    for reg in [&b, &w] {
        for (org, r) in reg.shutdown().await {
            r.map_err(|e| format!("{org}: {e}"))?;
        }
    }
    Ok(())
}
