//! Clones by reference (`docs/design.md` 2e): a clone restores its source's position byte
//! for byte while naming the source's segments; the source's retention keeps what a clone
//! names until the clone lets go; a clone whose snapshot retention retires under it
//! publishes nothing.

use std::sync::Arc;

use idem_base::{Clock, SystemClock};
use object_store::{ObjectStore, ObjectStoreExt};

use super::db::Db;
use super::levels::{history_with, kept_after_thinning};
use super::{CaseResult, org, prefix};
use crate::format::segment::Manifest;
use crate::testing::fault::PauseAt;
use crate::{
    CloneOutcome, Error, FailPoint, LogEntry, OrgId, Replica, Retention, Settings, Snapshot,
};

pub(super) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One page of 1 KiB per segment: the small databases of these cases span many.
pub(super) fn small_segments() -> Settings {
    Settings {
        segment_bytes: 1024,
        ..Settings::default()
    }
}

/// Keep only the newest snapshot, nothing by age.
pub(super) fn newest_only() -> Retention {
    Retention {
        keep_snapshots: 1,
        keep_ms: 0,
        window_ms: 0,
        level_ms: 0,
    }
}

/// Clones `src` at `at` into `dst` under a fresh claim, released after.
async fn clone(
    r: &Replica,
    src: &OrgId,
    at: Option<u64>,
    dst: &OrgId,
) -> Result<CloneOutcome, Error> {
    let mut claim = r.claim(dst, "cloner", false).await?;
    let out = r.clone_into(&mut claim, src, at).await;
    r.release(&mut claim).await?;
    out
}

/// The newest state of `org`, installed in a temp file and read back.
pub(super) async fn newest(r: &Replica, org: &OrgId) -> Result<Vec<u8>, BoxError> {
    let tmp = tempfile::tempdir()?;
    let dest = tmp.path().join("db");
    r.restore(org, None, &dest).await?;
    Ok(std::fs::read(&dest)?)
}

/// The manifest of the snapshot entry `e` of `org`.
async fn manifest_of(r: &Replica, org: &OrgId, e: &LogEntry) -> Result<Manifest, Error> {
    let (Some(name), Some(stored)) = (e.manifest(), e.stored()) else {
        return Err(Error::corrupt("test", "not a segmented snapshot"));
    };
    r.read_manifest(org, name, stored.bytes).await
}

/// True when the segment `name` of `org` is in the store.
async fn present(r: &Replica, org: &OrgId, name: &str) -> Result<bool, Error> {
    let path = r.inner.store.layout.blob(org, name);
    match r.inner.store.object.head(&path).await {
        Ok(_) => Ok(true),
        Err(object_store::Error::NotFound { .. }) => Ok(false),
        Err(e) => Err(Error::store("head", &path, e)),
    }
}

/// Every kept position of a history whose closed chains retention thinned (snapshots,
/// level sections, deltas) clones by reference and restores byte for byte; the clone
/// uploads only the segments holding a page changed since its source's snapshot (none for a
/// snapshot) and verifies; a thinned position is refused before anything is written.
pub(super) async fn a_clone_by_reference_restores_every_kept_position_byte_for_byte(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let (r, clock, positions) = history_with(store, 5, 2, small_segments(), None).await?;
    let acme = org("acme");
    let policy = Retention {
        keep_snapshots: 1,
        ..Retention::default()
    };
    r.compact_levels(&acme, &policy).await?;
    clock.set(SystemClock.now_ms());
    r.retain(&acme, &policy).await?;
    let kept = kept_after_thinning(&positions);
    let (mut sections, mut shared, mut uploaded) = (0, 0, 0);
    for (i, p) in positions.iter().enumerate() {
        let dst = org(&format!("copy-{i}"));
        let before = r.store_requests();
        let got = clone(&r, &acme, Some(p.seq), &dst).await;
        let cost = r.store_requests().since(&before);
        if !kept.get(&p.seq).copied().unwrap_or(false) {
            assert!(
                matches!(got, Err(Error::PositionNotKept { seq, .. }) if seq == p.seq),
                "thinned position {} answered {got:?}",
                p.seq
            );
            assert_eq!(
                r.history(&dst).await?.len(),
                2,
                "a claim and a release only"
            );
            continue;
        }
        let CloneOutcome::Shared(c) = got? else {
            panic!("position {} was copied, not shared", p.seq);
        };
        assert_eq!(c.position, p.seq);
        // A snapshot position uploads nothing; any other one uploads only the segments
        // holding a page changed since its snapshot, and names the rest.
        assert_eq!(c.uploaded_segments == 0, p.snapshot, "{c:?}");
        assert_eq!(
            c.shared_segments + c.uploaded_segments,
            p.image.len() / 1024,
            "one segment a page"
        );
        (shared, uploaded) = (shared + c.shared_segments, uploaded + c.uploaded_segments);
        sections +=
            usize::from(!p.snapshot && r.history(&acme).await?.iter().all(|e| e.seq() != p.seq));
        // A claim, a lease, the reference, the new segments, a manifest, the snapshot
        // entry and a release.
        assert!(
            cost.put as usize <= 6 + c.uploaded_segments,
            "a clone uploading {} segments made {} PUTs",
            c.uploaded_segments,
            cost.put
        );
        assert!(
            newest(&r, &dst).await? == p.image,
            "clone of {} differs",
            p.seq
        );
        let verified = r.verify(&dst).await?;
        assert!(verified.failed.is_empty(), "{:?}", verified.failed);
    }
    assert!(sections > 0, "no clone went through a level file");
    // This history rewrites most pages between snapshots (VACUUMs, updates of every k-th
    // row); snapshot positions name every segment.
    assert!(
        shared > 0 && uploaded > 0,
        "clones named {shared} segments and uploaded {uploaded}"
    );
    let last = positions
        .last()
        .map(|p| p.image.clone())
        .unwrap_or_default();
    let dst = org("copy-newest");
    assert!(matches!(
        clone(&r, &acme, None, &dst).await?,
        CloneOutcome::Shared(_)
    ));
    assert!(newest(&r, &dst).await? == last);
    // A clone of a clone names the first org's segments, and keeps them by its own
    // reference there.
    let second = org("copy-of-copy");
    assert!(matches!(
        clone(&r, &dst, None, &second).await?,
        CloneOutcome::Shared(_)
    ));
    assert!(newest(&r, &second).await? == last);
    let path = r.inner.store.layout.clone_ref(&acme, &second);
    assert!(
        r.inner.store.object.head(&path).await.is_ok(),
        "no reference in the origin"
    );
    Ok(())
}

