//! The process lease (I14): one object per writer process, renewed on a timer, keeps every
//! claim of that process alive without a store request per org; a successor's decision to
//! wait or claim watches it change (I15). Paused runtime time and a manual clock advance
//! together.

use std::sync::Arc;
use std::time::Duration;

use idem_replica::conformance::test_snapshot;
use idem_replica::fault::{Fault, FaultStore, Op};
use idem_replica::latency::{LatencyStore, Shape, Shapes};
use idem_replica::{Error, ManualClock, OrgId, Replica, Settings};
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

type R = Result<(), Box<dyn std::error::Error + Send + Sync>>;

const LEASE_MS: u64 = 3_000;

async fn open(
    store: &Arc<dyn ObjectStore>,
    clock: &Arc<ManualClock>,
    advertise: Option<&str>,
) -> Result<Replica, Error> {
    let settings = Settings {
        lease_ms: LEASE_MS,
        advertise: advertise.map(str::to_owned),
        ..Settings::default()
    };
    Replica::open_with(store.clone(), "t", settings, clock.clone(), None).await
}

async fn live_for(clock: &ManualClock, ms: u64) {
    for _ in 0..ms / 100 {
        clock.advance(100);
        tokio::time::advance(Duration::from_millis(100)).await;
        for _ in 0..5 {
            tokio::task::yield_now().await;
        }
    }
}

/// The watch a claimant keeps before it takes a lease for lapsed: the term plus a tenth.
const WATCH_MS: u64 = LEASE_MS + LEASE_MS / 10;

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_live_process_holds_its_claims_and_a_dead_one_lets_them_go() -> R {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let clock = Arc::new(ManualClock::new(1_000_000));
    let a = open(&store, &clock, Some("http://a:8080")).await?;
    let acme = OrgId::new("acme")?;
    let claim = a.claim(&acme, "a", false).await?;
    let lease = a.lease(&acme).await?.ok_or("no org lease")?;
    assert!(lease.process, "{lease:?}");
    // B watches for five lease lengths, long past the org lease's own term: every attempt
    // finds A's process lease renewed since the last, so it waits a whole watch again.
    let b = open(&store, &clock, None).await?;
    for _ in 0..10 {
        match b.claim(&acme, "b", false).await {
            Err(Error::LeaseHeld {
                holder,
                retry_after_ms,
                holder_addr,
                ..
            }) => {
                assert_eq!(holder, "a");
                assert!(retry_after_ms > WATCH_MS - LEASE_MS / 3, "{retry_after_ms}");
                assert_eq!(holder_addr.as_deref(), Some("http://a:8080"));
            }
            other => return Err(format!("a live process's claim was taken: {other:?}").into()),
        }
        live_for(&clock, LEASE_MS / 2).await;
    }
    // The process ends (its handle and renewal task go); B claims once it has seen the
    // lease unchanged for a whole watch, not before.
    drop(claim);
    drop(a);
    live_for(&clock, LEASE_MS).await;
    assert!(matches!(
        b.claim(&acme, "b", false).await,
        Err(Error::LeaseHeld { .. })
    ));
    live_for(&clock, WATCH_MS).await;
    let taken = b.claim(&acme, "b", false).await?;
    assert_eq!(taken.round(), 2);
    Ok(())
}

