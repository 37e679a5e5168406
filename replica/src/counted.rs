//! An object store wrapper that counts requests by kind ([`crate::metrics::STORE_REQUESTS`]):
//! what a ship, a confirmation or an idle org costs in store requests is read from it.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};

use crate::metrics::STORE_REQUESTS;

/// Counts every request to the store it wraps, then forwards it unchanged: into the
/// metrics facade, and into [`StoreRequests`] this process can read back.
#[derive(Debug)]
pub struct CountedStore {
    inner: Arc<dyn ObjectStore>,
    counts: Arc<Counts>,
}

/// Requests by op since the store was wrapped.
#[derive(Debug, Default)]
pub(crate) struct Counts([AtomicU64; OPS.len()]);

const OPS: [&str; 7] = ["put", "get", "head", "list", "delete", "copy", "multipart"];

/// Store requests made through one [`crate::Replica`] since it was opened, by op.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreRequests {
    /// PUTs (blobs, log entries, leases).
    pub put: u64,
    /// GETs (log entries, blobs, leases).
    pub get: u64,
    /// HEADs.
    pub head: u64,
    /// LISTs.
    pub list: u64,
    /// DELETEs (one per object).
    pub delete: u64,
    /// COPYs.
    pub copy: u64,
    /// Multipart uploads started.
    pub multipart: u64,
}

impl StoreRequests {
    /// Every request, all ops together.
    pub fn total(&self) -> u64 {
        self.put + self.get + self.head + self.list + self.delete + self.copy + self.multipart
    }

    /// The requests made since `earlier`, a snapshot of the same counts taken before (counts
    /// only grow; a later `earlier` saturates at zero).
    pub fn since(&self, earlier: &StoreRequests) -> StoreRequests {
        StoreRequests {
            put: self.put.saturating_sub(earlier.put),
            get: self.get.saturating_sub(earlier.get),
            head: self.head.saturating_sub(earlier.head),
            list: self.list.saturating_sub(earlier.list),
            delete: self.delete.saturating_sub(earlier.delete),
            copy: self.copy.saturating_sub(earlier.copy),
            multipart: self.multipart.saturating_sub(earlier.multipart),
        }
    }
}

impl CountedStore {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn ObjectStore>) -> CountedStore {
        CountedStore {
            inner,
            counts: Arc::default(),
        }
    }

    /// The requests made so far.
    pub fn requests(&self) -> StoreRequests {
        self.counts.snapshot()
    }

    pub(crate) fn counts(&self) -> Arc<Counts> {
        self.counts.clone()
    }

    fn count(&self, op: usize) {
        self.counts.count(op);
    }
}

impl Counts {
    fn count(&self, op: usize) {
        self.0[op].fetch_add(1, Ordering::Relaxed);
        metrics::counter!(STORE_REQUESTS, "op" => OPS[op]).increment(1);
    }

    pub(crate) fn snapshot(&self) -> StoreRequests {
        let c = |i: usize| self.0[i].load(Ordering::Relaxed);
        StoreRequests {
            put: c(0),
            get: c(1),
            head: c(2),
            list: c(3),
            delete: c(4),
            copy: c(5),
            multipart: c(6),
        }
    }
}

impl fmt::Display for CountedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.inner, f)
    }
}

#[async_trait]
impl ObjectStore for CountedStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.count(0);
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.count(6);
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.count(if options.head { 2 } else { 1 });
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        let counts = self.counts.clone();
        self.inner
            .delete_stream(locations.inspect(move |_| counts.count(4)).boxed())
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.count(3);
        self.inner.list(prefix)
    }

    // Forwarded, not left to the trait's default (a full listing filtered here): the
    // successor check lists from its own slot on (S3 `start-after`), so its cost follows the
    // entries above it, not the length of the log.
    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.count(3);
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.count(3);
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.count(5);
        self.inner.copy_opts(from, to, options).await
    }
}
