//! Guards against a snapshot interval that only the host's real time can move: the shipper
//! must count `ShipPolicy::snapshot_interval_ms` on the injected clock, so a `ManualClock`
//! (one value given to the replica and the registry) decides when a full snapshot is due.

mod common;

use std::sync::Arc;

use common::{R, effect};
use idem_org::{Registry, RegistrySettings};
use idem_replica::{OrgId, Replica};

const INTERVAL_MS: u64 = 60_000;

/// The kinds of the org's log entries after its claim, oldest first.
async fn shipped(registry: &Registry, org: &OrgId) -> Result<Vec<&'static str>, common::BoxErr> {
    let log = registry.replica().history(org).await?;
    Ok(log
        .iter()
        .map(|e| e.kind_name())
        .filter(|k| *k != "claim")
        .collect())
}

#[tokio::test]
async fn a_manual_clock_past_the_snapshot_interval_makes_the_next_ship_full() -> R {
    let dir = tempfile::tempdir()?;
    let clock = Arc::new(idem::ManualClock::new(1_700_000_000_000));
    let host: Arc<dyn idem::Clock> = clock.clone();
    let store = Replica::local_store(&dir.path().join("store"))?;
    let replica = Replica::open_with(
        store,
        "",
        idem_replica::Settings::default(),
        host.clone(),
        None,
    )
    .await?;
    let mut settings = RegistrySettings::default();
    settings.ship.snapshot_interval_ms = INTERVAL_MS;
    let registry = Registry::builder(dir.path().join("data"), replica, "w")
        .settings(settings)
        .on_open(|c| c.execute_batch(common::LEDGER))
        .clock(host)
        .build()?;
    let org = OrgId::new("acme")?;
    let handle = registry.acquire(&org).await?;

    assert!(handle.once("k1", effect("acme", "k1")).await?.applied);
    assert!(handle.once("k2", effect("acme", "k2")).await?.applied);
    let before = shipped(&registry, &org).await?;
    assert_eq!(before.last(), Some(&"delta"), "{before:?}");

    // Within the interval on the injected clock: still a delta.
    clock.advance(INTERVAL_MS - 1_000);
    assert!(handle.once("k3", effect("acme", "k3")).await?.applied);
    let within = shipped(&registry, &org).await?;
    assert_eq!(within.last(), Some(&"delta"), "{within:?}");

    // Past it: the next ship is a full snapshot, though almost no real time has passed.
    clock.advance(2_000);
    assert!(handle.once("k4", effect("acme", "k4")).await?.applied);
    let after = shipped(&registry, &org).await?;
    assert_eq!(after.last(), Some(&"snapshot"), "{after:?}");
    for (org, closed) in registry.shutdown().await {
        closed.map_err(|e| format!("{org}: {e}"))?;
    }
    Ok(())
}
