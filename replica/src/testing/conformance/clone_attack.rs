//! Attacks on clones by reference (`docs/clone-attack.md`): each case is a deterministic
//! schedule (failpoints and fault rules, no sleeps) that breaks, or guards, one claim of
//! `docs/design.md` 2e.

use std::sync::Arc;

use idem_base::SystemClock;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use super::clone::{BoxError, newest, newest_only, small_segments};
use super::db::{Db, diff};
use super::{CaseResult, org, prefix};
use crate::testing::fault::{Fault, FaultStore, Op, PauseAt};
use crate::{CloneOutcome, Error, FailPoint, Replica, Settings, Snapshot};

async fn open(
    store: Arc<dyn ObjectStore>,
    failpoints: Option<Arc<dyn crate::Failpoints>>,
) -> Result<Replica, Error> {
    Replica::open_with(
        store,
        &prefix()?,
        small_segments(),
        Arc::new(SystemClock),
        failpoints,
    )
    .await
}

async fn exists(r: &Replica, path: &object_store::path::Path) -> Result<bool, Error> {
    match r.inner.store.object.head(path).await {
        Ok(_) => Ok(true),
        Err(object_store::Error::NotFound { .. }) => Ok(false),
        Err(e) => Err(Error::store("head", path, e)),
    }
}

/// A 60-row database (about 25 pages of 1 KiB).
fn sixty_rows() -> Result<Db, BoxError> {
    let db = Db::new()?;
    db.exec("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i < 60) INSERT INTO t SELECT i, randomblob(300) FROM n")?;
    Ok(db)
}

/// ATK-1. A clone publishes one entry, the position's image: a store that keeps refusing
/// that entry's create fails the clone and leaves DST without any state (never SRC's
/// older snapshot S, which an earlier build of the clone published before a delta to the
/// position); the same clone into another org then succeeds.
pub(super) async fn atk_a_clone_whose_entry_never_lands_leaves_no_state(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let faults = Arc::new(FaultStore::new(store));
    let r = open(faults.clone(), None).await?;
    let (acme, beta) = (org("acme"), org("beta"));
    let mut db = sixty_rows()?;
    let first = db.image()?;
    let mut claim = r.claim(&acme, "a", false).await?;
    r.ship(&mut claim, Snapshot::from_bytes(first.clone(), 1))
        .await?;
    db.exec("UPDATE t SET v = randomblob(300) WHERE id <= 5")?;
    let at_p = db.image()?;
    let p = r.ship_delta(&mut claim, diff(&first, &at_p, 2)?).await?;
    r.release(&mut claim).await?;
    // beta: its claim at 1, the clone's one entry at 2.
    faults.inject_times(
        Op::Put,
        "/orgs/beta/log/00000000000000000002",
        1,
        50,
        Fault::FailBefore,
    );
    let mut c = r.claim(&beta, "cloner", false).await?;
    let got = r.clone_into(&mut c, &acme, Some(p.seq)).await;
    faults.clear();
    let _ = r.release(&mut c).await;
    assert!(
        got.is_err(),
        "the clone answered {got:?} with its entry refused"
    );
    assert!(
        r.history(&beta)
            .await?
            .iter()
            .all(|e| !e.is_snapshot() && !e.is_delta()),
        "a failed clone left beta a state"
    );
    assert!(newest(&r, &beta).await.is_err(), "beta restores a state");
    // A refused create may still land, so its reference stays (it only keeps segments).
    let gamma = org("gamma");
    let mut c = r.claim(&gamma, "cloner", false).await?;
    let again = r.clone_into(&mut c, &acme, Some(p.seq)).await?;
    r.release(&mut c).await?;
    assert!(matches!(again, CloneOutcome::Shared(_)));
    assert!(newest(&r, &gamma).await? == at_p);
    Ok(())
}

