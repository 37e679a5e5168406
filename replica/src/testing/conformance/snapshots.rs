//! Full snapshots: retention of old ones (I11), restore and verify of each, and a
//! consistent image under concurrent writes (I6, I10).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use tokio::sync::mpsc;

use super::{CaseResult, open, org, prefix, rows_in, test_snapshot};
use crate::{
    Clock, Error, LogEntry, ManualClock, Replica, Retention, Settings, Snapshot, SystemClock,
};

/// Retention deletes old snapshots and orphans but never the newest or anything after it.
pub(super) async fn retention_keeps_newest(store: Arc<dyn ObjectStore>) -> CaseResult {
    // Two minutes behind the store's clock, and still behind it after the 64 s this case
    // moves it on: within the bound retention checks against the store's clock (I15).
    let clock = Arc::new(ManualClock::new(SystemClock.now_ms() - 120_000));
    let r = Replica::open_with(
        store.clone(),
        &prefix()?,
        Settings::default(),
        clock.clone(),
        None,
    )
    .await?;
    let o = org("acme");
    let mut a = r.claim(&o, "a", false).await?;
    let mut shipped = Vec::new();
    for i in 0..4 {
        shipped.push(r.ship(&mut a, test_snapshot(i + 1)?).await?);
        clock.advance(1000);
    }
    // Young snapshots survive an age policy.
    let rep = r
        .retain(
            &o,
            &Retention {
                keep_snapshots: 1,
                keep_ms: 10_000,
                window_ms: 0,
                level_ms: 0,
            },
        )
        .await?;
    assert_eq!(rep.kept_snapshots, 4);
    clock.advance(60_000);
    let rep = r
        .retain(
            &o,
            &Retention {
                keep_snapshots: 2,
                keep_ms: 10_000,
                window_ms: 0,
                level_ms: 0,
            },
        )
        .await?;
    assert_eq!(rep.kept_snapshots, 2);
    let h = r.history(&o).await?;
    let seqs: Vec<u64> = h.iter().map(LogEntry::seq).collect();
    // The claim stays: retention never frees a slot a zombie could publish into.
    assert_eq!(seqs, vec![a.seq(), shipped[2].seq, shipped[3].seq]);
    for s in &shipped[..2] {
        let gone = store.head(&Path::from(s.blob.as_str())).await;
        assert!(
            matches!(gone, Err(object_store::Error::NotFound { .. })),
            "blob kept: {}",
            s.blob
        );
    }
    let kept = store.head(&Path::from(shipped[3].blob.as_str())).await;
    assert!(kept.is_ok(), "newest blob deleted");
    // Even keep_snapshots = 0 keeps the newest.
    r.retain(
        &o,
        &Retention {
            keep_snapshots: 0,
            keep_ms: 0,
            window_ms: 0,
            level_ms: 0,
        },
    )
    .await?;
    let tmp = tempfile::tempdir()?;
    let mut c = r.claim(&o, "b", true).await?;
    assert_eq!(r.hydrate(&mut c, &tmp.path().join("db")).await?.commit, 4);
    Ok(())
}

/// Restore picks any published snapshot by seq; verify checks them all.
pub(super) async fn restore_and_verify(store: Arc<dyn ObjectStore>) -> CaseResult {
    let r = open(store, &prefix()?).await?;
    let o = org("acme");
    let mut a = r.claim(&o, "a", false).await?;
    let s1 = r.ship(&mut a, test_snapshot(2)?).await?;
    let s2 = r.ship(&mut a, test_snapshot(6)?).await?;
    let tmp = tempfile::tempdir()?;
    let dest = tmp.path().join("db");
    assert_eq!(r.restore(&o, Some(s1.seq), &dest).await?.commit, 2);
    assert_eq!(rows_in(&dest)?, 2);
    let newest = r.restore(&o, None, &dest).await?.snapshot;
    assert_eq!(
        newest.map(|s| (s.seq, s.sha256)),
        Some((s2.seq, s2.sha256.clone()))
    );
    assert_eq!(rows_in(&dest)?, 6);
    assert!(matches!(
        r.restore(&o, Some(a.seq()), &dest).await,
        Err(Error::NoSuchSnapshot { .. })
    ));
    let v = r.verify(&o).await?;
    assert_eq!(v.ok, vec![s1.seq, s2.seq]);
    assert!(v.failed.is_empty());
    Ok(())
}