/// A refusal says when the holder is draining and releasing the org (its HTTP answer then
/// sends clients back in a second, not after the watch), and only then: not before the
/// drain, nor for an org the drain does not list. The watch itself is unchanged.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_refusal_names_a_draining_holder_for_the_orgs_it_releases() -> R {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let clock = Arc::new(ManualClock::new(1_000_000));
    let a = open(&store, &clock, None).await?;
    let (acme, beta) = (OrgId::new("acme")?, OrgId::new("beta")?);
    let _claims = (
        a.claim(&acme, "a", false).await?,
        a.claim(&beta, "a", false).await?,
    );
    let b = open(&store, &clock, None).await?;
    let refusal = |r: Result<idem_replica::Claim, Error>| match r {
        Err(Error::LeaseHeld {
            draining,
            retry_after_ms,
            ..
        }) => Ok((draining, retry_after_ms)),
        other => Err(format!("not refused as held: {other:?}")),
    };
    assert!(!refusal(b.claim(&acme, "b", false).await)?.0);
    assert!(a.drain(std::slice::from_ref(&acme)).await, "drain not said");
    let (draining, wait_ms) = refusal(b.claim(&acme, "b", false).await)?;
    assert!(draining, "a draining holder's refusal");
    // The drain's write changed the process lease: a whole watch from now, as before.
    assert!(wait_ms > LEASE_MS, "{wait_ms}");
    let (draining, _) = refusal(b.claim(&beta, "b", false).await)?;
    assert!(!draining, "beta is not among the orgs the drain releases");
    let e = b.claim(&acme, "b", false).await.err().ok_or("claimed")?;
    assert!(e.to_string().contains("it is draining"), "{e}");
    Ok(())
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_crafted_or_unreadable_process_lease_is_no_proof_of_life() -> R {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let clock = Arc::new(ManualClock::new(1_000_000));
    let r = open(&store, &clock, None).await?;
    let acme = OrgId::new("acme")?;
    // An org lease, past its own term, naming an instance that is not one (a path outside).
    let crafted = r#"{"v":1,"writer":"x","round":1,"expires_at_ms":5,"instance":"../../orgs/acme/log","process":true}"#;
    store
        .put(
            &Path::from("t/orgs/acme/lease.json"),
            PutPayload::from(crafted),
        )
        .await?;
    assert_eq!(r.process_lease("../../orgs/acme/log").await?, None);
    let c = r.claim(&acme, "w", false).await?;
    assert_eq!(c.round(), 1);
    // A garbled process lease behind a valid instance reads as absent, not as live.
    let instance = "0123456789abcdef0123456789abcdef";
    store
        .put(
            &Path::from(format!("t/processes/{instance}.json")),
            PutPayload::from_static(b"{not json"),
        )
        .await?;
    assert_eq!(r.process_lease(instance).await?, None);
    let beta = OrgId::new("beta")?;
    let lease = format!(
        r#"{{"v":1,"writer":"x","round":1,"expires_at_ms":5,"instance":"{instance}","process":true}}"#
    );
    store
        .put(
            &Path::from("t/orgs/beta/lease.json"),
            PutPayload::from(lease),
        )
        .await?;
    // An object is watched whatever it holds: unchanged for a whole watch, it proves nothing.
    assert!(matches!(
        r.claim(&beta, "w", false).await,
        Err(Error::LeaseHeld { .. })
    ));
    clock.advance(WATCH_MS);
    assert_eq!(r.claim(&beta, "w", false).await?.round(), 1);
    Ok(())
}

/// Regression: when the first process-lease PUT failed, no renewal task started until
/// the process claimed again, so its orgs lapsed while it lived. The timer starts anyway and
/// its next tick writes the lease.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_failed_first_process_lease_write_is_retried_by_the_timer() -> R {
    let raw: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let fs = Arc::new(FaultStore::new(raw.clone()));
    let clock = Arc::new(ManualClock::new(1_000_000));
    let settings = Settings {
        lease_ms: 3_000,
        ..Settings::default()
    };
    let acme = OrgId::new("acme")?;
    let a = Replica::open_with(fs.clone(), "t", settings.clone(), clock.clone(), None).await?;
    fs.inject(Op::Put, "processes/", 1, Fault::FailBefore);
    let mut ac = a.claim(&acme, "a", false).await?;
    a.ship(&mut ac, test_snapshot(1)?).await?;
    // B watches from the start: an absent process lease that stayed absent for a watch would
    // let it claim; the timer's retry makes it appear and then change.
    let b = Replica::open_with(raw.clone(), "t", settings.clone(), clock.clone(), None).await?;
    for _ in 0..20 {
        let got = b.claim(&acme, "b", false).await;
        assert!(
            matches!(got, Err(Error::LeaseHeld { .. })),
            "a live process's claim lapsed after one failed process-lease PUT: {got:?}"
        );
        live_for(&clock, 500).await;
    }
    Ok(())
}

