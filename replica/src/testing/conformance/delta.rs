//! Delta chains: a snapshot and its deltas hydrate and restore byte for byte, compactions
//! supersede the deltas before them, and a delta the chain tip cannot take is refused
//! before anything is published (I6, I7, I10).

use std::collections::BTreeMap;
use std::sync::Arc;

use object_store::{ObjectStore, ObjectStoreExt};

use super::db::{Db, Writer, diff, diff_keeping, page};
use super::{CaseResult, log_path, open, org, prefix};
use crate::{Claim, Delta, Error, Replica, Snapshot};

/// Builds a chain: one snapshot of 20 rows, then one delta per step (inserts, an update, a
/// delete that shrinks the file after VACUUM, a schema change). Returns the images per seq.
pub(super) async fn ship_chain(
    r: &Replica,
    claim: &mut Claim,
) -> Result<Vec<(u64, Vec<u8>)>, Box<dyn std::error::Error + Send + Sync>> {
    let mut db = Db::new()?;
    db.exec("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i < 20) INSERT INTO t SELECT i, randomblob(300) FROM n")?;
    let mut prev = db.image()?;
    let s = r.ship(claim, Snapshot::from_bytes(prev.clone(), 1)).await?;
    let mut images = vec![(s.seq, prev.clone())];
    let steps = [
        "INSERT INTO t VALUES (100, randomblob(2000))",
        "UPDATE t SET v = randomblob(10) WHERE id % 3 = 0",
        "CREATE TABLE u(k TEXT PRIMARY KEY, n INT); INSERT INTO u VALUES ('a', 1)",
        "DELETE FROM t WHERE id > 5; VACUUM",
        "ALTER TABLE u ADD COLUMN note TEXT; UPDATE u SET note = 'x'",
    ];
    for (i, step) in steps.iter().enumerate() {
        db.exec(step)?;
        let next = db.image()?;
        let mut delta = diff(&prev, &next, i as u64 + 2)?;
        if i % 2 == 0 {
            // Every other delta XOR-encodes its pages against the previous image.
            delta = delta.encode_against(|p| page(&prev, p));
        }
        let shipped = r.ship_delta(claim, delta).await?;
        assert!(shipped.delta);
        assert_eq!(shipped.commit, i as u64 + 2);
        images.push((shipped.seq, next.clone()));
        prev = next;
    }
    Ok(images)
}

/// A snapshot plus deltas (growth, update, schema change, VACUUM shrink) hydrates to exactly
/// the writer's last image, and restore reaches every published position byte for byte.
pub(super) async fn delta_chain_hydrates_and_restores_every_position(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let r = open(store, &prefix()?).await?;
    let acme = org("acme");
    let mut a = r.claim(&acme, "a", false).await?;
    let images = ship_chain(&r, &mut a).await?;
    r.release(&mut a).await?;
    let mut b = r.claim(&acme, "b", false).await?;
    let tmp = tempfile::tempdir()?;
    let h = r.hydrate(&mut b, &tmp.path().join("db")).await?;
    let (last_seq, last_image) = images.last().cloned().unwrap_or_default();
    assert_eq!(h.position, Some(last_seq));
    assert_eq!(h.deltas, images.len() - 1);
    assert_eq!(h.commit, images.len() as u64);
    let got = std::fs::read(tmp.path().join("db"))?;
    assert!(
        got == last_image,
        "hydrated image differs from the writer's"
    );
    for (seq, image) in &images {
        let dest = tmp.path().join(format!("at-{seq}"));
        let h = r.restore(&acme, Some(*seq), &dest).await?;
        assert_eq!(h.position, Some(*seq));
        let got = std::fs::read(&dest)?;
        assert!(got == *image, "restore at {seq} differs");
    }
    let claim_seq = b.seq();
    assert!(matches!(
        r.restore(&acme, Some(claim_seq), &tmp.path().join("x"))
            .await,
        Err(Error::NoSuchSnapshot { .. })
    ));
    let report = r.verify(&acme).await?;
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert_eq!(report.ok.len(), images.len());
    Ok(())
}

