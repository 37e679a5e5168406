//! One store URL for the library and the `idem` binary: what an embedder writes through
//! `Replica::open(store, "prod", ..)` is what `idem … --store DIR/prod` (or
//! `s3://bucket/prod`) reads; a store URL that leaves the prefix out gets a hint naming it;
//! `idem orgs` lists what a store holds.
//!
//! The S3, Azure and GCS cases are ignored unless asked for and fail without their servers:
//! `scripts/s3-server -- scripts/azure-server -- scripts/gcs-server -- cargo test --test
//! cli_store_url -- --include-ignored` (or `scripts/cloud-servers -- …`).

mod common;

use std::sync::Arc;

use common::{TestResult, assert_clean_failure, idem, run};
use idem_org::object_store::ObjectStore;
use idem_org::replica::{OrgId, Replica, Settings, Snapshot};
use idem_org::{object_store, rusqlite};

/// Ships one snapshot of org `acme` (a table `t` holding 7) under `prefix` of `store`, as
/// an embedder's service would, and releases it.
async fn library_writes(store: Arc<dyn ObjectStore>, prefix: &str) -> TestResult {
    let replica = Replica::open(store, prefix, Settings::default()).await?;
    let org = OrgId::new("acme")?;
    let mut claim = replica.claim(&org, "embedder", false).await?;
    let conn = rusqlite::Connection::open_in_memory()?;
    conn.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (7);")?;
    replica
        .ship(&mut claim, Snapshot::take(&conn, |_| Ok(1))?)
        .await?;
    replica.release(&mut claim).await?;
    Ok(())
}

