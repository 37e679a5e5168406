//! Attacks on the org layer on the journal (`docs/design.md` 3g, "The org layer on the
//! journal"): a zombie whose run another process adopted, a failed batch PUT (J3) while orgs
//! keep acknowledging, orgs evicted and taken again in one run, shutdown with requests in
//! flight, two journal processes racing for one free org, a per-org registry beside a
//! journal one, the journal restarted after its run was fenced, outside processes on a
//! journal org's file (I13), and kill -9 of a child process on the journal mid-load. Each
//! ends in an exactly-once check: every acknowledged key in the store once, and a journal
//! successor replays it without running `apply` again.

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use common::journal::{LEASE_MS, in_store, org, replays, retry, slow_store};
use common::{BoxErr, R, effect, registry, replica_with_lease};
use futures::StreamExt;
use idem_org::{ErrorKind, Registry, RegistrySettings};
use idem_replica::fault::{Fault, FaultStore, Op};
use idem_replica::latency::{LatencyStore, Shapes};
use idem_replica::{OrgId, Replica, SystemClock};
use object_store::ObjectStore;
use object_store::memory::InMemory;

fn journal() -> RegistrySettings {
    common::journal::settings(16 << 10)
}

async fn faulty_replica(store: Arc<dyn ObjectStore>) -> Result<(Replica, Arc<FaultStore>), BoxErr> {
    let faults = Arc::new(FaultStore::new(store));
    let settings = idem_replica::Settings {
        lease_ms: LEASE_MS,
        ..idem_replica::Settings::default()
    };
    let replica =
        Replica::open_with(faults.clone(), "t", settings, Arc::new(SystemClock), None).await?;
    Ok((replica, faults))
}

/// A first run of `key` in `o` on `reg` (retried while retryable): must apply.
async fn first(reg: &Registry, o: &OrgId, key: &str) -> R {
    let out = retry(|| reg.once(o, key, effect(o.as_str(), key))).await?;
    assert!(out.applied, "{o} {key}: a first run did not apply");
    assert_eq!(out.result, key.as_bytes());
    Ok(())
}

/// A fresh journal successor on `store` replays every acknowledged key of every org (after
/// judging whatever process held them), then shuts down; the store holds each once.
async fn successor_checks(
    store: Arc<dyn ObjectStore>,
    dir: &std::path::Path,
    name: &str,
    acked: &[(OrgId, Vec<String>)],
) -> R {
    let rs = replica_with_lease(store, LEASE_MS).await?;
    let s = registry(&dir.join(name), rs.clone(), name, journal())?;
    for (o, keys) in acked {
        replays(&s, o, keys).await?;
    }
    let results = s.shutdown().await;
    assert!(results.iter().all(|(_, r)| r.is_ok()), "{results:?}");
    for (o, keys) in acked {
        in_store(&rs, dir, o, keys, &[]).await?;
    }
    Ok(())
}

