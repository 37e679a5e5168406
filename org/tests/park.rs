//! Parked orgs (docs/design.md, section 3c): an idle org beyond `max_active_orgs` closes its
//! connection but keeps its claim, and its next request reopens it only after proving the
//! file is still exactly the chain's tip. A file touched while parked — written by another
//! process, a WAL left beside it, deleted, replaced — is never served from (I8, I13): the
//! org is poisoned and a re-acquire serves the store's state. Under concurrent requests,
//! parking and unparking keep exactly-once (I2, I3, I6).
//!
//! Descriptor counts and the scale test are in `park_fds.rs` (they count the process's
//! descriptors, which tests running beside them would change).

mod common;

use std::path::{Path, PathBuf};

use common::outside::outside;
use common::{BoxErr, R, effect, registry, replica};
use idem_org::{Error, ErrorKind, Org, Registry, RegistrySettings};
use idem_replica::{OrgId, Replica};

struct World {
    dir: tempfile::TempDir,
    replica: Replica,
    reg: Registry,
}

/// A registry with at most `active` orgs holding a connection, on a local store.
async fn world(active: usize) -> Result<World, BoxErr> {
    let dir = tempfile::tempdir()?;
    let store = Replica::local_store(&dir.path().join("store"))?;
    let replica = replica(store, None).await?;
    let settings = RegistrySettings {
        max_active_orgs: active,
        ..RegistrySettings::default()
    };
    let reg = registry(&dir.path().join("data"), replica.clone(), "w", settings)?;
    assert_eq!(reg.max_active_orgs(), active);
    Ok(World { dir, replica, reg })
}

fn id(name: &str) -> Result<OrgId, BoxErr> {
    Ok(OrgId::new(name)?)
}

/// `acme` served `keys`, then parked: another org's request took the one active slot.
async fn parked_acme(w: &World, keys: &[&str]) -> Result<Org, BoxErr> {
    let acme = w.reg.acquire(&id("acme")?).await?;
    for key in keys {
        assert!(acme.once(key, effect("acme", key)).await?.applied);
    }
    assert!(!acme.is_parked());
    assert!(
        w.reg
            .once(&id("other")?, "x", effect("other", "x"))
            .await?
            .applied
    );
    assert!(
        acme.is_parked(),
        "acme parks when another org needs the slot"
    );
    assert_eq!(w.reg.active_orgs(), 1);
    assert_eq!(acme.stats().parks, 1);
    Ok(acme)
}

fn acme_db(data: &Path) -> Result<PathBuf, BoxErr> {
    common::outside::served_db(data)
}

/// The parked org's next request is refused as poisoned (nothing answered from the file),
/// and a re-acquire claims a new round and serves the store's state: every key in `keys`
/// replays its first result, and the outsider's row is not there.
async fn refused_then_store_state(w: &World, parked: &Org, keys: &[&str]) -> R {
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
    // Nothing more is answered from that handle.
    assert!(parked.once(keys[0], effect("acme", keys[0])).await.is_err());

    let again = w.reg.acquire(&id("acme")?).await?;
    assert!(again.round() > parked.round(), "a new claim");
    for key in keys {
        let out = again.once(key, effect("acme", "ran-again")).await?;
        assert!(!out.applied, "{key} replays from the store's state");
        assert_eq!(out.result, key.as_bytes());
    }
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
    let acked: Vec<String> = keys.iter().map(|k| (*k).to_owned()).collect();
    w.reg.shutdown().await;
    common::oracle::exactly_once(&w.replica, "acme", &acked, &["outsider"], w.dir.path()).await
}

