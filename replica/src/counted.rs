//! An object store wrapper that counts requests by kind ([`crate::metrics::STORE_REQUESTS`]):
//! what a ship, a confirmation or an idle org costs in store requests is read from it.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};

use crate::metrics::STORE_REQUESTS;

/// Counts every request to the store it wraps, then forwards it unchanged.
#[derive(Debug)]
pub struct CountedStore {
    inner: Arc<dyn ObjectStore>,
}

impl CountedStore {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn ObjectStore>) -> CountedStore {
        CountedStore { inner }
    }
}

impl fmt::Display for CountedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.inner, f)
    }
}

fn count(op: &'static str) {
    metrics::counter!(STORE_REQUESTS, "op" => op).increment(1);
}

#[async_trait]
impl ObjectStore for CountedStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        count("put");
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        count("multipart");
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        count(if options.head { "head" } else { "get" });
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.inner
            .delete_stream(locations.inspect(|_| count("delete")).boxed())
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        count("list");
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        count("list");
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        count("copy");
        self.inner.copy_opts(from, to, options).await
    }
}
