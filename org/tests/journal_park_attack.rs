//! Attacks on parked journal orgs (docs/design.md 3c, 3g; I8, I13, I14): many orgs parking
//! and unparking under concurrent clients (with evictions, J7's lag releases and run
//! retention in the mix), files touched while parked (a WAL left beside, deleted, replaced
//! by an older copy of itself), shutdowns and releases of parked orgs, clean or tampered.
//! Every test ends with the exactly-once oracle on the store and, where the org moves on, a
//! successor process replaying every acknowledged key.

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::journal::{
    LEASE_MS, in_store, org, replays, replays_within, settings, successor_replays,
};
use common::outside::outside;
use common::parked::{
    World, acme, acme_db, active, keys, park_acme, parked_acme, world_with, world_with_writing_hook,
};
use common::{BoxErr, R, effect, registry, replica_with_lease};
use idem_org::{Error, ErrorKind, Org, Registry, RegistrySettings};
use idem_replica::OrgId;

fn wal_of(db: &std::path::Path) -> PathBuf {
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    PathBuf::from(wal)
}

/// The parked org's next request is refused as poisoned; a re-acquire (same process) serves
/// the store's state: every acked key replays, no outsider row; then, after a clean
/// shutdown, a successor process replays every key and the store holds each exactly once
/// and nothing of `forbidden`.
async fn refused_then_store_state(w: World, parked: &Org, acked: &[&str]) -> R {
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
    assert!(
        parked
            .once(acked[0], effect("acme", acked[0]))
            .await
            .is_err()
    );

    let again = w.reg.acquire(&acme()?).await?;
    // A journal org held by this process's run is taken again in the run (its round may
    // be the same: the poisoned tenure never serves again).
    assert!(again.is_serving() && !again.is_parked());
    assert_eq!(again.stats().unparks, 0, "hydrated, not unparked");
    let acked = keys(acked);
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
    // The new tenure goes on committing.
    assert!(again.once("fresh", effect("acme", "fresh")).await?.applied);
    let results = w.reg.shutdown().await;
    assert!(results.iter().all(|(_, r)| r.is_ok()), "{results:?}");
    let mut acked = acked;
    acked.push("fresh".into());
    successor_replays(w.store.clone(), &acked, settings(16 * 1024)).await?;
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

// ---------------------------------------------------------------------------------------
// 1. Many orgs, few active slots, concurrent clients.
// ---------------------------------------------------------------------------------------

/// Calls `f` until it returns anything but a retryable or reacquire error (a registry call
/// acquires again), for at most 30 s.
async fn retry_any<T, F, Fut>(mut f: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    let waited = idem_base::Stopwatch::start();
    loop {
        match f().await {
            Err(e)
                if matches!(e.kind(), ErrorKind::Retry | ErrorKind::Reacquire)
                    && waited.elapsed() < Duration::from_secs(30) =>
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            other => return other,
        }
    }
}

/// Shutdown results: every org released (an org J7 released meanwhile included: its
/// second release answers Ok).
fn shutdown_ok(results: &[(OrgId, Result<(), Error>)]) {
    assert!(results.iter().all(|(_, r)| r.is_ok()), "{results:?}");
}

/// Tallies of a concurrent run.
struct Run {
    by_org: Vec<Vec<String>>,
    /// `Poisoned` answers the clients saw (a healthy org's file refused).
    poisoned: usize,
    parks: u64,
    unparks: u64,
}

/// `clients` clients, each doing `per_client` first runs across `orgs` orgs (every third
/// replayed at once, possibly on a parked org) on `reg`. Retryable and reacquire errors
/// are retried with the same key: exactly-once makes a retry either the first run or a
/// replay with the first result. Returns the acknowledged keys per org.
async fn clients(
    reg: &Registry,
    orgs: usize,
    clients: usize,
    per_client: usize,
) -> Result<Run, BoxErr> {
    let mut tasks = Vec::new();
    for c in 0..clients {
        let reg = reg.clone();
        tasks.push(tokio::spawn(async move {
            let mut acked: Vec<(usize, String)> = Vec::new();
            let mut poisoned = 0usize;
            for i in 0..per_client {
                let o = (c * 7 + i * (c + 1)) % orgs;
                let id = org(o);
                let name = id.as_str().to_owned();
                let key = format!("k-{c}-{i}");
                let mut done = false;
                let waited = idem_base::Stopwatch::start();
                while waited.elapsed() < Duration::from_secs(30) {
                    match reg.once(&id, &key, effect(&name, &key)).await {
                        Ok(out) => {
                            assert_eq!(out.result, key.as_bytes(), "{name} {key}");
                            done = true;
                            break;
                        }
                        Err(e) if matches!(e.kind(), ErrorKind::Retry | ErrorKind::Reacquire) => {
                            if matches!(e, Error::Poisoned { .. }) {
                                eprintln!("{name} {key}: {e}");
                                poisoned += 1;
                            }
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        Err(e) => return Err(Box::new(e) as BoxErr),
                    }
                }
                assert!(done, "{key} on {name} never acknowledged");
                acked.push((o, key.clone()));
                if i % 3 == 0 {
                    let out = retry_any(|| reg.once(&id, &key, effect(&name, "ran-again"))).await?;
                    assert!(!out.applied, "{name} {key} replays");
                    assert_eq!(out.result, key.as_bytes(), "{name} {key}");
                }
            }
            Ok::<_, BoxErr>((acked, poisoned))
        }));
    }
    let mut by_org: Vec<Vec<String>> = vec![Vec::new(); orgs];
    let mut poisoned = 0;
    for t in tasks {
        let (acked, p) = t.await??;
        poisoned += p;
        for (o, key) in acked {
            by_org[o].push(key);
        }
    }
    let (parks, unparks) = reg
        .open_orgs()
        .iter()
        .map(|o| (o.stats().parks, o.stats().unparks))
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    Ok(Run {
        by_org,
        poisoned,
        parks,
        unparks,
    })
}

/// After the registry under test shut down: a successor process (fresh data directory,
/// writer `wb`, same store) replays every acked key of every org, and the store holds each
/// exactly once.
async fn successor_and_oracle(w: &World, by_org: &[Vec<String>]) -> R {
    let dir_b = tempfile::tempdir()?;
    let rb = replica_with_lease(w.store.clone(), LEASE_MS).await?;
    let b = registry(dir_b.path(), rb, "wb", settings(16 * 1024))?;
    for (o, acked) in by_org.iter().enumerate() {
        replays(&b, &org(o), acked).await?;
    }
    let results = b.shutdown().await;
    assert!(results.iter().all(|(_, r)| r.is_ok()), "{results:?}");
    for (o, acked) in by_org.iter().enumerate() {
        in_store(&w.replica, w.dir.path(), &org(o), acked, &[]).await?;
    }
    Ok(())
}

/// Runs `n_clients` concurrent clients making `requests` each over `orgs` orgs on `w`
/// ([`clients`]); with `must_park`, checks that orgs parked and unparked; checks that no
/// healthy org was poisoned; then shuts down (every org released) and hands every org to a
/// successor that replays every acknowledged key, with the oracle on the store.
async fn clients_then_successor(
    w: &World,
    orgs: usize,
    n_clients: usize,
    requests: usize,
    must_park: bool,
) -> R {
    let run = clients(&w.reg, orgs, n_clients, requests).await?;
    if must_park {
        assert!(
            run.parks > 0 && run.unparks > 0,
            "{} parks, {} unparks",
            run.parks,
            run.unparks
        );
    }
    assert_eq!(run.poisoned, 0, "a healthy org was poisoned");
    let results = w.reg.shutdown().await;
    shutdown_ok(&results);
    successor_and_oracle(w, &run.by_org).await
}

/// The journal variant of `park_and_unpark_under_concurrent_requests_keep_exactly_once`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn journal_park_and_unpark_under_concurrent_requests_keep_exactly_once() -> R {
    const ORGS: usize = 6;
    let w = world_with(active(2)).await?;
    clients_then_successor(&w, ORGS, 8, 25, true).await
}

/// One active slot: every request of another org parks the previous one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn journal_one_active_slot_under_concurrent_requests_keeps_exactly_once() -> R {
    const ORGS: usize = 5;
    let w = world_with(active(1)).await?;
    clients_then_successor(&w, ORGS, 6, 20, true).await
}

