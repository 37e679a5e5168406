//! kill -9 at each step of a delta ship — before the upload, between upload and publish,
//! between publish and the next capture's checkpoint — and at random instants while every
//! capture checkpoints: the next writer hydrates a consistent database that holds every
//! acknowledged request exactly once (I1, I2, I6, I10). The test binary re-runs itself as
//! the child writer, which kills itself with SIGKILL at the chosen seam.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use common::{BoxErr, R, effect, registry, replica};
use idem_org::{Error, RegistrySettings};
use idem_replica::{FailPoint, Failpoints, OrgId, Replica};

/// SIGKILLs this process on the `n`-th hit of `point`.
#[derive(Debug)]
struct KillAt {
    point: Option<FailPoint>,
    n: u64,
    hits: AtomicU64,
}

#[async_trait::async_trait]
impl Failpoints for KillAt {
    async fn hit(&self, point: FailPoint, _org: &OrgId) -> Result<(), String> {
        if Some(point) == self.point && self.hits.fetch_add(1, Ordering::SeqCst) + 1 == self.n {
            let me = std::process::id().to_string();
            let _ = Command::new("kill").args(["-9", &me]).status();
            // SIGKILL is delivered before `kill` returns; never go on.
            loop {
                std::thread::park();
            }
        }
        Ok(())
    }
}

fn point(name: &str) -> Option<FailPoint> {
    match name {
        "before_upload" => Some(FailPoint::ShipBeforeUpload),
        "after_upload" => Some(FailPoint::ShipAfterUpload),
        "after_publish" => Some(FailPoint::ShipAfterPublish),
        _ => None,
    }
}

fn settings() -> RegistrySettings {
    RegistrySettings {
        ship: idem_replica::ShipPolicy {
            // Every delta capture checkpoints, so kills land around checkpoints too.
            wal_checkpoint_bytes: 0,
            ..idem_replica::ShipPolicy::default()
        },
        force_claim: true,
        ..RegistrySettings::default()
    }
}

/// The child: 4 clients write until the process is killed, printing `ack <key>`.
async fn kill_child(spec: String) -> R {
    let (name, n) = spec.split_once(':').ok_or("spec is point:n")?;
    let store = std::env::var("IDEM_KILL_STORE")?;
    let data = std::env::var("IDEM_KILL_DATA")?;
    {
        let fp: Arc<dyn Failpoints> = Arc::new(KillAt {
            point: point(name),
            n: n.parse()?,
            hits: AtomicU64::new(0),
        });
        let store = Replica::local_store(store.as_ref())?;
        let reg = registry(
            data.as_ref(),
            replica(store, Some(fp)).await?,
            name,
            settings(),
        )?;
        let org = reg.acquire(&idem_replica::OrgId::new("acme")?).await?;
        println!("ready {}", org.round());
        let mut clients = Vec::new();
        for c in 0..4 {
            let (org, name) = (org.clone(), name.to_owned());
            clients.push(tokio::spawn(async move {
                for i in 0.. {
                    let key = format!("{name}-{c}-{i}");
                    match org.once(&key, effect("acme", &key)).await {
                        Ok(_) => println!("ack {key}"),
                        Err(Error::Fenced { .. }) => return,
                        Err(_) => {}
                    }
                }
            }));
        }
        for c in clients {
            c.await?;
        }
        Ok::<_, BoxErr>(())
    }
}

/// Runs a child until it dies (killed at its seam, or by us after `kill_after` acks) and
/// returns the keys it acknowledged.
fn run_child(
    dir: &std::path::Path,
    spec: &str,
    kill_after: Option<usize>,
) -> Result<Vec<String>, BoxErr> {
    let mut child =
        common::child_command("kill_at_each_ship_step_loses_no_acknowledged_request", spec)?
            .env("IDEM_KILL_STORE", dir.join("store"))
            .env("IDEM_KILL_DATA", dir.join("data"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
    let lines = BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
    let mut acked = Vec::new();
    for line in lines {
        let line = line?;
        if let Some(key) = line.strip_prefix("ack ") {
            acked.push(key.to_owned());
            if kill_after.is_some_and(|n| acked.len() >= n) {
                child.kill()?; // SIGKILL
                break;
            }
        }
    }
    let status = child.wait()?;
    assert!(!status.success(), "{spec}: the child must die by SIGKILL");
    Ok(acked)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_at_each_ship_step_loses_no_acknowledged_request() -> R {
    if let Some(spec) = common::child_role() {
        return kill_child(spec).await;
    }
    let dir = tempfile::tempdir()?;
    let mut all_acked = Vec::new();
    // The n-th hit is well past the claim's first full snapshot, so the kill lands in a delta.
    for spec in ["before_upload:6", "after_upload:6", "after_publish:6"] {
        let acked = run_child(dir.path(), spec, None)?;
        assert!(
            !acked.is_empty(),
            "{spec}: some requests were acknowledged first"
        );
        eprintln!("{spec}: {} acknowledged before the kill", acked.len());
        all_acked.extend(acked);
    }
    for storm in 0..4 {
        all_acked.extend(run_child(
            dir.path(),
            &format!("storm{storm}:0"),
            Some(25 + storm * 7),
        )?);
    }
    let store = replica(Replica::local_store(&dir.path().join("store"))?, None).await?;
    common::oracle::exactly_once(&store, "acme", &all_acked, &[], dir.path()).await
}