/// The source's retention keeps every segment a clone names after the snapshot they came
/// from is gone; the clone's snapshots that still name some keep the reference; once the
/// clone keeps no snapshot naming them, its retention deletes the reference and the
/// source's next run deletes them.
pub(super) async fn retention_keeps_what_a_clone_names_until_the_clone_lets_go(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let r = Replica::open_with(
        store,
        &prefix()?,
        small_segments(),
        Arc::new(SystemClock),
        None,
    )
    .await?;
    let (acme, beta) = (org("acme"), org("beta"));
    let mut db = Db::new()?;
    db.exec("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i < 60) INSERT INTO t SELECT i, randomblob(300) FROM n")?;
    let first = db.image()?;
    let mut claim = r.claim(&acme, "a", false).await?;
    let s1 = r
        .ship(&mut claim, Snapshot::from_bytes(first.clone(), 1))
        .await?;
    assert!(matches!(
        clone(&r, &acme, Some(s1.seq), &beta).await?,
        CloneOutcome::Shared(_)
    ));
    // The source rewrites every row and publishes a new snapshot; retention retires the
    // first.
    db.exec("UPDATE t SET v = randomblob(300)")?;
    r.ship(&mut claim, Snapshot::from_bytes(db.image()?, 2))
        .await?;
    r.release(&mut claim).await?;
    let log = r.history(&acme).await?;
    let s1_entry = log
        .iter()
        .find(|e| e.seq() == s1.seq)
        .cloned()
        .ok_or("s1")?;
    let s2_entry = log
        .iter()
        .rev()
        .find(|e| e.is_snapshot())
        .cloned()
        .ok_or("s2")?;
    let m1 = manifest_of(&r, &acme, &s1_entry).await?;
    let m2 = manifest_of(&r, &acme, &s2_entry).await?;
    let only_s1: Vec<String> = m1
        .segments
        .iter()
        .filter(|s| !m2.segments.iter().any(|t| t.name() == s.name()))
        .map(|s| s.name().to_owned())
        .collect();
    assert!(
        only_s1.len() >= 8,
        "{} segments only the first snapshot names",
        only_s1.len()
    );
    let report = r.retain(&acme, &newest_only()).await?;
    assert!(report.deleted_entries.contains(&s1.seq));
    for name in &only_s1 {
        assert!(
            present(&r, &acme, name).await?,
            "retention deleted {name}, which beta names"
        );
    }
    assert!(newest(&r, &beta).await? == first);
    // The clone's writer publishes a snapshot that changes one row: it names the source's
    // other segments, so the clone's retention keeps the reference.
    let mut other = Db::from_image(&first)?;
    other.exec("UPDATE t SET v = randomblob(300) WHERE id = 1")?;
    let mut claim = r.claim(&beta, "b", false).await?;
    let tmp = tempfile::tempdir()?;
    r.hydrate(&mut claim, &tmp.path().join("b.db")).await?;
    r.ship(&mut claim, Snapshot::from_bytes(other.image()?, 2))
        .await?;
    r.retain(&beta, &newest_only()).await?;
    let reference = r.inner.store.layout.clone_ref(&acme, &beta);
    assert!(
        r.inner.store.object.head(&reference).await.is_ok(),
        "the reference went early"
    );
    // While the reference stands, every segment it names stays.
    r.retain(&acme, &newest_only()).await?;
    for name in &only_s1 {
        assert!(
            present(&r, &acme, name).await?,
            "{name} went under a reference"
        );
    }
    // Then a snapshot of its own content: nothing of acme's is named any more.
    let mut own = Db::new()?;
    own.exec("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i < 90) INSERT INTO t SELECT i, randomblob(280) FROM n")?;
    let own_image = own.image()?;
    r.ship(&mut claim, Snapshot::from_bytes(own_image.clone(), 3))
        .await?;
    r.release(&mut claim).await?;
    r.retain(&beta, &newest_only()).await?;
    assert!(
        matches!(
            r.inner.store.object.head(&reference).await,
            Err(object_store::Error::NotFound { .. })
        ),
        "the clone kept its reference after its last snapshot naming acme went"
    );
    r.retain(&acme, &newest_only()).await?;
    for name in &only_s1 {
        assert!(
            !present(&r, &acme, name).await?,
            "{name} outlived every reference"
        );
    }
    assert!(newest(&r, &beta).await? == own_image);
    assert!(newest(&r, &acme).await? == db.image()?);
    Ok(())
}

