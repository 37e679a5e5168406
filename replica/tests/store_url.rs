//! One store URL for the library and the command line: a file URL, a plain path, an S3 and
//! an Azure URL name the objects the library writes through `Replica::open(store, prefix, ..)`.
//!
//! The S3 and Azure cases are ignored unless asked for and fail without their servers:
//! `scripts/s3-server -- scripts/azure-server -- cargo test -p idem-replica --test store_url
//! -- --include-ignored`.

use std::sync::Arc;

use idem_replica::conformance::{azure_store, s3_store, unique_prefix};
use idem_replica::{OrgId, Replica, Settings, Snapshot, StoreUrl};
use object_store::ObjectStore;

type R = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// Ships one snapshot of `org` (a table `t` holding `x`) under `prefix` of `store`.
async fn ship_under(store: Arc<dyn ObjectStore>, prefix: &str, org: &OrgId, x: i64) -> R {
    let replica = Replica::open(store, prefix, Settings::default()).await?;
    let mut claim = replica.claim(org, "writer-a", false).await?;
    let conn = rusqlite::Connection::open_in_memory()?;
    conn.execute_batch(&format!("CREATE TABLE t(x); INSERT INTO t VALUES ({x});"))?;
    replica
        .ship(&mut claim, Snapshot::take(&conn, |_| Ok(1))?)
        .await?;
    replica.release(&mut claim).await?;
    Ok(())
}

/// Restores `org` through `url` and reads `x` back.
async fn read_through(
    url: &StoreUrl,
    org: &OrgId,
) -> Result<i64, Box<dyn std::error::Error + Send + Sync>> {
    let replica = url.open_read_only(Settings::default())?;
    assert_eq!(replica.orgs().await?, vec![org.clone()]);
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("r.db");
    replica.restore(org, None, &path).await?;
    Ok(rusqlite::Connection::open(&path)?.query_row("SELECT x FROM t", [], |r| r.get(0))?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_and_a_file_url_name_what_the_library_writes_under_a_prefix() -> R {
    let dir = tempfile::tempdir()?;
    let root = dir.path().join("store");
    let org = OrgId::new("acme")?;
    ship_under(Replica::local_store(&root)?, "prod", &org, 41).await?;

    let path = StoreUrl::parse_existing(&root.join("prod").display().to_string())?;
    assert_eq!(read_through(&path, &org).await?, 41);
    let file = StoreUrl::parse_existing(&format!("file://{}", root.join("prod").display()))?;
    assert_eq!(read_through(&file, &org).await?, 41);

    // The store root holds no org itself; the hint names the prefix that does.
    let top = StoreUrl::parse_existing(&root.display().to_string())?;
    assert!(
        top.open_read_only(Settings::default())?
            .orgs()
            .await?
            .is_empty()
    );
    assert_eq!(top.prefixes_with_orgs().await?, vec!["prod".to_owned()]);
    assert_eq!(top.url_of("prod"), root.join("prod").display().to_string());

    // And the library opens by URL what it wrote by (store, prefix).
    let replica = Replica::open_url(
        &root.join("prod").display().to_string(),
        Settings::default(),
    )
    .await?;
    assert_eq!(replica.orgs().await?, vec![org]);
    Ok(())
}

/// What the library writes through a store built by hand is what `scheme://bucket/prefix`
/// names, with the URL's store built only from the environment variables a user would set
/// (the server's script exports them).
async fn a_cloud_url_names_what_the_library_writes(
    store: Arc<dyn ObjectStore>,
    scheme: &str,
    bucket: &str,
) -> R {
    let top = unique_prefix("url");
    let prefix = format!("{top}/prod");
    let org = OrgId::new("acme")?;
    ship_under(store, &prefix, &org, 42).await?;

    let url = StoreUrl::parse_existing(&format!("{scheme}://{bucket}/{prefix}"))?;
    assert_eq!(url.prefix(), prefix);
    assert_eq!(read_through(&url, &org).await?, 42);
    let above = StoreUrl::parse(&format!("{scheme}://{bucket}/{top}"))?;
    assert!(
        above
            .open_read_only(Settings::default())?
            .orgs()
            .await?
            .is_empty()
    );
    assert_eq!(read_through(&above.join("prod"), &org).await?, 42);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a loopback S3 server: run under scripts/s3-server"]
async fn an_s3_url_names_what_the_library_writes_under_a_prefix() -> R {
    // scripts/s3-server exports the AWS_* variables a user would set, which the URL reads.
    let bucket = std::env::var("IDEM_S3_BUCKET").unwrap_or_else(|_| "idem-test".to_owned());
    a_cloud_url_names_what_the_library_writes(s3_store(), "s3", &bucket).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Azurite: run under scripts/azure-server"]
async fn an_az_url_names_what_the_library_writes_under_a_prefix() -> R {
    // scripts/azure-server exports AZURE_STORAGE_USE_EMULATOR=true and
    // AZURITE_BLOB_STORAGE_URL, which object_store's Azure builder reads for the URL.
    let container =
        std::env::var("IDEM_AZURE_CONTAINER").unwrap_or_else(|_| "idem-test".to_owned());
    a_cloud_url_names_what_the_library_writes(azure_store(), "az", &container).await
}
