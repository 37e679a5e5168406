//! The replica on the GCS emulators: neither can hold idem's fencing through object_store
//! 0.14's GCS client (it writes through the XML API, `PUT /{bucket}/{object}` with
//! `x-goog-if-generation-match: 0` for a create): fake-gcs-server takes no such write, and
//! gcp-storage-emulator takes it but ignores the condition. The store probe must refuse both,
//! and these tests check that it does and why. The conformance suite does not run on them; a GCS
//! server that enforces the condition would run it with `TestStore::gcs()`.
//!
//! Ignored unless asked for, and failing when no server is configured:
//! `scripts/gcs-server -- cargo test -p idem-replica --test gcs -- --include-ignored` starts
//! fake-gcs-server and gcp-storage-emulator on loopback, sets `IDEM_GCS_ENDPOINT` and
//! `IDEM_GCS_STUB_ENDPOINT` and runs them.

use idem_replica::conformance::{
    GCS_ENDPOINT_ENV, GCS_STUB_ENDPOINT_ENV, gcs_store, unique_prefix,
};
use idem_replica::{Error, Replica, Settings};
use object_store::path::Path;
use object_store::{ObjectStore, PutMode, PutPayload};

type R = Result<(), Box<dyn std::error::Error + Send + Sync>>;

async fn create(
    store: &dyn ObjectStore,
    path: &Path,
    body: &'static [u8],
) -> object_store::Result<()> {
    store
        .put_opts(path, PutPayload::from_static(body), PutMode::Create.into())
        .await
        .map(|_| ())
}

/// fake-gcs-server (1.54.0) answers every XML API upload that is not a signed URL with `400
/// invalid uploadType`: object_store cannot write to it at all, so the probe's first create
/// fails and `Replica::open` refuses the store (a store error, before any condition is
/// tested). Lists and reads answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the GCS emulators: run under scripts/gcs-server"]
async fn fake_gcs_server_takes_no_write_from_object_store_so_the_probe_refuses_it() -> R {
    let store = gcs_store(GCS_ENDPOINT_ENV);
    let prefix = unique_prefix("gcs-fake");
    let path = Path::from(format!("{prefix}/obj"));
    match create(store.as_ref(), &path, b"first").await {
        Err(object_store::Error::AlreadyExists { .. }) | Ok(()) => {
            return Err(
                "fake-gcs-server took an XML API upload: run the conformance suite on it".into(),
            );
        }
        Err(e) => assert!(
            e.to_string().contains("invalid uploadType"),
            "an unexpected refusal: {e}"
        ),
    }
    let listed = store
        .list_with_delimiter(Some(&Path::from(prefix.as_str())))
        .await?;
    assert!(listed.objects.is_empty() && listed.common_prefixes.is_empty());
    match Replica::open(store, &prefix, Settings::default()).await {
        Err(Error::Store { op: "put", .. }) => Ok(()),
        other => Err(format!("fake-gcs-server was not refused: {other:?}").into()),
    }
}

/// gcp-storage-emulator stores an XML API upload but answers it without an ETag header, so
/// object_store reports every put as failed after the server took it (`MissingEtag`, read
/// only from a 2xx answer); and it ignores `x-goog-if-generation-match: 0`: a second create
/// on the same object is answered 2xx again where GCS answers 412. The probe refuses it at its
/// first put, before it can test the condition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the GCS emulators: run under scripts/gcs-server"]
async fn gcp_storage_emulator_ignores_the_create_condition_and_the_probe_refuses_it() -> R {
    let store = gcs_store(GCS_STUB_ENDPOINT_ENV);
    let prefix = unique_prefix("gcs-stub");
    let path = Path::from(format!("{prefix}/obj"));
    for attempt in ["first", "second"] {
        match create(store.as_ref(), &path, b"body").await {
            Err(e @ object_store::Error::Generic { .. }) => assert!(
                format!("{e:?}").contains("MissingEtag"),
                "{attempt} create: {e:?}"
            ),
            other => {
                return Err(format!(
                    "{attempt} create: gcp-storage-emulator changed ({other:?}): check it again"
                )
                .into());
            }
        }
    }
    match Replica::open(store, &prefix, Settings::default()).await {
        Err(Error::Store { op: "put", .. }) => Ok(()),
        other => Err(format!("gcp-storage-emulator was not refused: {other:?}").into()),
    }
}
