//! Callers that give up (issue 30): a caller's future dropped before the reservation lands,
//! while the executor runs, or during the settlement never strands the key. The protocol
//! runs to the end; the next call sees COMMITTED with the executor's result (or FAILED when
//! the executor proved it did nothing), never a RESERVED row "in progress" for a lease and
//! then AMBIGUOUS. A fake remote records every charge: the exactly-once oracle.
//!
//! Every step is ordered by a seam (a failpoint that holds the writer, a channel the executor
//! waits on), never by a sleep.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use common::remote::{Gate, Remote};
use common::{R, registry, replica};
use idem::effect::{self, State};
use idem::failpoint::{FailPoint, Write};
use idem_org::{Org, Registry, RegistrySettings};
use object_store::memory::InMemory;

async fn acme(dir: &std::path::Path) -> Result<(Registry, Org), common::BoxErr> {
    let reg = registry(
        &dir.join("a"),
        replica(Arc::new(InMemory::new()), None).await?,
        "A",
        RegistrySettings::default(),
    )?;
    let org = reg.acquire(&idem_replica::OrgId::new("acme")?).await?;
    Ok((reg, org))
}

/// The next call for `key` must not run its executor: it waits for the protocol still
/// running and replays what it recorded.
async fn replay(org: &Org, key: &str) -> Result<effect::Outcome, idem_org::Error> {
    org.effect(key, effect::Options::new(), || async {
        Err(effect::Error::ambiguous("a second execution"))
    })
    .await
}