/// A zombie: A's process lease stops reaching the store (a paused process), B adopts A's
/// run (K2) and serves. A, still running, must acknowledge nothing more: no first run, no
/// replay, in the org B took or in any other org of its run (one adopt seal fences them
/// all, I7); A's next acquire restarts its journal and is refused while B lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombie_whose_run_was_adopted_acknowledges_nothing() -> R {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let (ra, faults) = faulty_replica(store.clone()).await?;
    let a = registry(&dir.path().join("a"), ra.clone(), "wa", journal())?;
    let (o0, o1) = (org(0), org(1));
    let mut acked0 = Vec::new();
    let mut acked1 = Vec::new();
    for i in 0..4 {
        let k = format!("k{i}");
        first(&a, &o0, &k).await?;
        first(&a, &o1, &k).await?;
        acked0.push(k.clone());
        acked1.push(k);
    }
    // A pauses: its renewals fail before they reach the store.
    faults.inject_times(Op::Put, "processes/", 1, u64::MAX, Fault::FailBefore);
    let rb = replica_with_lease(store.clone(), LEASE_MS).await?;
    let b = registry(&dir.path().join("b"), rb.clone(), "wb", journal())?;
    replays(&b, &o0, &acked0[..1]).await?;
    first(&b, &o0, "b0").await?;
    acked0.push("b0".into());
    // A, the zombie: every answer is an error, never Ok.
    let mut forbidden = Vec::new();
    for (o, key) in [
        (&o0, "k0"),
        (&o0, "z0"),
        (&o1, "k1"),
        (&o1, "z1"),
        (&o0, "k2"),
    ] {
        for _ in 0..2 {
            let out = a.once(o, key, effect(o.as_str(), key)).await;
            assert!(out.is_err(), "zombie A answered {o} {key}: {out:?}");
        }
        if key.starts_with('z') {
            forbidden.push(key);
        }
    }
    // B goes on with both orgs (o1 came with the one adopt seal).
    replays(&b, &o1, &acked1).await?;
    first(&b, &o1, "b1").await?;
    acked1.push("b1".into());
    let results = b.shutdown().await;
    assert!(results.iter().all(|(_, r)| r.is_ok()), "{results:?}");
    in_store(&rb, dir.path(), &o0, &acked0, &forbidden).await?;
    in_store(&rb, dir.path(), &o1, &acked1, &forbidden).await?;
    drop(a);
    successor_checks(store, dir.path(), "c", &[(o0, acked0), (o1, acked1)]).await
}

/// After its run was fenced, A (its lease reaching the store again) restarts its journal
/// in the next run: a fresh org is served there, the orgs B holds are refused, and after
/// A's graceful shutdown and B's every key replays on a successor exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_journal_restarts_after_its_run_was_fenced() -> R {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let (ra, faults) = faulty_replica(store.clone()).await?;
    let a = registry(&dir.path().join("a"), ra.clone(), "wa", journal())?;
    let (o0, fresh) = (org(0), org(7));
    let mut acked0 = vec!["k0".to_owned(), "k1".to_owned()];
    for k in &acked0 {
        first(&a, &o0, k).await?;
    }
    faults.inject_times(Op::Put, "processes/", 1, u64::MAX, Fault::FailBefore);
    let rb = replica_with_lease(store.clone(), LEASE_MS).await?;
    let b = registry(&dir.path().join("b"), rb.clone(), "wb", journal())?;
    replays(&b, &o0, &acked0).await?;
    // A learns it was fenced.
    let out = a.once(&o0, "z0", effect("org0", "z0")).await;
    assert!(out.is_err(), "zombie A answered: {out:?}");
    // A runs again: its lease reaches the store.
    faults.clear();
    let mut acked_fresh = Vec::new();
    for i in 0..5 {
        let k = format!("f{i}");
        first(&a, &fresh, &k).await?;
        acked_fresh.push(k);
    }
    // The org B holds stays B's.
    for _ in 0..3 {
        let out = a.once(&o0, "z1", effect("org0", "z1")).await;
        assert!(out.is_err(), "A took org0 from live B: {out:?}");
    }
    first(&b, &o0, "b0").await?;
    acked0.push("b0".into());
    let results = a.shutdown().await;
    assert!(results.iter().all(|(_, r)| r.is_ok()), "A: {results:?}");
    let results = b.shutdown().await;
    assert!(results.iter().all(|(_, r)| r.is_ok()), "B: {results:?}");
    in_store(&rb, dir.path(), &o0, &acked0, &["z0", "z1"]).await?;
    successor_checks(
        store,
        dir.path(),
        "c",
        &[(o0, acked0), (fresh, acked_fresh)],
    )
    .await
}