/// A delta needs a published snapshot in the same claim; a fenced claim's delta is refused
/// and never acknowledged (I7).
pub(super) async fn delta_needs_a_snapshot_and_is_fenced(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let r = open(store, &prefix()?).await?;
    let acme = org("acme");
    let mut db = Db::new()?;
    let img = db.image()?;
    let mut a = r.claim(&acme, "a", false).await?;
    let no_tip = r.ship_delta(&mut a, diff(&img, &img, 1)?).await;
    assert!(
        matches!(no_tip, Err(Error::NoChainTip { .. })),
        "{no_tip:?}"
    );
    r.ship(&mut a, Snapshot::from_bytes(img.clone(), 1)).await?;
    assert_eq!(a.chain_tip(), Some(a.seq() + 1));
    db.exec("INSERT INTO t VALUES (1, x'00')")?;
    let next = db.image()?;
    r.ship_delta(&mut a, diff(&img, &next, 2)?).await?;
    let mut b = r.claim(&acme, "b", true).await?;
    db.exec("INSERT INTO t VALUES (2, x'01')")?;
    let late = db.image()?;
    let fenced = r.ship_delta(&mut a, diff(&next, &late, 3)?).await;
    assert!(matches!(fenced, Err(Error::Fenced { .. })), "{fenced:?}");
    let tmp = tempfile::tempdir()?;
    let h = r.hydrate(&mut b, &tmp.path().join("db")).await?;
    assert_eq!(h.commit, 2);
    Ok(())
}

/// A compacted delta (every page changed since the snapshot) supersedes the deltas before
/// it: hydrate reads the snapshot, it and the deltas after it — and still works when a
/// superseded delta is gone — while restore reaches every position byte for byte. A
/// compacted delta that misses a changed page is refused before anything is published.
pub(super) async fn compacted_delta_supersedes_the_chain(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let pfx = prefix()?;
    let r = open(store.clone(), &pfx).await?;
    let acme = org("acme");
    let mut a = r.claim(&acme, "a", false).await?;
    let images = ship_chain(&r, &mut a).await?;
    let (snap_seq, snap_img) = images[0].clone();
    let last = images.last().map(|(_, i)| i.clone()).unwrap_or_default();
    let mut db = Db::from_image(&last)?;
    db.exec("INSERT INTO u VALUES ('b', 2, 'y')")?;
    let now = db.image()?;
    // Missing a page changed since the snapshot: refused, nothing published.
    let mut partial = diff(&snap_img, &now, 90)?;
    let next = a.next_seq();
    let first_changed = partial.pages().keys().next().copied().unwrap_or(1);
    let pages: BTreeMap<u32, Vec<u8>> = partial
        .pages()
        .iter()
        .filter(|(p, _)| **p != first_changed)
        .map(|(p, v)| (*p, v.clone()))
        .collect();
    partial = Delta::new(1024, partial.db_pages(), pages, 90)?.compacted();
    let refused = r.ship_delta(&mut a, partial).await;
    assert!(
        matches!(refused, Err(Error::DeltaRefused { .. })),
        "{refused:?}"
    );
    assert_eq!(a.next_seq(), next);
    let compacted = r
        .ship_delta(&mut a, diff(&snap_img, &now, 90)?.compacted())
        .await?;
    let mut all = images.clone();
    all.push((compacted.seq, now.clone()));
    let mut prev = now;
    for i in 0..2u64 {
        db.exec(&format!(
            "INSERT INTO t VALUES ({}, randomblob(700))",
            500 + i
        ))?;
        let next = db.image()?;
        let d = r.ship_delta(&mut a, diff(&prev, &next, 91 + i)?).await?;
        all.push((d.seq, next.clone()));
        prev = next;
    }
    r.release(&mut a).await?;
    // Verify replays the compaction from the snapshot, as hydrate does.
    let report = r.verify(&acme).await?;
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert_eq!(report.ok.len(), all.len());
    // A superseded delta vanishes: the newest state does not need it.
    let gone = images[2].0;
    store.delete(&log_path(&pfx, gone)).await?;
    let mut b = r.claim(&acme, "b", false).await?;
    let tmp = tempfile::tempdir()?;
    let h = r.hydrate(&mut b, &tmp.path().join("db")).await?;
    assert_eq!(h.deltas, 3, "snapshot + compacted + 2 deltas");
    assert_eq!(h.snapshot.as_ref().map(|s| s.seq), Some(snap_seq));
    let got = std::fs::read(tmp.path().join("db"))?;
    assert!(got == prev, "hydrate through a compacted delta differs");
    for (seq, image) in all.iter().filter(|(s, _)| *s != gone) {
        let dest = tmp.path().join(format!("at-{seq}"));
        let restored = r.restore(&acme, Some(*seq), &dest).await;
        if *seq > gone && *seq < compacted.seq {
            // Between the missing delta and the compacted one: a typed error.
            assert!(
                matches!(restored, Err(Error::ChainBroken { .. })),
                "{restored:?}"
            );
            continue;
        }
        restored?;
        let got = std::fs::read(&dest)?;
        assert!(got == *image, "restore at {seq} differs");
    }
    Ok(())
}

