//! Every request a `Replica` makes goes through its `CountedStore`: the counts are what the
//! protocol costs (I14). A full snapshot ship of a small database is one segment PUT, one
//! manifest PUT and one log-entry PUT; a small
//! delta is one log-entry PUT carrying its body; neither lists the log (the create-only slot
//! after the writer's own last entry is the fence, I7, I11). A confirmation is one LIST.

use std::sync::Arc;

use std::collections::BTreeMap;

use idem_replica::conformance::test_snapshot;
use idem_replica::{Delta, OrgId, Replica, Settings, Snapshot, StoreRequests};
use object_store::ObjectStoreExt;
use object_store::memory::InMemory;

#[tokio::test]
async fn a_full_snapshot_costs_three_puts_and_no_list_and_the_counts_see_every_request()
-> Result<(), Box<dyn std::error::Error>> {
    let replica = Replica::open(Arc::new(InMemory::new()), "", Settings::default()).await?;
    // Opening probes that the store honours create-only puts: two PUTs and a DELETE.
    let opened = replica.store_requests();
    assert_eq!((opened.put, opened.delete), (2, 1), "{opened:?}");
    let org = OrgId::new("acme")?;
    let mut claim = replica.claim(&org, "w", false).await?;
    let before = replica.store_requests();
    replica.ship(&mut claim, test_snapshot(3)?).await?;
    let ship = replica.store_requests().since(&before);
    assert_eq!(
        ship,
        StoreRequests {
            put: 3,
            ..StoreRequests::default()
        }
    );
    // A second snapshot of the same pages names the segment it already uploaded.
    let before = replica.store_requests();
    replica.ship(&mut claim, test_snapshot(3)?).await?;
    assert_eq!(replica.store_requests().since(&before).put, 2);
    // A request made through `Replica::store` is counted too: it is the wrapper.
    let before = replica.store_requests();
    let _ = replica.store().head(&"nothing".into()).await;
    assert_eq!(replica.store_requests().since(&before).total(), 1);
    Ok(())
}

/// A store that records which listing calls reach it.
#[derive(Debug)]
struct Listings {
    inner: InMemory,
    with_offset: std::sync::atomic::AtomicU64,
}

impl std::fmt::Display for Listings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("listings")
    }
}