/// J3 in the registry: batch PUTs fail (before, and after landing: an unknown outcome)
/// while four orgs keep committing; the run self-seals and goes on in its continued run.
/// Every request answered Ok is in the store once; after a crash a successor adopts the
/// continued run and replays everything; a second writer then releases gracefully and a
/// third replays again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_batch_puts_self_seal_and_lose_no_acknowledged_key() -> R {
    const ORGS: usize = 4;
    let dir = tempfile::tempdir()?;
    let store = slow_store(Duration::from_millis(3), 7);
    let (ra, faults) = faulty_replica(store.clone()).await?;
    let a = registry(&dir.path().join("a"), ra.clone(), "wa", journal())?;
    let mut acked: Vec<(OrgId, Vec<String>)> = (0..ORGS).map(|i| (org(i), Vec::new())).collect();
    let mut faults_at = [
        (5, Fault::FailBefore),
        (12, Fault::FailAfter),
        (20, Fault::FailAfter),
    ]
    .into_iter()
    .peekable();
    for r in 0..30 {
        if let Some((at, fault)) = faults_at.peek().copied()
            && at == r
        {
            faults.inject(Op::Put, ".jnl", 1, fault);
            faults_at.next();
        }
        let outs: Vec<_> = futures::stream::iter(0..ORGS)
            .map(|i| {
                let a = &a;
                async move {
                    let (o, key) = (org(i), format!("k{r}"));
                    let out = a.once(&o, &key, effect(o.as_str(), &key)).await;
                    (i, key, out)
                }
            })
            .buffer_unordered(ORGS)
            .collect()
            .await;
        for (i, key, out) in outs {
            match out {
                Ok(o) => {
                    assert_eq!(o.result, key.as_bytes());
                    acked[i].1.push(key);
                }
                Err(e) => assert!(
                    matches!(e.kind(), ErrorKind::Retry | ErrorKind::Reacquire),
                    "org{i} {key}: {e:?}"
                ),
            }
        }
    }
    let sealed = ra.store_requests();
    eprintln!("{sealed:?}");
    assert!(
        acked.iter().all(|(_, k)| k.len() >= 20),
        "too few acknowledgements: {acked:?}"
    );
    // A crash: B adopts the continued run.
    drop(a);
    drop(ra);
    drop(faults);
    let rb = replica_with_lease(store.clone(), LEASE_MS).await?;
    let b = registry(&dir.path().join("b"), rb.clone(), "wb", journal())?;
    for (o, keys) in &acked {
        replays(&b, o, keys).await?;
    }
    for (o, keys) in &mut acked {
        first(&b, o, "after").await?;
        keys.push("after".into());
    }
    let results = b.shutdown().await;
    assert!(results.iter().all(|(_, r)| r.is_ok()), "{results:?}");
    successor_checks(store, dir.path(), "c", &acked).await
}

/// A failed batch PUT, then a graceful shutdown of the self-sealed run: the release seal
/// goes in the continued run, and a successor finds every org free and replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_self_sealed_run_shuts_down_and_a_successor_replays() -> R {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let (ra, faults) = faulty_replica(store.clone()).await?;
    let a = registry(&dir.path().join("a"), ra.clone(), "wa", journal())?;
    let (o0, o1) = (org(0), org(1));
    let mut acked = vec![(o0.clone(), Vec::new()), (o1.clone(), Vec::new())];
    for r in 0..6 {
        if r == 3 {
            faults.inject(Op::Put, ".jnl", 1, Fault::FailAfter);
        }
        for (o, keys) in &mut acked {
            let key = format!("k{r}");
            match a.once(o, &key, effect(o.as_str(), &key)).await {
                Ok(_) => keys.push(key),
                Err(e) => assert!(e.is_retryable(), "{o} {key}: {e:?}"),
            }
        }
    }
    let results = a.shutdown().await;
    assert!(results.iter().all(|(_, r)| r.is_ok()), "{results:?}");
    successor_checks(store, dir.path(), "b", &acked).await
}