/// A parked org's first request reopens it without a store request beyond the replay's
/// own confirmation, and it serves on as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_org_serves_its_next_request_from_its_own_file() -> R {
    let w = world(1).await?;
    let acme = parked_acme(&w, &["k1", "k2"]).await?;
    let before = w.replica.store_requests();
    let out = acme.once("k1", effect("acme", "ran-again")).await?;
    let after = w.replica.store_requests();
    assert!(!out.applied);
    assert_eq!(out.result, b"k1");
    assert!(!acme.is_parked());
    assert_eq!(acme.stats().unparks, 1);
    // The replay's confirmation is one LIST; the unpark adds nothing (no claim, no GET).
    assert_eq!(after.get, before.get, "{before:?} -> {after:?}");
    assert_eq!(after.list, before.list + 1, "{before:?} -> {after:?}");
    // A new key after the unpark ships as a delta on the same chain.
    let ships = acme.stats().full_ships;
    assert!(acme.once("k3", effect("acme", "k3")).await?.applied);
    assert_eq!(
        acme.stats().full_ships,
        ships,
        "the chain goes on with a delta"
    );
    // And `other` was parked to make room.
    assert_eq!(w.reg.active_orgs(), 1);
    w.reg.shutdown().await;
    let acked = ["k1", "k2", "k3"].map(String::from);
    common::oracle::exactly_once(&w.replica, "acme", &acked, &[], w.dir.path()).await
}

/// Regression guard: a process writing a parked org's database (it holds no lock while
/// parked) must not have its write served or shipped under the org's round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_file_written_from_outside_is_never_served() -> R {
    let w = world(1).await?;
    let acme = parked_acme(&w, &["k1", "k2"]).await?;
    let db = acme_db(&w.dir.path().join("data"))?;
    let lines = outside("write", &db, 1)?;
    assert_eq!(
        lines,
        vec!["ok 1".to_owned()],
        "nothing locks a parked file"
    );
    refused_then_store_state(&w, &acme, &["k1", "k2"]).await
}

/// An outsider that committed into the WAL and died leaves the database file untouched:
/// the file's pages alone would pass the check, so a WAL with frames refuses the unpark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wal_left_beside_a_parked_file_is_never_served() -> R {
    let w = world(1).await?;
    let acme = parked_acme(&w, &["k1"]).await?;
    let db = acme_db(&w.dir.path().join("data"))?;
    let lines = outside("write-and-die", &db, 1)?;
    assert_eq!(lines, vec!["ok 1".to_owned()]);
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    assert!(std::fs::metadata(PathBuf::from(wal))?.len() > 0);
    refused_then_store_state(&w, &acme, &["k1"]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_parked_file_is_never_recreated_empty() -> R {
    let w = world(1).await?;
    let acme = parked_acme(&w, &["k1", "k2"]).await?;
    let db = acme_db(&w.dir.path().join("data"))?;
    std::fs::remove_file(&db)?;
    refused_then_store_state(&w, &acme, &["k1", "k2"]).await
}

/// An older copy moved over the parked file (an operator's "restore"): another inode with
/// the state before `k2`, which a served request would answer as never applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_file_replaced_by_an_older_copy_is_never_served() -> R {
    let w = world(1).await?;
    let acme = w.reg.acquire(&id("acme")?).await?;
    assert!(acme.once("k1", effect("acme", "k1")).await?.applied);
    // Park once to get a closed file holding k1, and keep a copy of it.
    common::parked::park_through(&w.reg, &acme, &id("other")?).await?;
    let db = acme_db(&w.dir.path().join("data"))?;
    let old = w.dir.path().join("old-copy.db");
    std::fs::copy(&db, &old)?;
    // k2 on the same claim, then park again.
    assert!(acme.once("k2", effect("acme", "k2")).await?.applied);
    common::parked::park_through(&w.reg, &acme, &id("other")?).await?;
    std::fs::rename(&old, &db)?;
    refused_then_store_state(&w, &acme, &["k1", "k2"]).await
}

/// Same bytes written back in place (a backup tool that rewrites identical content): the
/// file is still the tip, so the org serves on. The check is of content, not of inodes or
/// times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_file_rewritten_with_its_own_bytes_still_serves() -> R {
    let w = world(1).await?;
    let acme = parked_acme(&w, &["k1"]).await?;
    let db = acme_db(&w.dir.path().join("data"))?;
    let bytes = std::fs::read(&db)?;
    std::fs::write(&db, &bytes)?;
    let out = acme.once("k1", effect("acme", "ran-again")).await?;
    assert!(!out.applied);
    assert!(acme.once("k2", effect("acme", "k2")).await?.applied);
    w.reg.shutdown().await;
    let acked = ["k1", "k2"].map(String::from);
    common::oracle::exactly_once(&w.replica, "acme", &acked, &[], w.dir.path()).await
}