/// Parking plus evictions (`max_open_orgs` below the orgs in use): a parked journal org is
/// released (reopened, proven, released section, Release entry) and taken again by the same
/// process, over and over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn journal_park_with_evictions_under_concurrent_requests_keeps_exactly_once() -> R {
    const ORGS: usize = 6;
    let w = world_with(RegistrySettings {
        max_open_orgs: 3,
        ..active(1)
    })
    .await?;
    assert_eq!(w.reg.max_open_orgs(), 3);
    clients_then_successor(&w, ORGS, 6, 20, false).await
}

/// Parking plus J7 (a lag of 3 batches releases idle, often parked, orgs) plus the run's
/// retention every 2 batches with no keep time: a parked org's sections must survive
/// retention until its release's checkpoint, and a lag release of a parked org must
/// capture from a proven file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn journal_park_with_lag_releases_and_retention_keeps_exactly_once() -> R {
    const ORGS: usize = 6;
    let mut s = active(2);
    s.journal.section_bytes = u64::MAX;
    s.journal.max_lag_batches = 3;
    s.journal.retain_every_batches = 2;
    s.retention.keep_ms = 0;
    let w = world_with(s).await?;
    clients_then_successor(&w, ORGS, 6, 20, false).await
}

// ---------------------------------------------------------------------------------------
// 2. Files touched while parked.
// ---------------------------------------------------------------------------------------

