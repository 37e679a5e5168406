//! The prune-cron pattern: a short-lived job that deletes idempotency keys older than the
//! retry window from every org whose writer's lease has lapsed (or was released), one org at
//! a time, and reports failures without stopping. `idem prune` is this, with a progress bar.
//!
//! Run: `cargo run --example prune_cron`

use std::time::Duration;

use idem_org::replica::{OrgId, Replica, Settings};
use idem_org::{Registry, rusqlite};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let store = Replica::local_store(&dir.path().join("store"))?;

    // Some history: a server applied keys in three orgs, then shut down gracefully.
    let replica = Replica::open(store.clone(), "prod", Settings::default()).await?;
    let server = Registry::builder(dir.path().join("server"), replica, "server").build()?;
    for org in ["acme", "globex", "initech"] {
        let h = server.acquire(&OrgId::new(org)?).await?;
        for i in 0..5 {
            h.once(&format!("req-{i}"), |_tx| Ok::<_, rusqlite::Error>(vec![]))
                .await?;
        }
    }
    server.shutdown().await;

    // The cron job: its own writer id and scratch directory; a live lease makes it skip an
    // org (retry next run) rather than fence a serving replica.
    let replica = Replica::open(store, "prod", Settings::default()).await?;
    let orgs = replica.orgs().await?;
    let cron = Registry::builder(dir.path().join("cron"), replica, "prune-cron").build()?;
    let window = Duration::ZERO; // real jobs: 7 days
    let (mut deleted, mut failed) = (0, 0);
    for org in &orgs {
        let result = async {
            let h = cron.acquire(org).await?;
            let n = h.prune(window).await?; // deletes and ships before returning
            h.release().await?;
            Ok::<_, idem_org::Error>(n)
        }
        .await;
        match result {
            Ok(n) => deleted += n,
            Err(e) => {
                failed += 1;
                eprintln!("org {org}: {e}");
            }
        }
    }
    println!(
        "pruned {deleted} keys in {} orgs; {failed} failed",
        orgs.len()
    );
    if failed > 0 {
        std::process::exit(1);
    }
    Ok(())
}