/// Orgs evicted by `max_open_orgs` (J4 release) and taken again in the same run (K1b after
/// their Release entry), round and round, while a crash at the end leaves the run to a
/// successor's adopt seal: every acknowledged key replays once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicted_orgs_come_back_in_the_same_run() -> R {
    const ORGS: usize = 5;
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let ra = replica_with_lease(store.clone(), LEASE_MS).await?;
    let mut settings = journal();
    settings.max_open_orgs = 2;
    settings.journal.section_bytes = 8 << 10;
    let a = registry(&dir.path().join("a"), ra.clone(), "wa", settings)?;
    let mut acked: Vec<(OrgId, Vec<String>)> = (0..ORGS).map(|i| (org(i), Vec::new())).collect();
    for r in 0..6 {
        for (o, keys) in &mut acked {
            let key = format!("k{r}");
            first(&a, o, &key).await?;
            keys.push(key);
            // A replay right after: the org may just have been evicted.
            replays(&a, o, &keys[keys.len() - 1..]).await?;
        }
    }
    // Some orgs concurrently: evictions race acquires of the same orgs.
    let outs: Vec<_> = futures::stream::iter(0..ORGS * 3)
        .map(|i| {
            let a = &a;
            async move {
                let o = org(i % ORGS);
                let key = format!("c{i}");
                // An org closed twice under the churn is a Reacquire: taken again.
                let waited = idem_base::Stopwatch::start();
                let out = loop {
                    match a.once(&o, &key, effect(o.as_str(), &key)).await {
                        Err(e)
                            if matches!(e.kind(), ErrorKind::Retry | ErrorKind::Reacquire)
                                && waited.elapsed() < Duration::from_secs(15) => {}
                        other => break other,
                    }
                };
                (i % ORGS, key, out)
            }
        })
        .buffer_unordered(ORGS * 3)
        .collect()
        .await;
    for (i, key, out) in outs {
        assert_eq!(out?.result, key.as_bytes());
        acked[i].1.push(key);
    }
    drop(a);
    drop(ra);
    successor_checks(store, dir.path(), "b", &acked).await
}

/// Shutdown with many requests in flight on a latency-shaped store: whatever was answered
/// Ok is in the store once and replays on a successor; nothing answered with an error ran
/// twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_requests_in_flight_loses_nothing_acknowledged() -> R {
    const ORGS: usize = 6;
    let dir = tempfile::tempdir()?;
    let store = slow_store(Duration::from_millis(10), 3);
    let ra = replica_with_lease(store.clone(), LEASE_MS).await?;
    let a = registry(&dir.path().join("a"), ra.clone(), "wa", journal())?;
    for i in 0..ORGS {
        first(&a, &org(i), "warm").await?;
    }
    let acks = Arc::new(std::sync::Mutex::new(Vec::<(usize, String)>::new()));
    let mut clients = Vec::new();
    for c in 0..ORGS * 2 {
        let (a, acks) = (a.clone(), acks.clone());
        clients.push(tokio::spawn(async move {
            for n in 0.. {
                let (i, key) = (c % ORGS, format!("c{c}-{n}"));
                match a
                    .once(&org(i), &key, effect(&format!("org{i}"), &key))
                    .await
                {
                    Ok(out) => {
                        assert!(out.applied);
                        idem_base::lock(&acks).push((i, key));
                    }
                    Err(_) => return,
                }
            }
        }));
    }
    common::until(|| idem_base::lock(&acks).len() >= 40).await?;
    let results = a.shutdown().await;
    assert!(results.iter().all(|(_, r)| r.is_ok()), "{results:?}");
    for c in clients {
        c.await?;
    }
    let mut acked: Vec<(OrgId, Vec<String>)> = (0..ORGS)
        .map(|i| (org(i), vec!["warm".to_owned()]))
        .collect();
    for (i, key) in idem_base::lock(&acks).drain(..) {
        acked[i].1.push(key);
    }
    successor_checks(store, dir.path(), "b", &acked).await
}

