//! The registry on the journal (`docs/design.md` 3g, "The org layer on the journal"): many
//! orgs' acknowledgements share one batch PUT (group commit across orgs), every
//! acknowledged key replays on a successor after a graceful shutdown (the release seal and
//! each org's Release entry free them, K1b) and after a crash (one adopt seal takes the dead
//! run's orgs, K2, then K4), replays are confirmed by a batch (J6), an org released per
//! org moves onto the journal, and a per-org registry refuses a journal org with a typed
//! error instead of claiming it; retention of the run deletes batches below every walk
//! entry and a successor still replays everything.

mod common;

use std::sync::Arc;

use std::time::Duration;

use common::journal::{LEASE_MS, in_store, keys, org, replays_within, slow_store};
use common::{R, effect, published, registry, replica_with_lease};
use futures::StreamExt;
use idem_org::{Registry, RegistrySettings};
use idem_replica::{OrgId, Replica};
use object_store::ObjectStore;
use object_store::memory::InMemory;

fn journal() -> RegistrySettings {
    // Each of these commits changes about four pages: orgs checkpoint (J5) every few
    // acknowledgements during the test.
    common::journal::settings(24 << 10)
}

/// Keys `k{from}..k{to}` in each of `orgs` orgs, one request in flight per org, all orgs
/// at once.
async fn load(reg: &Registry, orgs: usize, (from, to): (usize, usize)) -> R {
    for r in from..to {
        let results: Vec<_> = futures::stream::iter(0..orgs)
            .map(|i| async move {
                let o = org(i);
                let key = format!("k{r}");
                reg.once(&o, &key, effect(o.as_str(), &key)).await
            })
            .buffer_unordered(orgs)
            .collect()
            .await;
        for out in results {
            let out = out?;
            assert!(out.applied, "a first call did not apply");
        }
    }
    Ok(())
}

/// Every key of every org replays on `reg` (not applied again) with its first result, at
/// the first call (no retry); the orgs at once, each org's keys one after another.
async fn replays(reg: &Registry, orgs: usize, rounds: usize) -> R {
    let all = &keys(rounds);
    let results: Vec<R> = futures::stream::iter(0..orgs)
        .map(|i| async move { replays_within(Duration::ZERO, reg, &org(i), all).await })
        .buffer_unordered(orgs)
        .collect()
        .await;
    results.into_iter().collect()
}

