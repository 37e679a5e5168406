//! Regression tests from an adversarial review of delta shipping: restore of a delta whose
//! snapshot is gone, a zombie delta after retention, and a crafted delta size (I7, I10, I11).

use std::collections::BTreeMap;
use std::sync::Arc;

use idem_replica::{Delta, OrgId, Replica, Retention, Settings, Snapshot};
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

/// Pages that differ between two images, as a Delta.
fn diff(
    old: &[u8],
    new: &[u8],
    commit: u64,
) -> Result<Delta, Box<dyn std::error::Error + Send + Sync>> {
    let ps = u16::from_be_bytes([new[16], new[17]]) as usize;
    let mut pages = BTreeMap::new();
    for (i, p) in new.chunks(ps).enumerate() {
        if old.get(i * ps..(i + 1) * ps) != Some(p) {
            pages.insert(i as u32 + 1, p.to_vec());
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
        .ship_delta(&mut claim, diff(s.bytes(), s2.bytes(), 2)?)
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
        .ship_delta(&mut w1, diff(s1.bytes(), s2.bytes(), 2)?)
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
        .ship_delta(&mut w1, diff(s2.bytes(), s3.bytes(), 3)?)
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
