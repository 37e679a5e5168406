//! Every answer that depends on stored state waits for the same confirmation as a replay
//! (I6, I7), an active writer keeps its lease, and writer ids cannot collide.
//!
//! Regression (I6, I7): a fenced writer answered 422
//! "applied with a different request fingerprint" from a commit its failed ship never
//! published, while its successor went on to apply the other payload; a single writer
//! answered 422 from a commit whose ship then failed, or 4 ms before it was published; a
//! writer serving only replays let its lease lapse; and two processes configured with one
//! writer id took orgs from each other because a lease "of the same writer" never blocked.

mod common;

use std::sync::Arc;

use common::{BoxErr, R, effect, force, registry, replica};
use idem::Options;
use idem_org::{Error, ErrorKind, Registry, RegistrySettings};
use idem_replica::fault::{Fault, FaultStore, Op};
use object_store::ObjectStore;
use object_store::memory::InMemory;

fn with(fingerprint: &str) -> Options {
    Options::new().fingerprint(fingerprint.as_bytes().to_vec())
}

/// Refuses every create of a log entry: each ship fails, nothing is published.
fn refuse_log_writes(store: &FaultStore) {
    store.inject_times(Op::Put, "/log/", 1, u64::MAX, Fault::FailBefore);
}

async fn faulty(
    dir: &std::path::Path,
    inner: Arc<dyn ObjectStore>,
) -> Result<(Arc<FaultStore>, Registry), BoxErr> {
    let store = Arc::new(FaultStore::new(inner));
    let reg = registry(
        dir,
        replica(store.clone(), None).await?,
        "A",
        RegistrySettings::default(),
    )?;
    Ok((store, reg))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_writer_never_answers_422_from_an_unshipped_commit() -> R {
    let dir = tempfile::tempdir()?;
    let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let (store, a) = faulty(&dir.path().join("a"), inner.clone()).await?;
    let org_a = a.acquire(&idem_replica::OrgId::new("o")?).await?;
    org_a.once("k0", effect("o", "k0")).await?;
    refuse_log_writes(&store);
    let first = org_a.once_with("K", with("a"), effect("o", "K")).await;
    let Err(e) = first else {
        return Err("a ship the store refused acknowledged K".into());
    };
    assert_eq!(e.kind(), ErrorKind::Retry, "{e}");
    assert!(
        format!("{:?}", e).contains("StoreRefused"),
        "a refused write is named for what it is, not fencing: {e:?}"
    );
    store.clear();
    // A successor claims (the lease would lapse; force stands in for the wait).
    let b = registry(
        &dir.path().join("b"),
        replica(inner.clone(), None).await?,
        "B",
        force(),
    )?;
    let org_b = b.acquire(&idem_replica::OrgId::new("o")?).await?;
    // The payload B will apply, sent to A first: A must not refuse it from `a`, which only
    // its local file holds.
    let on_a = org_a.once_with("K", with("b"), effect("o", "K")).await;
    match on_a {
        Err(Error::Fenced { .. }) => {}
        other => return Err(format!("fenced writer answered {other:?}").into()),
    }
    let on_b = org_b.once_with("K", with("b"), effect("o", "K")).await?;
    assert!(on_b.applied, "the store never held `a`: B applies `b`");
    b.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_waits_for_the_ship_of_the_commit_it_reads() -> R {
    let dir = tempfile::tempdir()?;
    let (store, a) = faulty(dir.path(), Arc::new(InMemory::new())).await?;
    let org = a.acquire(&idem_replica::OrgId::new("o")?).await?;
    org.once("k0", effect("o", "k0")).await?;
    refuse_log_writes(&store);
    assert!(
        org.once_with("K", with("a"), effect("o", "K"))
            .await
            .is_err()
    );
    // While `a` is unshipped, a changed payload is not refused: it is retryable.
    let e = org
        .once_with("K", with("b"), effect("o", "K"))
        .await
        .err()
        .ok_or("K with `b` acknowledged")?;
    assert_eq!(e.kind(), ErrorKind::Retry, "{e}");
    let e = org.applied("K").await.err().ok_or("applied(K) answered")?;
    assert_eq!(e.kind(), ErrorKind::Retry, "{e}");
    store.clear();
    // Once `a` ships, the refusal is final and `a` replays.
    let e = org
        .once_with("K", with("b"), effect("o", "K"))
        .await
        .err()
        .ok_or("K with `b` acknowledged after `a`")?;
    assert_eq!(e.kind(), ErrorKind::Rejected, "{e}");
    let replay = org.once_with("K", with("a"), effect("o", "K")).await?;
    assert!(!replay.applied);
    a.shutdown().await;
    Ok(())
}

/// Polls `fut` exactly once: `Some` if it finished.
async fn poll_once<F: std::future::Future + Unpin>(fut: &mut F) -> Option<F::Output> {
    tokio::select! {
        biased;
        out = fut => Some(out),
        () = std::future::ready(()) => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_is_not_answered_before_the_conflicting_commit_is_published() -> R {
    let dir = tempfile::tempdir()?;
    let (store, a) = faulty(dir.path(), Arc::new(InMemory::new())).await?;
    let org = a.acquire(&idem_replica::OrgId::new("o")?).await?;
    org.once("k0", effect("o", "k0")).await?;
    // `a` commits; its ship is held at the publish of its log entry.
    let paused = store.pause_next(Op::Put, "/log/");
    let first = tokio::spawn({
        let org = org.clone();
        async move { org.once_with("K", with("a"), effect("o", "K")).await }
    });
    paused.reached.await?;
    // `b` reaches the writer, which finds `a` committed with another fingerprint.
    let second = org.once_with("K", with("b"), effect("o", "K"));
    let mut second = Box::pin(second);
    assert!(
        poll_once(&mut second).await.is_none(),
        "answered before `a` was even read"
    );
    // A read queued behind `b` runs on the writer thread after `b`'s job has replied.
    let (ran_tx, ran_rx) = tokio::sync::oneshot::channel();
    let probe = tokio::spawn({
        let org = org.clone();
        async move {
            org.read(move |_| {
                let _ = ran_tx.send(());
                Ok(())
            })
            .await
        }
    });
    ran_rx.await?;
    // `b`'s reply is ready; one poll shows whether it is answered before `a` is published.
    if let Some(out) = poll_once(&mut second).await {
        return Err(format!("answered {out:?} while the commit of `a` was unpublished").into());
    }
    let _ = paused.resume.send(());
    first.await??;
    let e = second.await.err().ok_or("`b` acknowledged")?;
    assert_eq!(e.kind(), ErrorKind::Rejected, "{e}");
    probe.await??;
    a.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_with_one_writer_id_do_not_fence_each_other() -> R {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    // Two processes (each opens its own Replica: its own instance), one configured id,
    // each in its own data directory.
    let p1 = registry(
        &dir.path().join("p1"),
        replica(store.clone(), None).await?,
        "idem",
        RegistrySettings::default(),
    )?;
    let p2 = registry(
        &dir.path().join("p2"),
        replica(store.clone(), None).await?,
        "idem",
        RegistrySettings::default(),
    )?;
    let org1 = p1.acquire(&idem_replica::OrgId::new("o")?).await?;
    org1.once("k1", effect("o", "k1")).await?;
    match p2.acquire(&idem_replica::OrgId::new("o")?).await {
        Err(e) if format!("{e:?}").contains("LeaseHeld") => {}
        other => return Err(format!("the second process took the org: {other:?}").into()),
    }
    assert!(org1.once("k2", effect("o", "k2")).await?.applied);
    p1.shutdown().await;
    // After a release the other process claims at once.
    let org2 = p2.acquire(&idem_replica::OrgId::new("o")?).await?;
    assert!(!org2.once("k1", effect("o", "k1")).await?.applied);
    p2.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_in_the_same_data_directory_waits_for_the_first() -> R {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let data = dir.path().join("data");
    let old = registry(
        &data,
        replica(store.clone(), None).await?,
        "w",
        RegistrySettings::default(),
    )?;
    old.acquire(&idem_replica::OrgId::new("o")?)
        .await?
        .once("k", effect("o", "k"))
        .await?;
    // While the old process lives (it holds the data directory's lock), a new one with the
    // same id and directory respects its lease.
    let new = registry(
        &data,
        replica(store.clone(), None).await?,
        "w",
        RegistrySettings::default(),
    )?;
    match new.acquire(&idem_replica::OrgId::new("o")?).await {
        Err(e) if format!("{e:?}").contains("LeaseHeld") => {}
        other => return Err(format!("claimed from a live process: {other:?}").into()),
    }
    // The old process's death (its data directory lock freed) is shown with real processes
    // in `tests/serve_http.rs` (kill -9, restart, first request acknowledged at once); here
    // it releases.
    old.shutdown().await;
    let org = new.acquire(&idem_replica::OrgId::new("o")?).await?;
    assert!(!org.once("k", effect("o", "k")).await?.applied);
    new.shutdown().await;
    Ok(())
}

/// Regression (I5, I6): a failed attempt is counted in a commit that did not bump the commit
/// counter, so "attempts exhausted" was answered from a count the store never held; a
/// successor would have run the key again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_exhausted_is_answered_only_once_the_count_is_shipped() -> R {
    let dir = tempfile::tempdir()?;
    let (store, a) = faulty(dir.path(), Arc::new(InMemory::new())).await?;
    let org = a.acquire(&idem_replica::OrgId::new("o")?).await?;
    org.once("k0", effect("o", "k0")).await?;
    refuse_log_writes(&store);
    let once = Options::new().max_attempts(1);
    let failing = |_tx: &rusqlite::Transaction<'_>| Err::<Vec<u8>, _>("declined");
    let e = org
        .once_with("K", once.clone(), failing)
        .await
        .err()
        .ok_or("K applied")?;
    assert_eq!(
        e.kind(),
        ErrorKind::Retry,
        "the failed attempt's count is not shipped: {e}"
    );
    let e = org
        .once_with("K", once.clone(), failing)
        .await
        .err()
        .ok_or("K applied")?;
    assert_eq!(
        e.kind(),
        ErrorKind::Retry,
        "exhausted only once the count ships: {e}"
    );
    store.clear();
    let e = org
        .once_with("K", once, failing)
        .await
        .err()
        .ok_or("K applied")?;
    assert_eq!(e.kind(), ErrorKind::Rejected, "{e}");
    a.shutdown().await;
    Ok(())
}

/// Regression (I6, I7): a read whose query failed ("no such row") was answered at once, even
/// by a fenced writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_writer_answers_no_read_error_either() -> R {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let a = registry(
        &dir.path().join("a"),
        replica(store.clone(), None).await?,
        "A",
        RegistrySettings::default(),
    )?;
    let org_a = a.acquire(&idem_replica::OrgId::new("o")?).await?;
    org_a.once("k0", effect("o", "k0")).await?;
    let b = registry(
        &dir.path().join("b"),
        replica(store.clone(), None).await?,
        "B",
        force(),
    )?;
    b.acquire(&idem_replica::OrgId::new("o")?)
        .await?
        .once("k1", effect("o", "k1"))
        .await?;
    let got = org_a
        .read(|c| {
            c.query_row("SELECT key FROM effects WHERE key = 'k1'", [], |r| {
                r.get::<_, String>(0)
            })
        })
        .await;
    assert!(matches!(got, Err(Error::Fenced { .. })), "{got:?}");
    b.shutdown().await;
    Ok(())
}