/// ATK-2. A clone fenced at its snapshot's publish (DST claimed with force while the clone
/// ran): nothing names SRC's segments, yet the clone reference stays, so SRC's retention
/// keeps the snapshot's segments for ever (nothing will ever release it: DST's retention
/// only releases origins its deleted snapshots named).
pub(super) async fn atk_a_fenced_clone_leaves_no_reference(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let pause = PauseAt::new(FailPoint::CloneAfterReferences);
    let fp: Arc<dyn crate::Failpoints> = pause.clone();
    let r = open(store, Some(fp)).await?;
    let (acme, beta) = (org("acme"), org("beta"));
    let mut db = sixty_rows()?;
    let mut claim = r.claim(&acme, "a", false).await?;
    let s1 = r
        .ship(&mut claim, Snapshot::from_bytes(db.image()?, 1))
        .await?;
    let handle = pause.arm().await;
    let cloner = {
        let (r, acme, beta) = (r.clone(), acme.clone(), beta.clone());
        tokio::spawn(async move {
            let mut c = r.claim(&beta, "cloner", false).await?;
            let got = r.clone_into(&mut c, &acme, Some(s1.seq)).await;
            let _ = r.release(&mut c).await;
            got
        })
    };
    handle.reached.await?;
    // A server takes beta over (a forced claim): the clone is now a zombie.
    let mut server = r.claim(&beta, "server", true).await?;
    let _ = handle.resume.send(());
    let got = cloner.await?;
    assert!(
        matches!(got, Err(Error::Fenced { .. })),
        "the fenced clone answered {got:?}"
    );
    r.release(&mut server).await?;
    assert!(
        r.history(&beta).await?.iter().all(|e| !e.is_snapshot()),
        "the fenced clone published"
    );
    // acme moves on and retires s1: with no clone naming them, its segments must go.
    db.exec("UPDATE t SET v = randomblob(300)")?;
    r.ship(&mut claim, Snapshot::from_bytes(db.image()?, 2))
        .await?;
    r.release(&mut claim).await?;
    r.retain(&acme, &newest_only()).await?;
    let reference = r.inner.store.layout.clone_ref(&acme, &beta);
    assert!(
        !exists(&r, &reference).await?,
        "a clone fenced before it published left its reference: acme keeps s1's segments for ever"
    );
    Ok(())
}

/// ATK-3. Two clones into the same DST through the library: the first (round 1) pauses
/// after its reference landed; the second takes DST with a forced claim (round 2, a fresh
/// claim that `clone_into` accepts) and publishes. SRC's retention retires the first
/// clone's snapshot, so the first clone finds it gone and deletes "its" reference, which
/// is the same object as the second clone's (`refs/<dst>.json`). SRC's retention then
/// deletes the segments the published clone names: DST no longer restores.
pub(super) async fn atk_a_zombie_clone_deletes_the_reference_of_the_clone_that_fenced_it(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let pause = PauseAt::new(FailPoint::CloneAfterReferences);
    let fp: Arc<dyn crate::Failpoints> = pause.clone();
    let r = open(store, Some(fp)).await?;
    let (acme, beta) = (org("acme"), org("beta"));
    let mut db = sixty_rows()?;
    let mut claim = r.claim(&acme, "a", false).await?;
    let s1 = r
        .ship(&mut claim, Snapshot::from_bytes(db.image()?, 1))
        .await?;
    db.exec("UPDATE t SET v = randomblob(300)")?;
    let second = db.image()?;
    r.ship(&mut claim, Snapshot::from_bytes(second.clone(), 2))
        .await?;
    let handle = pause.arm().await;
    let first_clone = {
        let (r, acme, beta) = (r.clone(), acme.clone(), beta.clone());
        tokio::spawn(async move {
            let mut c = r.claim(&beta, "cloner-1", false).await?;
            let got = r.clone_into(&mut c, &acme, Some(s1.seq)).await;
            let _ = r.release(&mut c).await;
            got
        })
    };
    handle.reached.await?;
    let mut c2 = r.claim(&beta, "cloner-2", true).await?;
    let second_clone = r.clone_into(&mut c2, &acme, None).await;
    let _ = r.release(&mut c2).await;
    let Ok(CloneOutcome::Shared(_)) = second_clone else {
        // Refused (a clone needs round 1): nothing more to check.
        let _ = handle.resume.send(());
        let _ = first_clone.await?;
        return Ok(());
    };
    // acme's retention retires s1 under the first clone, which then gives up.
    r.retain(&acme, &newest_only()).await?;
    let _ = handle.resume.send(());
    let got = first_clone.await?;
    assert!(matches!(got, Err(Error::PositionNotKept { .. })), "{got:?}");
    // acme rewrites everything and retires s2, whose segments beta names.
    db.exec("UPDATE t SET v = randomblob(300)")?;
    r.ship(&mut claim, Snapshot::from_bytes(db.image()?, 3))
        .await?;
    r.release(&mut claim).await?;
    r.retain(&acme, &newest_only()).await?;
    let got = newest(&r, &beta).await;
    assert!(
        matches!(&got, Ok(image) if *image == second),
        "the published clone no longer restores: {:?}",
        got.err()
    );
    Ok(())
}