/// Regression: a claimant watched for its own term; one configured with a shorter
/// lease than the holder's saw the holder's lease unchanged between two renewals and took a
/// live holder's org. It watches for the holder's term, written in the lease.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_claimant_with_a_shorter_lease_watches_for_the_holders_term() -> R {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let (a_clock, b_clock) = (
        Arc::new(ManualClock::new(1_000_000)),
        Arc::new(ManualClock::new(1_000_000)),
    );
    // The holder renews every 3 1/3 s; the claimant's own watch would be 1.1 s.
    const HOLDER_MS: u64 = 10_000;
    const HOLDER_WATCH_MS: u64 = HOLDER_MS + HOLDER_MS / 10;
    let long = Settings {
        lease_ms: HOLDER_MS,
        ..Settings::default()
    };
    let a = Replica::open_with(store.clone(), "t", long, a_clock.clone(), None).await?;
    let short = Settings {
        lease_ms: idem_replica::MIN_LEASE_MS,
        ..Settings::default()
    };
    let b = Replica::open_with(store.clone(), "t", short, b_clock.clone(), None).await?;
    let acme = OrgId::new("acme")?;
    let claim = a.claim(&acme, "a", false).await?;
    for _ in 0..30 {
        let got = b.claim(&acme, "b", false).await;
        match got {
            Err(Error::LeaseHeld { retry_after_ms, .. }) => {
                assert!(retry_after_ms <= HOLDER_WATCH_MS, "{retry_after_ms}")
            }
            other => return Err(format!("a live holder's org was taken: {other:?}").into()),
        }
        for clock in [&a_clock, &b_clock] {
            clock.advance(200);
        }
        tokio::time::advance(Duration::from_millis(200)).await;
        for _ in 0..5 {
            tokio::task::yield_now().await;
        }
    }
    // Once the holder is gone, a watch of the holder's term after B's next look, B claims.
    drop(claim);
    drop(a);
    assert!(matches!(
        b.claim(&acme, "b", false).await,
        Err(Error::LeaseHeld { .. })
    ));
    b_clock.advance(HOLDER_WATCH_MS);
    assert_eq!(b.claim(&acme, "b", false).await?.round(), 2);
    Ok(())
}

/// Every read of a process lease is an observation (I15), a watcher's as much as a claim's:
/// the watch of a holder's last renewal runs from the first read that returned it. B reads
/// A's lease as a warm-takeover watcher does, before and after a renewal; A stops; B's first
/// claim attempt then waits only what remains of a watch since its read of the renewal (a
/// whole watch without the fix), and the read of the bytes that renewal replaced shortens
/// nothing.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_watchers_read_of_a_process_lease_starts_the_watch_of_what_it_read() -> R {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let clock = Arc::new(ManualClock::new(1_000_000));
    let a = open(&store, &clock, None).await?;
    let acme = OrgId::new("acme")?;
    let claim = a.claim(&acme, "a", false).await?;
    let instance = a.instance().to_owned();
    let b = open(&store, &clock, None).await?;

    let first = b
        .process_lease(&instance)
        .await?
        .ok_or("no process lease")?;
    live_for(&clock, LEASE_MS / 3 + 100).await;
    let last = b
        .process_lease(&instance)
        .await?
        .ok_or("no process lease")?;
    assert!(last.renewals > first.renewals, "{first:?} {last:?}");
    // A stops right after its renewal was read.
    drop(claim);
    drop(a);
    live_for(&clock, WATCH_MS - 500).await;
    match b.claim(&acme, "b", false).await {
        Err(Error::LeaseHeld { retry_after_ms, .. }) => assert_eq!(retry_after_ms, 500),
        other => return Err(format!("not judged from the renewal's read: {other:?}").into()),
    }
    live_for(&clock, 500).await;
    assert_eq!(b.claim(&acme, "b", false).await?.round(), 2);
    Ok(())
}

