//! The warm takeover of a drained journal run (K2.6, `docs/design.md` 3g): a draining
//! journal process frees every org with one release seal and deletes its process lease,
//! often faster than a successor's watcher polls. Guards against (1) the successor opening
//! only the orgs whose requests reach it: its first claim at the seal learns the run's orgs
//! and opens the rest in the background, with no request; (2) following a run released
//! longer ago than `follow_ms`, which would load it with tenants nobody asked it for; (3) a
//! background claim taking an org a live third process claimed after the drain. Each ends
//! with the exactly-once oracle.

mod common;

use std::sync::Arc;

use common::journal::{LEASE_MS, in_store, org, replays, settings, slow_store};
use common::{R, effect, registry, replica_with_lease, until};
use idem_org::{Registry, RegistrySettings, WarmSettings};
use idem_replica::Replica;
use object_store::ObjectStore;

const ORGS: usize = 10;

/// Journal settings with the warm takeover on. The watcher lists `processes/` once at its
/// start and then only an hour later, so a drain notice is never what opens an org here.
fn warm() -> RegistrySettings {
    RegistrySettings {
        warm: WarmSettings {
            enabled: true,
            poll_ms: 3_600_000,
            ..WarmSettings::default()
        },
        ..settings(64 << 10)
    }
}

fn store() -> Arc<dyn ObjectStore> {
    slow_store(std::time::Duration::from_millis(1), 7)
}

/// A's registry (journal, no watcher) with every org acknowledged once; returns the keys.
async fn a_serving(
    store: &Arc<dyn ObjectStore>,
    dir: &std::path::Path,
) -> Result<(Registry, Replica, Vec<Vec<String>>), common::BoxErr> {
    let ra = replica_with_lease(store.clone(), LEASE_MS).await?;
    let a = registry(&dir.join("a"), ra.clone(), "wa", settings(64 << 10))?;
    let mut acked = Vec::new();
    for i in 0..ORGS {
        let key = format!("a{i}");
        let out = a
            .once(&org(i), &key, effect(&format!("org{i}"), &key))
            .await?;
        assert!(out.applied);
        acked.push(vec![key]);
    }
    Ok((a, ra, acked))
}

/// B with the watcher on and `follow_ms`.
async fn b(
    store: &Arc<dyn ObjectStore>,
    dir: &std::path::Path,
    follow_ms: u64,
) -> Result<(Registry, Replica), common::BoxErr> {
    let settings = RegistrySettings {
        warm: WarmSettings {
            follow_ms,
            ..warm().warm
        },
        ..warm()
    };
    let rb = replica_with_lease(store.clone(), LEASE_MS).await?;
    let b = registry(&dir.join("b"), rb.clone(), "wb", settings)?;
    Ok((b, rb))
}

async fn shut(reg: &Registry) -> R {
    for (o, r) in reg.shutdown().await {
        r.map_err(|e| format!("{o}: {e}"))?;
    }
    Ok(())
}

/// Replays A's keys on `b`, commits one more key per org, shuts `b` down and checks the
/// store's state of every org.
async fn finish(
    b: &Registry,
    rb: &Replica,
    mut acked: Vec<Vec<String>>,
    dir: &std::path::Path,
) -> R {
    for (i, keys) in acked.iter_mut().enumerate() {
        let (o, key) = (org(i), format!("b{i}"));
        replays(b, &o, keys).await?;
        let out = b.once(&o, &key, effect(&format!("org{i}"), &key)).await?;
        assert!(out.applied);
        keys.push(key);
    }
    shut(b).await?;
    for (i, keys) in acked.iter().enumerate() {
        in_store(rb, &dir.join(format!("check{i}")), &org(i), keys, &[]).await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successors_first_claim_at_a_release_seal_opens_the_runs_other_orgs() -> R {
    let dir = tempfile::tempdir()?;
    let store = store();
    let (a, _ra, mut acked) = a_serving(&store, dir.path()).await?;
    shut(&a).await?;
    // B starts after the drain: what it follows is the seal's age, not its own watch.
    let (b, rb) = b(&store, dir.path(), 300_000).await?;

    // One request: its claim takes org0 free at A's release seal, and B follows the run.
    let out = b.once(&org(0), "first", effect("org0", "first")).await?;
    assert!(out.applied);
    acked[0].push("first".into());
    until(|| b.warm_runs_met() == 1).await?;
    assert_eq!(b.warm_runs_followed(), 1, "A's released run followed");
    until(|| b.open_orgs().len() == ORGS && b.warm_claims_in_flight() == 0).await?;
    assert_eq!(
        b.warm_claims(),
        ORGS as u64 - 1,
        "every other org opened in the background"
    );
    assert!(b.open_orgs().iter().all(|o| o.is_serving()));
    finish(&b, &rb, acked, dir.path()).await
}

/// A seal older than `follow_ms` (here any seal: 0) is an idle org's last holder, not a
/// drain to follow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_seal_older_than_follow_ms_is_not_followed() -> R {
    let dir = tempfile::tempdir()?;
    let store = store();
    let (a, _ra, mut acked) = a_serving(&store, dir.path()).await?;
    shut(&a).await?;
    let (b, rb) = b(&store, dir.path(), 0).await?;
    let out = b.once(&org(0), "first", effect("org0", "first")).await?;
    assert!(out.applied);
    acked[0].push("first".into());
    until(|| b.warm_runs_met() == 1).await?;
    assert_eq!(b.warm_runs_followed(), 0, "a seal older than follow_ms");
    assert_eq!(b.open_orgs().len(), 1);
    assert_eq!(b.warm_claims_in_flight(), 0);
    finish(&b, &rb, acked, dir.path()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn following_a_released_run_never_takes_an_org_a_live_process_claimed() -> R {
    let dir = tempfile::tempdir()?;
    let store = store();
    let (a, _ra, mut acked) = a_serving(&store, dir.path()).await?;
    shut(&a).await?;
    // C, live, claims org1 after the drain.
    let rc = replica_with_lease(store.clone(), LEASE_MS).await?;
    let c = registry(&dir.path().join("c"), rc, "wc", settings(64 << 10))?;
    let out = c.once(&org(1), "c", effect("org1", "c")).await?;
    assert!(out.applied);
    acked[1].push("c".into());

    let (b, rb) = b(&store, dir.path(), 300_000).await?;
    let out = b.once(&org(0), "first", effect("org0", "first")).await?;
    assert!(out.applied);
    acked[0].push("first".into());
    until(|| b.warm_runs_met() == 1).await?;
    assert_eq!(b.warm_runs_followed(), 1);
    // Every other org opened, and the attempt on org1 is over.
    until(|| b.open_orgs().len() == ORGS - 1 && b.warm_claims_in_flight() == 0).await?;
    let org1 = org(1);
    assert!(b.serving(&org1).is_none(), "B took org1 from a live C");
    // C goes on acknowledging org1.
    let out = c.once(&org1, "c2", effect("org1", "c2")).await?;
    assert!(out.applied);
    acked[1].push("c2".into());
    shut(&c).await?;
    finish(&b, &rb, acked, dir.path()).await
}