/// A compacted delta that omits pages the chain added past the snapshot's end was accepted:
/// `ship_delta` zero-filled them before comparing snapshot+delta with tip+delta, so the
/// comparison never saw them, and the published compaction rebuilt a database that was not
/// the tip. The comparison now sees the pages as given, and refuses it.
pub(super) async fn compaction_missing_grown_pages_is_refused(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let mut w = Writer::start(store, "w", "INSERT INTO t(v) VALUES (randomblob(100));").await?;
    let s1 = w.image.clone();
    let n = (s1.len() / 1024) as u32;
    w.ship_change("INSERT INTO t(v) VALUES (randomblob(5000));", 2)
        .await?;
    let s2 = w.image.clone();
    assert!(s2.len() / 1024 > n as usize);
    let Writer {
        replica,
        org,
        mut claim,
        ..
    } = w;
    // The compaction carries the changed pages inside the snapshot, not the grown ones.
    let bad = diff_keeping(&s1, &s2, 2, |p| p <= n)?.compacted();
    let shipped = replica.ship_delta(&mut claim, bad).await;
    let dir = tempfile::tempdir()?;
    let dest = dir.path().join("x.db");
    let restored = replica.restore(&org, None, &dest).await;
    let same = restored.is_ok() && std::fs::read(&dest)? == s2;
    let verify = replica.verify(&org).await?;
    assert!(
        matches!(shipped, Err(Error::DeltaRefused { .. })),
        "compaction missing grown pages accepted: {shipped:?}; restore: {restored:?}, equals tip: {same}; verify failed: {:?}",
        verify.failed
    );
    Ok(())
}

/// A page encoded against content the chain tip does not hold (a caller's stale page cache)
/// was published and only failed at hydrate, as `ChainBroken`: a writer could acknowledge
/// requests whose state no successor can rebuild. `ship_delta` now refuses it before
/// publishing, and the next correct delta ships on the same chain.
pub(super) async fn a_delta_encoded_against_a_wrong_base_is_refused_before_publishing(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let w = Writer::start(store, "w", "INSERT INTO t(v) VALUES (randomblob(300));").await?;
    let s1 = w.image.clone();
    let Writer {
        replica,
        org,
        mut claim,
        mut db,
        ..
    } = w;
    db.exec("UPDATE t SET v = randomblob(300);")?;
    let s2 = db.image()?;
    let stale: Vec<u8> = s1.iter().map(|b| b ^ 0x5a).collect();
    let wrong = diff(&s1, &s2, 2)?.encode_against(|p| page(&stale, p));
    let before = replica.history(&org).await?.len();
    let seq = claim.next_seq();
    let refused = replica.ship_delta(&mut claim, wrong).await;
    assert!(
        matches!(&refused, Err(Error::DeltaRefused { seq: s, .. }) if *s == seq),
        "{refused:?}"
    );
    assert_eq!(
        replica.history(&org).await?.len(),
        before,
        "nothing published"
    );
    let right = diff(&s1, &s2, 2)?.encode_against(|p| page(&s1, p));
    replica.ship_delta(&mut claim, right).await?;
    let dir = tempfile::tempdir()?;
    let got = replica
        .restore(&org, None, &dir.path().join("x.db"))
        .await?;
    assert_eq!((got.commit, got.deltas), (2, 1));
    assert_eq!(std::fs::read(dir.path().join("x.db"))?, s2);
    Ok(())
}