/// A retired process is alive but renews nothing, so an observer's old read of its lease,
/// or of its absence, must not judge a claim it makes later. A's retire leaves its last
/// renewal in place (the delete fails), or deletes it and B reads it gone; a watch later A
/// claims again while its lease write fails. The claim must fail rather than be published beside a stale lease that B
/// would take for a whole watch of silence; the retried claim writes the lease first, and
/// B, who saw it change, waits a whole watch.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_claim_after_a_retire_is_made_only_once_its_lease_has_landed() -> R {
    for delete_fails in [true, false] {
        let memory: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let faults = Arc::new(FaultStore::new(memory.clone()));
        let a_store: Arc<dyn ObjectStore> = faults.clone();
        let clock = Arc::new(ManualClock::new(1_000_000));
        let a = open(&a_store, &clock, None).await?;
        let b = open(&memory, &clock, None).await?;
        let (acme, beta) = (OrgId::new("acme")?, OrgId::new("beta")?);
        let mut held = a.claim(&acme, "a", false).await?;
        a.release(&mut held).await?;
        if delete_fails {
            faults.inject(Op::Delete, "processes/", 1, Fault::FailBefore);
            assert!(!a.retire().await, "the delete was to fail");
            // A watcher reads the lease A no longer renews.
            assert!(b.process_lease(a.instance()).await?.is_some());
        } else {
            assert!(a.retire().await);
            // A watcher reads it gone.
            assert!(b.process_lease(a.instance()).await?.is_none());
        }
        live_for(&clock, WATCH_MS + 100).await;
        faults.inject(Op::Put, "processes/", 1, Fault::FailBefore);
        match a.claim(&beta, "a", false).await {
            Err(Error::Store { .. }) => {}
            other => return Err(format!("claimed beside a stale lease: {other:?}").into()),
        }
        let claim = a.claim(&beta, "a", false).await?;
        match b.claim(&beta, "b", false).await {
            Err(Error::LeaseHeld { retry_after_ms, .. }) => assert_eq!(retry_after_ms, WATCH_MS),
            other => return Err(format!("a live holder's new claim was taken: {other:?}").into()),
        }
        drop(claim);
    }
    Ok(())
}

/// Regression (review): two claims after a retire, made together while the first lease
/// write is slow and fails. The handle counted as unretired from the moment that write was
/// sent, so the second claim went out at once beside it and landed with no lease written,
/// which B, who had read the lease gone a watch before, took at once. Each claim now waits
/// for a write that landed: the first fails, the second writes the lease itself.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn two_claims_after_a_retire_each_wait_for_a_landed_lease() -> R {
    let memory: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let faults = Arc::new(FaultStore::new(memory.clone()));
    let slow: Arc<dyn ObjectStore> = Arc::new(LatencyStore::new(
        faults.clone(),
        Shapes::all(Shape::Constant(Duration::from_millis(20))),
        2,
    ));
    let clock = Arc::new(ManualClock::new(1_000_000));
    let a = open(&slow, &clock, None).await?;
    let b = open(&memory, &clock, None).await?;
    let (acme, beta, gamma) = (
        OrgId::new("acme")?,
        OrgId::new("beta")?,
        OrgId::new("gamma")?,
    );
    let mut held = a.claim(&acme, "a", false).await?;
    a.release(&mut held).await?;
    assert!(a.retire().await);
    assert!(b.process_lease(a.instance()).await?.is_none());
    live_for(&clock, WATCH_MS + 100).await;
    faults.inject(Op::Put, "processes/", 1, Fault::FailBefore);
    let (first, second) =
        futures::future::join(a.claim(&beta, "a", false), a.claim(&gamma, "a", false)).await;
    assert!(matches!(first, Err(Error::Store { .. })), "{first:?}");
    let second = second?;
    assert!(b.process_lease(a.instance()).await?.is_some());
    match b.claim(&gamma, "b", false).await {
        Err(Error::LeaseHeld { retry_after_ms, .. }) => assert_eq!(retry_after_ms, WATCH_MS),
        other => return Err(format!("a live holder's new claim was taken: {other:?}").into()),
    }
    drop(second);
    Ok(())
}

