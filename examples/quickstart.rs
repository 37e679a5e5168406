//! Quickstart: exactly-once transfers for one tenant, acknowledged only once shipped to the
//! object store (a local directory here; any `object_store` backend works).
//!
//! Run: `cargo run --example quickstart`

use idem_org::replica::{OrgId, Replica, Settings};
use idem_org::{Registry, rusqlite};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    // The store URL `idem --store` takes, prefix included: here the prefix `prod` of a local
    // directory (fsync'd); `s3://bucket/prod`, `gs://…`, `az://…` in production.
    let url = dir.path().join("store/prod").display().to_string();
    let replica = Replica::open_url(&url, Settings::default()).await?;
    let registry = Registry::builder(dir.path().join("data"), replica, "quickstart")
        .on_open(|c| c.execute_batch("CREATE TABLE IF NOT EXISTS ledger (key TEXT, cents INT)"))
        .build()?;

    let acme = registry.acquire(&OrgId::new("acme")?).await?; // claim a round, hydrate, then serve
    for attempt in 1..=3 {
        // A client retrying "pay-7" three times: the effect runs once, every call gets the
        // first result, and each returns only after the snapshot holding it is published.
        let out = acme
            .once("pay-7", |tx| {
                tx.execute("INSERT INTO ledger VALUES ('pay-7', 1250)", [])?;
                Ok::<_, rusqlite::Error>(b"paid 12.50".to_vec())
            })
            .await?;
        println!(
            "attempt {attempt}: applied={} result={:?} round={}",
            out.applied,
            String::from_utf8_lossy(&out.result),
            out.round
        );
    }
    println!("ships so far: {}", acme.stats().ships);
    registry.shutdown().await; // graceful handoff: final ship + Release entry
    Ok(())
}