/// `idem restore acme --store URL` and the value of `t.x` in the restored file.
fn restore_reads(url: &str, dir: &std::path::Path) -> TestResult<i64> {
    let to = dir.join(format!("restored-{}.db", dir.read_dir()?.count()));
    let out = run(&[
        "restore",
        "acme",
        "--store",
        url,
        "--to",
        to.to_str().ok_or("path")?,
    ]);
    assert!(
        out.status.success(),
        "restore from {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(rusqlite::Connection::open(&to)?.query_row("SELECT x FROM t", [], |r| r.get(0))?)
}

fn orgs_json(url: &str) -> TestResult<serde_json::Value> {
    let out = run(&["orgs", url, "--json"]);
    assert!(
        out.status.success(),
        "orgs {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_reads_under_the_prefix_the_library_wrote_and_names_it_when_left_out()
-> TestResult {
    let dir = tempfile::tempdir()?;
    let root = dir.path().join("store");
    library_writes(Replica::local_store(&root)?, "prod").await?;
    let root_s = root.display().to_string();
    let prod = root.join("prod").display().to_string();

    assert_eq!(restore_reads(&prod, dir.path())?, 7);
    assert_eq!(restore_reads(&format!("file://{prod}"), dir.path())?, 7);

    // The prefix left out of the URL: the error names the prefix and the URL that holds it.
    let out = run(&["inspect", "acme", "--store", &root_s]);
    assert_clean_failure(
        &out,
        &format!(
            "org acme not found under {root_s}; this store holds orgs under prefixes: prod (--store {prod})"
        ),
    );
    // Under the right prefix, an unknown org points at `idem orgs`.
    let out = run(&["inspect", "zeta", "--store", &prod]);
    assert_clean_failure(
        &out,
        &format!("org zeta not found under {prod}; `idem orgs {prod}` lists"),
    );

    // `idem orgs` lists the org with the head of its log (the embedder's release).
    let listed = orgs_json(&prod)?;
    let rows = listed.as_array().ok_or("not an array")?;
    assert_eq!(rows.len(), 1, "{listed}");
    assert_eq!(rows[0]["org"], "acme");
    assert_eq!(rows[0]["head"], "release");
    assert_eq!(rows[0]["writer"], "embedder");
    assert_eq!(rows[0]["released"], true);
    assert!(rows[0]["seq"].as_u64().ok_or("seq")? >= 2, "{listed}");
    let out = run(&["orgs", &prod]);
    let text = String::from_utf8(out.stdout)?;
    assert!(text.lines().any(|l| l.starts_with("acme\t")), "{text}");

    // Above the prefix: no org, and the hint.
    assert_eq!(orgs_json(&root_s)?, serde_json::json!([]));
    let out = run(&["orgs", &root_s]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout)?;
    assert!(
        text.contains(&format!(
            "no orgs under {root_s}; this store holds orgs under prefixes: prod (--store {prod})"
        )),
        "{text}"
    );
    Ok(())
}

#[test]
fn orgs_refuses_a_bad_store_url_with_one_line() -> TestResult {
    let dir = tempfile::tempdir()?;
    let missing = dir.path().join("missing");
    assert_clean_failure(
        &run(&["orgs", missing.to_str().ok_or("path")?]),
        "not a directory",
    );
    assert!(!missing.exists(), "a listing created the store");
    assert_clean_failure(
        &run(&["orgs", "ftp://host/x"]),
        "store URL \"ftp://host/x\"",
    );
    assert_clean_failure(&run(&["orgs", "s3://"]), "store URL \"s3://\"");
    let out = idem().args(["orgs"]).output()?;
    assert_eq!(
        out.status.code(),
        Some(2),
        "a missing STORE is a usage error"
    );
    Ok(())
}

/// The loopback S3 server `scripts/s3-server` starts, as the replica's own S3 tests build it
/// (`IDEM_S3_ENDPOINT`, path-style, plain HTTP, static test credentials).
fn s3_from_env() -> TestResult<(Arc<dyn ObjectStore>, String)> {
    let endpoint = std::env::var("IDEM_S3_ENDPOINT").map_err(|_| {
        "IDEM_S3_ENDPOINT is not set: run under scripts/s3-server \
         (scripts/s3-server -- cargo test --test cli_store_url -- --include-ignored)"
    })?;
    let bucket = std::env::var("IDEM_S3_BUCKET").unwrap_or_else(|_| "idem-test".to_owned());
    let store = object_store::aws::AmazonS3Builder::new()
        .with_bucket_name(&bucket)
        .with_endpoint(&endpoint)
        .with_allow_http(true)
        .with_virtual_hosted_style_request(false)
        .with_region("us-east-1")
        .with_access_key_id("test")
        .with_secret_access_key("test")
        .build()?;
    Ok((Arc::new(store), bucket))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a loopback S3 server: run under scripts/s3-server"]
async fn the_binary_reads_an_s3_url_under_the_prefix_the_library_wrote() -> TestResult {
    let (store, bucket) = s3_from_env()?;
    let top = format!("cli-url-{}-{}", std::process::id(), hex_nanos());
    library_writes(store, &format!("{top}/prod")).await?;
    let dir = tempfile::tempdir()?;
    // The binary reads the AWS_* variables scripts/s3-server exports, as a user's shell would.
    let url = format!("s3://{bucket}/{top}/prod");
    assert_eq!(restore_reads(&url, dir.path())?, 7);
    let listed = orgs_json(&url)?;
    assert_eq!(listed[0]["org"], "acme", "{listed}");
    let above = format!("s3://{bucket}/{top}");
    assert_eq!(orgs_json(&above)?, serde_json::json!([]));
    Ok(())
}

/// A variable a cloud server's script exports, or the error naming the script to run under.
fn server_env(name: &str, script: &str) -> TestResult<String> {
    std::env::var(name).map_err(|_| {
        format!(
            "{name} is not set: run under {script} \
             ({script} -- cargo test --test cli_store_url -- --include-ignored)"
        )
        .into()
    })
}

/// An `az://` URL pointed at Azurite only through object_store's own variables
/// (`AZURE_STORAGE_USE_EMULATOR=true`, `AZURITE_BLOB_STORAGE_URL`, which
/// `scripts/azure-server` exports): the library and the binary name the same objects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Azurite: run under scripts/azure-server"]
async fn the_binary_reads_an_az_url_under_the_prefix_the_library_wrote() -> TestResult {
    let container = server_env("IDEM_AZURE_CONTAINER", "scripts/azure-server")?;
    server_env("AZURITE_BLOB_STORAGE_URL", "scripts/azure-server")?;
    let top = format!("cli-url-{}-{}", std::process::id(), hex_nanos());
    let store = idem_org::replica::StoreUrl::parse(&format!("az://{container}"))?;
    library_writes(store.store().clone(), &format!("{top}/prod")).await?;
    let dir = tempfile::tempdir()?;
    let url = format!("az://{container}/{top}/prod");
    assert_eq!(restore_reads(&url, dir.path())?, 7);
    assert_eq!(orgs_json(&url)?[0]["org"], "acme");
    Ok(())
}

#[test]
#[ignore = "needs Azurite: run under scripts/azure-server"]
fn check_store_passes_on_azurite() -> TestResult {
    let container = server_env("IDEM_AZURE_CONTAINER", "scripts/azure-server")?;
    let out = run(&[
        "check-store",
        &format!("az://{container}/cli-check-{}", hex_nanos()),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.starts_with("store ok: create-only probe"),
        "check-store on Azurite: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// Neither GCS emulator holds a create-only put through object_store (docs/stores.md):
/// `check-store` must refuse both, at the probe, with a clean one-line error.
#[test]
#[ignore = "needs the GCS emulators: run under scripts/gcs-server"]
fn check_store_refuses_both_gcs_emulators() -> TestResult {
    let bucket = server_env("IDEM_GCS_BUCKET", "scripts/gcs-server")?;
    for (endpoint, why) in [
        ("IDEM_GCS_ENDPOINT", "invalid uploadType"),
        ("IDEM_GCS_STUB_ENDPOINT", "ETag Header missing"),
    ] {
        let base = server_env(endpoint, "scripts/gcs-server")?;
        let out = idem()
            .env("GOOGLE_BASE_URL", base)
            .args(["check-store", &format!("gs://{bucket}/cli-check")])
            .output()?;
        assert_clean_failure(&out, "cannot open store: object store put failed");
        assert_clean_failure(&out, why);
    }
    Ok(())
}

fn hex_nanos() -> String {
    let nanos = idem_base::Clock::now(&idem_base::SystemClock)
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{nanos:x}")
}
