//! Prune checks this host's clock against the store's before it deletes a key (I15).
//!
//! The host is a `ManualClock` fed to the registry and the replica alike; the store is a local
//! directory, whose Last-Modified is the kernel's real time. A manual clock set days away from
//! the real time is therefore a skewed host, seen through the store's own answers.
//!
//! Regression guarded against: a server whose clock stepped 8 days forward pruned keys
//! acknowledged seconds earlier, and their retries ran again instead of replaying.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{BoxErr, R, effect, registry};
use idem::{Clock, SystemClock};
use idem_org::{ErrorKind, Registry, RegistrySettings};
use idem_replica::{OrgId, Replica};

const DAY_MS: u64 = 86_400_000;
const MINUTE_MS: u64 = 60_000;

/// A registry over a fresh local store whose clock (keys' stamps, prune, the replica's
/// leases and clock check) is `clock`.
async fn open(dir: &std::path::Path, clock: &Arc<idem::ManualClock>) -> Result<Registry, BoxErr> {
    let store = Replica::local_store(&dir.join("store"))?;
    let host: Arc<dyn idem::Clock> = clock.clone();
    let replica = Replica::open_with(
        store,
        "",
        idem_replica::Settings::default(),
        host.clone(),
        None,
    )
    .await?;
    Ok(Registry::builder(dir.join("data"), replica, "w")
        .settings(RegistrySettings::default())
        .on_open(|c| c.execute_batch(common::LEDGER))
        .clock(host)
        .build()?)
}

fn real_now_ms() -> u64 {
    SystemClock.now_ms()
}

/// The retention window of these tests: 7 days.
const WEEK: Duration = Duration::from_millis(7 * DAY_MS);

/// Applies `keys` in `org`, each returning its own name.
async fn apply(registry: &Registry, org: &OrgId, keys: &[&str]) -> R {
    let handle = registry.acquire(org).await?;
    for k in keys {
        assert!(handle.once(k, effect(org.as_str(), k)).await?.applied);
    }
    Ok(())
}