/// What the store holds for `orgs` orgs: every key applied exactly once, and no other.
async fn exactly_once(replica: &Replica, dir: &std::path::Path, orgs: usize, rounds: usize) -> R {
    for i in 0..orgs {
        let effects = in_store(replica, dir, &org(i), &keys(rounds), &[]).await?;
        assert_eq!(effects.len(), rounds, "org{i}: {effects:?}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_share_batches_and_a_successor_replays_after_shutdown() -> R {
    const ORGS: usize = 24;
    const ROUNDS: usize = 6;
    let dir = tempfile::tempdir()?;
    // A store whose every request takes 20 ms, as S3's take tens: commits of other orgs
    // arrive while a batch is in flight, and the next batch takes them all.
    let store = slow_store(Duration::from_millis(20), 1);
    let ra = replica_with_lease(store.clone(), LEASE_MS).await?;
    let a = registry(&dir.path().join("a"), ra.clone(), "wa", journal())?;
    load(&a, ORGS, (0, 1)).await?;
    let before = ra.store_requests().put;
    load(&a, ORGS, (1, ROUNDS)).await?;
    let puts = ra.store_requests().put - before;
    let acks = (ORGS * (ROUNDS - 1)) as u64;
    // One PUT per ack per org on the per-org path; here batches are shared (lease
    // renewals and J5 checkpoints included in the count).
    eprintln!("{puts} PUTs for {acks} acknowledgements");
    assert!(
        puts * 2 < acks,
        "{puts} PUTs for {acks} acknowledgements: batches are not shared"
    );
    // Replays on A are confirmed by a batch (J6), never answered from the file alone.
    let confirm_from = ra.store_requests().put;
    replays(&a, 2, ROUNDS).await?;
    assert!(
        ra.store_requests().put > confirm_from,
        "replays confirmed without a batch"
    );
    // J4 for every org: nothing is unshipped, so the shutdown writes the process lease's
    // drain and one release seal, not a checkpoint and a Release entry per org.
    let shutdown_from = ra.store_requests().put;
    let results = a.shutdown().await;
    assert!(results.iter().all(|(_, r)| r.is_ok()), "{results:?}");
    let shutdown_puts = ra.store_requests().put - shutdown_from;
    assert!(
        shutdown_puts <= 3,
        "{shutdown_puts} PUTs to release {ORGS} orgs"
    );
    exactly_once(&ra, dir.path(), ORGS, ROUNDS).await?;

    let rb = replica_with_lease(store.clone(), LEASE_MS).await?;
    let b = registry(&dir.path().join("b"), rb.clone(), "wb", journal())?;
    replays(&b, ORGS, ROUNDS).await?;
    // B goes on writing each org, and a third process reads everything exactly once.
    for i in 0..ORGS {
        let o = org(i);
        assert!(
            b.once(&o, "after", effect(o.as_str(), "after"))
                .await?
                .applied
        );
    }
    b.shutdown().await;
    let rc = replica_with_lease(store, LEASE_MS).await?;
    for i in 0..ORGS {
        let (effects, keys) = published(&rc, &format!("org{i}"), dir.path()).await?;
        assert_eq!(keys, ROUNDS as i64 + 1, "org{i}: {effects:?}");
        assert_eq!(effects.get("after"), Some(&1), "org{i}: {effects:?}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_writers_orgs_are_adopted_by_one_seal() -> R {
    const ORGS: usize = 5;
    const ROUNDS: usize = 3;
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let ra = replica_with_lease(store.clone(), LEASE_MS).await?;
    let a = registry(&dir.path().join("a"), ra.clone(), "wa", journal())?;
    load(&a, ORGS, (0, ROUNDS)).await?;
    // A crash: no release, no seal; the process lease stops being renewed with the last
    // clone of A's replica.
    drop(a);
    drop(ra);
    let rb = replica_with_lease(store.clone(), LEASE_MS).await?;
    let b = registry(&dir.path().join("b"), rb.clone(), "wb", journal())?;
    // B is refused while A's lease may be live (I15), then takes the orgs.
    let o0 = org(0);
    let mut refused = 0;
    let first = loop {
        match b.once(&o0, "k0", effect("org0", "never")).await {
            Ok(out) => break out,
            Err(e) if e.kind() == idem_org::ErrorKind::Retry => {
                refused += 1;
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(e) => return Err(e.into()),
        }
    };
    assert!(refused > 0, "B claimed while A's lease was live");
    assert!(!first.applied);
    // K2.5: the adopted run's other orgs open in the background, before any request.
    common::until(|| (1..ORGS).all(|i| b.serving(&org(i)).is_some())).await?;
    let seals_before = rb.store_requests().put;
    replays(&b, ORGS, ROUNDS).await?;
    // The other orgs came with the one adopt seal: their acquires claimed nothing.
    let puts = rb.store_requests().put - seals_before;
    assert!(
        puts < (ORGS as u64) * 4 * 2,
        "{puts} PUTs to take {ORGS} adopted orgs"
    );
    b.shutdown().await;
    exactly_once(&rb, dir.path(), ORGS, ROUNDS).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_org_org_moves_onto_the_journal_and_per_org_registries_refuse_it() -> R {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let ra = replica_with_lease(store.clone(), LEASE_MS).await?;
    let a = registry(&dir.path().join("a"), ra, "wa", RegistrySettings::default())?;
    let o = org(0);
    assert!(a.once(&o, "k0", effect("org0", "k0")).await?.applied);
    a.shutdown().await;

    let rb = replica_with_lease(store.clone(), LEASE_MS).await?;
    let b = registry(&dir.path().join("b"), rb.clone(), "wb", journal())?;
    assert!(!b.once(&o, "k0", effect("org0", "never")).await?.applied);
    assert!(b.once(&o, "k1", effect("org0", "k1")).await?.applied);
    b.shutdown().await;

    let rc = replica_with_lease(store, LEASE_MS).await?;
    let c = registry(
        &dir.path().join("c"),
        rc.clone(),
        "wc",
        RegistrySettings::default(),
    )?;
    let refused = c.once(&o, "k2", effect("org0", "k2")).await;
    let e = refused.expect_err("a per-org registry claimed a journal org");
    assert!(
        e.to_string().contains("journal"),
        "not a typed journal refusal: {e}"
    );
    c.shutdown().await;
    exactly_once(&rc, dir.path(), 1, 2).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_batches_below_every_entry_and_a_successor_still_replays() -> R {
    const ORGS: usize = 3;
    const ROUNDS: usize = 40;
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let ra = replica_with_lease(store.clone(), LEASE_MS).await?;
    let mut settings = journal();
    // A checkpoint every ship or two, retention every 8 batches of anything old at all.
    settings.journal.section_bytes = 8 << 10;
    settings.journal.retain_every_batches = 8;
    settings.retention.keep_ms = 0;
    let a = registry(&dir.path().join("a"), ra.clone(), "wa", settings)?;
    load(&a, ORGS, (0, ROUNDS)).await?;
    // Retention runs in the background: wait until the run's first slots are gone and the
    // pass is over (a listing in the middle of its deletes sees only some of them gone).
    let lowest = || async {
        let mut slots = Vec::new();
        let mut listed = store.list(Some(&object_store::path::Path::from("t/journals")));
        while let Some(meta) = listed.next().await {
            let name = meta?.location.filename().unwrap_or_default().to_owned();
            if let Some(slot) = name
                .strip_suffix(".jnl")
                .and_then(|s| s.parse::<u64>().ok())
            {
                slots.push(slot);
            }
        }
        Ok::<_, common::BoxErr>((slots.iter().min().copied(), slots.len()))
    };
    let waited = idem_base::Stopwatch::start();
    loop {
        let (min, count) = lowest().await?;
        if min.is_some_and(|m| m > 1) && count < ORGS * ROUNDS {
            break;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(20),
            "retention did not bring the run under one object per ack: lowest slot {min:?} \
             of {count} kept"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.shutdown().await;
    let rb = replica_with_lease(store, LEASE_MS).await?;
    let b = registry(&dir.path().join("b"), rb.clone(), "wb", journal())?;
    replays(&b, ORGS, ROUNDS).await?;
    b.shutdown().await;
    exactly_once(&rb, dir.path(), ORGS, ROUNDS).await
}

/// J7: with a lag of 8 batches, a busy org whose sections never reach the byte budget is
/// checkpointed by its lag, and an idle org is released (its log ends in a Release entry)
/// and served again, replaying, at its next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_org_is_checkpointed_when_busy_and_released_when_idle() -> R {
    use idem_replica::journal::JournalMark;
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let ra = replica_with_lease(store.clone(), LEASE_MS).await?;
    let mut settings = journal();
    settings.journal.section_bytes = u64::MAX;
    settings.journal.max_lag_batches = 8;
    let a = registry(&dir.path().join("a"), ra.clone(), "wa", settings)?;
    let (busy, quiet) = (org(0), org(1));
    assert!(a.once(&quiet, "q", effect("org1", "q")).await?.applied);
    let checkpoints = |log: &[idem_replica::LogEntry]| {
        log.iter()
            .filter(|e| matches!(e.header.journal, Some(JournalMark::Checkpoint { .. })))
            .count()
    };
    let released =
        |log: &[idem_replica::LogEntry]| log.last().is_some_and(|e| e.kind_name() == "release");
    let mut i = 0;
    loop {
        let key = format!("b{i}");
        assert!(a.once(&busy, &key, effect("org0", &key)).await?.applied);
        i += 1;
        let (b, q) = (
            ra.journal_history(&busy).await?,
            ra.journal_history(&quiet).await?,
        );
        // The first checkpoint is the tenure's own (a never-written org); later ones are
        // the lag's, since the byte budget is never reached.
        if checkpoints(&b) >= 3 && released(&q) {
            break;
        }
        assert!(
            i < 200,
            "after {i} acks: busy {} checkpoints, quiet released {}",
            checkpoints(&b),
            released(&q)
        );
    }
    let again = a.once(&quiet, "q", effect("org1", "never")).await?;
    assert!(!again.applied);
    a.shutdown().await;
    let (effects, keys) = published(&ra, "org1", dir.path()).await?;
    assert_eq!((effects.get("q"), keys), (Some(&1), 1));
    let (_, keys) = published(&ra, "org0", dir.path()).await?;
    assert_eq!(keys, i as i64);
    Ok(())
}

/// An org that stops without its Release entry (here poisoned: its file was replaced under
/// the writer, I13) stays counted by the run's retention (T3): its acknowledged sections
/// are kept while other orgs' batches go, and a successor that adopts the crashed run
/// replays its keys. Guards against a stopped tenure detached from the run, whose entry
/// then no longer held retention back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_org_keeps_its_sections_through_retention() -> R {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let ra = replica_with_lease(store.clone(), LEASE_MS).await?;
    let mut settings = journal();
    settings.journal.section_bytes = u64::MAX;
    settings.journal.max_lag_batches = 0;
    settings.journal.retain_every_batches = 2;
    settings.retention.keep_ms = 0;
    let data = dir.path().join("a");
    let a = registry(&data, ra.clone(), "wa", settings)?;
    let (acme, beta) = (OrgId::new("acme")?, org(1));
    for k in ["k0", "k1", "k2"] {
        assert!(a.once(&acme, k, effect("acme", k)).await?.applied);
    }
    // Replace acme's file under its writer: its next ship finds the files changed.
    let db = common::outside::served_db(&data)?;
    let copy = db.with_extension("copy");
    std::fs::copy(&db, &copy)?;
    std::fs::rename(&copy, &db)?;
    let poisoned = a.once(&acme, "k3", effect("acme", "k3")).await;
    assert!(
        poisoned.is_err(),
        "a replaced file was shipped: {poisoned:?}"
    );
    // Beta's batches go on, and retention runs every two of them.
    for i in 0..30 {
        let key = format!("b{i}");
        assert!(a.once(&beta, &key, effect("org1", &key)).await?.applied);
    }
    drop(a);
    drop(ra);
    let rb = replica_with_lease(store, LEASE_MS).await?;
    let b = registry(&dir.path().join("b"), rb.clone(), "wb", journal())?;
    let replayed = loop {
        match b.once(&acme, "k0", effect("acme", "never")).await {
            Ok(out) => break out,
            Err(e) if e.kind() == idem_org::ErrorKind::Retry => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(e.into()),
        }
    };
    assert!(!replayed.applied);
    for k in ["k1", "k2"] {
        assert!(!b.once(&acme, k, effect("acme", "never")).await?.applied);
    }
    b.shutdown().await;
    let (effects, keys) = published(&rb, "acme", dir.path()).await?;
    assert_eq!(keys, 3, "{effects:?}");
    Ok(())
}

/// A forced claim over another process's run would adopt that whole run, so the journal
/// refuses `force_claim` when the registry is built, and `idem serve` the two flags.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_journal_refuses_force_claim() -> R {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let ra = replica_with_lease(store, LEASE_MS).await?;
    let mut settings = journal();
    settings.force_claim = true;
    let built = Registry::builder(dir.path(), ra, "wa")
        .settings(settings)
        .build();
    let e = built.err().ok_or("built with force_claim on the journal")?;
    assert!(e.to_string().contains("force_claim"), "{e}");
    Ok(())
}

/// `Replica::verify` of a journal org rebuilds every checkpoint by its base links and the
/// walk's newest state, and reports damage to a checkpoint's stored bytes at its seq.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_checks_a_journal_org_and_reports_a_damaged_checkpoint() -> R {
    use object_store::ObjectStoreExt;
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let ra = replica_with_lease(store.clone(), LEASE_MS).await?;
    let a = registry(&dir.path().join("a"), ra.clone(), "wa", journal())?;
    let o = org(0);
    for k in ["k0", "k1", "k2"] {
        assert!(a.once(&o, k, effect("org0", k)).await?.applied);
    }
    a.shutdown().await;
    let report = ra.verify(&o).await?;
    assert!(report.failed.is_empty(), "{:#?}", report.failed);
    assert!(!report.ok.is_empty(), "no checkpoint verified");
    // Damage every object of the org beside its log (the checkpoints' stored bytes).
    let mut listed = store.list(Some(&object_store::path::Path::from("t/orgs/org0")));
    let mut damaged = 0;
    while let Some(meta) = listed.next().await {
        let path = meta?.location;
        if !path.as_ref().contains("/log/") {
            store
                .put(&path, b"not what was stored".to_vec().into())
                .await?;
            damaged += 1;
        }
    }
    assert!(damaged > 0, "no stored bytes beside the log");
    let report = ra.verify(&o).await?;
    assert!(
        !report.failed.is_empty(),
        "damage not reported: ok {:?}",
        report.ok
    );
    Ok(())
}

/// J4 for every org: the release seal a shutdown places counts the entries of the orgs it
/// frees (their walks read their newest sections, then meet it), so the run's retention
/// after the shutdown deletes none of those sections and every acknowledged key survives
/// (T3, I11). A seal whose `retain_below` was its own slot let retention delete them: a
/// successor then served the org's last checkpoint and ran acknowledged keys again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_after_a_shutdowns_release_seal_keeps_the_sections_its_orgs_walks_read() -> R {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let ra = replica_with_lease(store.clone(), LEASE_MS).await?;
    // No size-triggered checkpoints: the acknowledged state lives in the run's sections.
    let a = registry(
        &dir.path().join("a"),
        ra.clone(),
        "wa",
        common::journal::settings(u64::MAX),
    )?;
    let o = org(0);
    let acked = keys(3);
    for k in &acked {
        assert!(a.once(&o, k, effect(o.as_str(), k)).await?.applied);
    }
    let results = a.shutdown().await;
    assert!(results.iter().all(|(_, r)| r.is_ok()), "{results:?}");
    let mut runs = std::collections::BTreeSet::new();
    let mut listed = store.list(Some(&object_store::path::Path::from("t/journals")));
    while let Some(meta) = listed.next().await {
        let meta = meta?;
        let mut parts = meta.location.parts().skip(2);
        if let Some(run) = parts.next() {
            runs.insert(idem_replica::journal::RunName::parse(run.as_ref())?);
        }
    }
    assert_eq!(runs.len(), 1, "{runs:?}");
    for run in &runs {
        let retained = ra.retain_run(run, 0).await?;
        eprintln!("{run}: {retained:?}");
    }
    in_store(&ra, dir.path(), &o, &acked, &[]).await?;
    let rb = replica_with_lease(store.clone(), LEASE_MS).await?;
    let b = registry(&dir.path().join("b"), rb, "wb", journal())?;
    replays_within(Duration::ZERO, &b, &o, &acked).await?;
    let results = b.shutdown().await;
    assert!(results.iter().all(|(_, r)| r.is_ok()), "{results:?}");
    Ok(())
}
