//! Retention and the races around it: old chains go whole, claims stay so a zombie's
//! publish always collides (I7, I11), and readers that raced retention read again.

use std::sync::Arc;

use object_store::ObjectStore;
use object_store::path::Path;

use super::db::{Db, Writer, diff};
use super::delta::ship_chain;
use super::{CaseResult, open, org, prefix, rows_in, test_snapshot};
use crate::testing::fault::{FaultStore, Op, PauseAt};
use crate::{Error, FailPoint, LogEntry, Replica, Retention, Settings, Snapshot, SystemClock};

/// A replica over `store` under `prefix` whose failpoints are `pause`.
async fn paused_replica(
    store: Arc<dyn ObjectStore>,
    prefix: &str,
    pause: Arc<PauseAt>,
) -> Result<Replica, Error> {
    Replica::open_with(
        store,
        prefix,
        Settings::default(),
        Arc::new(SystemClock),
        Some(pause),
    )
    .await
}

/// Keep one snapshot, whatever its age.
const KEEP_ONE: Retention = Retention {
    keep_snapshots: 1,
    keep_ms: 0,
    window_ms: 0,
    level_ms: 0,
};

/// A zombie paused after uploading resumes after its successor shipped and retention ran:
/// retention kept the successor's claim in the zombie's slot (claims are never deleted), so
/// the zombie's create collides and it is fenced; hydrate installs the successor's snapshot
/// (I7, I11).
pub(super) async fn zombie_after_retention_is_fenced(store: Arc<dyn ObjectStore>) -> CaseResult {
    let p = prefix()?;
    let pause = PauseAt::new(FailPoint::ShipAfterUpload);
    let za = paused_replica(store.clone(), &p, pause.clone()).await?;
    let rb = open(store, &p).await?;
    let o = org("acme");
    let mut a = za.claim(&o, "a", false).await?;
    za.ship(&mut a, test_snapshot(1)?).await?;
    let zombie_slot = a.next_seq();
    let handle = pause.arm().await;
    // The zombie's claim moves into its task: a claim has one owner, never a copy.
    let zombie = {
        let za = za.clone();
        let snap = test_snapshot(2)?;
        tokio::spawn(async move { za.ship(&mut a, snap).await })
    };
    handle.reached.await.map_err(|_| "zombie never paused")?;
    let mut b = rb.claim(&o, "b", true).await?;
    assert_eq!(b.seq(), zombie_slot, "successor claimed the zombie's slot");
    let s1 = rb.ship(&mut b, test_snapshot(3)?).await?;
    let s2 = rb.ship(&mut b, test_snapshot(4)?).await?;
    let rep = rb
        .retain(
            &o,
            &Retention {
                keep_snapshots: 1,
                keep_ms: 0,
                window_ms: 0,
                level_ms: 0,
            },
        )
        .await?;
    assert!(
        !rep.deleted_entries.contains(&b.seq()),
        "retention freed the claim in the zombie's slot: {rep:?}"
    );
    assert!(
        rep.deleted_entries.contains(&s1.seq),
        "retention deleted nothing: {rep:?}"
    );
    assert!(!rep.deleted_entries.contains(&s2.seq));
    let _ = handle.resume.send(());
    let res = zombie.await?;
    assert!(
        matches!(res, Err(Error::Fenced { .. })),
        "zombie not fenced: {res:?}"
    );
    let tmp = tempfile::tempdir()?;
    let mut c = rb.claim(&o, "c", true).await?;
    let h = rb.hydrate(&mut c, &tmp.path().join("db")).await?;
    assert_eq!(
        h.snapshot.map(|s| s.seq),
        Some(s2.seq),
        "hydrate did not pick the successor's snapshot"
    );
    assert_eq!(rows_in(&tmp.path().join("db"))?, 4);
    Ok(())
}