/// Two journal processes race for one free org, again and again: exactly one serves it
/// (the other is refused while the winner lives), and what the winner acknowledged
/// replays on the loser once the winner shut down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_journal_processes_race_for_a_free_org() -> R {
    let dir = tempfile::tempdir()?;
    let store = slow_store(Duration::from_millis(2), 5);
    let ra = replica_with_lease(store.clone(), LEASE_MS).await?;
    let rb = replica_with_lease(store.clone(), LEASE_MS).await?;
    let a = registry(&dir.path().join("a"), ra.clone(), "wa", journal())?;
    let b = registry(&dir.path().join("b"), rb.clone(), "wb", journal())?;
    let mut all = Vec::new();
    for i in 0..8 {
        let o = org(i);
        let (ka, kb) = (format!("a{i}"), format!("b{i}"));
        let (out_a, out_b) = tokio::join!(
            a.once(&o, &ka, effect(o.as_str(), &ka)),
            b.once(&o, &kb, effect(o.as_str(), &kb)),
        );
        let won = [out_a.is_ok(), out_b.is_ok()];
        assert!(
            won != [true, true],
            "{o}: both processes served one org: {out_a:?} {out_b:?}"
        );
        let mut keys = Vec::new();
        if out_a.is_ok() {
            keys.push(ka);
        }
        if out_b.is_ok() {
            keys.push(kb);
        }
        for e in [&out_a, &out_b]
            .into_iter()
            .filter_map(|r| r.as_ref().err())
        {
            assert_eq!(e.kind(), ErrorKind::Retry, "{o}: {e:?}");
        }
        all.push((o, keys));
    }
    let ra_results = a.shutdown().await;
    assert!(ra_results.iter().all(|(_, r)| r.is_ok()), "{ra_results:?}");
    // B now takes every org (A's were released) and replays.
    for (o, keys) in &all {
        replays(&b, o, keys).await?;
    }
    let results = b.shutdown().await;
    assert!(results.iter().all(|(_, r)| r.is_ok()), "{results:?}");
    successor_checks(store, dir.path(), "c", &all).await
}

/// A per-org registry beside a journal one on the same store: while the journal process
/// serves an org, the per-org registry is refused and writes nothing into the org's log
/// (the journal writer's J5 checkpoints and Release entry still land), and an org the
/// per-org registry holds is refused to the journal process while its holder lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_org_registry_beside_a_journal_one() -> R {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let rj = replica_with_lease(store.clone(), LEASE_MS).await?;
    let mut settings = journal();
    settings.journal.section_bytes = 4 << 10;
    let j = registry(&dir.path().join("j"), rj.clone(), "wj", settings)?;
    let rp = replica_with_lease(store.clone(), LEASE_MS).await?;
    let p = registry(
        &dir.path().join("p"),
        rp.clone(),
        "wp",
        RegistrySettings::default(),
    )?;
    let (jo, po) = (org(0), org(1));
    first(&j, &jo, "j0").await?;
    first(&p, &po, "p0").await?;
    let mut jkeys = vec!["j0".to_owned()];
    for i in 1..12 {
        // The per-org registry tries the journal org between the journal's ships.
        let out = p.once(&jo, "px", effect("org0", "px")).await;
        assert!(
            out.is_err(),
            "a per-org registry served a journal org: {out:?}"
        );
        let k = format!("j{i}");
        first(&j, &jo, &k).await?;
        jkeys.push(k);
    }
    let out = j.once(&po, "jx", effect("org1", "jx")).await;
    assert!(
        out.is_err(),
        "the journal took a live per-org holder's org: {out:?}"
    );
    let results = j.shutdown().await;
    assert!(results.iter().all(|(_, r)| r.is_ok()), "{results:?}");
    let results = p.shutdown().await;
    assert!(results.iter().all(|(_, r)| r.is_ok()), "{results:?}");
    in_store(&rj, dir.path(), &jo, &jkeys, &["px"]).await?;
    in_store(&rj, dir.path(), &po, &["p0".to_owned()], &["jx"]).await?;
    successor_checks(
        store,
        dir.path(),
        "c",
        &[(jo, jkeys), (po, vec!["p0".into()])],
    )
    .await
}