/// ATK-4. The clone's retention run that deletes its last snapshot naming SRC fails
/// before it deletes its reference (a store error on that DELETE). Its entry deletions
/// stand, so no later run counts that snapshot among its doomed ones, and the reference is
/// never released: SRC keeps the segments for ever. A repeated run must finish the job
/// ("a partial run is safe to repeat").
pub(super) async fn atk_an_interrupted_clone_retention_releases_its_reference_on_the_next_run(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let faults = Arc::new(FaultStore::new(store));
    let r = open(faults.clone(), None).await?;
    let (acme, beta) = (org("acme"), org("beta"));
    let mut db = sixty_rows()?;
    let mut claim = r.claim(&acme, "a", false).await?;
    let s1 = r
        .ship(&mut claim, Snapshot::from_bytes(db.image()?, 1))
        .await?;
    let mut c = r.claim(&beta, "cloner", false).await?;
    assert!(matches!(
        r.clone_into(&mut c, &acme, Some(s1.seq)).await?,
        CloneOutcome::Shared(_)
    ));
    r.release(&mut c).await?;
    // beta's writer publishes a snapshot of its own content: nothing of acme's named.
    let mut c = r.claim(&beta, "b", false).await?;
    let tmp = tempfile::tempdir()?;
    r.hydrate(&mut c, &tmp.path().join("b.db")).await?;
    let mut own = Db::new()?;
    own.exec("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i < 90) INSERT INTO t SELECT i, randomblob(280) FROM n")?;
    r.ship(&mut c, Snapshot::from_bytes(own.image()?, 3))
        .await?;
    r.release(&mut c).await?;
    let reference = r.inner.store.layout.clone_ref(&acme, &beta);
    faults.inject(
        Op::Delete,
        "/orgs/acme/refs/beta.json",
        1,
        Fault::FailBefore,
    );
    let first = r.retain(&beta, &newest_only()).await;
    assert!(first.is_err(), "the injected DELETE did not fail the run");
    faults.clear();
    r.retain(&beta, &newest_only()).await?;
    r.retain(&beta, &newest_only()).await?;
    assert!(
        !exists(&r, &reference).await?,
        "an interrupted run of the clone's retention leaked its reference for ever"
    );
    // And acme's retention, once s1 is retired, deletes what only s1 named.
    db.exec("UPDATE t SET v = randomblob(300)")?;
    r.ship(&mut claim, Snapshot::from_bytes(db.image()?, 2))
        .await?;
    r.release(&mut claim).await?;
    let report = r.retain(&acme, &newest_only()).await?;
    assert!(
        report.deleted_blobs.iter().any(|b| b.ends_with(".seg.zst")),
        "acme kept s1's segments"
    );
    Ok(())
}

/// ATK-5 (cost). A clone of a clone names two origins: one reference each, beside the
/// segments it uploads.
pub(super) async fn atk_a_clone_of_a_clone_costs_eight_puts_or_fewer(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    // Every delta in a blob (a setting, not the size, decides: "whatever the size").
    let settings = Settings {
        inline_delta_bytes: 0,
        ..small_segments()
    };
    let r = Replica::open_with(store, &prefix()?, settings, Arc::new(SystemClock), None).await?;
    let (acme, beta, gamma) = (org("acme"), org("beta"), org("gamma"));
    let mut db = sixty_rows()?;
    let first = db.image()?;
    let mut claim = r.claim(&acme, "a", false).await?;
    r.ship(&mut claim, Snapshot::from_bytes(first.clone(), 1))
        .await?;
    r.release(&mut claim).await?;
    let mut c = r.claim(&beta, "cloner", false).await?;
    r.clone_into(&mut c, &acme, None).await?;
    r.release(&mut c).await?;
    // beta writes: a snapshot naming some of acme's segments and some of its own.
    let mut c = r.claim(&beta, "b", false).await?;
    let tmp = tempfile::tempdir()?;
    r.hydrate(&mut c, &tmp.path().join("b.db")).await?;
    db.exec("UPDATE t SET v = randomblob(300) WHERE id <= 10")?;
    let at_beta = db.image()?;
    r.ship(&mut c, Snapshot::from_bytes(at_beta.clone(), 2))
        .await?;
    db.exec("UPDATE t SET v = randomblob(300) WHERE id = 30")?;
    let at_delta = db.image()?;
    r.ship_delta(&mut c, diff(&at_beta, &at_delta, 3)?).await?;
    r.release(&mut c).await?;
    let before = r.store_requests();
    let mut c = r.claim(&gamma, "cloner", false).await?;
    let got = r.clone_into(&mut c, &beta, None).await?;
    r.release(&mut c).await?;
    let cost = r.store_requests().since(&before);
    let CloneOutcome::Shared(c) = got else {
        panic!("the clone of a clone was copied");
    };
    assert!(newest(&r, &gamma).await? == at_delta);
    // A claim, a lease, a reference in each of the two origins, the new segments, a
    // manifest, the snapshot entry and a release.
    assert!(
        cost.put as usize <= 7 + c.uploaded_segments,
        "a clone of a clone uploading {} segments made {} PUTs ({cost:?})",
        c.uploaded_segments,
        cost.put
    );
    Ok(())
}

