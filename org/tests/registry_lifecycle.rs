//! The registry's lifecycle against concurrent requests: an eviction in progress is never
//! fenced by the same process's next acquire of that org, and `shutdown` releases an org
//! that was still opening when it began.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::{R, effect, registry, replica};
use idem_org::RegistrySettings;
use idem_replica::{FailPoint, Failpoints, OrgId};
use object_store::memory::InMemory;
use tokio::sync::{Mutex, mpsc, oneshot};

/// Holds the first hit of `hold` for org `org` until released, and reports every later
/// hit of `watch` for that org.
#[derive(Debug)]
struct Hooks {
    org: &'static str,
    hold: FailPoint,
    armed: AtomicBool,
    held: Mutex<Option<(oneshot::Sender<()>, oneshot::Receiver<()>)>>,
    watch: FailPoint,
    seen: mpsc::UnboundedSender<FailPoint>,
}

#[async_trait::async_trait]
impl Failpoints for Hooks {
    async fn hit(&self, point: FailPoint, org: &OrgId) -> Result<(), String> {
        if org.as_str() != self.org {
            return Ok(());
        }
        if point == self.watch {
            let _ = self.seen.send(point);
        }
        if point == self.hold && self.armed.swap(false, Ordering::SeqCst) {
            let pair = self.held.lock().await.take();
            if let Some((reached, resume)) = pair {
                let _ = reached.send(());
                let _ = resume.await;
            }
        }
        Ok(())
    }
}

fn hooks(
    org: &'static str,
    hold: FailPoint,
    watch: FailPoint,
) -> (
    Arc<Hooks>,
    oneshot::Receiver<()>,
    oneshot::Sender<()>,
    mpsc::UnboundedReceiver<FailPoint>,
) {
    let (reached_tx, reached) = oneshot::channel();
    let (resume, resume_rx) = oneshot::channel();
    let (seen, seen_rx) = mpsc::unbounded_channel();
    let h = Arc::new(Hooks {
        org,
        hold,
        armed: AtomicBool::new(false),
        held: Mutex::new(Some((reached_tx, resume_rx))),
        watch,
        seen,
    });
    (h, reached, resume, seen_rx)
}

/// Regression: eviction removed the org from the registry before its release finished, so
/// a concurrent acquire of it claimed the next round over the release's final ship and
/// fenced the process's own writer (requests then failed `Fenced`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_waits_for_the_eviction_of_that_org_instead_of_fencing_it() -> R {
    let dir = tempfile::tempdir()?;
    let (h, reached, resume, mut claims) = hooks(
        "a",
        FailPoint::ReleaseBeforePublish,
        FailPoint::ClaimBeforePublish,
    );
    let reg = registry(
        dir.path(),
        replica(Arc::new(InMemory::new()), Some(h.clone())).await?,
        "A",
        RegistrySettings {
            max_open_orgs: 1,
            ..RegistrySettings::default()
        },
    )?;
    let (a, b) = (OrgId::new("a")?, OrgId::new("b")?);
    reg.once(&a, "k1", effect("a", "k1")).await?;
    assert_eq!(claims.recv().await, Some(FailPoint::ClaimBeforePublish));
    h.armed.store(true, Ordering::SeqCst);
    // Opening b evicts a; a's release is held before its Release entry.
    let open_b = tokio::spawn({
        let (reg, b) = (reg.clone(), b.clone());
        async move { reg.once(&b, "k1", effect("b", "k1")).await }
    });
    reached.await?;
    let again = tokio::spawn({
        let (reg, a) = (reg.clone(), a.clone());
        async move { reg.once(&a, "k2", effect("a", "k2")).await }
    });
    // While a's release is held, no new claim of a may start (it would fence the release).
    let early = tokio::time::timeout(std::time::Duration::from_millis(500), claims.recv()).await;
    assert!(early.is_err(), "a was claimed again over its own release");
    let _ = resume.send(());
    assert!(open_b.await??.applied);
    assert!(again.await??.applied, "k2 runs once, on the next round");
    let log = reg.replica().history(&a).await?;
    let kinds: Vec<&str> = log.iter().map(|e| e.kind_name()).collect();
    let release = kinds
        .iter()
        .position(|k| *k == "release")
        .ok_or("no release")?;
    assert_eq!(
        kinds
            .iter()
            .skip(release)
            .filter(|k| **k == "claim")
            .count(),
        1,
        "the next claim comes after the release: {kinds:?}"
    );
    reg.shutdown().await;
    Ok(())
}

/// Regression: `shutdown` skipped an org still opening (claim published, hydrate running),
/// which then served on, kept its lease and was never released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_an_org_that_was_still_opening() -> R {
    let dir = tempfile::tempdir()?;
    let (h, reached, resume, _claims) = hooks(
        "acme",
        FailPoint::ClaimAfterPublish,
        FailPoint::ReleaseBeforePublish,
    );
    h.armed.store(true, Ordering::SeqCst);
    let reg = registry(
        dir.path(),
        replica(Arc::new(InMemory::new()), Some(h.clone())).await?,
        "A",
        RegistrySettings::default(),
    )?;
    let acme = OrgId::new("acme")?;
    let request = tokio::spawn({
        let (reg, acme) = (reg.clone(), acme.clone());
        async move { reg.once(&acme, "k", effect("acme", "k")).await }
    });
    reached.await?; // the claim is published; the org is still opening
    let shutdown = tokio::spawn({
        let reg = reg.clone();
        async move { reg.shutdown().await }
    });
    let _ = resume.send(());
    let released = shutdown.await?;
    assert_eq!(released.len(), 1, "{released:?}");
    assert!(
        released.iter().all(|(o, r)| *o == acme && r.is_ok()),
        "{released:?}"
    );
    // The request either ran before the release (and shipped) or was refused: never both
    // unshipped and acknowledged.
    let _ = request.await?;
    let log = reg.replica().history(&acme).await?;
    assert_eq!(log.last().map(|e| e.kind_name()), Some("release"));
    let after = reg
        .acquire(&acme)
        .await
        .err()
        .ok_or("acquired after shutdown")?;
    assert!(
        matches!(after, idem_org::Error::ShuttingDown { .. }),
        "{after:?}"
    );
    Ok(())
}

/// An org released while the registry still maps it (an explicit `Org::release`, or J7's
/// release of a lagging journal org racing the shutdown) is released once: a second
/// `release` answers Ok, so `shutdown` reports every org released and retires the process
/// lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_org_released_before_shutdown_is_reported_released() -> R {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(InMemory::new());
    let reg = registry(
        dir.path(),
        replica(store.clone(), None).await?,
        "A",
        RegistrySettings::default(),
    )?;
    let acme = OrgId::new("acme")?;
    let org = reg.acquire(&acme).await?;
    assert!(org.once("k", effect("acme", "k")).await?.applied);
    org.release().await?;
    org.release().await?;
    let released = reg.shutdown().await;
    assert!(released.iter().all(|(_, r)| r.is_ok()), "{released:?}");
    let leases = reg.replica().process_leases().await?;
    assert!(
        leases.is_empty(),
        "the process lease is retired: {leases:?}"
    );
    Ok(())
}