/// I13 on the journal: an outside process opening, writing, checkpointing or backing up a
/// journal org's file is refused, and the org goes on acknowledging exactly what it
/// committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outside_processes_cannot_touch_a_journal_orgs_file() -> R {
    if std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("no python3: skipped");
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let ra = replica_with_lease(store.clone(), LEASE_MS).await?;
    let data = dir.path().join("a");
    let a = registry(&data, ra.clone(), "wa", journal())?;
    let acme = OrgId::new("acme")?;
    let mut keys = Vec::new();
    for (i, action) in ["read", "write", "TRUNCATE", "backup", "write"]
        .into_iter()
        .enumerate()
    {
        let k = format!("k{i}");
        first(&a, &acme, &k).await?;
        keys.push(k);
        let db = common::outside::served_db(&data)?;
        let lines = common::outside::outside(action, &db, 2)?;
        common::outside::all_locked(action, &lines)?;
    }
    replays(&a, &acme, &keys).await?;
    let results = a.shutdown().await;
    assert!(results.iter().all(|(_, r)| r.is_ok()), "{results:?}");
    in_store(&ra, dir.path(), &acme, &keys, &["outsider"]).await?;
    successor_checks(store, dir.path(), "b", &[(acme, keys)]).await
}

const KILL_TEST: &str = "kill_9_of_a_journal_process_mid_load_loses_no_acknowledged_key";
const KILL_ORGS: usize = 4;

/// The child: a journal registry on a local-directory store with S3's latency, 8 clients
/// over 4 orgs writing until the process is killed, printing `ack <org> <key>`.
async fn kill_child(name: String) -> R {
    let store = std::env::var("IDEM_KILL_STORE")?;
    let data = std::env::var("IDEM_KILL_DATA")?;
    let local = Replica::local_store(store.as_ref())?;
    let seed = name.bytes().map(u64::from).sum();
    let store = Arc::new(LatencyStore::new(local, Shapes::s3(), seed));
    let settings = idem_replica::Settings {
        lease_ms: LEASE_MS,
        ..idem_replica::Settings::default()
    };
    let replica = Replica::open_with(store, "t", settings, Arc::new(SystemClock), None).await?;
    let mut rs = journal();
    rs.journal.section_bytes = 8 << 10;
    let reg = registry(data.as_ref(), replica, &name, rs)?;
    let mut clients = Vec::new();
    for c in 0..KILL_ORGS * 2 {
        let (reg, name) = (reg.clone(), name.clone());
        clients.push(tokio::spawn(async move {
            let o = org(c % KILL_ORGS);
            for i in 0.. {
                let key = format!("{name}-{c}-{i}");
                loop {
                    match reg.once(&o, &key, effect(o.as_str(), &key)).await {
                        Ok(_) => {
                            println!("ack {o} {key}");
                            break;
                        }
                        Err(e) if matches!(e.kind(), ErrorKind::Retry | ErrorKind::Reacquire) => {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        Err(e) => {
                            println!("error {o} {key}: {e}");
                            return;
                        }
                    }
                }
            }
        }));
    }
    for c in clients {
        c.await?;
    }
    Ok(())
}

fn run_kill_child(
    dir: &std::path::Path,
    name: &str,
    kill_after: usize,
) -> Result<Vec<(String, String)>, BoxErr> {
    let mut child = common::child_command(KILL_TEST, name)?
        .env("IDEM_KILL_STORE", dir.join("store"))
        .env("IDEM_KILL_DATA", dir.join(name))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let lines = BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
    let mut acked = Vec::new();
    for line in lines {
        let line = line?;
        if let Some(rest) = line.strip_prefix("ack ") {
            let (o, key) = rest.split_once(' ').ok_or("bad ack line")?;
            acked.push((o.to_owned(), key.to_owned()));
            if acked.len() >= kill_after {
                child.kill()?; // SIGKILL, batches in flight
                break;
            }
        } else if line.starts_with("error ") {
            let _ = child.kill();
            return Err(format!("{name}: {line}").into());
        }
    }
    let status = child.wait()?;
    assert!(!status.success(), "{name}: the child must die by SIGKILL");
    Ok(acked)
}

/// kill -9 of a journal process with batches in flight, three times: each successor adopts
/// the dead run (after its lease lapsed) and goes on; every key any of them acknowledged
/// is in the store once and replays on a final successor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_a_journal_process_mid_load_loses_no_acknowledged_key() -> R {
    if let Some(name) = common::child_role() {
        return kill_child(name).await;
    }
    let dir = tempfile::tempdir()?;
    std::fs::create_dir_all(dir.path().join("store"))?;
    let mut all: Vec<(OrgId, Vec<String>)> = (0..KILL_ORGS).map(|i| (org(i), Vec::new())).collect();
    for (i, kill_after) in [30, 47, 19].into_iter().enumerate() {
        let acked = run_kill_child(dir.path(), &format!("w{i}"), kill_after)?;
        assert_eq!(acked.len(), kill_after, "w{i} stopped acknowledging early");
        for (o, key) in acked {
            let at = all
                .iter_mut()
                .find(|(x, _)| x.as_str() == o)
                .ok_or("unknown org")?;
            at.1.push(key);
        }
    }
    let store = Replica::local_store(&dir.path().join("store"))?;
    let seen: BTreeSet<&String> = all.iter().flat_map(|(_, k)| k).collect();
    assert_eq!(seen.len(), 30 + 47 + 19, "a key acknowledged twice");
    successor_checks(store, dir.path(), "final", &all).await
}

