//! A drained process deletes its process lease (I14, I15). Guards against a process that
//! shut down and released every org leaving `processes/<instance>.json` in the store for
//! ever, listed by every successor's watcher at every poll: after `Registry::shutdown` the
//! lease is gone from the listing and is not written again by the renewal task (a live
//! process's renewals are the witness that renewal periods passed), a successor still
//! takes every org at its first request, and a later claim through the same replica handle
//! writes the lease again.

mod common;

use std::sync::Arc;

use common::{R, effect, registry, replica_with_lease, until, witness, witness_puts};
use idem_org::{Registry, RegistrySettings};
use idem_replica::fault::{FaultStore, Op};
use idem_replica::{OrgId, Replica};
use object_store::ObjectStore;
use object_store::memory::InMemory;

const LEASE_MS: u64 = 1_000;

async fn listed(replica: &Replica, instance: &str) -> Result<bool, common::BoxErr> {
    Ok(replica
        .process_leases()
        .await?
        .iter()
        .any(|l| l.instance == instance))
}

/// Process A: its replica (lease term [`LEASE_MS`]) and registry, under `dir/a`.
async fn process_a(
    dir: &std::path::Path,
    store: Arc<dyn ObjectStore>,
) -> Result<(Replica, Registry), common::BoxErr> {
    let ra = replica_with_lease(store, LEASE_MS).await?;
    let a = registry(
        &dir.join("a"),
        ra.clone(),
        "wa",
        RegistrySettings::default(),
    )?;
    Ok((ra, a))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drained_process_deletes_its_lease_and_renews_it_no_more() -> R {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let (ra, a) = process_a(dir.path(), store.clone()).await?;
    let mut acked = Vec::new();
    for org in ["org0", "org1", "org2"] {
        let out = a.once(&OrgId::new(org)?, "k", effect(org, "k")).await?;
        assert!(out.applied);
        acked.push(org);
    }
    assert!(listed(&ra, ra.instance()).await?, "A's lease written");

    for (org, r) in a.shutdown().await {
        r.map_err(|e| format!("{org}: {e}"))?;
    }
    assert!(
        !listed(&ra, ra.instance()).await?,
        "A's lease still in processes/ after every org was released"
    );

    // A live process renews every third of its term; once it has renewed six times, two
    // of A's renewal periods have passed, in which A wrote nothing.
    let (rw, w) = witness(&dir.path().join("w"), store.clone(), LEASE_MS).await?;
    let a_puts = ra.store_requests().put;
    witness_puts(&rw, 6).await?;
    assert_eq!(ra.store_requests().put, a_puts, "A renewed after its drain");
    assert!(!listed(&ra, ra.instance()).await?);

    // The orgs move at their first request on a successor (each Release is at the head)
    // and replay what A acknowledged.
    let rb = replica_with_lease(store.clone(), LEASE_MS).await?;
    let b = registry(
        &dir.path().join("b"),
        rb.clone(),
        "wb",
        RegistrySettings::default(),
    )?;
    for org in &acked {
        let out = b.once(&OrgId::new(org)?, "k", effect(org, "k")).await?;
        assert!(!out.applied, "{org}/k replayed, not run again");
    }

    // A claim through A's handle (a registry started again in this process) writes the
    // lease again, and its renewals resume.
    let again = registry(
        &dir.path().join("a2"),
        ra.clone(),
        "wa",
        RegistrySettings::default(),
    )?;
    again
        .once(&OrgId::new("org9")?, "k", effect("org9", "k"))
        .await?;
    assert!(listed(&ra, ra.instance()).await?, "A's lease written again");
    let puts = ra.store_requests().put;
    until(|| ra.store_requests().put >= puts + 2).await?;
    for reg in [&again, &b, &w] {
        for (org, r) in reg.shutdown().await {
            r.map_err(|e| format!("{org}: {e}"))?;
        }
    }
    Ok(())
}

/// Regression: a second `shutdown` called while the first still released orgs found none,
/// skipped the drain's linger and deleted the process lease at once, so the process said
/// it held nothing while an org's release was still on its way to the store. Now it waits
/// for the first and returns nothing; a call after both returns at once.
#[tokio::test(flavor = "current_thread")]
async fn a_second_shutdown_waits_for_the_first_to_release_every_org() -> R {
    let dir = tempfile::tempdir()?;
    let faults = Arc::new(FaultStore::new(Arc::new(InMemory::new())));
    let (ra, a) = process_a(dir.path(), faults.clone()).await?;
    for org in ["org0", "org1"] {
        assert!(
            a.once(&OrgId::new(org)?, "k", effect(org, "k"))
                .await?
                .applied
        );
    }
    // org1's release is held at its Release entry.
    let held = faults.pause_next(Op::Put, "orgs/org1/log/");
    let first = tokio::spawn({
        let a = a.clone();
        async move { a.shutdown().await }
    });
    held.reached.await?;
    // This runtime has one thread: between two polls of the second call, every task that
    // can move (the first call's other release included) runs until it waits. A second
    // call that does not wait for the first has nothing to wait for but this store.
    let mut second = std::pin::pin!(a.shutdown());
    for _ in 0..64 {
        assert!(
            futures::poll!(second.as_mut()).is_pending(),
            "a second shutdown returned while org1's release was held"
        );
        tokio::task::yield_now().await;
    }
    assert!(
        listed(&ra, ra.instance()).await?,
        "the process lease was deleted while org1's release was held"
    );
    let _ = held.resume.send(());
    let released = first.await?;
    let mut orgs: Vec<String> = Vec::new();
    for (org, r) in released {
        r.map_err(|e| format!("{org}: {e}"))?;
        orgs.push(org.to_string());
    }
    orgs.sort();
    assert_eq!(orgs, ["org0", "org1"]);
    assert!(
        second.await.is_empty(),
        "the first call reported the releases"
    );
    assert!(
        !listed(&ra, ra.instance()).await?,
        "the lease outlived both calls"
    );
    assert!(a.shutdown().await.is_empty());
    Ok(())
}

/// While a holder drains, a successor's refusal sends clients back in a second (what its
/// HTTP answer's `Retry-After` says, `org/src/http/status.rs`), not after the watch a dead
/// holder would need, for the orgs the drain releases; once the release lands, the
/// successor takes the org. A refusal repeated from the successor's memory of the last one
/// (a request within `retry_ms` of it) says the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_holders_orgs_are_worth_asking_again_in_a_second() -> R {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let (ra, a) = process_a(dir.path(), store.clone()).await?;
    let (acme, beta) = (OrgId::new("acme")?, OrgId::new("beta")?);
    assert!(a.once(&acme, "k", effect("acme", "k")).await?.applied);
    assert!(a.once(&beta, "k", effect("beta", "k")).await?.applied);
    let rb = replica_with_lease(store.clone(), LEASE_MS).await?;
    let settings = RegistrySettings {
        warm: idem_org::WarmSettings {
            enabled: true,
            ..idem_org::WarmSettings::default()
        },
        ..RegistrySettings::default()
    };
    let b = registry(&dir.path().join("b"), rb, "wb", settings)?;
    let wait = |r: Result<idem_org::Org, idem_org::Error>| match r {
        Err(e) => e.retry_after().ok_or_else(|| format!("no wait in {e}")),
        Ok(_) => Err("an org taken from its live holder".to_owned()),
    };
    // A says it drains acme alone (its shutdown lists every org), and has not released it.
    assert!(ra.drain(std::slice::from_ref(&acme)).await);
    for _ in 0..2 {
        assert_eq!(
            wait(b.acquire(&acme).await)?,
            std::time::Duration::from_secs(1)
        );
    }
    // An org the drain does not list: the whole watch (a term and a tenth).
    let beta_wait = wait(b.acquire(&beta).await)?;
    assert!(
        beta_wait > std::time::Duration::from_millis(LEASE_MS),
        "{beta_wait:?}"
    );
    for (org, r) in a.shutdown().await {
        r.map_err(|e| format!("{org}: {e}"))?;
    }
    // Released: B takes it at a request, or its watcher already did.
    let waited = idem_base::Stopwatch::start();
    while b.acquire(&acme).await.is_err() {
        if waited.elapsed() > std::time::Duration::from_secs(20) {
            return Err("acme not taken within 20 s of its release".into());
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    b.shutdown().await;
    Ok(())
}
