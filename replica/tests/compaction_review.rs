//! Regression tests from a second adversarial review: a compacted delta that misses grown
//! pages, and `restore` of the newest state racing retention (I10).

use std::collections::BTreeMap;
use std::sync::Arc;

use idem_replica::{Delta, Error, OrgId, Replica, Settings, Snapshot};
use object_store::{ObjectStore, memory::InMemory};
use rusqlite::{Connection, MAIN_DB};

type R = Result<(), Box<dyn std::error::Error + Send + Sync>>;
type BoxErr = Box<dyn std::error::Error + Send + Sync>;

fn image(conn: &mut Connection) -> Result<Vec<u8>, BoxErr> {
    let mut img = conn.serialize(MAIN_DB)?.to_vec();
    img[18] = 1;
    img[19] = 1;
    Ok(img)
}

fn diff(old: &[u8], new: &[u8], commit: u64, keep: impl Fn(u32) -> bool) -> Result<Delta, BoxErr> {
    let ps = u16::from_be_bytes([new[16], new[17]]) as usize;
    let mut pages = BTreeMap::new();
    for (i, p) in new.chunks(ps).enumerate() {
        let pgno = i as u32 + 1;
        if old.get(i * ps..(i + 1) * ps) != Some(p) && keep(pgno) {
            pages.insert(pgno, p.to_vec());
        }
    }
    Ok(Delta::new(
        ps as u32,
        (new.len() / ps) as u32,
        pages,
        commit,
    )?)
}

/// A compacted delta that omits pages the chain ADDED past the snapshot's end is accepted:
/// `ship_delta` fills them with zeros (fill_growth against the snapshot) BEFORE comparing
/// snapshot+delta with tip+delta, so the comparison never sees them. The published
/// compaction then rebuilds a database that is not the tip (checksums agree with it).
#[tokio::test]
async fn compaction_missing_grown_pages_is_refused() -> R {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let replica = Replica::open(store.clone(), "", Settings::default()).await?;
    let org = OrgId::new("acme")?;
    let mut claim = replica.claim(&org, "w", false).await?;
    let mut conn = Connection::open_in_memory()?;
    conn.execute_batch(
        "PRAGMA page_size=1024; CREATE TABLE t(x BLOB); INSERT INTO t VALUES (randomblob(100));",
    )?;
    let s1 = image(&mut conn)?;
    let n = (s1.len() / 1024) as u32;
    replica
        .ship(&mut claim, Snapshot::from_bytes(s1.clone(), 1))
        .await?;
    conn.execute_batch("INSERT INTO t VALUES (randomblob(5000));")?;
    let s2 = image(&mut conn)?;
    assert!(s2.len() / 1024 > n as usize);
    replica
        .ship_delta(&mut claim, diff(&s1, &s2, 2, |_| true)?)
        .await?;
    // The compaction carries the changed pages inside the snapshot, not the grown ones.
    let bad = diff(&s1, &s2, 2, |p| p <= n)?.compacted();
    let shipped = replica.ship_delta(&mut claim, bad).await;
    let dir = tempfile::tempdir()?;
    let dest = dir.path().join("x.db");
    let restored = replica.restore(&org, None, &dest).await;
    let same = restored.is_ok() && std::fs::read(&dest)? == s2;
    let verify = replica.verify(&org).await?;
    assert!(
        matches!(shipped, Err(Error::InvalidSnapshot { .. })),
        "compaction missing grown pages accepted: {shipped:?}; restore: {restored:?}, equals tip: {same}; verify failed: {:?}",
        verify.failed
    );
    Ok(())
}

/// `restore(None)` reads the log, then retention retires what it read (a newer snapshot was
/// published) before it finishes: held at its first log GET (entries vanish) or at its first
/// blob GET (blobs vanish). It used to skip vanished entries and "restore" an empty database
/// over `dest`, or fail with a missing blob; it now reads the log again and restores the
/// newer snapshot. The held call makes the order exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_newest_racing_retention_reads_again() -> R {
    use idem_replica::fault::{FaultStore, Op};
    for held_at in ["/log/", "/snap/"] {
        let mem: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let held = Arc::new(FaultStore::new(mem.clone()));
        let writer = Replica::open(mem.clone(), "", Settings::default()).await?;
        // One GET at a time: the held one is the first of the read.
        let one = Settings {
            read_concurrency: 1,
            ..Settings::default()
        };
        let reader = Replica::open(held.clone(), "", one).await?;
        let org = OrgId::new("acme")?;
        let mut claim = writer.claim(&org, "w", false).await?;
        let mut conn = Connection::open_in_memory()?;
        conn.execute_batch(
            "PRAGMA page_size=1024; CREATE TABLE t(x BLOB); INSERT INTO t VALUES (randomblob(100));",
        )?;
        let s1 = image(&mut conn)?;
        writer
            .ship(&mut claim, Snapshot::from_bytes(s1.clone(), 1))
            .await?;
        conn.execute_batch("INSERT INTO t VALUES (randomblob(100));")?;
        let s2 = image(&mut conn)?;
        writer
            .ship_delta(&mut claim, diff(&s1, &s2, 2, |_| true)?)
            .await?;
        let pause = held.pause_next(Op::Get, held_at);
        let dir = tempfile::tempdir()?;
        let dest = dir.path().join("x.db");
        let (r2, o2, d2) = (reader.clone(), org.clone(), dest.clone());
        let restore = tokio::spawn(async move { r2.restore(&o2, None, &d2).await });
        pause.reached.await?;
        conn.execute_batch("INSERT INTO t VALUES (randomblob(100));")?;
        let s3 = image(&mut conn)?;
        writer
            .ship(&mut claim, Snapshot::from_bytes(s3.clone(), 3))
            .await?;
        let kept = writer
            .retain(
                &org,
                &idem_replica::Retention {
                    keep_snapshots: 1,
                    keep_ms: 0,
                },
            )
            .await?;
        assert!(!kept.deleted_entries.is_empty(), "{kept:?}");
        let _ = pause.resume.send(());
        let got = restore.await??;
        assert_eq!(got.commit, 3, "held at {held_at}: {got:?}");
        let restored = std::fs::read(&dest)?;
        let mut want = s3;
        want[18] = 1;
        want[19] = 1;
        assert!(
            restored == want,
            "held at {held_at}: not the newest snapshot"
        );
    }
    Ok(())
}
