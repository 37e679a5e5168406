//! The S3 API test server: `scripts/s3-server` starts one on loopback and names it in
//! [`S3_ENDPOINT_ENV`]. S3 tests are `#[ignore]`d with that reason, and fail (never skip)
//! when run without it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use object_store::ObjectStore;

use crate::Error;

/// Names the S3 endpoint of a test server (`scripts/s3-server` sets it).
pub const S3_ENDPOINT_ENV: &str = "IDEM_S3_ENDPOINT";
/// Names the bucket on that server (default `idem-test`).
pub const S3_BUCKET_ENV: &str = "IDEM_S3_BUCKET";

/// The S3-compatible test server named by [`S3_ENDPOINT_ENV`], or `None` when it is unset
/// (for benchmarks, which leave out the S3 row; tests use [`s3_store`]).
///
/// Built the way a user configures one: `AmazonS3Builder` with the endpoint, path-style
/// addressing, plain HTTP allowed, region `us-east-1` and static credentials. Conditional
/// puts are object_store's default (`If-None-Match: *` for `PutMode::Create`). Each
/// conformance case works under its own random prefix, so one bucket serves them all.
///
/// # Errors
/// [`Error::Store`] when the builder refuses the settings.
pub fn s3_store_from_env() -> Result<Option<Arc<dyn ObjectStore>>, Error> {
    let Ok(endpoint) = std::env::var(S3_ENDPOINT_ENV) else {
        return Ok(None);
    };
    let bucket = std::env::var(S3_BUCKET_ENV).unwrap_or_else(|_| "idem-test".to_owned());
    let built = object_store::aws::AmazonS3Builder::new()
        .with_bucket_name(&bucket)
        .with_endpoint(&endpoint)
        .with_allow_http(true)
        .with_virtual_hosted_style_request(false)
        .with_region("us-east-1")
        .with_access_key_id("test")
        .with_secret_access_key("test")
        .build();
    super::built(built, || format!("s3://{bucket} at {endpoint}"))
}

/// The S3 test server, for a test that needs one.
///
/// # Panics
/// When [`S3_ENDPOINT_ENV`] is not set or the store cannot be built: a test that did not
/// run must not count as passed. Such tests are `#[ignore = "needs a loopback S3 server:
/// run under scripts/s3-server"]`, and run with `--include-ignored`.
pub fn s3_store() -> Arc<dyn ObjectStore> {
    super::required(
        "a loopback S3 server",
        S3_ENDPOINT_ENV,
        "scripts/s3-server",
        s3_store_from_env(),
    )
}

/// A prefix no other test (or earlier run against the same bucket) uses: `tag`, the process
/// id, the time in ns and a per-process counter.
pub fn unique_prefix(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = idem_base::Clock::now(&idem_base::SystemClock)
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "s3test-{tag}-{}-{nanos}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}
