//! A claim that downloads its hydrate beside its own requests (`Replica::claim_to_hydrate`)
//! must install nothing it downloaded before losing (I7, I8, I10). Guards against a fused
//! claim whose PUT collides with another claimant's, or whose successor check finds a newer
//! entry above it, installing the image it downloaded from the log it listed first: that
//! image misses what the other writer published, so a hydrate of it would drop acknowledged
//! state. Another claimant is interposed at the exact step (before the claim's PUT reaches
//! the store, or after it landed and before its successor check), not raced by timing.

mod common;

use std::sync::Arc;

use common::interpose::{Hook, Interpose};
use common::{R, memory};
use idem_replica::conformance::test_snapshot;
use idem_replica::{Error, OrgId, Replica, Settings};

/// When the interposed claimant runs, relative to the first log PUT through the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum When {
    /// Before the PUT reaches the store: it takes the slot, the PUT collides.
    BeforePut,
    /// After the PUT landed: it claims above, the successor check finds it.
    AfterPut,
}

/// An org whose first holder shipped commit 5 and released it; then a store over it that
/// lets a third writer claim (by force) and ship commit 9 at `when`.
async fn interposed(when: When) -> R<Arc<Interpose>> {
    let raw = memory();
    let org = OrgId::new("acme")?;
    let a = Replica::open(raw.clone(), "", Settings::default()).await?;
    let mut claim = a.claim(&org, "a", false).await?;
    a.ship(&mut claim, test_snapshot(5)?).await?;
    a.release(&mut claim).await?;
    let c_store = raw.clone();
    let hook: Hook = Box::pin(async move {
        let run = async {
            let c = Replica::open(c_store, "", Settings::default()).await?;
            let org = OrgId::new("acme")?;
            let mut claim = c.claim(&org, "c", true).await?;
            c.ship(&mut claim, test_snapshot(9)?).await?;
            Ok::<_, Error>(())
        };
        if let Err(e) = run.await {
            panic!("the interposed writer failed: {e}");
        }
    });
    let store = Interpose::new(raw);
    match when {
        When::BeforePut => store.before_put("/log/", hook),
        When::AfterPut => store.after_put("/log/", hook),
    }
    Ok(store)
}

/// With no retry, the claim that lost answers `Contended` and leaves nothing on disk.
async fn lost_claim_installs_nothing(when: When) -> R {
    let store = interposed(when).await?;
    let settings = Settings {
        claim_retries: 0,
        ..Settings::default()
    };
    let b = Replica::open(store, "", settings).await?;
    let org = OrgId::new("acme")?;
    let dir = tempfile::tempdir()?;
    let claimed = b.claim_to_hydrate(&org, "b", None, true).await;
    assert!(
        matches!(claimed, Err(Error::Contended { .. })),
        "{when:?}: {claimed:?}"
    );
    assert_eq!(std::fs::read_dir(dir.path())?.count(), 0, "{when:?}");
    Ok(())
}

/// Retried, the claim hydrates what the other writer published, not the image it
/// downloaded from its first listing.
async fn retried_claim_installs_the_newer_state(when: When) -> R {
    let store = interposed(when).await?;
    let b = Replica::open(store, "", Settings::default()).await?;
    let org = OrgId::new("acme")?;
    let dir = tempfile::tempdir()?;
    let mut claim = b.claim_to_hydrate(&org, "b", None, true).await?;
    let hydrated = b.hydrate(&mut claim, &dir.path().join("db")).await?;
    assert_eq!(hydrated.commit, 9, "{when:?}: {hydrated:?}");
    let conn = rusqlite::Connection::open(dir.path().join("db"))?;
    let rows: i64 = conn.query_row("SELECT count(*) FROM t", [], |r| r.get(0))?;
    assert_eq!(rows, 9, "{when:?}");
    Ok(())
}

#[tokio::test]
async fn a_prefetching_claim_whose_put_collides_installs_nothing() -> R {
    lost_claim_installs_nothing(When::BeforePut).await
}

#[tokio::test]
async fn a_prefetching_claim_that_finds_a_successor_installs_nothing() -> R {
    lost_claim_installs_nothing(When::AfterPut).await
}

#[tokio::test]
async fn a_prefetching_claim_that_collided_hydrates_the_winners_state() -> R {
    retried_claim_installs_the_newer_state(When::BeforePut).await
}

#[tokio::test]
async fn a_prefetching_claim_below_a_successor_hydrates_the_successors_state() -> R {
    retried_claim_installs_the_newer_state(When::AfterPut).await
}