/// Retention deletes an old snapshot together with its deltas, keeps the newest snapshot's
/// chain whole, and hydrate still rebuilds the newest state (I11).
pub(super) async fn retention_keeps_the_delta_chain(store: Arc<dyn ObjectStore>) -> CaseResult {
    let r = open(store, &prefix()?).await?;
    let acme = org("acme");
    let mut a = r.claim(&acme, "a", false).await?;
    let old = ship_chain(&r, &mut a).await?;
    let new = ship_chain(&r, &mut a).await?;
    let report = r
        .retain(
            &acme,
            &Retention {
                keep_snapshots: 1,
                keep_ms: 0,
                window_ms: 0,
                level_ms: 0,
            },
        )
        .await?;
    for (seq, _) in &old {
        assert!(
            report.deleted_entries.contains(seq),
            "old chain entry {seq} kept"
        );
    }
    let left: Vec<u64> = r.history(&acme).await?.iter().map(LogEntry::seq).collect();
    for (seq, _) in &new {
        assert!(left.contains(seq), "newest chain entry {seq} deleted");
    }
    r.release(&mut a).await?;
    let mut b = r.claim(&acme, "b", false).await?;
    let tmp = tempfile::tempdir()?;
    r.hydrate(&mut b, &tmp.path().join("db")).await?;
    let got = std::fs::read(tmp.path().join("db"))?;
    assert!(new.last().is_some_and(|(_, img)| *img == got));
    Ok(())
}

/// A zombie's delta paused between upload and publish resumes after the successor shipped
/// and retention ran: the successor's claim still holds the zombie's slot (retention never
/// deletes claims), so the delta never lands and the zombie is fenced; its uploaded blob is an
/// orphan the next retention collects; hydrate and verify see only the successor (I7, I11).
pub(super) async fn zombie_delta_is_fenced_and_collected(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    // A delta uploaded as a blob (the orphan retention collects), and one inside its entry.
    for inline_delta_bytes in [0, Settings::default().inline_delta_bytes] {
        zombie_delta_fenced(store.clone(), inline_delta_bytes).await?;
    }
    Ok(())
}

async fn zombie_delta_fenced(store: Arc<dyn ObjectStore>, inline_delta_bytes: usize) -> CaseResult {
    let p = prefix()?;
    let pause = PauseAt::new(FailPoint::ShipAfterUpload);
    let za = Replica::open_with(
        store.clone(),
        &p,
        Settings {
            inline_delta_bytes,
            ..Settings::default()
        },
        Arc::new(SystemClock),
        Some(pause.clone()),
    )
    .await?;
    let rb = open(store, &p).await?;
    let o = org("acme");
    let mut db = Db::new()?;
    let first = db.image()?;
    let mut a = za.claim(&o, "a", false).await?;
    za.ship(&mut a, Snapshot::from_bytes(first.clone(), 1))
        .await?;
    db.exec("INSERT INTO t VALUES (7, x'07')")?;
    let delta = diff(&first, &db.image()?, 2)?;
    let zombie_slot = a.next_seq();
    let handle = pause.arm().await;
    let zombie = {
        let za = za.clone();
        tokio::spawn(async move { za.ship_delta(&mut a, delta).await })
    };
    handle.reached.await.map_err(|_| "zombie never paused")?;
    let mut b = rb.claim(&o, "b", true).await?;
    assert_eq!(
        b.seq(),
        zombie_slot,
        "the successor's claim is in the zombie's slot"
    );
    rb.ship(&mut b, test_snapshot(3)?).await?;
    let newest = rb.ship(&mut b, test_snapshot(4)?).await?;
    let keep_one = Retention {
        keep_snapshots: 1,
        keep_ms: 0,
        window_ms: 0,
        level_ms: 0,
    };
    let first_run = rb.retain(&o, &keep_one).await?;
    assert!(
        !first_run.deleted_entries.contains(&b.seq()),
        "{first_run:?}"
    );
    let _ = handle.resume.send(());
    let res = zombie.await?;
    assert!(
        matches!(res, Err(Error::Fenced { .. })),
        "zombie not fenced: {res:?}"
    );
    let log = rb.history(&o).await?;
    assert!(
        !log.iter().any(|e| e.is_delta()),
        "the zombie's delta landed: {log:?}"
    );
    rb.retain(&o, &keep_one).await?;
    let blobs: Vec<String> = {
        use futures::TryStreamExt;
        let dir = Path::from(format!("{p}/orgs/acme/snap"));
        rb.store()
            .list(Some(&dir))
            .map_ok(|m| m.location.to_string())
            .try_collect()
            .await?
    };
    assert!(
        !blobs.iter().any(|b| b.ends_with(".delta.zst")),
        "the zombie's orphan blob survived retention: {blobs:?}"
    );
    let mut c = rb.claim(&o, "c", true).await?;
    let tmp = tempfile::tempdir()?;
    let h = rb.hydrate(&mut c, &tmp.path().join("db")).await?;
    assert_eq!(h.position, Some(newest.seq));
    let report = rb.verify(&o).await?;
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    Ok(())
}