/// An outsider that committed into the WAL and died leaves the journal file's pages alone:
/// the WAL with frames beside it must refuse the unpark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wal_left_beside_a_parked_journal_file_is_never_served() -> R {
    let w = world_with(active(1)).await?;
    let parked = parked_acme(&w, &["k1", "k2"]).await?;
    let db = acme_db(&w)?;
    let lines = outside("write-and-die", &db, 1)?;
    assert_eq!(lines, vec!["ok 1".to_owned()]);
    assert!(std::fs::metadata(wal_of(&db))?.len() > 0);
    refused_then_store_state(w, &parked, &["k1", "k2"]).await
}

/// A deleted parked journal file is never recreated empty (which would answer every key
/// as new).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_parked_journal_file_is_never_recreated_empty() -> R {
    let w = world_with(active(1)).await?;
    let parked = parked_acme(&w, &["k1", "k2"]).await?;
    std::fs::remove_file(acme_db(&w)?)?;
    refused_then_store_state(w, &parked, &["k1", "k2"]).await
}

/// A parked journal file replaced by an older copy of itself (taken while parked after
/// k1; the org then unparked, committed k2 in the same tenure and parked again): serving it
/// would answer k2 as never applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_journal_file_replaced_by_an_older_copy_is_never_served() -> R {
    let w = world_with(active(1)).await?;
    let a_org = parked_acme(&w, &["k1"]).await?;
    let db = acme_db(&w)?;
    let old = w.dir.path().join("old-copy.db");
    std::fs::copy(&db, &old)?;
    assert!(a_org.once("k2", effect("acme", "k2")).await?.applied);
    park_acme(&w, &a_org).await?;
    assert_eq!(a_org.stats().unparks, 1);
    std::fs::rename(&old, &db)?;
    refused_then_store_state(w, &a_org, &["k1", "k2"]).await
}

/// The older copy put back in place (same inode, `write` over it) rather than renamed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_journal_file_overwritten_in_place_with_an_older_copy_is_never_served() -> R {
    let w = world_with(active(1)).await?;
    let a_org = parked_acme(&w, &["k1"]).await?;
    let db = acme_db(&w)?;
    let old = std::fs::read(&db)?;
    assert!(a_org.once("k2", effect("acme", "k2")).await?.applied);
    park_acme(&w, &a_org).await?;
    std::fs::write(&db, &old)?;
    refused_then_store_state(w, &a_org, &["k1", "k2"]).await
}

/// An older copy from before a *later* park of a longer history: after k1..k3 parked three
/// times, the copy from the first park (k1) and its WAL-less state is put back. Also the
/// copy from the park just before the last one (k1, k2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_journal_file_replaced_by_the_previous_parks_copy_is_never_served() -> R {
    let w = world_with(active(1)).await?;
    let a_org = parked_acme(&w, &["k1"]).await?;
    let db = acme_db(&w)?;
    assert!(a_org.once("k2", effect("acme", "k2")).await?.applied);
    park_acme(&w, &a_org).await?;
    let previous = std::fs::read(&db)?;
    assert!(a_org.once("k3", effect("acme", "k3")).await?.applied);
    park_acme(&w, &a_org).await?;
    std::fs::write(&db, &previous)?;
    refused_then_store_state(w, &a_org, &["k1", "k2", "k3"]).await
}

/// The file truncated by one page while parked (a partial restore).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_parked_journal_file_is_never_served() -> R {
    let w = world_with(active(1)).await?;
    let parked = parked_acme(&w, &["k1", "k2"]).await?;
    let db = acme_db(&w)?;
    let len = std::fs::metadata(&db)?.len();
    let f = std::fs::OpenOptions::new().write(true).open(&db)?;
    f.set_len(len - 4096)?;
    drop(f);
    refused_then_store_state(w, &parked, &["k1", "k2"]).await
}