/// Drops the caller of an effect on `key` while the org's writer is held at `point`, then
/// opens it: the next call must replay the one charge, never run or answer "in progress".
async fn dropped_at(point: FailPoint, key: &'static str) -> R {
    let dir = tempfile::tempdir()?;
    let (reg, org) = acme(dir.path()).await?;
    let remote = Arc::new(Remote::default());
    let (gate, keys) = Gate::at(point);
    let caller = {
        let (org, remote) = (org.clone(), remote.clone());
        tokio::spawn(async move {
            let opts = effect::Options::new().failpoints(gate);
            org.effect(key, opts, move || async move { Ok(remote.charge(key)) })
                .await
        })
    };
    keys.reached.await?; // the writer is at `point`
    caller.abort();
    assert!(
        caller.await.is_err_and(|e| e.is_cancelled()),
        "the caller is gone"
    );
    keys.open.send(())?;
    let out = replay(&org, key).await?;
    let charge = format!("ch_{key}_0").into_bytes();
    assert_eq!((out.executed, &out.result), (false, &charge));
    assert_eq!(remote.charges(key), 1);
    let row = org.effect_record(key).await?.ok_or("no row")?;
    assert_eq!(row.state, State::Committed);
    reg.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_dropped_before_the_reservation_lands_leaves_the_effect_recorded() -> R {
    // Guards: the reservation committed on the writer after the caller's future was gone, and
    // nothing ran or settled it: RESERVED "in progress" for the lease, then AMBIGUOUS.
    dropped_at(FailPoint::BeforeCommit(Write::Reserve), "pay-1").await
}

/// Starts an effect on `key` whose executor waits on a channel, drops its caller while the
/// executor runs (a `select!` with a timeout, a request handler cancelled), then lets the
/// executor end with `end`.
async fn dropped_while_running(
    org: &Org,
    remote: &Arc<Remote>,
    key: &'static str,
    end: fn(&Remote, &str) -> Result<Vec<u8>, effect::Error>,
) -> R {
    let (running_tx, running) = tokio::sync::oneshot::channel();
    let (go, go_rx) = tokio::sync::oneshot::channel::<()>();
    let caller = {
        let (org, remote) = (org.clone(), remote.clone());
        tokio::spawn(async move {
            org.effect(key, effect::Options::new(), move || async move {
                let _ = running_tx.send(());
                let _ = go_rx.await;
                end(&remote, key)
            })
            .await
        })
    };
    running.await?;
    caller.abort();
    assert!(caller.await.is_err_and(|e| e.is_cancelled()));
    go.send(()).map_err(|()| "executor gone")?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_dropped_while_the_executor_runs_leaves_its_ok_recorded() -> R {
    // Guards: the executor ran on and returned Ok, but nothing recorded it.
    let dir = tempfile::tempdir()?;
    let (reg, org) = acme(dir.path()).await?;
    let remote = Arc::new(Remote::default());
    dropped_while_running(&org, &remote, "pay-2", |r, k| Ok(r.charge(k))).await?;
    let out = replay(&org, "pay-2").await?;
    assert_eq!(
        (out.executed, out.result.as_slice()),
        (false, &b"ch_pay-2_0"[..])
    );
    assert_eq!(remote.charges("pay-2"), 1);
    reg.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_dropped_during_the_settlement_leaves_it_recorded() -> R {
    // The executor returned; its settlement is about to commit when the caller goes. (Once
    // queued, a writer job outlives its caller: this one holds without the task too.)
    dropped_at(FailPoint::BeforeCommit(Write::Settle), "pay-3").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_caller_whose_executor_proved_nothing_ran_leaves_the_key_failed() -> R {
    // The other legitimate end: FAILED, which the next call reserves and runs itself.
    let dir = tempfile::tempdir()?;
    let (reg, org) = acme(dir.path()).await?;
    let remote = Arc::new(Remote::default());
    dropped_while_running(&org, &remote, "pay-4", |_, _| {
        Err(effect::Error::not_executed("card declined before charging"))
    })
    .await?;
    let charged = remote.clone();
    let out = org
        .effect("pay-4", effect::Options::new(), move || async move {
            Ok(charged.charge("pay-4"))
        })
        .await?;
    assert!(out.executed, "a FAILED key runs again");
    assert_eq!(remote.charges("pay-4"), 1);
    let states: Vec<State> = org
        .effect_history("pay-4")
        .await?
        .into_iter()
        .map(|t| t.state)
        .collect();
    assert_eq!(
        states,
        [
            State::Reserved,
            State::Failed,
            State::Reserved,
            State::Committed
        ]
    );
    reg.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_remote_is_charged_once_per_key_whatever_the_callers_drop() -> R {
    // The oracle: many callers per key, some dropped right away (before or after their
    // reservation, as the scheduler has it), some while their executor runs, some kept. Every
    // key ends COMMITTED with exactly one charge, and every answer any caller got is that
    // charge.
    let dir = tempfile::tempdir()?;
    let (reg, org) = acme(dir.path()).await?;
    let remote = Arc::new(Remote::default());
    let answers: Arc<Mutex<BTreeMap<String, Vec<Vec<u8>>>>> = Arc::default();
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        seed >> 33
    };
    const KEYS: usize = 12;
    const CALLERS: usize = 3;
    let mut tasks = Vec::new();
    for k in 0..KEYS {
        for _ in 0..CALLERS {
            let key = format!("k{k}");
            let plan = next() % 3;
            let (running_tx, running) = tokio::sync::oneshot::channel::<()>();
            let (org, remote, answers) = (org.clone(), remote.clone(), answers.clone());
            let call_key = key.clone();
            let caller = tokio::spawn(async move {
                let out = org
                    .effect(&call_key, effect::Options::new(), {
                        let key = call_key.clone();
                        move || async move {
                            let _ = running_tx.send(());
                            for _ in 0..3 {
                                tokio::task::yield_now().await;
                            }
                            Ok(remote.charge(&key))
                        }
                    })
                    .await;
                if let Ok(o) = out {
                    let mut a = answers.lock().unwrap_or_else(|p| p.into_inner());
                    a.entry(call_key).or_default().push(o.result);
                }
            });
            match plan {
                0 => caller.abort(),
                1 => {
                    tasks.push(tokio::spawn(async move {
                        let _ = running.await;
                        caller.abort();
                    }));
                }
                _ => tasks.push(tokio::spawn(async move {
                    let _ = caller.await;
                })),
            }
        }
    }
    for t in tasks {
        t.await?;
    }
    // A last call per key: it waits for whatever still runs, and runs the effect only if no
    // caller got as far as a reservation.
    for k in 0..KEYS {
        let key = format!("k{k}");
        let charged = remote.clone();
        let last_key = key.clone();
        let out = org
            .effect(&key, effect::Options::new(), move || async move {
                Ok(charged.charge(&last_key))
            })
            .await?;
        answers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key)
            .or_default()
            .push(out.result);
    }
    let charges = remote.per_key();
    let answers = answers.lock().unwrap_or_else(|p| p.into_inner()).clone();
    for k in 0..KEYS {
        let key = format!("k{k}");
        assert_eq!(charges.get(&key), Some(&1), "charges of {key}: {charges:?}");
        let row = org.effect_record(&key).await?.ok_or("no row")?;
        assert_eq!(row.state, State::Committed, "{key}");
        let stored = row.result.ok_or("no result")?;
        for a in &answers[&key] {
            assert_eq!(a, &stored, "an answer for {key} that is not its one charge");
        }
    }
    assert!(org.effects(Some(State::Reserved)).await?.is_empty());
    reg.shutdown().await;
    Ok(())
}
