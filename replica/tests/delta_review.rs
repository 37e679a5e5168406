//! Regression tests from two adversarial reviews of delta shipping: restore of a delta whose
//! snapshot is gone, a zombie delta after retention, a crafted delta size, a compacted delta
//! that misses grown pages, restore of the newest state racing retention, and a failed apply
//! that waited for the next fetch (I7, I10, I11).

use std::collections::BTreeMap;
use std::sync::Arc;

use idem_replica::{Claim, Delta, Error, OrgId, Replica, Retention, Settings, Snapshot};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, memory::InMemory};
use rusqlite::Connection;

type R = Result<(), Box<dyn std::error::Error + Send + Sync>>;

fn snap(
    conn: &Connection,
    commit: u64,
) -> Result<Snapshot, Box<dyn std::error::Error + Send + Sync>> {
    Ok(Snapshot::take(conn, |_| Ok(commit))?)
}

type BoxErr = Box<dyn std::error::Error + Send + Sync>;

/// The exact image of an in-memory database, page 1 canonical.
fn image(conn: &mut Connection) -> Result<Vec<u8>, BoxErr> {
    let mut img = conn.serialize(rusqlite::MAIN_DB)?.to_vec();
    img[18] = 1;
    img[19] = 1;
    Ok(img)
}

/// Pages that differ between two images and pass `keep`, as a Delta.
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

fn count(path: &std::path::Path) -> rusqlite::Result<i64> {
    Connection::open(path)?.query_row("SELECT count(*) FROM t", [], |r| r.get(0))
}

/// A claimed org on an in-memory store whose chain starts with a full snapshot of a 1 KiB-page
/// database holding one `bytes`-byte random row: (replica, org, claim, connection, image).
async fn started(bytes: usize) -> Result<(Replica, OrgId, Claim, Connection, Vec<u8>), BoxErr> {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let replica = Replica::open(store, "", Settings::default()).await?;
    let org = OrgId::new("acme")?;
    let mut claim = replica.claim(&org, "w", false).await?;
    let mut conn = Connection::open_in_memory()?;
    conn.execute_batch(&format!(
        "PRAGMA page_size=1024; CREATE TABLE t(x BLOB); INSERT INTO t VALUES (randomblob({bytes}));"
    ))?;
    let s1 = image(&mut conn)?;
    replica
        .ship(&mut claim, Snapshot::from_bytes(s1.clone(), 1))
        .await?;
    Ok((replica, org, claim, conn, s1))
}

/// A delta entry with no snapshot below it (e.g. retention interrupted after deleting the
/// snapshot entry but before its deltas: snapshot entries are deleted first) is a position the
/// CLI lists; `restore --at` it must fail, not "restore" an empty database over `dest`.
#[tokio::test]
async fn restore_at_a_delta_without_its_snapshot_is_an_error_not_an_empty_db() -> R {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let replica = Replica::open(store.clone(), "", Settings::default()).await?;
    let org = OrgId::new("acme")?;
    let mut claim = replica.claim(&org, "w", false).await?;
    let conn = Connection::open_in_memory()?;
    conn.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (1);")?;
    let s = snap(&conn, 1)?;
    replica.ship(&mut claim, s.clone()).await?;
    conn.execute_batch("INSERT INTO t VALUES (2);")?;
    let s2 = snap(&conn, 2)?;
    let d = replica
        .ship_delta(&mut claim, diff(s.bytes(), s2.bytes(), 2, |_| true)?)
        .await?;
    // The snapshot entry goes (as an interrupted retention run would leave it).
    store
        .delete(&Path::from(format!("orgs/acme/log/{:020}.json", d.seq - 1)))
        .await?;
    let dir = tempfile::tempdir()?;
    let dest = dir.path().join("restored.db");
    std::fs::write(&dest, b"the operator's previous file")?;
    let got = replica.restore(&org, Some(d.seq), &dest).await;
    assert!(
        got.is_err(),
        "restore --at {} succeeded with {got:?}; dest exists: {}",
        d.seq,
        dest.exists()
    );
    Ok(())
}