/// Liveness guard: same bytes written back in place still serve (the proof is of content).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_journal_file_rewritten_with_its_own_bytes_still_serves() -> R {
    let w = world_with(active(1)).await?;
    let a_org = parked_acme(&w, &["k1"]).await?;
    let db = acme_db(&w)?;
    let bytes = std::fs::read(&db)?;
    std::fs::write(&db, &bytes)?;
    let out = a_org.once("k1", effect("acme", "ran-again")).await?;
    assert!(!out.applied);
    assert!(a_org.once("k2", effect("acme", "k2")).await?.applied);
    let results = w.reg.shutdown().await;
    assert!(results.iter().all(|(_, r)| r.is_ok()), "{results:?}");
    let acked = keys(&["k1", "k2"]);
    successor_replays(w.store.clone(), &acked, settings(16 * 1024)).await?;
    in_store(&w.replica, w.dir.path(), &acme()?, &acked, &[]).await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 3. Shutdown with many parked journal orgs.
// ---------------------------------------------------------------------------------------

/// Shutdown of a registry holding 16 journal orgs, all but one parked: the release seal
/// frees each at its acknowledged state, so a successor takes every one at its first
/// request and replays every key; nothing is applied twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_many_parked_journal_orgs_hands_every_org_to_a_successor() -> R {
    const ORGS: usize = 16;
    let w = world_with(active(1)).await?;
    let mut by_org: Vec<Vec<String>> = vec![Vec::new(); ORGS];
    for round in 0..3 {
        for (o, acked) in by_org.iter_mut().enumerate() {
            let key = format!("k{round}");
            let id = org(o);
            assert!(
                w.reg
                    .once(&id, &key, effect(id.as_str(), &key))
                    .await?
                    .applied
            );
            acked.push(key);
        }
        // Replays of the previous org's keys on parked orgs, unparking each.
        for (o, acked) in by_org.iter().enumerate().step_by(3) {
            replays(&w.reg, &org(o), acked).await?;
        }
    }
    let open = w.reg.open_orgs();
    let parked = open.iter().filter(|o| o.is_parked()).count();
    assert_eq!(open.len(), ORGS);
    assert!(parked >= ORGS - 1, "{parked} of {ORGS} parked");
    let results = w.reg.shutdown().await;
    assert_eq!(results.len(), ORGS);
    assert!(results.iter().all(|(_, r)| r.is_ok()), "{results:?}");

    let dir_b = tempfile::tempdir()?;
    let rb = replica_with_lease(w.store.clone(), LEASE_MS).await?;
    let b = registry(dir_b.path(), rb, "wb", settings(16 * 1024))?;
    for (o, acked) in by_org.iter().enumerate() {
        // The seal freed it: the first request is served.
        replays_within(Duration::ZERO, &b, &org(o), acked).await?;
        let id = org(o);
        assert!(
            b.once(&id, "after", effect(id.as_str(), "after"))
                .await?
                .applied
        );
    }
    let results = b.shutdown().await;
    assert!(results.iter().all(|(_, r)| r.is_ok()), "{results:?}");
    for (o, acked) in by_org.iter_mut().enumerate() {
        acked.push("after".into());
        in_store(&w.replica, w.dir.path(), &org(o), acked, &[]).await?;
    }
    Ok(())
}

/// Shutdown with a parked journal org whose file was written from outside: the shutdown
/// does not reopen it (the seal frees it at its acknowledged state), so the outsider's row
/// must never reach the store or a successor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_a_tampered_parked_journal_org_publishes_nothing_of_the_outsider() -> R {
    let w = world_with(active(1)).await?;
    let _parked = parked_acme(&w, &["k1", "k2"]).await?;
    let lines = outside("write", &acme_db(&w)?, 1)?;
    assert_eq!(lines, vec!["ok 1".to_owned()]);
    let results = w.reg.shutdown().await;
    assert!(
        results.iter().all(|(_, r)| r.is_ok()),
        "a parked org at shutdown needs no reopen: {results:?}"
    );
    let acked = keys(&["k1", "k2"]);
    successor_replays(w.store.clone(), &acked, settings(16 * 1024)).await?;
    in_store(&w.replica, w.dir.path(), &acme()?, &acked, &["outsider"]).await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 4. Release of a tampered parked journal org.