/// A zombie whose batch PUT is held in flight while B adopts its run: B's adopt seal
/// takes the held slot, so the request riding that batch is never acknowledged by A, and
/// B's state (which does not hold it) is what every later request sees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombies_batch_in_flight_during_the_adoption_acknowledges_nothing() -> R {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let (ra, faults) = faulty_replica(store.clone()).await?;
    let a = registry(&dir.path().join("a"), ra.clone(), "wa", journal())?;
    let o0 = org(0);
    let mut acked = vec!["k0".to_owned(), "k1".to_owned()];
    for k in &acked {
        first(&a, &o0, k).await?;
    }
    faults.inject_times(Op::Put, "processes/", 1, u64::MAX, Fault::FailBefore);
    let held = faults.pause_next(Op::Put, ".jnl");
    let zombie = {
        let a = a.clone();
        tokio::spawn(async move { a.once(&org(0), "z", effect("org0", "z")).await })
    };
    held.reached.await?;
    let rb = replica_with_lease(store.clone(), LEASE_MS).await?;
    let b = registry(&dir.path().join("b"), rb.clone(), "wb", journal())?;
    replays(&b, &o0, &acked).await?;
    let _ = held.resume.send(());
    let out = zombie.await?;
    assert!(
        out.is_err(),
        "the zombie acknowledged z after the adoption: {out:?}"
    );
    // z was never acknowledged: B runs it now, once.
    first(&b, &o0, "z").await?;
    acked.push("z".into());
    let results = b.shutdown().await;
    assert!(results.iter().all(|(_, r)| r.is_ok()), "{results:?}");
    drop(a);
    successor_checks(store, dir.path(), "c", &[(o0, acked)]).await
}

