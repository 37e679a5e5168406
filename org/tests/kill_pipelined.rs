//! kill -9 of a writer with several ships in flight (`docs/design.md` 3e), at instants
//! between landings, again and again: each next writer claims over the ships that never
//! landed and the strays that did, hydrates, and goes on; at the end the store holds every
//! acknowledged request exactly once (I1, I2, I6, I7, I10). The test binary re-runs itself
//! as the child writer, on a store with S3's latency so that ships overlap.

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::Arc;

use common::{BoxErr, R, effect, registry};
use idem_org::RegistrySettings;
use idem_replica::latency::{LatencyStore, Shapes};
use idem_replica::{OrgId, Replica, SystemClock};

async fn pipelined_replica(store: &str, seed: u64) -> Result<Replica, BoxErr> {
    let local = Replica::local_store(store.as_ref())?;
    let store = Arc::new(LatencyStore::new(local, Shapes::s3(), seed));
    let settings = idem_replica::Settings {
        ship_window: 4,
        ..idem_replica::Settings::default()
    };
    Ok(Replica::open_with(store, "t", settings, Arc::new(SystemClock), None).await?)
}

/// The child: 16 clients write until the process is killed, printing `ack <key>`.
async fn child(name: String) -> R {
    let store = std::env::var("IDEM_KILL_STORE")?;
    let data = std::env::var("IDEM_KILL_DATA")?;
    let seed = name.bytes().map(u64::from).sum();
    let settings = RegistrySettings {
        force_claim: true,
        ..RegistrySettings::default()
    };
    let reg = registry(
        data.as_ref(),
        pipelined_replica(&store, seed).await?,
        &name,
        settings,
    )?;
    let org = reg.acquire(&OrgId::new("acme")?).await?;
    println!("ready {}", org.round());
    let mut clients = Vec::new();
    for c in 0..16 {
        let (org, name) = (org.clone(), name.clone());
        clients.push(tokio::spawn(async move {
            for i in 0.. {
                let key = format!("{name}-{c}-{i}");
                match org.once(&key, effect("acme", &key)).await {
                    Ok(_) => println!("ack {key}"),
                    Err(e) if e.is_retryable() => {}
                    Err(_) => return,
                }
            }
        }));
    }
    for c in clients {
        c.await?;
    }
    Ok(())
}

/// Runs a child until it has acknowledged `kill_after` requests, SIGKILLs it, and returns
/// the keys it acknowledged.
fn run_child(dir: &std::path::Path, name: &str, kill_after: usize) -> Result<Vec<String>, BoxErr> {
    let mut child = common::child_command(
        "kill_9_between_pipelined_landings_loses_no_acknowledged_request",
        name,
    )?
    .env("IDEM_KILL_STORE", dir.join("store"))
    .env("IDEM_KILL_DATA", dir.join("data"))
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()?;
    let lines = BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
    let mut acked = Vec::new();
    for line in lines {
        if let Some(key) = line?.strip_prefix("ack ") {
            acked.push(key.to_owned());
            if acked.len() >= kill_after {
                child.kill()?; // SIGKILL, with ships in flight
                break;
            }
        }
    }
    let status = child.wait()?;
    assert!(!status.success(), "{name}: the child must die by SIGKILL");
    Ok(acked)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_between_pipelined_landings_loses_no_acknowledged_request() -> R {
    if let Some(name) = common::child_role() {
        return child(name).await;
    }
    let dir = tempfile::tempdir()?;
    std::fs::create_dir_all(dir.path().join("store"))?;
    let mut all_acked = Vec::new();
    for (i, kill_after) in [40, 57, 23, 71, 36].into_iter().enumerate() {
        let acked = run_child(dir.path(), &format!("w{i}"), kill_after)?;
        assert_eq!(acked.len(), kill_after, "w{i} stopped acknowledging early");
        all_acked.extend(acked);
    }
    let store = Replica::local_store(&dir.path().join("store"))?;
    let replica = common::replica(store, None).await?;
    common::oracle::exactly_once(&replica, "acme", &all_acked, &[], dir.path()).await
}