/// A successor that hydrated a chain continues it: its first delta applies to the previous
/// round's tip, across the claim between; the fenced writer's late delta is refused; a third
/// round continues after a release; every position of the chain restores byte for byte and
/// verifies; retention keeps the whole cross-round chain of a kept snapshot and deletes it
/// whole with its snapshot (I7, I10, I11).
pub(super) async fn a_successor_continues_the_chain_and_a_zombie_stays_fenced(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let r = open(store, &prefix()?).await?;
    let acme = org("acme");
    let mut a = r.claim(&acme, "a", false).await?;
    let mut images = ship_chain(&r, &mut a).await?;
    let a_tip = a.chain_tip().ok_or("A has no tip")?;
    // B takes over while A still runs (a zombie from now on).
    let mut b = r.claim(&acme, "b", true).await?;
    let tmp = tempfile::tempdir()?;
    r.hydrate(&mut b, &tmp.path().join("b.db")).await?;
    assert_eq!(b.chain_tip(), Some(a_tip), "B holds A's tip");
    let mut prev = images.last().map(|(_, i)| i.clone()).unwrap_or_default();
    let mut db = Db::from_image(&prev)?;
    db.exec("INSERT INTO t VALUES (700, randomblob(900))")?;
    let next = db.image()?;
    let d = r.ship_delta(&mut b, diff(&prev, &next, 50)?).await?;
    assert!(d.delta, "B's first ship is a delta");
    images.push((d.seq, next.clone()));
    prev = next;
    // A's late delta onto its own tip: its slot is taken, it is fenced (I7).
    let late = r
        .ship_delta(&mut a, diff(&images[images.len() - 2].1, &prev, 99)?)
        .await;
    assert!(matches!(late, Err(Error::Fenced { .. })), "{late:?}");
    r.release(&mut b).await?;
    // C continues after B's release.
    let mut c = r.claim(&acme, "c", false).await?;
    r.hydrate(&mut c, &tmp.path().join("c.db")).await?;
    assert!(std::fs::read(tmp.path().join("c.db"))? == prev);
    db.exec("UPDATE t SET v = randomblob(20) WHERE id = 700")?;
    let next = db.image()?;
    let d = r.ship_delta(&mut c, diff(&prev, &next, 51)?).await?;
    assert!(d.delta);
    images.push((d.seq, next.clone()));
    for (seq, image) in &images {
        let dest = tmp.path().join(format!("at-{seq}"));
        r.restore(&acme, Some(*seq), &dest).await?;
        assert!(std::fs::read(&dest)? == *image, "restore at {seq} differs");
    }
    let report = r.verify(&acme).await?;
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert_eq!(report.ok.len(), images.len());
    // A new snapshot: with two kept, the old chain stays whole, B's and C's deltas included.
    r.ship(&mut c, Snapshot::from_bytes(next, 52)).await?;
    let keep_two = crate::Retention {
        keep_snapshots: 2,
        keep_ms: 0,
        window_ms: 0,
        level_ms: 0,
    };
    let kept = r.retain(&acme, &keep_two).await?;
    assert!(kept.deleted_entries.is_empty(), "{kept:?}");
    let (seq, image) = images.last().cloned().unwrap_or_default();
    r.restore(&acme, Some(seq), &tmp.path().join("kept"))
        .await?;
    assert!(std::fs::read(tmp.path().join("kept"))? == image);
    // With one kept, the old snapshot goes with every delta of its chain; claims stay.
    let keep_one = crate::Retention {
        keep_snapshots: 1,
        keep_ms: 0,
        window_ms: 0,
        level_ms: 0,
    };
    let gone = r.retain(&acme, &keep_one).await?;
    for (seq, _) in &images {
        assert!(gone.deleted_entries.contains(seq), "{seq} kept: {gone:?}");
    }
    assert!(!gone.deleted_entries.contains(&b.seq()) && !gone.deleted_entries.contains(&c.seq()));
    let h = r.restore(&acme, None, &tmp.path().join("newest")).await?;
    assert_eq!(h.commit, 52);
    Ok(())
}