/// Retention used to delete the successor's claim below the newest snapshot; a zombie then
/// landed its delta in that freed slot, chained onto its own previous delta, and `restore
/// --at` it installed a never-acknowledged state. Retention now keeps claims, so the zombie's
/// create collides: fenced, nothing lands, nothing restorable.
#[tokio::test]
async fn a_zombie_delta_after_retention_never_lands() -> R {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let replica = Replica::open(store.clone(), "", Settings::default()).await?;
    let org = OrgId::new("acme")?;
    let mut w1 = replica.claim(&org, "w1", false).await?;
    let conn = Connection::open_in_memory()?;
    conn.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (1);")?;
    let s1 = snap(&conn, 1)?;
    replica.ship(&mut w1, s1.clone()).await?;
    conn.execute_batch("INSERT INTO t VALUES (2);")?;
    let s2 = snap(&conn, 2)?;
    replica
        .ship_delta(&mut w1, diff(s1.bytes(), s2.bytes(), 2, |_| true)?)
        .await?;
    // w2 takes over from the published state (2 rows) and ships its own snapshot.
    let mut w2 = replica.claim(&org, "w2", true).await?;
    replica.ship(&mut w2, s2.clone()).await?;
    let report = replica
        .retain(
            &org,
            &Retention {
                keep_snapshots: 10,
                keep_ms: 0,
            },
        )
        .await?;
    assert!(!report.deleted_entries.contains(&w2.seq), "{report:?}");
    // The zombie w1 wakes up with 1000 unacknowledged rows and ships a delta.
    conn.execute_batch(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i < 1000) \
         INSERT INTO t SELECT i FROM n;",
    )?;
    let s3 = snap(&conn, 3)?;
    let zombie_seq = w1.next_seq();
    let err = replica
        .ship_delta(&mut w1, diff(s2.bytes(), s3.bytes(), 3, |_| true)?)
        .await
        .err()
        .ok_or("zombie acknowledged")?;
    assert!(err.is_fenced(), "{err:?}");
    let log = replica.history(&org).await?;
    assert!(
        !log.iter()
            .any(|e| e.seq() >= zombie_seq && e.round() == w1.round && e.seq() != w1.seq),
        "the zombie's delta landed: {log:?}"
    );
    let dir = tempfile::tempdir()?;
    let dest = dir.path().join("at.db");
    let got = replica.restore(&org, Some(zombie_seq), &dest).await;
    assert!(
        matches!(got, Err(idem_replica::Error::NoSuchSnapshot { .. })),
        "{got:?}"
    );
    assert!(!dest.exists());
    let verified = replica.verify(&org).await?;
    assert!(verified.failed.is_empty(), "{:?}", verified.failed);
    assert_eq!(count_restored(&replica, &org, dir.path()).await?, 2);
    Ok(())
}

async fn count_restored(
    replica: &Replica,
    org: &OrgId,
    dir: &std::path::Path,
) -> Result<i64, Box<dyn std::error::Error + Send + Sync>> {
    let dest = dir.join("newest.db");
    replica.restore(org, None, &dest).await?;
    Ok(count(&dest)?)
}

/// A delta entry + blob claiming db_pages = u32::MAX (store data, shapes consistent) made
/// `verify` panic (u32 overflow) and restore fail with a Task error; it is Corrupt, and
/// nothing is allocated for pages the body does not carry.
#[tokio::test]
async fn a_delta_with_a_huge_db_size_is_corrupt_not_a_panic() -> R {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let replica = Replica::open(store.clone(), "", Settings::default()).await?;
    let org = OrgId::new("acme")?;
    let mut claim = replica.claim(&org, "w", false).await?;
    let conn = Connection::open_in_memory()?;
    conn.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (1);")?;
    let s = snap(&conn, 1)?;
    replica.ship(&mut claim, s.clone()).await?;
    let ps = u16::from_be_bytes([s.bytes()[16], s.bytes()[17]]) as u32;
    let d = replica
        .ship_delta(
            &mut claim,
            Delta::new(ps, (s.len() as u32) / ps, BTreeMap::new(), 1)?,
        )
        .await?;
    // Rewrite blob and entry consistently: body = page_size, u32::MAX pages, 0 changed.
    let mut body = Vec::new();
    body.extend_from_slice(&ps.to_le_bytes());
    body.extend_from_slice(&u32::MAX.to_le_bytes());
    body.extend_from_slice(&0u32.to_le_bytes());
    let mut blob = idem_replica::BLOB_MAGIC.to_vec();
    blob.extend_from_slice(&idem_replica::BLOB_VERSION.to_le_bytes());
    blob.extend_from_slice(&zstd::encode_all(&body[..], 1)?);
    let sha = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(&body))
    };
    let entry_path = Path::from(format!("orgs/acme/log/{:020}.json", d.seq));
    let mut v: serde_json::Value =
        serde_json::from_slice(&store.get(&entry_path).await?.bytes().await?)?;
    let blob_name = v["blob"].as_str().ok_or("no blob")?.to_owned();
    v["db_pages"] = u32::MAX.into();
    v["sha256"] = sha.into();
    v["bytes"] = (body.len() as u64).into();
    store
        .put(&entry_path, PutPayload::from(serde_json::to_vec(&v)?))
        .await?;
    store
        .put(
            &Path::from(format!("orgs/acme/snap/{blob_name}")),
            PutPayload::from(blob),
        )
        .await?;

    let dir = tempfile::tempdir()?;
    let restored = replica.restore(&org, None, &dir.path().join("x.db")).await;
    let r2 = replica.clone();
    let o2 = org.clone();
    let verified = tokio::spawn(async move { r2.verify(&o2).await.map(|r| r.failed.len()) }).await;
    assert!(
        verified.is_ok(),
        "verify panicked on a crafted delta: {:?}",
        verified.err()
    );
    let kind = restored.as_ref().err().map(|e| e.kind());
    assert_eq!(kind, Some(idem_replica::ErrorKind::Corrupt), "{restored:?}");
    Ok(())
}