/// The journal's ways of naming this process after a retire wait for the lease too: a
/// K1b claim (its claim entry names the run, judged by this process's lease) and an adopt
/// seal (it hands a dead run's orgs to this process's run). With the lease's write failing,
/// each fails and publishes nothing that names the process; retried, the claim is made once
/// the lease has landed.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn journal_claims_and_adopt_seals_after_a_retire_wait_for_the_lease() -> R {
    let memory: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let faults = Arc::new(FaultStore::new(memory.clone()));
    let store: Arc<dyn ObjectStore> = faults.clone();
    let clock = Arc::new(ManualClock::new(1_000_000));
    let a = open(&store, &clock, None).await?;
    let mut run = a.start_run("a", 4).await?;
    assert!(a.retire().await);
    let acme = OrgId::new("acme")?;
    let lease_path = Path::from(format!("t/processes/{}.json", a.instance()));
    let lease = || memory.head(&lease_path);

    faults.inject(Op::Put, "processes/", 1, Fault::FailBefore);
    match a.claim_free(&acme, &mut run).await {
        Err(Error::Store { .. }) => {}
        other => return Err(format!("a K1b claim beside no lease: {other:?}").into()),
    }
    assert!(
        a.history(&acme).await?.is_empty(),
        "a claim entry was published"
    );
    faults.inject(Op::Put, "processes/", 1, Fault::FailBefore);
    let dead = idem_replica::journal::RunName::new("0123456789abcdef0123456789abcdef", 1)?;
    match a.adopt_run(&dead, "a", run.name(), 1).await {
        Err(Error::Store { .. }) => {}
        other => return Err(format!("an adopt seal beside no lease: {other:?}").into()),
    }
    assert!(lease().await.is_err(), "the lease was written after all");

    let tenure = a.claim_free(&acme, &mut run).await?;
    assert!(tenure.is_ok(), "{tenure:?}");
    assert!(lease().await.is_ok(), "claimed with no lease in the store");
    Ok(())
}

/// Regression: the watch ran only when the org lease was of the log's newest round.
/// A claim entry lands before its claimer writes the org lease, so a third claimant whose
/// create collided with it re-read a head newer than the lease (the releaser's) and claimed
/// at once, fencing the live claimer. Schedule: A releases; C passes its check and pauses
/// before its create; B's create lands and B pauses before its lease write; C's create
/// collides, and C must now judge B (the claim entry names B's process), not A's lease.
#[tokio::test(flavor = "current_thread")]
async fn a_claim_newer_than_the_org_lease_is_judged_by_its_claimer_before_its_lease_exists() -> R {
    use idem_replica::FailPoint;
    use idem_replica::fault::PauseAt;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let clock = Arc::new(ManualClock::new(1_000_000));
    let settings = Settings {
        lease_ms: LEASE_MS,
        ..Settings::default()
    };
    let acme = OrgId::new("acme")?;
    let a = open(&store, &clock, None).await?;
    let mut ac = a.claim(&acme, "a", false).await?;
    a.release(&mut ac).await?;
    let (b_pause, c_pause) = (
        PauseAt::new(FailPoint::ClaimAfterPublish),
        PauseAt::new(FailPoint::ClaimBeforePublish),
    );
    let b = Replica::open_with(
        store.clone(),
        "t",
        settings.clone(),
        clock.clone(),
        Some(b_pause.clone()),
    )
    .await?;
    let c = Replica::open_with(
        store.clone(),
        "t",
        settings,
        clock.clone(),
        Some(c_pause.clone()),
    )
    .await?;
    let c_held = c_pause.arm().await;
    let c_claim = tokio::spawn({
        let (c, acme) = (c.clone(), acme.clone());
        async move { c.claim(&acme, "c", false).await }
    });
    c_held.reached.await?;
    let b_held = b_pause.arm().await;
    let b_claim = tokio::spawn({
        let (b, acme) = (b.clone(), acme.clone());
        async move { b.claim(&acme, "b", false).await }
    });
    b_held.reached.await?;
    // B's claim entry (round 2) is the head, and it alone names B: no org lease is written.
    assert_eq!(
        a.lease(&acme).await?.map(|l| (l.writer, l.round)),
        Some(("b".to_owned(), 2))
    );
    assert!(
        store
            .head(&Path::from("t/orgs/acme/lease.json"))
            .await
            .is_err()
    );
    let _ = c_held.resume.send(());
    match c_claim.await? {
        Err(Error::LeaseHeld { holder, .. }) => assert_eq!(holder, "b"),
        other => return Err(format!("C fenced a live claimer: {other:?}").into()),
    }
    let _ = b_held.resume.send(());
    let mut bc = b_claim.await??;
    assert_eq!(bc.round(), 2);
    b.confirm(&mut bc).await?;
    Ok(())
}