/// Retention used to delete the successor's claim below the newest snapshot; a zombie then
/// landed its delta in that freed slot, chained onto its own previous delta, and `restore
/// --at` it installed a never-acknowledged state. Retention now keeps claims, so the zombie's
/// create collides: fenced, nothing lands, nothing restorable.
pub(super) async fn a_zombie_delta_after_retention_never_lands(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let mut w1 = Writer::start(store, "w1", "INSERT INTO t(v) VALUES (1);").await?;
    w1.ship_change("INSERT INTO t(v) VALUES (2);", 2).await?;
    let s2 = w1.image.clone();
    let (replica, org) = (w1.replica.clone(), w1.org.clone());
    // w2 takes over from the published state (2 rows) and ships its own snapshot.
    let mut w2 = replica.claim(&org, "w2", true).await?;
    replica
        .ship(&mut w2, Snapshot::from_bytes(s2.clone(), 2))
        .await?;
    let keep_ten = Retention {
        keep_snapshots: 10,
        keep_ms: 0,
        window_ms: 0,
        level_ms: 0,
    };
    let report = replica.retain(&org, &keep_ten).await?;
    assert!(!report.deleted_entries.contains(&w2.seq()), "{report:?}");
    // The zombie w1 wakes up with 1000 unacknowledged rows and ships a delta.
    w1.db.exec(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i < 1000) \
         INSERT INTO t(v) SELECT i FROM n;",
    )?;
    let s3 = w1.db.image()?;
    let zombie_seq = w1.claim.next_seq();
    let err = replica
        .ship_delta(&mut w1.claim, diff(&s2, &s3, 3)?)
        .await
        .err()
        .ok_or("zombie acknowledged")?;
    assert!(matches!(err, Error::Fenced { .. }), "{err:?}");
    assert!(err.is_claim_lost(), "{err:?}");
    let log = replica.history(&org).await?;
    assert!(
        !log.iter().any(|e| e.seq() >= zombie_seq
            && e.round() == w1.claim.round()
            && e.seq() != w1.claim.seq()),
        "the zombie's delta landed: {log:?}"
    );
    let dir = tempfile::tempdir()?;
    let dest = dir.path().join("at.db");
    let got = replica.restore(&org, Some(zombie_seq), &dest).await;
    assert!(matches!(got, Err(Error::NoSuchSnapshot { .. })), "{got:?}");
    assert!(!dest.exists());
    let verified = replica.verify(&org).await?;
    assert!(verified.failed.is_empty(), "{:?}", verified.failed);
    let newest = dir.path().join("newest.db");
    replica.restore(&org, None, &newest).await?;
    let rows: i64 =
        rusqlite::Connection::open(&newest)?
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))?;
    assert_eq!(rows, 2);
    Ok(())
}

/// `restore(None)` reads the log, then retention retires what it read (a newer snapshot was
/// published) before it finishes: held at its first log GET (entries vanish) or at its first
/// blob GET (blobs vanish). It used to skip vanished entries and "restore" an empty database
/// over `dest`, or fail with a missing blob; it now reads the log again and restores the
/// newer snapshot. The held call makes the order exact.
pub(super) async fn restore_newest_racing_retention_reads_again(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    for held_at in ["/log/", "/snap/"] {
        let mut w = Writer::start(
            store.clone(),
            "w",
            "INSERT INTO t(v) VALUES (randomblob(100));",
        )
        .await?;
        w.ship_change("INSERT INTO t(v) VALUES (randomblob(100));", 2)
            .await?;
        let held = Arc::new(FaultStore::new(store.clone()));
        // One GET at a time: the held one is the first of the read.
        let one = Settings {
            read_concurrency: 1,
            ..Settings::default()
        };
        let reader = Replica::open(held.clone(), &w.prefix, one).await?;
        let (writer, org) = (w.replica.clone(), w.org.clone());
        let pause = held.pause_next(Op::Get, held_at);
        let dir = tempfile::tempdir()?;
        let dest = dir.path().join("x.db");
        let (r2, o2, d2) = (reader.clone(), org.clone(), dest.clone());
        let restore = tokio::spawn(async move { r2.restore(&o2, None, &d2).await });
        pause.reached.await?;
        w.db.exec("INSERT INTO t(v) VALUES (randomblob(100));")?;
        let s3 = w.db.image()?;
        writer
            .ship(&mut w.claim, Snapshot::from_bytes(s3.clone(), 3))
            .await?;
        let kept = writer.retain(&org, &KEEP_ONE).await?;
        assert!(!kept.deleted_entries.is_empty(), "{kept:?}");
        let _ = pause.resume.send(());
        let got = restore.await??;
        assert_eq!(got.commit, 3, "held at {held_at}: {got:?}");
        let restored = std::fs::read(&dest)?;
        assert!(restored == s3, "held at {held_at}: not the newest snapshot");
    }
    Ok(())
}