/// Many clients on more orgs than may be active: every request's org is parked and
/// unparked over and over while others are in flight. Every acknowledged key is applied
/// exactly once, replays return the first result, and a successor sees them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn park_and_unpark_under_concurrent_requests_keep_exactly_once() -> R {
    const ORGS: usize = 6;
    const CLIENTS: usize = 8;
    const PER_CLIENT: usize = 25;
    let w = world(2).await?;
    let reg = w.reg.clone();
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let reg = reg.clone();
        tasks.push(tokio::spawn(async move {
            let mut acked: Vec<(usize, String)> = Vec::new();
            for i in 0..PER_CLIENT {
                // Deterministic spread: each client walks the orgs at its own stride.
                let org = (c * 7 + i * (c + 1)) % ORGS;
                let name = format!("org-{org}");
                let key = format!("k-{c}-{i}");
                let org_id = OrgId::new(&name)?;
                let mut done = false;
                for _ in 0..50 {
                    match reg.once(&org_id, &key, effect(&name, &key)).await {
                        Ok(out) => {
                            assert_eq!(out.result, key.as_bytes());
                            done = true;
                            break;
                        }
                        Err(e) if matches!(e.kind(), ErrorKind::Retry | ErrorKind::Reacquire) => {
                            tokio::task::yield_now().await;
                        }
                        Err(e) => return Err(Box::new(e) as BoxErr),
                    }
                }
                assert!(done, "{key} on {name} never acknowledged");
                acked.push((org, key.clone()));
                // Every third key is replayed at once, possibly on a parked org.
                if i % 3 == 0 {
                    let out = reg.once(&org_id, &key, effect(&name, "ran-again")).await?;
                    assert!(!out.applied, "{key} replays");
                    assert_eq!(out.result, key.as_bytes());
                }
            }
            Ok::<_, BoxErr>(acked)
        }));
    }
    let mut by_org: Vec<Vec<String>> = vec![Vec::new(); ORGS];
    for t in tasks {
        for (org, key) in t.await?? {
            by_org[org].push(key);
        }
    }
    let (parks, unparks) = reg
        .open_orgs()
        .iter()
        .map(|o| (o.stats().parks, o.stats().unparks))
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    assert!(parks > 0 && unparks > 0, "{parks} parks, {unparks} unparks");
    assert!(reg.active_orgs() <= 2 + CLIENTS, "{}", reg.active_orgs());
    reg.shutdown().await;
    for (org, keys) in by_org.iter().enumerate() {
        common::oracle::exactly_once(&w.replica, &format!("org-{org}"), keys, &[], w.dir.path())
            .await?;
    }
    Ok(())
}

/// An application hook that writes at every open (here: a row per open) writes into the
/// WAL of each unpark, outside any request's commit. Those pages must ship before the org
/// parks again: folded into the file by the park's checkpoint unshipped, the next unpark
/// would find the file differing from the chain's tip and poison a healthy org.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hook_that_writes_at_every_open_ships_before_the_org_parks_again() -> R {
    let dir = tempfile::tempdir()?;
    let store = Replica::local_store(&dir.path().join("store"))?;
    let replica = replica(store, None).await?;
    let reg = Registry::builder(dir.path().join("data"), replica.clone(), "w")
        .settings(RegistrySettings {
            max_active_orgs: 1,
            ..RegistrySettings::default()
        })
        .on_open(common::parked::writing_hook)
        .build()?;
    let (acme, other) = (id("acme")?, id("other")?);
    let mut acked = Vec::new();
    for round in 0..3 {
        let key = format!("k{round}");
        assert!(reg.once(&acme, &key, effect("acme", &key)).await?.applied);
        acked.push(key);
        // Parks acme (other takes the slot), then other parks as acme comes back.
        let handle = reg.acquire(&acme).await?;
        common::parked::park_through(&reg, &handle, &other).await?;
    }
    let handle = reg.acquire(&acme).await?;
    assert_eq!(handle.stats().parks, 3);
    assert_eq!(handle.stats().unparks, 2);
    let opens: i64 = handle
        .read(|c| c.query_row("SELECT count(*) FROM opens", [], |r| r.get(0)))
        .await?;
    // The first open and one per unpark (this read's included).
    assert_eq!(opens, 4);
    reg.shutdown().await;
    common::oracle::exactly_once(&replica, "acme", &acked, &[], dir.path()).await
}

