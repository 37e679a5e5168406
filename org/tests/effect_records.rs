//! What an org's effect records say (issue 30): who holds a reservation, when a reservation
//! another writer made lapses for this one (its own observation, I15), resolving through the
//! holder, the open effects `/metrics` counts, a result too large to keep, and a settlement
//! whose SQLite commit fails on a full disk after the executor's `Ok`.

mod common;

use std::process::Command;
use std::sync::Arc;

use common::remote::Remote;
use common::{R, force, registry, replica};
use idem::effect::{self, Resolution, State};
use idem_org::{Error, OpenEffects, Org, Registry, RegistrySettings};
use idem_replica::OrgId;
use object_store::memory::InMemory;

const LEASE: u64 = 60_000;

fn is_idem(e: &Error, f: impl Fn(&idem::Error) -> bool) -> bool {
    e.idem().is_some_and(f)
}

/// The error's text and every source's, joined without removing repeats (what `anyhow`'s
/// `{:#}` or a log of the chain prints).
fn walked(e: &dyn std::error::Error) -> String {
    let mut parts = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(s) = cur {
        parts.push(s.to_string());
        cur = s.source();
    }
    parts.join(": ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_judges_the_lease_by_its_own_clock_and_resolves_through_itself() -> R {
    // Guards: the org layer left `holder` empty (errors named a random attempt id); a lapsed
    // reservation was not counted; a successor compared the holder's stamp with its own
    // clock (I15); a resolve of a reservation a live holder may still run.
    let dir = tempfile::tempdir()?;
    let store = Arc::new(InMemory::new());
    let a = registry(
        &dir.path().join("a"),
        replica(store.clone(), None).await?,
        "A",
        RegistrySettings::default(),
    )?;
    let id = OrgId::new("acme")?;
    let org_a = a.acquire(&id).await?;
    let remote = Arc::new(Remote::default());
    let (running_tx, running) = tokio::sync::oneshot::channel();
    let (go, go_rx) = tokio::sync::oneshot::channel::<()>();
    let charging = {
        let (org_a, remote) = (org_a.clone(), remote.clone());
        tokio::spawn(async move {
            org_a
                .effect(
                    "g1",
                    effect::Options::new().lease_ms(LEASE),
                    move || async move {
                        let _ = running_tx.send(());
                        let _ = go_rx.await;
                        Ok(remote.charge("g1"))
                    },
                )
                .await
        })
    };
    running.await?;
    let _ = org_a
        .effect("g2", effect::Options::new(), || async {
            Err(effect::Error::ambiguous("gateway timeout"))
        })
        .await;
    let row = org_a.effect_record("g1").await?.ok_or("no row")?;
    assert_eq!(row.holder.as_deref(), Some(org_a.effect_holder()));
    let label = org_a.effect_holder().to_owned();
    assert!(
        label.starts_with("A (instance ") && label.contains("round 1"),
        "{label}"
    );
    assert_eq!(
        a.open_effects(),
        OpenEffects {
            reserved: 1,
            ambiguous: 1
        }
    );
    // The holder refuses to resolve what its own executor still runs.
    let err = org_a
        .resolve("g1", Resolution::NotExecuted, "ops")
        .await
        .err()
        .ok_or("resolved a running effect")?;
    assert!(
        is_idem(&err, |e| matches!(e, idem::Error::EffectInProgress { .. })),
        "{err:?}"
    );
    let text = walked(&err);
    assert_eq!(text.matches(&label).count(), 1, "{text}");
    assert_eq!(text.matches("in progress").count(), 1, "{text}");

    // B claims (fencing A) on a clock of its own.
    let clock = Arc::new(idem::ManualClock::new(row.created_ms + 1));
    let b = Registry::builder(
        dir.path().join("b"),
        replica(store.clone(), None).await?,
        "B",
    )
    .settings(force())
    .clock(clock.clone())
    .on_open(|c| c.execute_batch(common::LEDGER))
    .build()?;
    let org_b = b.acquire(&id).await?;
    assert_eq!(
        b.open_effects(),
        OpenEffects {
            reserved: 1,
            ambiguous: 1
        }
    );
    // A's stamp passing is not B's observation: still in progress, and not resolvable.
    clock.set(row.lease_until_ms);
    assert_eq!(b.open_effects().reserved, 1, "B trusted A's clock");
    let err = org_b
        .resolve("g1", Resolution::NotExecuted, "ops")
        .await
        .err()
        .ok_or("resolved inside the holder's term")?;
    assert!(
        is_idem(&err, |e| matches!(e, idem::Error::EffectInProgress { .. })),
        "{err:?}"
    );
    // A whole term after B's claim, on B's clock: AMBIGUOUS for every reader.
    clock.set(row.created_ms + 1 + LEASE);
    assert_eq!(
        b.open_effects(),
        OpenEffects {
            reserved: 0,
            ambiguous: 2
        }
    );
    let listed = org_b.effects(Some(State::Ambiguous)).await?;
    assert_eq!(
        listed.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(),
        ["g1", "g2"]
    );
    b.record_effect_gauges();

    // A's executor ends: fenced, A's caller gets the result, and the operator resolves with it.
    let _ = go.send(());
    let err = charging
        .await?
        .err()
        .ok_or("a fenced writer acknowledged")?;
    let result = err
        .effect_result()
        .ok_or("no result in the error")?
        .to_vec();
    assert_eq!(result, b"ch_g1_0");
    let row = org_b
        .resolve("g1", Resolution::Executed(result.clone()), "ops")
        .await?;
    assert_eq!((row.state, row.error.as_deref()), (State::Committed, None));
    org_b.resolve("g2", Resolution::NotExecuted, "ops").await?;
    assert_eq!(b.open_effects(), OpenEffects::default());
    let trail: Vec<(State, Option<String>)> = org_b
        .effect_history("g1")
        .await?
        .into_iter()
        .map(|t| (t.state, t.actor))
        .collect();
    assert_eq!(
        trail,
        [
            (State::Reserved, Some(label.clone())),
            (State::Ambiguous, Some("ops".into())),
            (State::Committed, Some("ops".into())),
        ]
    );
    let out = org_b
        .effect("g1", effect::Options::new(), || async {
            Ok(b"again".to_vec())
        })
        .await?;
    assert_eq!((out.executed, out.result), (false, result));
    assert_eq!(remote.charges("g1"), 1);
    b.shutdown().await;
    a.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_result_is_recorded_as_executed_and_never_charged_again() -> R {
    // Guards: an untyped "string or blob too big" after the charge, the key stuck RESERVED.
    let dir = tempfile::tempdir()?;
    let a = registry(
        &dir.path().join("a"),
        replica(Arc::new(InMemory::new()), None).await?,
        "A",
        RegistrySettings::default(),
    )?;
    let org = a.acquire(&OrgId::new("acme")?).await?;
    let remote = Arc::new(Remote::default());
    let charge = |remote: &Arc<Remote>| {
        let remote = remote.clone();
        move || async move {
            let mut receipt = remote.charge("big");
            receipt.resize(idem::DEFAULT_MAX_RESULT_BYTES + 1, b' ');
            Ok(receipt)
        }
    };
    let err = org
        .effect("big", effect::Options::new(), charge(&remote))
        .await
        .err()
        .ok_or("kept an oversized result")?;
    assert!(
        is_idem(&err, |e| matches!(
            e,
            idem::Error::EffectResultNotKept {
                result: Some(_),
                ..
            }
        )),
        "{err:?}"
    );
    assert_eq!(
        err.effect_result().map(<[u8]>::len),
        Some(idem::DEFAULT_MAX_RESULT_BYTES + 1)
    );
    let row = org.effect_record("big").await?.ok_or("no row")?;
    assert!(
        row.state == State::Committed && row.result_not_kept(),
        "{row:?}"
    );
    let again = org
        .effect("big", effect::Options::new(), charge(&remote))
        .await;
    assert!(
        again.as_ref().is_err_and(|e| is_idem(e, |e| matches!(
            e,
            idem::Error::EffectResultNotKept { result: None, .. }
        ))),
        "{again:?}"
    );
    assert_eq!(remote.charges("big"), 1);
    a.shutdown().await;
    Ok(())
}

/// A small tmpfs at a fresh directory, unmounted on drop.
struct Small(tempfile::TempDir);

impl Drop for Small {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.path()).status();
    }
}