// ---------------------------------------------------------------------------------------

/// Checks after a release that must have failed on a tampered parked file: nothing of it
/// was published (no Release entry, no outsider row); after the process shuts down, a
/// successor replays every acked key and never sees the outsider.
async fn release_refused(w: World, parked: &Org, acked: &[&str]) -> R {
    assert!(!parked.is_serving());
    let log = w.replica.journal_history(&acme()?).await?;
    assert!(
        log.last().is_none_or(|e| e.kind_name() != "release"),
        "no Release entry for a tampered file: {:?}",
        log.iter().map(|e| e.kind_name()).collect::<Vec<_>>()
    );
    // Nothing was published from the file: the store's newest state has no outsider.
    let acked = keys(acked);
    in_store(&w.replica, w.dir.path(), &acme()?, &acked, &["outsider"]).await?;
    // The same process takes the org again from the store.
    replays(&w.reg, &acme()?, &acked).await?;
    let results = w.reg.shutdown().await;
    shutdown_ok(&results);
    successor_replays(w.store.clone(), &acked, settings(16 * 1024)).await?;
    in_store(&w.replica, w.dir.path(), &acme()?, &acked, &["outsider"]).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releasing_a_tampered_parked_journal_org_publishes_nothing_of_it() -> R {
    let w = world_with(active(1)).await?;
    let parked = parked_acme(&w, &["k1", "k2"]).await?;
    let lines = outside("write", &acme_db(&w)?, 1)?;
    assert_eq!(lines, vec!["ok 1".to_owned()]);
    let err = parked
        .release()
        .await
        .expect_err("the release of a tampered parked file must fail");
    assert!(
        matches!(err, Error::Poisoned { .. }),
        "poisoned, got {err:?}"
    );
    release_refused(w, &parked, &["k1", "k2"]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releasing_a_parked_journal_org_with_a_foreign_wal_publishes_nothing_of_it() -> R {
    let w = world_with(active(1)).await?;
    let parked = parked_acme(&w, &["k1", "k2"]).await?;
    let lines = outside("write-and-die", &acme_db(&w)?, 1)?;
    assert_eq!(lines, vec!["ok 1".to_owned()]);
    let err = parked.release().await.expect_err("must fail");
    assert!(
        matches!(err, Error::Poisoned { .. }),
        "poisoned, got {err:?}"
    );
    release_refused(w, &parked, &["k1", "k2"]).await
}

/// Eviction of a tampered parked journal org (`max_open_orgs` 2, a third org acquired):
/// the eviction's release must fail without publishing the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicting_a_tampered_parked_journal_org_publishes_nothing_of_it() -> R {
    let w = world_with(RegistrySettings {
        max_open_orgs: 2,
        ..active(1)
    })
    .await?;
    let parked = parked_acme(&w, &["k1", "k2"]).await?;
    let lines = outside("write", &acme_db(&w)?, 1)?;
    assert_eq!(lines, vec!["ok 1".to_owned()]);
    // acme is the least recently used: a third org evicts it.
    let third = OrgId::new("third")?;
    assert!(w.reg.once(&third, "t", effect("third", "t")).await?.applied);
    assert!(!parked.is_serving(), "acme was evicted");
    release_refused(w, &parked, &["k1", "k2"]).await
}

// ---------------------------------------------------------------------------------------
// 5. J7's lag trigger on parked orgs.
// ---------------------------------------------------------------------------------------

/// Settings with one active org, no byte checkpoints, and a lag of `lag` batches.
fn lagging(lag: u64) -> RegistrySettings {
    let mut s = active(1);
    s.journal.section_bytes = u64::MAX;
    s.journal.max_lag_batches = lag;
    s
}

/// Requests on `other` until `acme` is no longer serving (J7 released it), at most 300;
/// then waits until that release ended: the registry forgets an org once its release
/// returned.
async fn until_lag_releases(w: &World, a_org: &Org) -> R {
    let other = OrgId::new("other")?;
    let mut i = 0;
    while a_org.is_serving() {
        let key = format!("b{i}");
        assert!(
            w.reg
                .once(&other, &key, effect("other", &key))
                .await?
                .applied
        );
        i += 1;
        assert!(i < 300, "acme never released by its lag");
    }
    let id = acme()?;
    common::until(|| w.reg.open_orgs().iter().all(|o| o.id() != &id)).await
}

/// Polls acme's log until its newest entry is a Release entry, at most 20 s.
async fn until_released(w: &World) -> R {
    let waited = idem_base::Stopwatch::start();
    loop {
        let log = w.replica.journal_history(&acme()?).await?;
        if log.last().is_some_and(|e| e.kind_name() == "release") {
            return Ok(());
        }
        assert!(
            waited.elapsed() < Duration::from_secs(20),
            "no Release entry"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A parked journal org released by J7's lag trigger: the release reopened and proved the
/// file and landed a Release entry, so a live successor takes it at once and replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lag_release_of_a_parked_journal_org_hands_it_to_a_live_successor() -> R {
    let w = world_with(lagging(6)).await?;
    let acme_org = parked_acme(&w, &["k1", "k2"]).await?;
    until_lag_releases(&w, &acme_org).await?;
    until_released(&w).await?;
    assert_eq!(acme_org.stats().unparks, 1, "the release reopened the file");

    let dir_b = tempfile::tempdir()?;
    let rb = replica_with_lease(w.store.clone(), LEASE_MS).await?;
    let b = registry(dir_b.path(), rb, "wb", settings(16 * 1024))?;
    let acked = keys(&["k1", "k2"]);
    replays_within(Duration::ZERO, &b, &acme()?, &acked).await?;
    assert!(b.once(&acme()?, "k3", effect("acme", "k3")).await?.applied);
    let results = b.shutdown().await;
    assert!(results.iter().all(|(_, r)| r.is_ok()), "{results:?}");
    let results = w.reg.shutdown().await;
    shutdown_ok(&results);
    in_store(
        &w.replica,
        w.dir.path(),
        &acme()?,
        &keys(&["k1", "k2", "k3"]),
        &[],
    )
    .await?;
    Ok(())
}

/// A parked journal org written from outside, then lagging: J7's release must refuse the
/// file (no Release entry, nothing of the outsider published).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lag_release_of_a_tampered_parked_journal_org_publishes_nothing_of_it() -> R {
    let w = world_with(lagging(6)).await?;
    let parked = parked_acme(&w, &["k1", "k2"]).await?;
    assert!(parked.is_serving() && parked.is_parked());
    let lines = outside("write", &acme_db(&w)?, 1)?;
    assert_eq!(lines, vec!["ok 1".to_owned()]);
    until_lag_releases(&w, &parked).await?;
    release_refused(w, &parked, &["k1", "k2"]).await
}

// ---------------------------------------------------------------------------------------
// 6. Retention while parked.
// ---------------------------------------------------------------------------------------

/// A parked journal org's sections are in batches of the run; with retention every 2
/// batches, no keep time and no lag trigger, another org's 60 ships must not delete them
/// while acme is parked: acme then unparks and ships more, and a successor replays all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_journal_orgs_sections_survive_the_runs_retention() -> R {
    let mut s = active(1);
    s.journal.section_bytes = u64::MAX;
    s.journal.max_lag_batches = 0;
    s.journal.retain_every_batches = 2;
    s.retention.keep_ms = 0;
    let w = world_with(s).await?;
    let acme_org = parked_acme(&w, &["k1", "k2", "k3"]).await?;
    let other = OrgId::new("other")?;
    for i in 0..60 {
        let key = format!("b{i}");
        assert!(
            w.reg
                .once(&other, &key, effect("other", &key))
                .await?
                .applied
        );
    }
    assert!(acme_org.is_parked());
    // Nothing about acme is lost even before it unparks: the store's newest state holds it.
    let acked = keys(&["k1", "k2", "k3"]);
    in_store(&w.replica, w.dir.path(), &acme()?, &acked, &[]).await?;
    assert!(!acme_org.once("k2", effect("acme", "again")).await?.applied);
    assert!(acme_org.once("k4", effect("acme", "k4")).await?.applied);
    park_acme(&w, &acme_org).await?;
    for i in 60..100 {
        let key = format!("b{i}");
        assert!(
            w.reg
                .once(&other, &key, effect("other", &key))
                .await?
                .applied
        );
    }
    let results = w.reg.shutdown().await;
    assert!(results.iter().all(|(_, r)| r.is_ok()), "{results:?}");
    let acked = keys(&["k1", "k2", "k3", "k4"]);
    successor_replays(w.store.clone(), &acked, settings(16 * 1024)).await?;
    in_store(&w.replica, w.dir.path(), &acme()?, &acked, &[]).await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 7. Concurrency against the lifecycle: tampering, shutdown and releases racing requests.
// ---------------------------------------------------------------------------------------

/// The database file org `o`'s writer serves under the data directory `data`, if any.
fn db_of(data: &std::path::Path, o: &OrgId) -> Option<PathBuf> {
    let dir = data.join("orgs").join(o.as_str());
    std::fs::read_dir(dir).ok()?.find_map(|e| {
        let p = e.ok()?.path();
        p.extension().is_some_and(|x| x == "db").then_some(p)
    })
}

/// Clients on 4 orgs with one active slot while an attacker writes into whichever org's
/// file is parked (a real SQLite process: it can only get in while nothing holds the file).
/// Every write that got in must poison its org at the next unpark; none may be answered
/// from or reach the store; acked keys survive into a successor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attacker_writing_parked_files_under_concurrent_requests_is_never_served() -> R {
    const ORGS: usize = 4;
    let w = world_with(active(1)).await?;
    let data = w.dir.path().join("data");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let attacker = {
        let (reg, data, stop) = (w.reg.clone(), data.clone(), stop.clone());
        tokio::spawn(async move {
            let mut got_in = 0u32;
            let mut tries = 0u32;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                for o in 0..ORGS {
                    let id = org(o);
                    let parked = reg.serving(&id).is_some_and(|h| h.is_parked());
                    let Some(db) = db_of(&data, &id) else {
                        continue;
                    };
                    if !parked {
                        continue;
                    }
                    tries += 1;
                    let lines =
                        tokio::task::spawn_blocking(move || outside("write", &db, 1)).await?;
                    if lines.is_ok_and(|l| l == ["ok 1"]) {
                        got_in += 1;
                    }
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            Ok::<_, BoxErr>((got_in, tries))
        })
    };
    let run = clients(&w.reg, ORGS, 4, 30).await?;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (got_in, tries) = attacker.await??;
    assert!(got_in > 0, "the attacker never got in ({tries} tries)");
    // Every org's current handle answers without the outsider.
    for o in 0..ORGS {
        let id = org(o);
        let outsider: i64 = retry_any(|| async {
            w.reg
                .acquire(&id)
                .await?
                .read(|c| {
                    c.query_row(
                        "SELECT count(*) FROM effects WHERE key = 'outsider'",
                        [],
                        |r| r.get(0),
                    )
                })
                .await
        })
        .await?;
        assert_eq!(outsider, 0, "{id} served an outsider's row");
    }
    let results = w.reg.shutdown().await;
    shutdown_ok(&results);
    let dir_b = tempfile::tempdir()?;
    let rb = replica_with_lease(w.store.clone(), LEASE_MS).await?;
    let b = registry(dir_b.path(), rb, "wb", settings(16 * 1024))?;
    for (o, acked) in run.by_org.iter().enumerate() {
        replays(&b, &org(o), acked).await?;
    }
    let results = b.shutdown().await;
    shutdown_ok(&results);
    for (o, acked) in run.by_org.iter().enumerate() {
        in_store(&w.replica, w.dir.path(), &org(o), acked, &["outsider"]).await?;
    }
    Ok(())
}

/// Clients keep sending to 6 orgs (one active slot, so most are parked) while the registry
/// shuts down: every answer a client got before the shutdown refused it is in the store and
/// replays on a successor; nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_racing_requests_on_parked_journal_orgs_loses_no_ack() -> R {
    const ORGS: usize = 6;
    const CLIENTS: usize = 6;
    let w = world_with(active(1)).await?;
    let acks = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let (reg, acks) = (w.reg.clone(), acks.clone());
        tasks.push(tokio::spawn(async move {
            let mut acked: Vec<(usize, String)> = Vec::new();
            for i in 0.. {
                let o = (c * 5 + i * (c + 1)) % ORGS;
                let id = org(o);
                let key = format!("k-{c}-{i}");
                let out = if i % 4 == 3 && !acked.is_empty() {
                    // A replay of an earlier key, likely on a parked org.
                    let (po, pk) = acked[i % acked.len()].clone();
                    let pid = org(po);
                    match reg.once(&pid, &pk, effect(pid.as_str(), "ran-again")).await {
                        Ok(out) => {
                            assert!(!out.applied, "{pid} {pk} applied twice");
                            assert_eq!(out.result, pk.as_bytes());
                            continue;
                        }
                        Err(e) => Err(e),
                    }
                } else {
                    reg.once(&id, &key, effect(id.as_str(), &key)).await
                };
                match out {
                    Ok(out) => {
                        assert_eq!(out.result, key.as_bytes());
                        acked.push((o, key));
                        acks.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    Err(Error::ShuttingDown { .. }) => break,
                    Err(e) if matches!(e.kind(), ErrorKind::Retry | ErrorKind::Reacquire) => {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    Err(e) => return Err(Box::new(e) as BoxErr),
                }
                if i > 100_000 {
                    break;
                }
            }
            Ok::<_, BoxErr>(acked)
        }));
    }
    // Shut down once a state is reached (enough acks), never after a fixed sleep.
    common::until(|| acks.load(std::sync::atomic::Ordering::SeqCst) >= 120).await?;
    let results = w.reg.shutdown().await;
    let mut by_org: Vec<Vec<String>> = vec![Vec::new(); ORGS];
    for t in tasks {
        for (o, key) in t.await?? {
            by_org[o].push(key);
        }
    }
    // A release may fail only as an org whose handle a request had already closed.
    let bad: Vec<_> = results.iter().filter(|(_, r)| r.is_err()).collect();
    eprintln!("shutdown results with errors: {bad:?}");
    successor_and_oracle(&w, &by_org).await
}

/// Explicit releases of a parked journal org racing requests on it, 20 times: each round
/// parks acme, then a release and 4 requests (new keys and replays) start together. An
/// answer is either served before the release's final section or refused; every acked key
/// is in the store and replays in a successor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_of_a_parked_journal_org_racing_requests_lose_no_ack() -> R {
    let w = world_with(active(1)).await?;
    let mut acked: Vec<String> = Vec::new();
    let id = acme()?;
    for round in 0..20 {
        let a_org = w.reg.acquire(&id).await?;
        let key = format!("r{round}");
        assert!(a_org.once(&key, effect("acme", &key)).await?.applied);
        acked.push(key);
        park_acme(&w, &a_org).await?;
        let release = {
            let h = a_org.clone();
            tokio::spawn(async move { h.release().await })
        };
        let mut reqs = Vec::new();
        for j in 0..4 {
            let h = a_org.clone();
            let (key, replay) = if j % 2 == 0 {
                (format!("r{round}-{j}"), false)
            } else {
                (acked[(round + j) % acked.len()].clone(), true)
            };
            reqs.push(tokio::spawn(async move {
                let out = h
                    .once(
                        &key,
                        effect("acme", if replay { "ran-again" } else { &key }),
                    )
                    .await;
                (key, replay, out)
            }));
        }
        for r in reqs {
            let (key, replay, out) = r.await?;
            match out {
                Ok(out) => {
                    assert_eq!(out.applied, !replay, "{key}");
                    assert_eq!(out.result, key.as_bytes());
                    if !replay {
                        acked.push(key);
                    }
                }
                Err(e) => assert_eq!(e.kind(), ErrorKind::Reacquire, "{key}: {e:?}"),
            }
        }
        release.await??;
        assert!(!a_org.is_serving());
    }
    replays(&w.reg, &id, &acked).await?;
    let results = w.reg.shutdown().await;
    shutdown_ok(&results);
    successor_replays(w.store.clone(), &acked, settings(16 * 1024)).await?;
    in_store(&w.replica, w.dir.path(), &id, &acked, &[]).await?;
    Ok(())
}

/// Parking with a J5 checkpoint at every ship (`section_bytes` 1) and every other one a
/// snapshot read from the file (`max_chain_deltas` 1): the file a snapshot checkpoint reads
/// after an unpark must be the acknowledged state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn journal_park_with_snapshot_checkpoints_under_concurrent_requests_keeps_exactly_once() -> R
{
    const ORGS: usize = 5;
    let mut s = active(1);
    s.journal.section_bytes = 1;
    s.journal.max_chain_deltas = 1;
    let w = world_with(s).await?;
    let run = clients(&w.reg, ORGS, 5, 20).await?;
    assert!(run.parks > 0 && run.unparks > 0);
    assert_eq!(run.poisoned, 0, "a healthy org was poisoned");
    let results = w.reg.shutdown().await;
    shutdown_ok(&results);
    successor_and_oracle(&w, &run.by_org).await
}

/// Parking with an application hook that writes at every open (so every unpark leaves the
/// WAL position unknown and each park must ship first), under concurrent clients.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn journal_park_with_a_writing_hook_under_concurrent_requests_keeps_exactly_once() -> R {
    const ORGS: usize = 5;
    let w = world_with_writing_hook().await?;
    clients_then_successor(&w, ORGS, 5, 20, true).await
}
