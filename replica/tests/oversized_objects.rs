//! A store that lies about an object's size, or holds one crafted to be huge, cannot make a
//! replica hold it (I10, I12). Guards against log entries, leases and delta blobs read whole
//! with no bound: a multi-gigabyte object at a log position would have been buffered in full
//! by every claim, hydrate and `idem inspect` of the org. Each is now read up to a bound (an
//! entry: `MAX_ENTRY_BYTES`; a delta blob: the size its entry records) and refused beyond
//! it as `Corrupt`, naming the object, with nothing installed.

use std::collections::BTreeMap;
use std::sync::Arc;

use idem_replica::{Delta, ErrorKind, MAX_ENTRY_BYTES, OrgId, Replica, Settings, Snapshot};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, memory::InMemory};

type R = Result<(), Box<dyn std::error::Error>>;

fn conn_with(rows: i64) -> rusqlite::Result<rusqlite::Connection> {
    let conn = rusqlite::Connection::open_in_memory()?;
    conn.execute_batch("CREATE TABLE t(x);")?;
    for i in 0..rows {
        conn.execute("INSERT INTO t VALUES (randomblob(200) || ?1)", [i])?;
    }
    Ok(conn)
}

/// The pages of `next` that differ from `prev` (both images of `page_size` pages).
fn diff(
    prev: &[u8],
    next: &[u8],
    page_size: usize,
    commit: u64,
) -> Result<Delta, idem_replica::Error> {
    let mut pages = BTreeMap::new();
    for (i, page) in next.chunks(page_size).enumerate() {
        if prev.get(i * page_size..(i + 1) * page_size) != Some(page) {
            pages.insert(i as u32 + 1, page.to_vec());
        }
    }
    Delta::new(
        page_size as u32,
        (next.len() / page_size) as u32,
        pages,
        commit,
    )
}

/// An object of `n` bytes: a JSON object padded with spaces, so only its size is wrong.
fn padded(n: u64) -> PutPayload {
    let mut body = b"{\"v\":1}".to_vec();
    body.resize(n as usize, b' ');
    PutPayload::from(body)
}

#[tokio::test]
async fn an_oversized_object_at_a_log_position_is_corrupt_not_held() -> R {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let replica = Replica::open(store.clone(), "", Settings::default()).await?;
    let org = OrgId::new("acme")?;
    let mut claim = replica.claim(&org, "w", false).await?;
    let shipped = replica
        .ship(&mut claim, Snapshot::take(&conn_with(3)?, |_| Ok(1))?)
        .await?;
    // The next position, as a lying store would serve it.
    let head = Path::from(format!("orgs/acme/log/{:020}.json", shipped.seq + 1));
    store.put(&head, padded(MAX_ENTRY_BYTES + 1)).await?;

    let other = Replica::open(store.clone(), "", Settings::default()).await?;
    let claimed = other.claim(&org, "w2", true).await;
    let err = claimed
        .err()
        .ok_or("a claim read past an oversized entry")?;
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err:?}");
    assert!(err.to_string().contains(head.as_ref()), "{err}");
    assert!(
        err.to_string().contains("expected"),
        "refused for its size: {err}"
    );
    let history = other.history(&org).await;
    assert!(
        matches!(&history, Err(e) if e.kind() == ErrorKind::Corrupt),
        "{history:?}"
    );

    // At the bound the same object is read, and refused for what it says (no entry kind),
    // not for its size.
    store.put(&head, padded(MAX_ENTRY_BYTES)).await?;
    let err = other
        .history(&org)
        .await
        .err()
        .ok_or("a padded entry read")?;
    assert!(
        matches!(&err, idem_replica::Error::UnknownFormat { .. }),
        "{err:?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_delta_blob_longer_than_its_entry_records_is_corrupt_and_nothing_is_restored() -> R {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let settings = Settings {
        inline_delta_bytes: 0,
        ..Settings::default()
    };
    let replica = Replica::open(store.clone(), "", settings).await?;
    let org = OrgId::new("acme")?;
    let mut claim = replica.claim(&org, "w", false).await?;
    let before = conn_with(3)?;
    let base = Snapshot::take(&before, |_| Ok(1))?;
    let base_bytes = base.bytes().to_vec();
    replica.ship(&mut claim, base).await?;
    before.execute("INSERT INTO t VALUES (randomblob(300))", [])?;
    let after = Snapshot::take(&before, |_| Ok(2))?;
    let shipped = replica
        .ship_delta(&mut claim, diff(&base_bytes, after.bytes(), 4096, 2)?)
        .await?;
    let entry = replica
        .history(&org)
        .await?
        .into_iter()
        .find(|e| e.seq() == shipped.seq)
        .ok_or("the delta's entry")?;
    let name = entry.blob().ok_or("the delta has a blob")?.to_owned();
    let blob = Path::from(format!("orgs/acme/snap/{name}"));
    let mut longer = store.get(&blob).await?.bytes().await?.to_vec();
    longer.extend_from_slice(&[0u8; 64]);
    store.put(&blob, PutPayload::from(longer)).await?;

    let dest = tempfile::tempdir()?;
    let restored = replica.restore(&org, None, &dest.path().join("x.db")).await;
    let err = restored
        .err()
        .ok_or("a blob longer than its entry was restored")?;
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err:?}");
    assert!(err.to_string().contains(blob.as_ref()), "{err}");
    assert!(
        err.to_string().contains("expected"),
        "refused for its size: {err}"
    );
    assert!(!dest.path().join("x.db").exists());
    Ok(())
}

/// A dead holder's process lease over the cap (a lying store, or a drain listing hundreds of
/// thousands of orgs) is watched like any other: its orgs move after one watch of the
/// claimant's clock, not never.
#[tokio::test]
async fn a_dead_holders_oversized_process_lease_lapses_after_a_watch() -> R {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let settings = Settings {
        lease_ms: 1_000,
        ..Settings::default()
    };
    let a = Replica::open(store.clone(), "", settings.clone()).await?;
    let org = OrgId::new("acme")?;
    let mut claim = a.claim(&org, "wa", false).await?;
    a.ship(&mut claim, Snapshot::take(&conn_with(1)?, |_| Ok(1))?)
        .await?;
    let path = Path::from(format!("processes/{}.json", a.instance()));
    drop(claim);
    drop(a);
    store
        .put(&path, padded(idem_replica::MAX_LEASE_BYTES + 1))
        .await?;

    let clock = Arc::new(idem_replica::ManualClock::new(1_000_000));
    let b = Replica::open_with(store.clone(), "", settings, clock.clone(), None).await?;
    let first = b.claim(&org, "wb", false).await;
    assert!(
        matches!(&first, Err(idem_replica::Error::LeaseHeld { .. })),
        "a first sighting waits a watch: {first:?}"
    );
    clock.advance(1_100);
    b.claim(&org, "wb", false).await?;
    Ok(())
}