/// What a zombie tries after its successor took over.
#[derive(Clone, Copy, Debug)]
enum ZombieOp {
    Delta,
    Snapshot,
    Release,
}

/// A ship or release no longer lists the log after its create: the create-only slot after
/// the writer's own last entry is the fence, because the successor's claim was created in
/// exactly that slot and retention never frees a claim. A zombie whose successor claimed,
/// shipped two snapshots and ran retention (its own snapshot and delta deleted) tries a
/// delta, a snapshot or a release: each is `Fenced` by the collision alone (its handle made
/// no LIST), nothing of it lands, and hydrate installs the successor's state (I7, I11).
pub(super) async fn a_zombie_is_fenced_by_its_create_without_a_list(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    for op in [ZombieOp::Delta, ZombieOp::Snapshot, ZombieOp::Release] {
        let mut w1 = Writer::start(store.clone(), "w1", "INSERT INTO t(v) VALUES (1);").await?;
        w1.ship_change("INSERT INTO t(v) VALUES (2);", 2).await?;
        let (zombie, o) = (w1.replica.clone(), w1.org.clone());
        let rb = open(store.clone(), &w1.prefix).await?;
        let mut b = rb.claim(&o, "w2", true).await?;
        assert_eq!(
            b.seq(),
            w1.claim.next_seq(),
            "{op:?}: the claim is in the zombie's slot"
        );
        rb.ship(&mut b, Snapshot::from_bytes(w1.image.clone(), 2))
            .await?;
        let newest = rb
            .ship(&mut b, Snapshot::from_bytes(w1.image.clone(), 2))
            .await?;
        let report = rb.retain(&o, &KEEP_ONE).await?;
        assert!(
            report.deleted_entries.contains(&(b.seq() - 1)),
            "{op:?}: retention kept the zombie's delta: {report:?}"
        );
        w1.db.exec("INSERT INTO t(v) VALUES (3);")?;
        let next = w1.db.image()?;
        let before = zombie.store_requests();
        let got = match op {
            ZombieOp::Delta => zombie
                .ship_delta(&mut w1.claim, diff(&w1.image, &next, 3)?)
                .await
                .map(|_| ()),
            ZombieOp::Snapshot => zombie
                .ship(&mut w1.claim, Snapshot::from_bytes(next, 3))
                .await
                .map(|_| ()),
            ZombieOp::Release => zombie.release(&mut w1.claim).await,
        };
        assert!(
            matches!(
                got,
                Err(Error::Fenced {
                    ours: 1,
                    theirs: 2,
                    ..
                })
            ),
            "{op:?}: zombie not fenced: {got:?}"
        );
        let after = zombie.store_requests();
        assert_eq!(after.list, before.list, "{op:?}: the fence needed a LIST");
        let log = rb.history(&o).await?;
        assert!(
            !log.iter().any(|e| e.round() == 1 && !e.is_claim()),
            "{op:?}: the zombie's entry landed: {log:?}"
        );
        let mut c = rb.claim(&o, "w3", true).await?;
        let tmp = tempfile::tempdir()?;
        let h = rb.hydrate(&mut c, &tmp.path().join("db")).await?;
        assert_eq!(h.position, Some(newest.seq), "{op:?}");
        assert_eq!(rows_in(&tmp.path().join("db"))?, 2, "{op:?}");
    }
    Ok(())
}
