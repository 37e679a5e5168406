//! External effects on an org: each transition is acknowledged only after a ship, so a
//! handoff between reserve and execute never lets the successor execute again.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use common::{R, force, registry, replica};
use idem::effect::{self, Resolution};
use idem_org::{Error, RegistrySettings};
use object_store::memory::InMemory;

#[derive(Debug)]
struct At(AtomicU64);
impl idem::Clock for At {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }

    fn monotonic_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// The state of `key` in the newest published snapshot of `org`.
async fn published_state(
    replica: &idem_replica::Replica,
    org: &str,
    key: &str,
    dir: &std::path::Path,
) -> Result<Option<String>, common::BoxErr> {
    let dest = dir.join(format!("check-{key}.db"));
    let _ = std::fs::remove_file(&dest);
    replica
        .restore(&idem_replica::OrgId::new(org)?, None, &dest)
        .await?;
    let conn = rusqlite::Connection::open(&dest)?;
    Ok(idem::effect::get(&conn, key)?.map(|e| e.state.to_string()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_effect_runs_once_and_its_settlement_is_shipped_before_the_ack() -> R {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(InMemory::new());
    let a = registry(
        &dir.path().join("a"),
        replica(store, None).await?,
        "A",
        RegistrySettings::default(),
    )?;
    let acme = a.acquire(&idem_replica::OrgId::new("acme")?).await?;
    let runs = Arc::new(AtomicUsize::new(0));
    for _ in 0..2 {
        let runs = runs.clone();
        let out = acme
            .effect("mail-1", effect::Options::new(), move || async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok(b"sent".to_vec())
            })
            .await?;
        assert_eq!(out.result, b"sent");
        assert_eq!(
            published_state(a.replica(), "acme", "mail-1", dir.path()).await?,
            Some("committed".into()),
            "acknowledged only once the settlement is in the store"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let out = acme
        .effect_blocking("mail-2", effect::Options::new(), || {
            Err(effect::Error::not_executed("smtp refused"))
        })
        .await;
    assert!(
        matches!(&out, Err(Error::Idem { source, .. })
            if matches!(**source, idem::Error::EffectNotExecuted { .. })),
        "{out:?}"
    );
    let out = acme
        .effect_blocking("mail-2", effect::Options::new(), || Ok(b"retried".to_vec()))
        .await?;
    assert!(out.executed, "a FAILED key runs again");

    let out = acme
        .effect("mail-3", effect::Options::new(), || async {
            Err(effect::Error::ambiguous("timeout"))
        })
        .await;
    assert!(out.is_err());
    assert_eq!(acme.effects(Some(effect::State::Ambiguous)).await?.len(), 1);
    let row = acme
        .resolve("mail-3", Resolution::NotExecuted, "ops")
        .await?;
    assert_eq!(row.state, effect::State::Failed);
    assert_eq!(
        published_state(a.replica(), "acme", "mail-3", dir.path()).await?,
        Some("failed".into())
    );
    a.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_between_reserve_and_settle_never_executes_twice() -> R {
    // Guards: a reservation acknowledged before it is shipped would let the successor, which
    // hydrates only shipped state, find the key free and execute it a second time.
    let dir = tempfile::tempdir()?;
    let store = Arc::new(InMemory::new());
    let a = registry(
        &dir.path().join("a"),
        replica(store.clone(), None).await?,
        "A",
        RegistrySettings::default(),
    )?;
    let org_a = a.acquire(&idem_replica::OrgId::new("acme")?).await?;
    let runs = Arc::new(AtomicUsize::new(0));
    let (running_tx, running_rx) = tokio::sync::oneshot::channel();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let attempt = [1u8; 16];
    let task = {
        let (org_a, runs) = (org_a.clone(), runs.clone());
        tokio::spawn(async move {
            let opts = effect::Options::new().lease_ms(60_000).attempt_id(attempt);
            org_a
                .effect("charge-1", opts, move || async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    let _ = running_tx.send(());
                    let _ = go_rx.await;
                    Ok(b"charged".to_vec())
                })
                .await
        })
    };
    running_rx.await?; // A's reservation is acknowledged and its executor is running

    // A rolling deploy: B claims (which fences A) and hydrates what A shipped.
    let b = registry(
        &dir.path().join("b"),
        replica(store.clone(), None).await?,
        "B",
        force(),
    )?;
    let org_b = b.acquire(&idem_replica::OrgId::new("acme")?).await?;
    let row = org_b
        .effect_record("charge-1")
        .await?
        .ok_or("B does not see A's reservation")?;
    assert_eq!(row.state, effect::State::Reserved);
    assert_eq!(row.attempt, attempt.to_vec(), "A's attempt");

    let b_runs = Arc::new(AtomicUsize::new(0));
    let try_b = |at: u64| {
        let b_runs = b_runs.clone();
        let opts = effect::Options::new()
            .lease_ms(60_000)
            .clock(Arc::new(At(AtomicU64::new(at))));
        let org_b = org_b.clone();
        async move {
            org_b
                .effect("charge-1", opts, move || async move {
                    b_runs.fetch_add(1, Ordering::SeqCst);
                    Ok(b"again".to_vec())
                })
                .await
        }
    };
    let err = try_b(row.created_ms + 1)
        .await
        .err()
        .ok_or("B executed during A's lease")?;
    assert!(
        matches!(&err, Error::Idem { source, .. }
            if matches!(**source, idem::Error::EffectInProgress { .. })),
        "{err:?}"
    );
    // A's own stamp is A's clock: B never compares it with its own (I15). B judges by its
    // observation — a whole lease term after its own claim, on its own clock — which is never
    // earlier than A's deadline, since the reservation was published before B's claim.
    let err = try_b(row.lease_until_ms)
        .await
        .err()
        .ok_or("B executed at A's stamp")?;
    assert!(
        matches!(&err, Error::Idem { source, .. }
            if matches!(**source, idem::Error::EffectInProgress { .. })),
        "B trusted A's clock: {err:?}"
    );
    let term_after_claim = idem::Clock::now_ms(&idem::SystemClock) + 60_000;
    for _ in 0..2 {
        let err = try_b(term_after_claim)
            .await
            .err()
            .ok_or("B executed after A's lease lapsed")?;
        assert!(
            matches!(&err, Error::Idem { source, .. }
                if matches!(**source, idem::Error::EffectAmbiguous { .. })),
            "{err:?}"
        );
    }

    // A's executor finishes; its settlement is never acknowledged (A is fenced), and A's
    // caller gets the result it could not record (issue 30), with the fence as the cause.
    let _ = go_tx.send(());
    let a_out = task.await?;
    match &a_out {
        Err(Error::EffectUnacknowledged { result, source, .. }) => {
            assert_eq!(result.as_bytes(), b"charged");
            assert!(matches!(**source, Error::Fenced { .. }), "{source:?}");
        }
        other => panic!("fenced A acknowledged or lost its result: {other:?}"),
    }
    assert_eq!(
        a_out.as_ref().err().map(Error::kind),
        Some(idem_org::ErrorKind::Reacquire)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(b_runs.load(Ordering::SeqCst), 0, "never a second execution");
    let row = org_b.effect_record("charge-1").await?.ok_or("row gone")?;
    assert_eq!(row.state, effect::State::Ambiguous);
    b.shutdown().await;
    a.shutdown().await;
    Ok(())
}
