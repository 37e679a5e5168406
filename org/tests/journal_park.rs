//! Parked orgs on the journal (docs/design.md, sections 3c and 3g): an idle journal org
//! beyond `max_active_orgs` closes its connection and gives back its descriptors while its
//! tenure stays attached to the run, and its next request reopens it only after proving the
//! file is exactly the state of its newest acknowledged section (I8, I13, I14). A file
//! touched while parked is never served from; releasing a parked org reopens it first, so
//! its released section is captured from a proven file, and a successor takes it at once.
//!
//! Descriptor counts are in `park_fds.rs`.

mod common;

use std::time::Duration;

use common::journal::{LEASE_MS, in_store, replays, replays_within, settings};
use common::outside::outside;
use common::parked::{
    acme, acme_db, active, keys, park_acme, parked_acme, world_with, world_with_writing_hook,
};
use common::{R, effect, registry, replica_with_lease};
use idem_org::{Error, ErrorKind};

/// A parked journal org's first request reopens it from its own file with no store read
/// (no GET: nothing is hydrated), replays from it, and the org goes on committing in the
/// same tenure; a successor replays every key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_journal_org_serves_its_next_request_from_its_own_file() -> R {
    let w = world_with(active(1)).await?;
    let org = parked_acme(&w, &["k1", "k2"]).await?;
    let before = w.replica.store_requests();
    let out = org.once("k1", effect("acme", "ran-again")).await?;
    let after = w.replica.store_requests();
    assert!(!out.applied);
    assert_eq!(out.result, b"k1");
    assert!(!org.is_parked());
    assert_eq!(org.stats().unparks, 1);
    assert_eq!(after.get, before.get, "{before:?} -> {after:?}");
    // A new key after the unpark is captured from the reopened file.
    assert!(org.once("k3", effect("acme", "k3")).await?.applied);
    // Park and unpark again: the state after k3 is what the proof compares against.
    park_acme(&w, &org).await?;
    assert!(!org.once("k3", effect("acme", "ran-again")).await?.applied);
    assert_eq!(org.stats().unparks, 2);
    let results = w.reg.shutdown().await;
    assert!(results.iter().all(|(_, r)| r.is_ok()), "{results:?}");
    let acked = keys(&["k1", "k2", "k3"]);
    common::journal::successor_replays(w.store.clone(), &acked, settings(16 * 1024)).await?;
    in_store(&w.replica, w.dir.path(), &acme()?, &acked, &[]).await?;
    Ok(())
}

/// A process writing a parked journal org's file (nothing locks it while parked) is never
/// served: the next request is refused as poisoned, and a re-acquire hydrates the store's
/// state, without the outsider's row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_journal_file_written_from_outside_is_never_served() -> R {
    let w = world_with(active(1)).await?;
    let parked = parked_acme(&w, &["k1", "k2"]).await?;
    let lines = outside("write", &acme_db(&w)?, 1)?;
    assert_eq!(
        lines,
        vec!["ok 1".to_owned()],
        "nothing locks a parked file"
    );
    let err = parked
        .once("after", effect("acme", "after"))
        .await
        .expect_err("a request on a touched parked file must fail");
    assert!(
        matches!(err, Error::Poisoned { .. }),
        "poisoned, got {err:?}"
    );
    assert_eq!(err.kind(), ErrorKind::Reacquire);
    assert!(!parked.is_serving());

    let again = w.reg.acquire(&acme()?).await?;
    let acked = keys(&["k1", "k2"]);
    replays(&w.reg, &acme()?, &acked).await?;
    let outsider: i64 = again
        .read(|c| {
            c.query_row(
                "SELECT count(*) FROM effects WHERE key = 'outsider'",
                [],
                |r| r.get(0),
            )
        })
        .await?;
    assert_eq!(outsider, 0, "the outsider's write is not served");
    w.reg.shutdown().await;
    in_store(
        &w.replica,
        w.dir.path(),
        &acme()?,
        &acked,
        &["outsider", "after"],
    )
    .await?;
    Ok(())
}

/// Releasing a parked journal org (what J7's lag trigger and an eviction do) reopens and
/// proves its file, ships its released section and lands its Release entry: a successor
/// process takes the org at its first request while this process is still live, and
/// replays every key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releasing_a_parked_journal_org_frees_it_for_a_successor_at_once() -> R {
    let w = world_with(active(1)).await?;
    let acme_org = parked_acme(&w, &["k1", "k2"]).await?;
    acme_org.release().await?;
    assert_eq!(acme_org.stats().unparks, 1, "the release reopened the file");
    assert!(!acme_org.is_serving());

    let dir_b = tempfile::tempdir()?;
    let rb = replica_with_lease(w.store.clone(), LEASE_MS).await?;
    let b = registry(dir_b.path(), rb, "wb", settings(16 * 1024))?;
    // A's lease is live: only a landed Release entry lets B's first request through.
    let acked = keys(&["k1", "k2"]);
    replays_within(Duration::ZERO, &b, &acme()?, &acked).await?;
    assert!(b.once(&acme()?, "k3", effect("acme", "k3")).await?.applied);
    let results = b.shutdown().await;
    assert!(results.iter().all(|(_, r)| r.is_ok()), "{results:?}");
    w.reg.shutdown().await;
    let acked = keys(&["k1", "k2", "k3"]);
    in_store(&w.replica, w.dir.path(), &acme()?, &acked, &[]).await?;
    Ok(())
}

/// An application hook that writes at every open writes into the WAL of each unpark,
/// outside any request's commit. When only replays follow (no commit ships those pages),
/// they must still ship before the org parks again: folded into the file by the park's
/// checkpoint unshipped, the next unpark would find the file differing from the
/// acknowledged state and poison a healthy org.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hook_that_writes_at_every_open_ships_before_a_journal_org_parks_again() -> R {
    let w = world_with_writing_hook().await?;
    let (dir, replica, reg) = (&w.dir, &w.replica, &w.reg);
    let acme = acme()?;
    assert!(reg.once(&acme, "k0", effect("acme", "k0")).await?.applied);
    let handle = reg.acquire(&acme).await?;
    for round in 0..3 {
        // Parks acme (other takes the slot); acme's replay unparks it, and other parks.
        park_acme(&w, &handle).await?;
        let out = reg.once(&acme, "k0", effect("acme", "ran-again")).await?;
        assert!(!out.applied, "round {round}");
    }
    assert!(handle.is_serving());
    assert_eq!(handle.stats().parks, 3);
    assert_eq!(handle.stats().unparks, 3);
    let opens: i64 = handle
        .read(|c| c.query_row("SELECT count(*) FROM opens", [], |r| r.get(0)))
        .await?;
    // The first open and one per unpark.
    assert_eq!(opens, 4);
    let results = reg.shutdown().await;
    assert!(results.iter().all(|(_, r)| r.is_ok()), "{results:?}");
    in_store(replica, dir.path(), &acme, &keys(&["k0"]), &[]).await?;
    Ok(())
}
