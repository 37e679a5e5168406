//! Every request a `Replica` makes goes through its `CountedStore`: the counts are what the
//! protocol costs (I14). A snapshot ship is one blob PUT, one log-entry PUT and the LIST
//! above its slot that finds no successor (I11).

use std::sync::Arc;

use idem_replica::conformance::test_snapshot;
use idem_replica::{OrgId, Replica, Settings, StoreRequests};
use object_store::ObjectStoreExt;
use object_store::memory::InMemory;

fn minus(a: StoreRequests, b: StoreRequests) -> StoreRequests {
    StoreRequests {
        put: a.put - b.put,
        get: a.get - b.get,
        head: a.head - b.head,
        list: a.list - b.list,
        delete: a.delete - b.delete,
        copy: a.copy - b.copy,
        multipart: a.multipart - b.multipart,
    }
}

#[tokio::test]
async fn a_ship_costs_two_puts_and_a_list_and_the_counts_see_every_request()
-> Result<(), Box<dyn std::error::Error>> {
    let replica = Replica::open(Arc::new(InMemory::new()), "", Settings::default()).await?;
    // Opening probes that the store honours create-only puts: two PUTs and a DELETE.
    let opened = replica.store_requests();
    assert_eq!((opened.put, opened.delete), (2, 1), "{opened:?}");
    let org = OrgId::new("acme")?;
    let mut claim = replica.claim(&org, "w", false).await?;
    let before = replica.store_requests();
    replica.ship(&mut claim, test_snapshot(3)?).await?;
    let ship = minus(replica.store_requests(), before);
    assert_eq!((ship.put, ship.list), (2, 1), "{ship:?}");
    // A request made through `Replica::store` is counted too: it is the wrapper.
    let before = replica.store_requests();
    let _ = replica.store().head(&"nothing".into()).await;
    assert_eq!(minus(replica.store_requests(), before).total(), 1);
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
/// lists the whole prefix; the successor check must reach the store as a listing from its
/// slot on (S3 `start-after`).
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
    let before = store.with_offset.load(std::sync::atomic::Ordering::SeqCst);
    replica.ship(&mut claim, test_snapshot(3)?).await?;
    assert_eq!(
        store.with_offset.load(std::sync::atomic::Ordering::SeqCst) - before,
        1
    );
    Ok(())
}
