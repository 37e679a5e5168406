//! Real processes: SIGKILL of a serving writer under load, and two processes sharing one data
//! directory during a rolling restart. Each test re-runs this binary as its child writer
//! (`common::child_command`).

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use common::{BoxErr, R, effect, force, published, registry, replica};
use idem_org::Error;
use idem_replica::Replica;

fn spawn_writer(
    test: &str,
    store: &std::path::Path,
    data: &std::path::Path,
    prefix: &str,
) -> std::io::Result<Child> {
    common::child_command(test, prefix)?
        .env("IDEM_ORG_STORE", store)
        .env("IDEM_ORG_DATA", data)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
}

/// The child: a writer that serves requests from 4 concurrent clients until it is fenced,
/// printing `ack <key>` for each acknowledgement and `fenced` when fenced.
async fn child_writer(prefix: String) -> R {
    let store = std::env::var("IDEM_ORG_STORE")?;
    let data = std::env::var("IDEM_ORG_DATA")?;
    {
        let store = Replica::local_store(store.as_ref())?;
        let reg = registry(data.as_ref(), replica(store, None).await?, &prefix, force())?;
        let org = reg.acquire(&idem_replica::OrgId::new("acme")?).await?;
        println!("ready {}", org.round());
        let mut clients = Vec::new();
        for c in 0..4 {
            let (org, prefix) = (org.clone(), prefix.clone());
            clients.push(tokio::spawn(async move {
                for i in 0.. {
                    let key = format!("{prefix}-{c}-{i}");
                    match org.once(&key, effect("acme", &key)).await {
                        Ok(_) => println!("ack {key}"),
                        Err(Error::Fenced { .. }) => {
                            println!("fenced");
                            return;
                        }
                        Err(e) => println!("error {key} {e}"),
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

fn signal(child: &Child, sig: &str) -> R {
    let status = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()?;
    if !status.success() {
        return Err(format!("kill {sig} failed").into());
    }
    Ok(())
}

fn read_until(
    lines: &mut impl Iterator<Item = std::io::Result<String>>,
    acked: &mut Vec<String>,
    stop: impl Fn(&str, usize) -> bool,
) -> R {
    for line in lines {
        let line = line?;
        if let Some(key) = line.strip_prefix("ack ") {
            acked.push(key.to_owned());
        }
        if stop(&line, acked.len()) {
            return Ok(());
        }
    }
    Err("child ended early".into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_under_load_loses_no_acknowledged_request() -> R {
    const TEST: &str = "sigkill_under_load_loses_no_acknowledged_request";
    if let Some(prefix) = common::child_role() {
        return child_writer(prefix).await;
    }
    let dir = tempfile::tempdir()?;
    let (store, data) = (dir.path().join("store"), dir.path().join("data"));
    let mut child = spawn_writer(TEST, &store, &data, "a")?;
    let mut lines = BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
    let mut acked = Vec::new();
    read_until(&mut lines, &mut acked, |_, n| n >= 40)?;
    child.kill()?; // SIGKILL, mid-load
    child.wait()?;
    read_until(&mut lines, &mut acked, |_, _| false).ok(); // lines already in the pipe
    let store = replica(Replica::local_store(&store)?, None).await?;
    common::oracle::exactly_once(&store, "acme", &acked, &[], dir.path()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_sharing_the_data_directory_never_touches_the_old_files() -> R {
    const TEST: &str = "a_successor_sharing_the_data_directory_never_touches_the_old_files";
    if let Some(prefix) = common::child_role() {
        return child_writer(prefix).await;
    }
    let dir = tempfile::tempdir()?;
    let (store, data) = (dir.path().join("store"), dir.path().join("data"));
    let mut child = spawn_writer(TEST, &store, &data, "old")?;
    let mut lines = BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
    let mut acked = Vec::new();
    read_until(&mut lines, &mut acked, |_, n| n >= 10)?;
    let org_dir = data.join("orgs").join("acme");
    let old_files: Vec<_> = std::fs::read_dir(&org_dir)?
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(
        old_files
            .iter()
            .any(|p| p.extension().is_some_and(|e| e == "db"))
    );

    // Pause the old process (SIGSTOP) so it cannot notice the handoff and clean up after
    // itself: whatever disappears from its files now was removed by the successor.
    signal(&child, "-STOP")?;
    // The successor, in this process, on the same data directory, while the old one is live.
    let reg = registry(
        &data,
        replica(Replica::local_store(&store)?, None).await?,
        "new",
        force(),
    )?;
    let org = reg.acquire(&idem_replica::OrgId::new("acme")?).await?;
    for p in &old_files {
        assert!(
            p.exists(),
            "the successor removed {p:?} which the old process has open"
        );
    }
    org.once("new-1", effect("acme", "new-1")).await?;
    signal(&child, "-CONT")?;
    read_until(&mut lines, &mut acked, |l, _| l == "fenced")?;
    assert!(child.wait()?.success());
    for key in &acked {
        assert!(
            !org.once(key, effect("acme", "never")).await?.applied,
            "{key}"
        );
    }
    let (effects, keys) = published(reg.replica(), "acme", dir.path()).await?;
    assert!(effects.values().all(|n| *n == 1));
    assert_eq!(effects.len() as i64, keys);
    reg.shutdown().await;
    Ok(())
}
