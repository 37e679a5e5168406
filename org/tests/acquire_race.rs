//! Regression: a failed first acquire must not orphan the writer a concurrent acquire opens.
//!
//! Failure guarded against: acquire #1's claim fails while acquire #2 waits on the same slot;
//! #1 removed the slot, #2 then opened a writer in the orphaned slot, and acquire #3 claimed a
//! new round with the same writer id, fencing #2's live handle (a replica fencing itself).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::{R, registry, replica};
use idem_org::RegistrySettings;
use idem_replica::{FailPoint, Failpoints, OrgId};
use object_store::memory::InMemory;
use tokio::sync::{Mutex, oneshot};

/// Pauses the first claim before it publishes, then fails it; later claims pass.
#[derive(Debug, Default)]
struct FailFirstClaim {
    used: AtomicBool,
    reached: Mutex<Option<oneshot::Sender<()>>>,
    resume: Mutex<Option<oneshot::Receiver<()>>>,
}

#[async_trait::async_trait]
impl Failpoints for FailFirstClaim {
    async fn hit(&self, point: FailPoint, _org: &OrgId) -> Result<(), String> {
        if point != FailPoint::ClaimBeforePublish || self.used.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        if let Some(tx) = self.reached.lock().await.take() {
            let _ = tx.send(());
        }
        if let Some(rx) = self.resume.lock().await.take() {
            let _ = rx.await;
        }
        Err("injected claim failure".into())
    }
}

// current_thread: spawned tasks run in FIFO order on one thread, so "acquire #2 is waiting on
// the slot" holds once #1 is paused and the test task has yielded.
#[tokio::test(flavor = "current_thread")]
async fn a_failed_first_acquire_does_not_orphan_the_concurrent_one() -> R {
    let dir = tempfile::tempdir()?;
    let fp = Arc::new(FailFirstClaim::default());
    let (reached_tx, reached) = oneshot::channel();
    let (resume, resume_rx) = oneshot::channel();
    *fp.reached.lock().await = Some(reached_tx);
    *fp.resume.lock().await = Some(resume_rx);
    let reg = registry(
        dir.path(),
        replica(Arc::new(InMemory::new()), Some(fp.clone())).await?,
        "A",
        RegistrySettings::default(),
    )?;
    let (r1, r2) = (reg.clone(), reg.clone());
    let acme = idem_replica::OrgId::new("acme")?;
    let (a1, a2) = (acme.clone(), acme);
    let first = tokio::spawn(async move { r1.acquire(&a1).await });
    reached.await?;
    let second = tokio::spawn(async move { r2.acquire(&a2).await });
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let _ = resume.send(());
    assert!(
        first.await?.is_err(),
        "the first claim was failed on purpose"
    );
    let org = second.await??;
    let again = reg.acquire(&idem_replica::OrgId::new("acme")?).await?;
    assert_eq!(
        again.round(),
        org.round(),
        "a second writer was claimed for the org"
    );
    assert!(org.is_serving());
    org.once("k", common::effect("acme", "k")).await?;
    reg.shutdown().await;
    Ok(())
}