/// ATK-6 (guard). The source's folder is deleted: the clone's verify reports it and its
/// restore fails typed, nothing installed; a crafted or unreadable reference in the source
/// keeps every segment; a reference naming another org is ignored as damage, never
/// followed.
pub(super) async fn atk_verify_after_the_source_is_gone_and_crafted_references(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let r = open(store, None).await?;
    let (acme, beta) = (org("acme"), org("beta"));
    let mut db = sixty_rows()?;
    let mut claim = r.claim(&acme, "a", false).await?;
    let s1 = r
        .ship(&mut claim, Snapshot::from_bytes(db.image()?, 1))
        .await?;
    db.exec("UPDATE t SET v = randomblob(300)")?;
    r.ship(&mut claim, Snapshot::from_bytes(db.image()?, 2))
        .await?;
    r.release(&mut claim).await?;
    // Crafted references beside none real: each must make retention keep every segment.
    for (name, body) in [
        ("x.json", b"{not json".to_vec()),
        (
            "y.json",
            br#"{"v":1,"org":"other","clone":"y","snapshot":1,"segments":[]}"#.to_vec(),
        ),
        (
            "z.json",
            br#"{"v":1,"org":"acme","clone":"z","snapshot":1,"segments":["../../other/snap/x"]}"#
                .to_vec(),
        ),
    ] {
        let path = object_store::path::Path::from(format!(
            "{}/{name}",
            r.inner.store.layout.refs_dir(&acme)
        ));
        r.inner
            .store
            .object
            .put(&path, PutPayload::from(body))
            .await
            .map_err(|e| Error::store("put", &path, e))?;
        let report = r.retain(&acme, &newest_only()).await?;
        assert!(
            report
                .deleted_blobs
                .iter()
                .all(|b| !b.ends_with(".seg.zst")),
            "a crafted reference {name} let segments go: {:?}",
            report.deleted_blobs
        );
        r.inner
            .store
            .object
            .delete(&path)
            .await
            .map_err(|e| Error::store("delete", &path, e))?;
    }
    let _ = s1;
    let mut c = r.claim(&beta, "cloner", false).await?;
    r.clone_into(&mut c, &acme, None).await?;
    r.release(&mut c).await?;
    // Offboard acme without offboarding beta.
    let refs = r.inner.store.layout.refs_dir(&acme).to_string();
    let dir = object_store::path::Path::from(refs.trim_end_matches("/refs"));
    let listed: Vec<_> = {
        use futures::TryStreamExt;
        r.inner
            .store
            .object
            .list(Some(&dir))
            .try_collect()
            .await
            .map_err(|e| Error::store("list", &dir, e))?
    };
    assert!(!listed.is_empty());
    for m in listed {
        r.inner
            .store
            .object
            .delete(&m.location)
            .await
            .map_err(|e| Error::store("delete", &m.location, e))?;
    }
    let verified = r.verify(&beta).await?;
    assert!(
        !verified.failed.is_empty(),
        "verify of a clone whose origin is gone passed"
    );
    let tmp = tempfile::tempdir()?;
    let dest = tmp.path().join("db");
    assert!(r.restore(&beta, None, &dest).await.is_err());
    assert!(!dest.exists());
    Ok(())
}