/// A snapshot taken while another connection writes continuously passes `integrity_check`
/// and holds every row committed before it began, and exactly its commit counter's rows.
pub(super) async fn snapshot_under_concurrent_writes(store: Arc<dyn ObjectStore>) -> CaseResult {
    let r = open(store, &prefix()?).await?;
    let o = org("acme");
    let mut a = r.claim(&o, "a", false).await?;
    let tmp = tempfile::tempdir()?;
    let db = tmp.path().join("live.db");
    let sql = |source| Error::Sqlite {
        op: "concurrent-writes test",
        source,
    };
    let setup = rusqlite::Connection::open(&db).map_err(sql)?;
    setup
        .execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB);")
        .map_err(sql)?;
    drop(setup);
    // Row i is counted in `begun` before its INSERT and in `committed` after it returns: a
    // snapshot taken between two reads of them holds at least the first `committed` and at
    // most the second `begun` rows (the commit lands before `committed` is raised).
    let begun = Arc::new(AtomicU64::new(0));
    let committed = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (started_tx, mut started) = mpsc::channel::<()>(1);
    let writer = {
        let (db, begun, committed, stop) =
            (db.clone(), begun.clone(), committed.clone(), stop.clone());
        std::thread::spawn(move || -> Result<(), Error> {
            let conn = rusqlite::Connection::open(&db).map_err(sql)?;
            conn.busy_timeout(std::time::Duration::from_secs(10))
                .map_err(sql)?;
            let mut i: u64 = 0;
            while !stop.load(Ordering::SeqCst) {
                i += 1;
                begun.store(i, Ordering::SeqCst);
                conn.execute(
                    "INSERT INTO t(id, v) VALUES (?1, zeroblob(512))",
                    [i as i64],
                )
                .map_err(sql)?;
                committed.store(i, Ordering::SeqCst);
                if i == 200 {
                    let _ = started_tx.blocking_send(());
                }
            }
            Ok(())
        })
    };
    let _ = started.recv().await;
    for _ in 0..3 {
        let before = committed.load(Ordering::SeqCst);
        let (db2, b2) = (db.clone(), begun.clone());
        let snap = tokio::task::spawn_blocking(move || {
            let conn = rusqlite::Connection::open(&db2).map_err(sql)?;
            let s = Snapshot::take(&conn, |c| {
                c.query_row("SELECT count(*) FROM t", [], |r| r.get::<_, i64>(0))
                    .map(|n| n as u64)
            })?;
            Ok::<_, Error>((s, b2.load(Ordering::SeqCst)))
        })
        .await??;
        let (snap, after) = snap;
        assert!(
            snap.commit() >= before && snap.commit() <= after,
            "{before} <= {} <= {after}",
            snap.commit()
        );
        let shipped = r.ship(&mut a, snap).await?;
        let dest = tmp.path().join("hydrated.db");
        let h = r.restore(&o, Some(shipped.seq), &dest).await?;
        let conn = rusqlite::Connection::open(&dest).map_err(sql)?;
        crate::rebuild::check::sqlite_check(&conn, "integrity_check", "hydrated")?;
        let (n, max): (i64, i64) = conn
            .query_row("SELECT count(*), coalesce(max(id), 0) FROM t", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .map_err(sql)?;
        assert_eq!(
            (n as u64, max as u64),
            (h.commit, h.commit),
            "snapshot rows vs its commit counter"
        );
        assert!(
            h.commit >= before,
            "snapshot lost rows committed before it began"
        );
    }
    stop.store(true, Ordering::SeqCst);
    writer.join().map_err(|_| "writer thread panicked")??;
    Ok(())
}