/// A retention run of the source that retires the clone's snapshot between the clone's
/// reference landing and its check: the run lists the reference and keeps the segments,
/// the clone sees the entry gone, publishes nothing and deletes its reference, and the
/// source's next run deletes the segments. Without the reference read after the entry
/// deletions, or without the clone's check, one of these fails.
pub(super) async fn a_clone_whose_snapshot_retention_retires_under_it_publishes_nothing(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let pause = PauseAt::new(FailPoint::CloneAfterReferences);
    let fp: Arc<dyn crate::Failpoints> = pause.clone();
    let r = Replica::open_with(
        store,
        &prefix()?,
        small_segments(),
        Arc::new(SystemClock),
        Some(fp),
    )
    .await?;
    let (acme, beta) = (org("acme"), org("beta"));
    let mut db = Db::new()?;
    db.exec("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i < 60) INSERT INTO t SELECT i, randomblob(300) FROM n")?;
    let mut claim = r.claim(&acme, "a", false).await?;
    let s1 = r
        .ship(&mut claim, Snapshot::from_bytes(db.image()?, 1))
        .await?;
    db.exec("UPDATE t SET v = randomblob(300)")?;
    r.ship(&mut claim, Snapshot::from_bytes(db.image()?, 2))
        .await?;
    r.release(&mut claim).await?;
    let log = r.history(&acme).await?;
    let s1_entry = log
        .iter()
        .find(|e| e.seq() == s1.seq)
        .cloned()
        .ok_or("s1")?;
    let segments: Vec<String> = manifest_of(&r, &acme, &s1_entry)
        .await?
        .segments
        .iter()
        .map(|s| s.name().to_owned())
        .collect();
    let handle = pause.arm().await;
    let cloner = {
        let (r, acme, beta) = (r.clone(), acme.clone(), beta.clone());
        tokio::spawn(async move { clone(&r, &acme, Some(s1.seq), &beta).await })
    };
    handle.reached.await?;
    let report = r.retain(&acme, &newest_only()).await?;
    assert!(report.deleted_entries.contains(&s1.seq));
    let kept_now: Vec<&String> = segments
        .iter()
        .filter(|n| report.deleted_blobs.iter().any(|b| b.ends_with(n.as_str())))
        .collect();
    assert!(
        kept_now.is_empty(),
        "retention deleted {kept_now:?} under a reference"
    );
    let _ = handle.resume.send(());
    let got = cloner.await?;
    assert!(
        matches!(got, Err(Error::PositionNotKept { .. })),
        "the clone answered {got:?}"
    );
    assert!(
        r.history(&beta)
            .await?
            .iter()
            .all(|e| !e.is_snapshot() && !e.is_delta()),
        "the clone published"
    );
    let reference = r.inner.store.layout.clone_ref(&acme, &beta);
    assert!(matches!(
        r.inner.store.object.head(&reference).await,
        Err(object_store::Error::NotFound { .. })
    ));
    let report = r.retain(&acme, &newest_only()).await?;
    assert!(
        segments
            .iter()
            .any(|n| report.deleted_blobs.iter().any(|b| b.ends_with(n.as_str()))),
        "the first snapshot's segments outlived the reference"
    );
    Ok(())
}
