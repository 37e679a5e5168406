//! Handoff walk-through: two writers (think: two replicas of a rolling upgrade) share one
//! store. Writer A serves, releases on shutdown; writer B claims a higher round, hydrates A's
//! last snapshot and replays A's keys without running them again. Then B is abandoned without
//! a release (a crash) and C takes over with `force_claim`, fencing B.
//!
//! Run: `cargo run --example handoff`

use idem_org::replica::{OrgId, Replica, Settings};
use idem_org::{ErrorKind, Registry, RegistrySettings, rusqlite};

fn pay(tx: &rusqlite::Transaction<'_>) -> Result<Vec<u8>, rusqlite::Error> {
    tx.execute("INSERT INTO ledger VALUES (1250)", [])?;
    Ok(b"paid".to_vec())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let store = Replica::local_store(&dir.path().join("store"))?;
    let writer = |name: &str, force: bool| {
        let store = store.clone();
        let data = dir.path().join(name);
        let name = name.to_owned();
        async move {
            let replica = Replica::open(store, "prod", Settings::default()).await?;
            Registry::builder(data, replica, name)
                .settings(RegistrySettings {
                    force_claim: force,
                    ..RegistrySettings::default()
                })
                .on_open(|c| c.execute_batch("CREATE TABLE IF NOT EXISTS ledger (cents INT)"))
                .build()
                .map_err(Box::<dyn std::error::Error>::from)
        }
    };

    let a = writer("replica-a", false).await?;
    let out = a
        .acquire(&OrgId::new("acme")?)
        .await?
        .once("pay-7", pay)
        .await?;
    println!("A (round {}): pay-7 applied={}", out.round, out.applied);
    a.shutdown().await; // final ship + Release: B need not wait for A's lease

    let b = writer("replica-b", false).await?;
    let b_acme = b.acquire(&OrgId::new("acme")?).await?;
    let out = b_acme.once("pay-7", pay).await?;
    println!(
        "B (round {}): pay-7 applied={} (replayed A's result)",
        b_acme.round(),
        out.applied
    );
    b_acme.once("pay-8", pay).await?;

    // B "crashes": no release, its lease stays live. C forces the claim and fences B.
    let c = writer("replica-c", true).await?;
    let c_acme = c.acquire(&OrgId::new("acme")?).await?;
    println!("C (round {}): took over with force_claim", c_acme.round());
    for key in ["pay-7", "pay-8"] {
        let out = c_acme.once(key, pay).await?;
        println!(
            "C: {key} applied={} (first applied in round {})",
            out.applied, out.round
        );
    }
    match b_acme.once("pay-9", pay).await {
        Err(e) if e.kind() == ErrorKind::Reacquire => println!("B is fenced: {e}"),
        other => println!("unexpected for the fenced B: {other:?}"),
    }
    c.shutdown().await;
    Ok(())
}