/// A compacted delta that omits pages the chain added past the snapshot's end was accepted:
/// `ship_delta` zero-filled them before comparing snapshot+delta with tip+delta, so the
/// comparison never saw them, and the published compaction rebuilt a database that was not
/// the tip. The comparison now sees the pages as given, and refuses it.
#[tokio::test]
async fn compaction_missing_grown_pages_is_refused() -> R {
    let (replica, org, mut claim, mut conn, s1) = started(100).await?;
    let n = (s1.len() / 1024) as u32;
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

/// Hydrate applies a batch of deltas while it fetches the next. It used to wait for the
/// whole next batch even after the apply failed, so a stalled GET held a broken chain's
/// error (and the caller) as long as the store client allowed; the apply error now returns
/// at once. The GET of a delta in the second batch is held (never resumed) while the first
/// batch fails its checksum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_apply_returns_without_waiting_for_the_next_fetch() -> R {
    use idem_replica::fault::{FaultStore, Op};
    let mem: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let held = Arc::new(FaultStore::new(mem.clone()));
    let writer = Replica::open(mem.clone(), "", Settings::default()).await?;
    let two = Settings {
        read_concurrency: 2,
        ..Settings::default()
    };
    let reader = Replica::open(held.clone(), "", two).await?;
    let org = OrgId::new("acme")?;
    let mut claim = writer.claim(&org, "w", false).await?;
    let mut conn = Connection::open_in_memory()?;
    conn.execute_batch("PRAGMA page_size=1024; CREATE TABLE t(x BLOB);")?;
    let mut prev = image(&mut conn)?;
    writer
        .ship(&mut claim, Snapshot::from_bytes(prev.clone(), 1))
        .await?;
    let mut deltas = Vec::new();
    for commit in 2..=6 {
        conn.execute("INSERT INTO t VALUES (randomblob(300))", [])?;
        let next = image(&mut conn)?;
        deltas.push(
            writer
                .ship_delta(&mut claim, diff(&prev, &next, commit, |_| true)?)
                .await?,
        );
        prev = next;
    }
    // The first delta's checksum after it is wrong: the first batch (deltas 1-2) fails.
    let entry_path = Path::from(format!("orgs/acme/log/{:020}.json", deltas[0].seq));
    let mut v: serde_json::Value =
        serde_json::from_slice(&mem.get(&entry_path).await?.bytes().await?)?;
    v["checksum"] = "0000000000000000".into();
    mem.put(&entry_path, PutPayload::from(serde_json::to_vec(&v)?))
        .await?;
    // The third delta's blob (second batch) never arrives while the test runs.
    let blob = deltas[2]
        .blob
        .rsplit('/')
        .next()
        .ok_or("no blob name")?
        .to_owned();
    let pause = held.pause_next(Op::Get, &blob);
    let dir = tempfile::tempdir()?;
    let dest = dir.path().join("x.db");
    let (r2, o2, d2) = (reader.clone(), org.clone(), dest.clone());
    let restore = tokio::spawn(async move { r2.restore(&o2, None, &d2).await });
    let got = tokio::time::timeout(std::time::Duration::from_secs(60), restore)
        .await
        .map_err(|_| "restore waited for the held GET after its apply failed")??;
    assert!(matches!(got, Err(Error::ChainBroken { .. })), "{got:?}");
    assert!(!dest.exists(), "nothing is installed");
    drop(pause);
    Ok(())
}

/// A page encoded against content the chain tip does not hold (a caller's stale page cache)
/// was published and only failed at hydrate, as `ChainBroken`: a writer could acknowledge
/// requests whose state no successor can rebuild. `ship_delta` now refuses it before
/// publishing, and the next correct delta ships on the same chain.
#[tokio::test]
async fn a_delta_encoded_against_a_wrong_base_is_refused_before_publishing() -> R {
    let (replica, org, mut claim, mut conn, s1) = started(300).await?;
    conn.execute_batch("UPDATE t SET x = randomblob(300);")?;
    let s2 = image(&mut conn)?;
    let stale: Vec<u8> = s1.iter().map(|b| b ^ 0x5a).collect();
    let wrong = diff(&s1, &s2, 2, |_| true)?.encode_against(|p| {
        let at = (p as usize - 1) * 1024;
        stale.get(at..at + 1024)
    });
    let before = replica.history(&org).await?.len();
    let refused = replica.ship_delta(&mut claim, wrong).await;
    assert!(
        matches!(refused, Err(Error::InvalidSnapshot { .. })),
        "{refused:?}"
    );
    assert_eq!(
        replica.history(&org).await?.len(),
        before,
        "nothing published"
    );
    let right = diff(&s1, &s2, 2, |_| true)?.encode_against(|p| {
        let at = (p as usize - 1) * 1024;
        s1.get(at..at + 1024)
    });
    replica.ship_delta(&mut claim, right).await?;
    let dir = tempfile::tempdir()?;
    let got = replica
        .restore(&org, None, &dir.path().join("x.db"))
        .await?;
    assert_eq!((got.commit, got.deltas), (2, 1));
    assert_eq!(std::fs::read(dir.path().join("x.db"))?, s2);
    Ok(())
}