#[async_trait::async_trait]
impl object_store::ObjectStore for Listings {
    async fn put_opts(
        &self,
        location: &object_store::path::Path,
        payload: object_store::PutPayload,
        opts: object_store::PutOptions,
    ) -> object_store::Result<object_store::PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }
    async fn put_multipart_opts(
        &self,
        location: &object_store::path::Path,
        opts: object_store::PutMultipartOptions,
    ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }
    async fn get_opts(
        &self,
        location: &object_store::path::Path,
        options: object_store::GetOptions,
    ) -> object_store::Result<object_store::GetResult> {
        self.inner.get_opts(location, options).await
    }
    fn delete_stream(
        &self,
        locations: futures::stream::BoxStream<
            'static,
            object_store::Result<object_store::path::Path>,
        >,
    ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::path::Path>> {
        self.inner.delete_stream(locations)
    }
    fn list(
        &self,
        prefix: Option<&object_store::path::Path>,
    ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>> {
        self.inner.list(prefix)
    }
    fn list_with_offset(
        &self,
        prefix: Option<&object_store::path::Path>,
        offset: &object_store::path::Path,
    ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>> {
        self.with_offset
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.list_with_offset(prefix, offset)
    }
    async fn list_with_delimiter(
        &self,
        prefix: Option<&object_store::path::Path>,
    ) -> object_store::Result<object_store::ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }
    async fn copy_opts(
        &self,
        from: &object_store::path::Path,
        to: &object_store::path::Path,
        options: object_store::CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

/// Regression: the counting wrapper left `list_with_offset` to the trait's default, which
/// lists the whole prefix; the successor check of a confirmation must reach the store as a
/// listing from its slot on (S3 `start-after`).
#[tokio::test]
async fn the_successor_check_lists_from_its_slot_through_the_counting_wrapper()
-> Result<(), Box<dyn std::error::Error>> {
    let store = Arc::new(Listings {
        inner: InMemory::new(),
        with_offset: Default::default(),
    });
    let replica = Replica::open(store.clone(), "", Settings::default()).await?;
    let org = OrgId::new("acme")?;
    let mut claim = replica.claim(&org, "w", false).await?;
    replica.ship(&mut claim, test_snapshot(3)?).await?;
    let before = store.with_offset.load(std::sync::atomic::Ordering::SeqCst);
    replica.confirm(&mut claim).await?;
    assert_eq!(
        store.with_offset.load(std::sync::atomic::Ordering::SeqCst) - before,
        1
    );
    Ok(())
}

type R = Result<(), Box<dyn std::error::Error>>;

/// An image of table `t` with `rows` rows of `blob_bytes` random bytes each; commit = rows.
fn image(rows: u64, blob_bytes: usize) -> Result<Snapshot, Box<dyn std::error::Error>> {
    let conn = rusqlite::Connection::open_in_memory()?;
    conn.execute_batch("PRAGMA page_size=1024; CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")?;
    for i in 0..rows {
        conn.execute(
            "INSERT INTO t(id, v) VALUES (?1, randomblob(?2))",
            rusqlite::params![i as i64, blob_bytes as i64],
        )?;
    }
    Ok(Snapshot::take(&conn, |c| {
        c.query_row("SELECT count(*) FROM t", [], |r| r.get::<_, i64>(0))
            .map(|n| n as u64)
    })?)
}

/// The pages of `next` (1 KiB pages) that differ from `prev`, as a delta at `commit`.
fn diff(prev: &[u8], next: &[u8], commit: u64) -> Result<Delta, idem_replica::Error> {
    let mut pages = BTreeMap::new();
    for (i, page) in next.chunks(1024).enumerate() {
        if prev.get(i * 1024..(i + 1) * 1024) != Some(page) {
            pages.insert(i as u32 + 1, page.to_vec());
        }
    }
    Delta::new(1024, (next.len() / 1024) as u32, pages, commit)
}

/// `n` images, each the one before plus a row of `blob_bytes` random bytes (one connection,
/// so every image is the previous one with some pages changed).
fn growing(n: u64, blob_bytes: usize) -> Result<Vec<Vec<u8>>, Box<dyn std::error::Error>> {
    let conn = rusqlite::Connection::open_in_memory()?;
    conn.execute_batch("PRAGMA page_size=1024; CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")?;
    let mut out = Vec::new();
    for i in 0..n {
        conn.execute(
            "INSERT INTO t(id, v) VALUES (?1, randomblob(?2))",
            rusqlite::params![i as i64, blob_bytes as i64],
        )?;
        let snap = Snapshot::take(&conn, |_| Ok(i + 1))?;
        out.push(snap.bytes().to_vec());
    }
    Ok(out)
}

/// The objects under the org's `snap/` directory.
async fn blobs(replica: &Replica) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    use futures::TryStreamExt;
    Ok(replica
        .store()
        .list(Some(&"orgs/acme/snap".into()))
        .map_ok(|m| m.location.to_string())
        .try_collect()
        .await?)
}

/// Issue 16's goal: a small delta ship is exactly one create-only PUT (its body inside the
/// entry) and no LIST; the chain stays checkable.
#[tokio::test]
async fn a_small_delta_costs_exactly_one_put_and_no_list() -> R {
    let replica = Replica::open(Arc::new(InMemory::new()), "", Settings::default()).await?;
    let org = OrgId::new("acme")?;
    let mut claim = replica.claim(&org, "w", false).await?;
    let images = growing(2, 100)?;
    replica
        .ship(&mut claim, Snapshot::from_bytes(images[0].clone(), 1))
        .await?;
    let blobs_before = blobs(&replica).await?;
    let before = replica.store_requests();
    let shipped = replica
        .ship_delta(&mut claim, diff(&images[0], &images[1], 2)?)
        .await?;
    let cost = replica.store_requests().since(&before);
    assert_eq!(
        cost,
        StoreRequests {
            put: 1,
            ..StoreRequests::default()
        }
    );
    assert!(shipped.delta);
    assert!(
        shipped
            .blob
            .ends_with(&format!("log/{:020}.json", shipped.seq))
    );
    assert_eq!(
        blobs(&replica).await?,
        blobs_before,
        "a delta blob was uploaded"
    );
    let log = replica.history(&org).await?;
    assert!(
        log.last()
            .is_some_and(|e| e.is_inline() && e.version() == 2)
    );
    Ok(())
}

/// A delta whose packed body is above `inline_delta_bytes` (or with inline bodies off) gets
/// its blob: two PUTs, still no LIST.
#[tokio::test]
async fn a_large_delta_or_inline_off_costs_two_puts_and_no_list() -> R {
    let two_puts = StoreRequests {
        put: 2,
        ..StoreRequests::default()
    };
    // 300 KB of random bytes: about 300 KB packed, above the 256 KiB default.
    let big = image(300, 1000)?;
    let small = image(0, 0)?;
    let off = Settings {
        inline_delta_bytes: 0,
        ..Settings::default()
    };
    let grown = growing(2, 100)?;
    for (settings, prev, next) in [
        (
            Settings::default(),
            small.bytes().to_vec(),
            big.bytes().to_vec(),
        ),
        (off, grown[0].clone(), grown[1].clone()),
    ] {
        let replica = Replica::open(Arc::new(InMemory::new()), "", settings).await?;
        let org = OrgId::new("acme")?;
        let mut claim = replica.claim(&org, "w", false).await?;
        replica
            .ship(&mut claim, Snapshot::from_bytes(prev.clone(), 1))
            .await?;
        let before = replica.store_requests();
        replica
            .ship_delta(&mut claim, diff(&prev, &next, 2)?)
            .await?;
        assert_eq!(replica.store_requests().since(&before), two_puts);
        let log = replica.history(&org).await?;
        assert!(
            log.last()
                .is_some_and(|e| e.blob().is_some() && e.version() == 1)
        );
    }
    Ok(())
}

/// Inline bodies go through hydrate, restore at every position and verify byte for byte,
/// with the same size and sha256 checks as blobs (I10).
#[tokio::test]
async fn inline_deltas_hydrate_restore_and_verify_byte_for_byte() -> R {
    let replica = Replica::open(Arc::new(InMemory::new()), "", Settings::default()).await?;
    let org = OrgId::new("acme")?;
    let mut claim = replica.claim(&org, "w", false).await?;
    let images = growing(6, 300)?;
    replica
        .ship(&mut claim, Snapshot::from_bytes(images[0].clone(), 1))
        .await?;
    let mut positions = Vec::new();
    for (i, pair) in images.windows(2).enumerate() {
        let shipped = replica
            .ship_delta(&mut claim, diff(&pair[0], &pair[1], i as u64 + 2)?)
            .await?;
        positions.push((shipped.seq, pair[1].clone()));
    }
    let log = replica.history(&org).await?;
    assert_eq!(log.iter().filter(|e| e.is_inline()).count(), 5, "{log:?}");
    let dir = tempfile::tempdir()?;
    for (seq, want) in &positions {
        let dest = dir.path().join(format!("at-{seq}.db"));
        let restored = replica.restore(&org, Some(*seq), &dest).await?;
        assert_eq!(restored.position, Some(*seq));
        assert!(std::fs::read(&dest)? == *want, "restore at {seq} differs");
    }
    replica.release(&mut claim).await?;
    let mut next = replica.claim(&org, "w2", false).await?;
    let dest = dir.path().join("hydrated.db");
    let hydrated = replica.hydrate(&mut next, &dest).await?;
    assert_eq!(hydrated.deltas, 5);
    assert!(
        positions
            .last()
            .is_some_and(|(_, want)| std::fs::read(&dest).ok().as_ref() == Some(want))
    );
    let report = replica.verify(&org).await?;
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert_eq!(report.ok.len(), 6);
    Ok(())
}

/// Retention used to GET every log entry on every run, so its cost grew with the log (and,
/// run every few full snapshots, with the acknowledgements). It now reads only entries its
/// handle has not published or read before: a run over a log this handle wrote is three
/// LISTs (the log, the level files, the blobs).
#[tokio::test]
async fn retention_reads_only_entries_its_handle_has_not_seen() -> R {
    let store = Arc::new(InMemory::new());
    let replica = Replica::open(store.clone(), "", Settings::default()).await?;
    let org = OrgId::new("acme")?;
    let mut claim = replica.claim(&org, "w", false).await?;
    let images = growing(5, 100)?;
    replica
        .ship(&mut claim, Snapshot::from_bytes(images[0].clone(), 1))
        .await?;
    for (i, pair) in images.windows(2).enumerate() {
        replica
            .ship_delta(&mut claim, diff(&pair[0], &pair[1], i as u64 + 2)?)
            .await?;
    }
    let policy = idem_replica::Retention::default();
    let lists = StoreRequests {
        list: 3,
        ..StoreRequests::default()
    };
    let before = replica.store_requests();
    replica.retain(&org, &policy).await?;
    assert_eq!(replica.store_requests().since(&before), lists);
    // Another handle reads each entry once and the snapshot's manifest once, then knows them.
    let other = Replica::open(store, "", Settings::default()).await?;
    let before = other.store_requests();
    other.retain(&org, &policy).await?;
    let first = other.store_requests().since(&before);
    assert_eq!((first.get, first.list), (7, 3), "{first:?}");
    let before = other.store_requests();
    other.retain(&org, &policy).await?;
    assert_eq!(other.store_requests().since(&before), lists);
    // Entries retention deletes are forgotten: the next run neither reads nor deletes them.
    let keep_one = idem_replica::Retention {
        keep_snapshots: 1,
        keep_ms: 0,
        window_ms: 0,
        level_ms: 0,
    };
    replica
        .ship(&mut claim, Snapshot::from_bytes(images[4].clone(), 5))
        .await?;
    let report = replica.retain(&org, &keep_one).await?;
    assert_eq!(report.deleted_entries, vec![2, 3, 4, 5, 6], "{report:?}");
    let before = replica.store_requests();
    let again = replica.retain(&org, &keep_one).await?;
    assert!(again.deleted_entries.is_empty(), "{again:?}");
    assert_eq!(replica.store_requests().since(&before), lists);
    Ok(())
}