/// Fills the file system holding `dir` with `dir/filler` until a write fails (ENOSPC).
fn fill(dir: &std::path::Path) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(dir.join("filler"))?;
    let block = vec![0u8; 4096];
    while f.write_all(&block).is_ok() {}
    let _ = f.sync_all();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: mounts a 4 MiB tmpfs"]
async fn a_settle_whose_commit_fails_on_a_full_disk_hands_back_the_result() -> R {
    // Guards: after the charge, a failed settle commit lost the executor's result: the caller
    // got a bare SQLite error and the operator had nothing to resolve with.
    let small = Small(tempfile::tempdir()?);
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=4m", "tmpfs"])
        .arg(small.0.path())
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        return Err("cannot mount a tmpfs here: run this test as root".into());
    }
    let data = small.0.path().join("data");
    let a = registry(
        &data,
        replica(Arc::new(InMemory::new()), None).await?,
        "A",
        RegistrySettings::default(),
    )?;
    let org: Org = a.acquire(&OrgId::new("acme")?).await?;
    let remote = Arc::new(Remote::default());
    let full = small.0.path().to_owned();
    let charged = remote.clone();
    let err = org
        .effect("pay", effect::Options::new(), move || async move {
            let receipt = charged.charge("pay");
            fill(&full).map_err(effect::Error::ambiguous)?; // the disk fills meanwhile
            Ok(receipt)
        })
        .await
        .err()
        .ok_or("a settle on a full disk succeeded")?;
    assert_eq!(err.effect_result(), Some(&b"ch_pay_0"[..]), "{err:?}");
    // The cause is the settlement's own commit, which SQLite refused (disk full) and the
    // re-read showed did not land, once reissued.
    let disk_full = |e: &idem::Error| {
        matches!(e, idem::Error::EffectCommitFailed { source, .. }
            if source.to_string().contains("disk is full"))
    };
    assert!(
        matches!(&err, Error::EffectUnacknowledged { source, .. } if is_idem(source, disk_full)),
        "{err:?}"
    );
    std::fs::remove_file(small.0.path().join("filler"))?;
    // This writer knows its executor ended without a settlement: AMBIGUOUS at once, never
    // run again, and resolvable with the result the error carried.
    let result = err.effect_result().ok_or("no result")?.to_vec();
    let handle = a.acquire(&OrgId::new("acme")?).await?;
    let again = handle
        .effect("pay", effect::Options::new(), || async {
            Ok(b"twice".to_vec())
        })
        .await;
    assert!(
        again
            .as_ref()
            .is_err_and(|e| is_idem(e, |e| matches!(e, idem::Error::EffectAmbiguous { .. }))),
        "{again:?}"
    );
    let row = handle
        .resolve("pay", Resolution::Executed(result), "ops")
        .await?;
    assert_eq!(row.state, State::Committed);
    assert_eq!(remote.charges("pay"), 1);
    a.shutdown().await;
    Ok(())
}