/// A parked org released (a shutdown, an eviction) keeps its closed file for the next
/// acquire on this host, like an active one: the park left exactly the chain's tip in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_parked_org_keeps_its_file_for_reuse() -> R {
    let w = world(1).await?;
    let acme = parked_acme(&w, &["k1"]).await?;
    acme.release().await?;
    let dir = w.dir.path().join("data").join("orgs").join("acme");
    let kept = std::fs::read_dir(&dir)?
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "cache"))
        .count();
    assert_eq!(kept, 1, "a resume record beside the kept file");
    let again = w.reg.acquire(&id("acme")?).await?;
    assert!(!again.once("k1", effect("acme", "ran-again")).await?.applied);
    // Reused, not downloaded: the claim's first ship continues the chain with a delta.
    assert!(again.once("k2", effect("acme", "k2")).await?.applied);
    assert_eq!(again.stats().full_ships, 0);
    w.reg.shutdown().await;
    let acked = ["k1", "k2"].map(String::from);
    common::oracle::exactly_once(&w.replica, "acme", &acked, &[], w.dir.path()).await
}

/// A park never waits for a pool worker still running one of the org's jobs: here a read
/// whose caller has gone (its future dropped, so the org counts as idle). Waiting would hold
/// another org's request, whose acquire parks the victim, behind that job for as long as it
/// runs. The park is skipped and the org stays active past the limit; once the worker has
/// let go, a later acquire parks it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_park_never_waits_for_a_worker_running_an_abandoned_job() -> R {
    let dir = tempfile::tempdir()?;
    let store = Replica::local_store(&dir.path().join("store"))?;
    let replica = replica(store, None).await?;
    let settings = RegistrySettings {
        max_active_orgs: 1,
        writer_threads: 2,
        ..RegistrySettings::default()
    };
    let reg = registry(&dir.path().join("data"), replica.clone(), "w", settings)?;
    let acme = reg.acquire(&id("acme")?).await?;
    assert!(acme.once("k1", effect("acme", "k1")).await?.applied);

    let (started_tx, started_rx) = std::sync::mpsc::channel::<()>();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let reader = acme.clone();
    let read = tokio::spawn(async move {
        reader
            .read(move |_| {
                let _ = started_tx.send(());
                let _ = go_rx.recv();
                Ok(())
            })
            .await
    });
    tokio::task::spawn_blocking(move || started_rx.recv()).await??;
    // The caller gives up: the org is idle, but a worker still runs its read.
    read.abort();
    assert!(read.await.is_err_and(|e| e.is_cancelled()));

    // Another org's first request is answered while that read still runs (bounded, so a
    // park that waited for the read fails here instead of hanging).
    let other_id = id("other")?;
    let other = reg.once(&other_id, "x", effect("other", "x"));
    let out = tokio::time::timeout(std::time::Duration::from_secs(20), other).await??;
    assert!(out.applied);
    assert!(
        !acme.is_parked(),
        "no park while the worker runs acme's read"
    );
    assert_eq!(reg.active_orgs(), 2, "past the limit until a later acquire");

    go_tx.send(())?;
    // Once the worker has let go, the next acquires park acme (a wait for a state).
    let mut n = 0;
    while !acme.is_parked() {
        n += 1;
        assert!(n <= 200, "acme never parked");
        let org = id(&format!("org{n}"))?;
        assert!(
            reg.once(&org, "x", effect(org.as_str(), "x"))
                .await?
                .applied
        );
    }
    assert_eq!(acme.stats().parks, 1);
    let out = acme.once("k1", effect("acme", "ran-again")).await?;
    assert!(!out.applied);
    reg.shutdown().await;
    common::oracle::exactly_once(&replica, "acme", &["k1".to_owned()], &[], dir.path()).await
}