/// Regression: the renewal loop awaited each PUT without a deadline, so one PUT that
/// hung stopped every later renewal and a live holder lost all its orgs a watch later. Each
/// renewal now gets one period; the next tick writes again.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_hung_renewal_does_not_stop_the_next_ones() -> R {
    let raw: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let fs = Arc::new(FaultStore::new(raw.clone()));
    let clock = Arc::new(ManualClock::new(1_000_000));
    let settings = Settings {
        lease_ms: LEASE_MS,
        ..Settings::default()
    };
    let acme = OrgId::new("acme")?;
    let a = Replica::open_with(fs.clone(), "t", settings.clone(), clock.clone(), None).await?;
    let _claim = a.claim(&acme, "a", false).await?;
    // The first renewal's PUT never returns (its resume end is kept, never sent).
    let hung = fs.pause_next(Op::Put, "processes/");
    let b = Replica::open_with(raw.clone(), "t", settings, clock.clone(), None).await?;
    let mut reached = hung.reached;
    for _ in 0..20 {
        let got = b.claim(&acme, "b", false).await;
        assert!(
            matches!(got, Err(Error::LeaseHeld { .. })),
            "a live holder lost its org behind one hung renewal: {got:?}"
        );
        live_for(&clock, LEASE_MS / 2).await;
    }
    assert!(reached.try_recv().is_ok(), "no renewal PUT was held");
    drop(hung.resume);
    Ok(())
}

/// A lease shorter than a second is refused when the handle opens (renewals every third of it
/// would not keep up with a store's round trips), with the typed settings error.
#[tokio::test(flavor = "current_thread")]
async fn a_lease_shorter_than_a_second_is_refused() -> R {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let clock = Arc::new(ManualClock::new(1_000_000));
    for lease_ms in [0, 999] {
        let settings = Settings {
            lease_ms,
            ..Settings::default()
        };
        let got = Replica::open_with(store.clone(), "t", settings, clock.clone(), None).await;
        assert!(
            matches!(&got, Err(Error::InvalidSettings { reason }) if reason.contains("lease_ms")),
            "{lease_ms}: {:?}",
            got.map(|_| ())
        );
    }
    let settings = Settings {
        lease_ms: idem_replica::MIN_LEASE_MS,
        ..Settings::default()
    };
    Replica::open_with(store, "t", settings, clock, None).await?;
    Ok(())
}

/// A holder's term is read from a lease any writer to the store can craft: a claimant honours
/// it only up to ten of its own terms or an hour, so a lease claiming a term of years cannot
/// block an org forever.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_crafted_holders_term_is_capped() -> R {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let clock = Arc::new(ManualClock::new(1_000_000));
    let r = open(&store, &clock, None).await?;
    let acme = OrgId::new("acme")?;
    let instance = "0123456789abcdef0123456789abcdef";
    let lease = format!(
        r#"{{"v":1,"writer":"x","round":1,"expires_at_ms":5,"instance":"{instance}","process":true,"term_ms":{}}}"#,
        u64::MAX / 2
    );
    store
        .put(
            &Path::from("t/orgs/acme/lease.json"),
            PutPayload::from(lease),
        )
        .await?;
    let cap = idem_replica::max_holder_term_ms(LEASE_MS);
    assert_eq!(cap, idem_replica::MAX_HOLDER_TERM_MS);
    match r.claim(&acme, "w", false).await {
        Err(Error::LeaseHeld { retry_after_ms, .. }) => {
            assert_eq!(retry_after_ms, cap + cap / 10)
        }
        other => return Err(format!("{other:?}").into()),
    }
    clock.advance(cap + cap / 10);
    assert_eq!(r.claim(&acme, "w", false).await?.round(), 1);
    Ok(())
}