/// Each key replays its stored result without running `apply` (I3): the key was not pruned.
async fn assert_replays(registry: &Registry, org: &OrgId, keys: &[&str]) -> R {
    let handle = registry.acquire(org).await?;
    let ran = Arc::new(AtomicUsize::new(0));
    for k in keys {
        let ran = ran.clone();
        let out = handle
            .once(k, move |_tx| {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<_, rusqlite::Error>(b"ran again".to_vec())
            })
            .await?;
        assert!(!out.applied, "key {k} ran again: it was pruned");
        assert_eq!(out.result, k.as_bytes(), "key {k}");
    }
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_days_ahead_of_the_store_refuses_to_prune_and_every_key_replays() -> R {
    let dir = tempfile::tempdir()?;
    let clock = Arc::new(idem::ManualClock::new(real_now_ms()));
    let registry = open(dir.path(), &clock).await?;
    let acme = OrgId::new("acme")?;
    let keys = ["k1", "k2", "k3"];
    apply(&registry, &acme, &keys).await?;

    // The host's clock steps 8 days forward: by it, the keys are 8 days old.
    clock.advance(8 * DAY_MS);
    let handle = registry.acquire(&acme).await?;
    let refused = handle.prune(WEEK).await;
    let err = refused
        .err()
        .ok_or("a host 8 days ahead of the store pruned")?;
    assert_eq!(err.kind(), ErrorKind::Fatal, "{err}");
    let said = err.to_string();
    assert!(
        said.contains("prune refused") && said.contains("ahead of the store"),
        "{said}"
    );
    assert!(matches!(
        err,
        idem_org::Error::Replica { ref source, .. }
            if matches!(**source, idem_replica::Error::ClockSkew { op: "prune", .. })
    ));
    // The registry's pruner refuses every open org the same way, touching none.
    let all = registry.prune_all(WEEK, |_| {}).await;
    assert_eq!(all.len(), 1);
    assert!(all.iter().all(|(_, r)| r.is_err()), "{all:?}");
    assert_replays(&registry, &acme, &keys).await?;
    registry.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_days_behind_the_store_refuses_to_prune() -> R {
    let dir = tempfile::tempdir()?;
    let clock = Arc::new(idem::ManualClock::new(real_now_ms()));
    let registry = open(dir.path(), &clock).await?;
    let acme = OrgId::new("acme")?;
    apply(&registry, &acme, &["k1"]).await?;
    clock.set(real_now_ms() - 8 * DAY_MS);
    let handle = registry.acquire(&acme).await?;
    let err = handle
        .prune(Duration::ZERO)
        .await
        .err()
        .ok_or("a host 8 days behind the store pruned")?;
    assert!(err.to_string().contains("behind the store"), "{err}");
    assert_replays(&registry, &acme, &["k1"]).await?;
    registry.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_within_the_bound_prunes_by_the_window_as_before() -> R {
    let dir = tempfile::tempdir()?;
    // A host a few minutes behind the store (within the default bound of 5 minutes).
    let clock = Arc::new(idem::ManualClock::new(real_now_ms() - 4 * MINUTE_MS));
    let registry = open(dir.path(), &clock).await?;
    let acme = OrgId::new("acme")?;
    apply(&registry, &acme, &["old-1", "old-2"]).await?;
    clock.set(real_now_ms() - MINUTE_MS);
    apply(&registry, &acme, &["new"]).await?;
    // Keys applied more than two minutes ago by this clock go; the newer one stays.
    let window = Duration::from_millis(2 * MINUTE_MS);
    let pruned = registry.acquire(&acme).await?.prune(window).await?;
    assert_eq!(pruned, 2);
    assert_replays(&registry, &acme, &["new"]).await?;
    let handle = registry.acquire(&acme).await?;
    let again = handle.once("old-1", effect("acme", "old-1")).await?;
    assert!(
        again.applied,
        "a pruned key runs again: that is what prune means"
    );
    registry.shutdown().await;
    Ok(())
}

/// Within the bound, the host may still read ahead of the store: a key is then judged by the
/// store's time, never pruned younger than the window by the store's clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_younger_than_the_window_by_the_stores_clock_stays_though_the_host_reads_ahead() -> R
{
    let dir = tempfile::tempdir()?;
    let clock = Arc::new(idem::ManualClock::new(real_now_ms()));
    let registry = open(dir.path(), &clock).await?;
    let acme = OrgId::new("acme")?;
    apply(&registry, &acme, &["k1"]).await?;
    // Four minutes ahead of the store: inside the bound, so prune runs; by the host's clock
    // k1 is four minutes old, by the store's a few milliseconds.
    clock.advance(4 * MINUTE_MS);
    let window = Duration::from_millis(3 * MINUTE_MS);
    let pruned = registry.acquire(&acme).await?.prune(window).await?;
    assert_eq!(
        pruned, 0,
        "k1 was pruned younger than the window by the store's clock"
    );
    assert_replays(&registry, &acme, &["k1"]).await?;
    registry.shutdown().await;
    Ok(())
}

/// The measurement is the process's, not each org's: pruning many orgs reads the store's
/// clock once (one HEAD of the process lease), not once per org (I16).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pruning_every_open_org_reads_the_stores_clock_once() -> R {
    let dir = tempfile::tempdir()?;
    let store = Replica::local_store(&dir.path().join("store"))?;
    let replica = common::replica(store, None).await?;
    let registry = registry(
        &dir.path().join("data"),
        replica.clone(),
        "w",
        RegistrySettings::default(),
    )?;
    for org in ["a", "b", "c", "d"] {
        apply(&registry, &OrgId::new(org)?, &["k"]).await?;
    }
    let before = replica.store_requests();
    let results = registry.prune_all(Duration::from_secs(3600), |_| {}).await;
    assert!(
        results.iter().all(|(_, r)| matches!(r, Ok(0))),
        "{results:?}"
    );
    let spent = replica.store_requests().since(&before);
    assert_eq!(spent.head, 1, "{spent:?}");
    registry.shutdown().await;
    Ok(())
}

/// Regression: the pruner computed its cutoff (now − window) from the host's clock before any
/// org measured the skew. On a host 8 days ahead the cutoff was real time + 1 day; the first
/// org was refused, NTP then stepped the clock back, and the next org, now within the bound
/// (nothing to move the cutoff back by), pruned every key with that future cutoff. Each org
/// now computes its cutoff after its own check, from that reading. The step happens in the
/// progress callback, between the two orgs' prunes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_clock_stepping_back_during_a_prune_run_prunes_no_young_key() -> R {
    let dir = tempfile::tempdir()?;
    let clock = Arc::new(idem::ManualClock::new(real_now_ms()));
    let registry = open(dir.path(), &clock).await?;
    let (a, b) = (OrgId::new("a")?, OrgId::new("b")?);
    apply(&registry, &a, &["k1", "k2"]).await?;
    apply(&registry, &b, &["k1", "k2"]).await?;

    clock.advance(8 * DAY_MS);
    let step = clock.clone();
    let mut seen = Vec::new();
    let results = registry
        .prune_all(WEEK, |p| {
            seen.push(p.result.as_ref().is_err_and(idem_org::Error::is_clock_skew));
            // NTP steps the clock back after the first org.
            step.set(real_now_ms());
        })
        .await;
    assert_eq!(seen, [true, false], "{results:?}");
    assert!(
        results.iter().any(|(_, r)| matches!(r, Ok(0))),
        "the org pruned after the step deleted keys seconds old: {results:?}"
    );
    assert_replays(&registry, &a, &["k1", "k2"]).await?;
    assert_replays(&registry, &b, &["k1", "k2"]).await?;
    registry.shutdown().await;
    Ok(())
}
