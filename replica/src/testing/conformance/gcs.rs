//! The Google Cloud Storage emulators: `scripts/gcs-server` starts fake-gcs-server and
//! gcp-storage-emulator on loopback and names them in [`GCS_ENDPOINT_ENV`] and
//! [`GCS_STUB_ENDPOINT_ENV`]. Neither can run the conformance suite through object_store's
//! GCS client (docs/stores.md says why); their tests check that idem refuses them. Those
//! tests are `#[ignore]`d, and fail (never skip) when run without the servers.

use std::sync::Arc;

use object_store::{ClientOptions, ObjectStore};

use crate::Error;

/// Names the base URL of fake-gcs-server (`http://127.0.0.1:PORT`; `scripts/gcs-server` sets it).
pub const GCS_ENDPOINT_ENV: &str = "IDEM_GCS_ENDPOINT";
/// Names the base URL of gcp-storage-emulator (`scripts/gcs-server` sets it).
pub const GCS_STUB_ENDPOINT_ENV: &str = "IDEM_GCS_STUB_ENDPOINT";
/// Names the bucket on both servers (default `idemtest`: letters only, as object_store
/// percent-encodes every other character of a bucket name and gcp-storage-emulator routes on
/// the raw path).
pub const GCS_BUCKET_ENV: &str = "IDEM_GCS_BUCKET";

/// The GCS emulator whose base URL the variable `endpoint_env` names ([`GCS_ENDPOINT_ENV`]
/// or [`GCS_STUB_ENDPOINT_ENV`]), or `None` when it is unset.
///
/// Built as `GOOGLE_BASE_URL`, `GOOGLE_BEARER_TOKEN=test` and `GOOGLE_ALLOW_HTTP=true` build
/// it for a `gs://` URL: the emulator's base URL, a static bearer token the emulators do not
/// check (object_store 0.14 fetches a token for every write, even with `skip_signature`, so
/// without one it asks the instance metadata server), plain HTTP. object_store 0.14 speaks the XML API to it (`PUT
/// /{bucket}/{object}`, create-only as `x-goog-if-generation-match: 0`).
///
/// # Errors
/// [`Error::Store`] when the builder refuses the settings.
pub fn gcs_store_from_env(endpoint_env: &str) -> Result<Option<Arc<dyn ObjectStore>>, Error> {
    let Ok(endpoint) = std::env::var(endpoint_env) else {
        return Ok(None);
    };
    let bucket = std::env::var(GCS_BUCKET_ENV).unwrap_or_else(|_| "idemtest".to_owned());
    let built = object_store::gcp::GoogleCloudStorageBuilder::new()
        .with_bucket_name(&bucket)
        .with_base_url(endpoint.trim_end_matches('/'))
        .with_bearer_token("test")
        .with_client_options(ClientOptions::new().with_allow_http(true))
        .build();
    super::built(built, || format!("gs://{bucket} at {endpoint}"))
}

/// The GCS emulator `endpoint_env` names, for a test that needs it.
///
/// # Panics
/// When `endpoint_env` is not set or the store cannot be built: a test that did not run must
/// not count as passed. Such tests are `#[ignore = "needs the GCS emulators: run under
/// scripts/gcs-server"]`, and run with `--include-ignored`.
pub fn gcs_store(endpoint_env: &str) -> Arc<dyn ObjectStore> {
    super::required(
        "a GCS emulator",
        endpoint_env,
        "scripts/gcs-server",
        gcs_store_from_env(endpoint_env),
    )
}
