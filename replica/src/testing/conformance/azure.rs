//! The Azure Blob test server: `scripts/azure-server` starts Azurite on loopback and names it
//! in [`AZURE_ENDPOINT_ENV`]. Azure tests are `#[ignore]`d with that reason, and fail (never
//! skip) when run without it.

use std::sync::Arc;

use object_store::ObjectStore;

use crate::Error;

/// Names the Blob service URL of a test server, without the account (`http://127.0.0.1:PORT`;
/// `scripts/azure-server` sets it).
pub const AZURE_ENDPOINT_ENV: &str = "IDEM_AZURE_ENDPOINT";
/// Names the container on that server (default `idem-test`).
pub const AZURE_CONTAINER_ENV: &str = "IDEM_AZURE_CONTAINER";

/// Azurite's well-known development account (the emulator's only account by default).
pub const AZURITE_ACCOUNT: &str = "devstoreaccount1";
/// The public key of [`AZURITE_ACCOUNT`], published in Azurite's documentation.
pub const AZURITE_ACCOUNT_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// The Azure Blob test server named by [`AZURE_ENDPOINT_ENV`], or `None` when it is unset.
///
/// Built the way a user configures an account with an explicit endpoint:
/// `MicrosoftAzureBuilder` with the account URL (`{endpoint}/devstoreaccount1`, Azurite's
/// path-style addressing), the account's shared key and plain HTTP allowed. Conditional puts
/// are object_store's (`If-None-Match: *` for `PutMode::Create`, `If-Match` for updates).
/// Each conformance case works under its own random prefix, so one container serves them all.
///
/// # Errors
/// [`Error::Store`] when the builder refuses the settings.
pub fn azure_store_from_env() -> Result<Option<Arc<dyn ObjectStore>>, Error> {
    let Ok(endpoint) = std::env::var(AZURE_ENDPOINT_ENV) else {
        return Ok(None);
    };
    let container = std::env::var(AZURE_CONTAINER_ENV).unwrap_or_else(|_| "idem-test".to_owned());
    let account_url = format!("{}/{AZURITE_ACCOUNT}", endpoint.trim_end_matches('/'));
    let built = object_store::azure::MicrosoftAzureBuilder::new()
        .with_account(AZURITE_ACCOUNT)
        .with_access_key(AZURITE_ACCOUNT_KEY)
        .with_endpoint(account_url.clone())
        .with_allow_http(true)
        .with_container_name(&container)
        .build();
    super::built(built, || format!("az://{container} at {account_url}"))
}

/// The Azure test server, for a test that needs one.
///
/// # Panics
/// When [`AZURE_ENDPOINT_ENV`] is not set or the store cannot be built: a test that did not
/// run must not count as passed. Such tests are `#[ignore = "needs Azurite: run under
/// scripts/azure-server"]`, and run with `--include-ignored`.
pub fn azure_store() -> Arc<dyn ObjectStore> {
    super::required(
        "Azurite",
        AZURE_ENDPOINT_ENV,
        "scripts/azure-server",
        azure_store_from_env(),
    )
}
