//! Scratch.
mod common;
use std::sync::Arc;
use common::{R, effect, registry, replica};
use idem_org::Settings;
use object_store::memory::InMemory;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scratch() -> R {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(InMemory::new());
    let data = dir.path().join("data");
    let acme = idem_replica::OrgId::new("acme")?;
    let a = registry(&data, replica(store.clone(), None).await?, "A", Settings::default())?;
    a.once(&acme, "k1", effect("acme", "k1")).await?;
    a.shutdown().await;
    let ls = || -> Vec<String> { std::fs::read_dir(data.join("orgs/acme")).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect() };
    println!("after A: {:?}", ls());
    let b = registry(&data, replica(store.clone(), None).await?, "B", Settings::default())?;
    let o = b.acquire(&acme).await?;
    println!("after B acquire: {:?}", ls());
    o.once("k2", effect("acme", "k2")).await?;
    println!("stats {:?}", o.stats());
    b.shutdown().await;
    println!("after B: {:?}", ls());
    Ok(())
}