/// J4 interrupted: the released checkpoint's or the Release entry's PUT fails (before the
/// store, or after it landed) during an org's release. The org is served again in the same
/// run (K4 over the stopped tenure, or K1b after a Release entry that did land), then the
/// process crashes: a successor adopts the run and every acknowledged key replays once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_interrupted_between_its_entries_loses_nothing() -> R {
    for (nth, fault) in [
        (1, Fault::FailBefore),
        (1, Fault::FailAfter),
        (2, Fault::FailBefore),
        (2, Fault::FailAfter),
    ] {
        let dir = tempfile::tempdir()?;
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let (ra, faults) = faulty_replica(store.clone()).await?;
        let mut settings = journal();
        settings.journal.section_bytes = u64::MAX;
        settings.journal.max_lag_batches = 0;
        let a = registry(&dir.path().join("a"), ra.clone(), "wa", settings)?;
        let o0 = org(0);
        let mut acked = Vec::new();
        for k in ["k0", "k1"] {
            first(&a, &o0, k).await?;
            acked.push(k.to_owned());
        }
        // Three in a row: a create retries an absent entry once (I9).
        faults.inject_times(Op::Put, "org0/log/", nth, 3, fault);
        let released = a.acquire(&o0).await?.release().await;
        eprintln!("{nth} {fault:?}: release {released:?}");
        replays(&a, &o0, &acked).await?;
        for k in ["k2", "k3"] {
            first(&a, &o0, k).await?;
            acked.push(k.to_owned());
        }
        replays(&a, &o0, &acked).await?;
        drop(a);
        drop(ra);
        drop(faults);
        successor_checks(store, dir.path(), "b", &[(o0, acked)]).await?;
    }
    Ok(())
}

/// The store refuses every journal PUT for a while (batches and the self-seal alike): a
/// request waiting for its batch gets a retryable error in bounded time, as a failed ship
/// gives one per org, instead of waiting for the store to come back; once it is back, the
/// org serves again, a shutdown completes, and a successor replays what was acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_gets_an_error_while_the_store_refuses_journal_puts() -> R {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let (ra, faults) = faulty_replica(store.clone()).await?;
    let a = registry(&dir.path().join("a"), ra.clone(), "wa", journal())?;
    let o0 = org(0);
    let mut acked = vec!["k0".to_owned()];
    first(&a, &o0, "k0").await?;
    faults.inject_times(Op::Put, ".jnl", 1, u64::MAX, Fault::FailBefore);
    let out = tokio::time::timeout(
        Duration::from_secs(10),
        a.once(&o0, "k1", effect("org0", "k1")),
    )
    .await
    .map_err(|_| "a request waited 10 s for a store that refuses every journal PUT")?;
    let e = out
        .err()
        .ok_or("acknowledged with every journal PUT refused")?;
    assert_eq!(e.kind(), ErrorKind::Retry, "{e:?}");
    faults.clear();
    // k1 committed locally and was not acknowledged: its retry replays once shipped.
    let out = retry(|| a.once(&o0, "k1", effect("org0", "k1"))).await?;
    assert_eq!(out.result, b"k1");
    acked.push("k1".into());
    first(&a, &o0, "k2").await?;
    acked.push("k2".into());
    let results = tokio::time::timeout(Duration::from_secs(15), a.shutdown())
        .await
        .map_err(|_| "shutdown hung")?;
    assert!(results.iter().all(|(_, r)| r.is_ok()), "{results:?}");
    successor_checks(store, dir.path(), "b", &[(o0, acked)]).await
}

/// The store refuses a dozen journal PUTs in a row (the batch and the first two tries of
/// the self-seal), then takes them again: the org serves on in the continued run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_continued_run_serves_after_a_self_seal_that_needed_retries() -> R {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let (ra, faults) = faulty_replica(store.clone()).await?;
    let a = registry(&dir.path().join("a"), ra.clone(), "wa", journal())?;
    let o0 = org(0);
    let mut acked = vec!["k0".to_owned()];
    first(&a, &o0, "k0").await?;
    faults.inject_times(Op::Put, ".jnl", 1, 12, Fault::FailBefore);
    for k in ["k1", "k2", "k3"] {
        let out = tokio::time::timeout(
            Duration::from_secs(10),
            retry(|| a.once(&o0, k, effect("org0", k))),
        )
        .await
        .map_err(|_| format!("{k} hung after the store came back"))??;
        assert_eq!(out.result, k.as_bytes());
        acked.push(k.to_owned());
    }
    let results = a.shutdown().await;
    assert!(results.iter().all(|(_, r)| r.is_ok()), "{results:?}");
    successor_checks(store, dir.path(), "b", &[(o0, acked)]).await
}
