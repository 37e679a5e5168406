//! kill -9 in the middle of streaming a segmented snapshot, both ways:
//! - while a full snapshot's segments upload (some PUT, others not, no manifest): nothing of
//!   that ship is acknowledged or reaches the log, the next writer hydrates the previous
//!   acknowledged state and serves, and retention deletes the dead ship's segments (I6, I10,
//!   I11);
//! - while an acquire hydrates segment by segment into its temp file: the claim's database
//!   file is never created (only the hidden temp file exists), and the next writer on the
//!   same data directory removes that temp file, hydrates and serves (I8, I10).
//!
//! The test binary re-runs itself as the child writer, which SIGKILLs itself at the chosen
//! failpoint hit; segments are 64 KiB and the database about 4 MB of random bytes, so each
//! snapshot has dozens of segments and the kill lands in the middle of one.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use common::{BoxErr, R, registry};
use idem_org::{Registry, RegistrySettings};
use idem_replica::{FailPoint, Failpoints, OrgId, Replica, Retention};

const ORG: &str = "acme";
/// Segment size of every writer here: a ~4 MB database is ~64 segments.
const SEGMENT_BYTES: usize = 64 << 10;
const BULK_ROWS: u32 = 64;
const BULK_ROW_BYTES: u32 = 60_000;

/// SIGKILLs this process at the `n`-th hit of `point`; with `ship` > 0, counting only hits
/// during the `ship`-th ship (ships are counted by [`FailPoint::ShipBeforeUpload`]).
#[derive(Debug)]
struct KillAt {
    point: FailPoint,
    ship: u64,
    n: u64,
    ships: AtomicU64,
    hits: AtomicU64,
}

impl KillAt {
    fn arc(point: FailPoint, ship: u64, n: u64) -> Arc<dyn Failpoints> {
        Arc::new(KillAt {
            point,
            ship,
            n,
            ships: AtomicU64::new(0),
            hits: AtomicU64::new(0),
        })
    }
}

#[async_trait::async_trait]
impl Failpoints for KillAt {
    async fn hit(&self, point: FailPoint, _org: &OrgId) -> Result<(), String> {
        if point == FailPoint::ShipBeforeUpload {
            self.ships.fetch_add(1, Ordering::SeqCst);
        }
        let counted = self.ship == 0 || self.ships.load(Ordering::SeqCst) == self.ship;
        if point == self.point && counted && self.hits.fetch_add(1, Ordering::SeqCst) + 1 == self.n
        {
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

/// A replica with small segments under the prefix the oracle reads (`t`).
async fn replica(store: &Path, failpoints: Option<Arc<dyn Failpoints>>) -> Result<Replica, BoxErr> {
    Ok(Replica::open_with(
        Replica::local_store(store)?,
        "t",
        idem_replica::Settings {
            segment_bytes: SEGMENT_BYTES,
            ..idem_replica::Settings::default()
        },
        Arc::new(idem_replica::SystemClock),
        failpoints,
    )
    .await?)
}

/// Every ship is a full snapshot, and retention runs only where a test calls it.
fn settings() -> RegistrySettings {
    RegistrySettings {
        ship: idem_replica::ShipPolicy {
            max_deltas: 0,
            ..idem_replica::ShipPolicy::default()
        },
        retain_every_ships: 0,
        force_claim: true,
        ..RegistrySettings::default()
    }
}

/// The effect `common::effect` writes (so the oracle's replays match), after rewriting the
/// whole bulk table with random bytes: every request changes nearly every segment, so its
/// snapshot uploads dozens of them.
fn bulk_effect(
    key: &str,
) -> impl FnOnce(&rusqlite::Transaction<'_>) -> rusqlite::Result<Vec<u8>> + Clone + Send + 'static {
    let key = key.to_owned();
    move |tx| {
        tx.execute_batch(&format!(
            "CREATE TABLE IF NOT EXISTS bulk (id INTEGER PRIMARY KEY, b BLOB);
             WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {BULK_ROWS})
             INSERT OR REPLACE INTO bulk SELECT i, randomblob({BULK_ROW_BYTES}) FROM n;"
        ))?;
        tx.execute(
            "INSERT INTO effects (key, org) VALUES (?1, ?2)",
            [&key, ORG],
        )?;
        Ok(key.into_bytes())
    }
}

/// Runs `key` on `reg`'s org and requires that it applied now (not a replay).
async fn serve(reg: &Registry, key: &str) -> R {
    let org = reg.acquire(&OrgId::new(ORG)?).await?;
    let out = org.once(key, bulk_effect(key)).await?;
    assert!(out.applied, "{key} is new: it must apply");
    assert_eq!(out.result, key.as_bytes());
    Ok(())
}

/// The child. `upload:<ship>:<n>`: acquires, then runs requests one at a time (printing
/// `start <key>` before each and `ack <key>` once acknowledged) until the kill at the `n`-th
/// segment PUT of the `ship`-th ship. `hydrate:<n>`: acquires, killed at the `n`-th
/// downloaded segment of its hydrate.
async fn child(spec: String) -> R {
    let store = PathBuf::from(std::env::var("IDEM_KILL_STORE")?);
    let data = PathBuf::from(std::env::var("IDEM_KILL_DATA")?);
    let parts: Vec<&str> = spec.split(':').collect();
    let kill = match parts.as_slice() {
        ["upload", ship, n] => KillAt::arc(FailPoint::ShipDuringUpload, ship.parse()?, n.parse()?),
        ["hydrate", n] => KillAt::arc(FailPoint::HydrateAfterDownload, 0, n.parse()?),
        _ => return Err(format!("bad child spec {spec}").into()),
    };
    let reg = registry(
        &data,
        replica(&store, Some(kill)).await?,
        "child",
        settings(),
    )?;
    let org = reg.acquire(&OrgId::new(ORG)?).await?;
    println!("ready {}", org.round());
    if parts[0] == "hydrate" {
        // The kill point was not reached: the parent fails the test.
        return Ok(());
    }
    for i in 0.. {
        let key = format!("upload-{i}");
        println!("start {key}");
        org.once(&key, bulk_effect(&key)).await?;
        println!("ack {key}");
    }
    Ok(())
}

/// What a child printed before it died.
#[derive(Default)]
struct Seen {
    ready: bool,
    acked: Vec<String>,
    started: Vec<String>,
}

fn run_child(test: &str, dir: &Path, data: &str, spec: &str) -> Result<Seen, BoxErr> {
    let mut child = common::child_command(test, spec)?
        .env("IDEM_KILL_STORE", dir.join("store"))
        .env("IDEM_KILL_DATA", dir.join(data))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut seen = Seen::default();
    for line in BufReader::new(child.stdout.take().ok_or("no stdout")?).lines() {
        let line = line?;
        // The harness prints `test <name> ... ` without a newline before the child's first line.
        if line.contains("ready ") {
            seen.ready = true;
        } else if let Some(key) = line.strip_prefix("start ") {
            seen.started.push(key.to_owned());
        } else if let Some(key) = line.strip_prefix("ack ") {
            seen.acked.push(key.to_owned());
        }
    }
    let status = child.wait()?;
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        status.signal(),
        Some(9),
        "{spec}: the child must die by SIGKILL at its failpoint ({status})"
    );
    Ok(seen)
}

/// Names of the objects under the org's `snap/` in the local store whose log position is
/// `seq` and whose name ends with `suffix` (object_store's staging files, `name#n`, skipped).
fn snap_objects(store: &Path, seq: u64, suffix: &str) -> Result<Vec<String>, BoxErr> {
    let dir = store.join("t/orgs").join(ORG).join("snap");
    let prefix = format!("{seq:020}-");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.starts_with(&prefix) && name.ends_with(suffix) && !name.contains('#') {
            out.push(name);
        }
    }
    out.sort();
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_while_a_snapshots_segments_upload_acknowledges_nothing_of_it() -> R {
    const TEST: &str = "kill_while_a_snapshots_segments_upload_acknowledges_nothing_of_it";
    if let Some(spec) = common::child_role() {
        return child(spec).await;
    }
    let dir = tempfile::tempdir()?;
    let store = dir.path().join("store");
    // Two snapshots are acknowledged whole; the third is killed after its 5th segment PUT.
    let seen = run_child(TEST, dir.path(), "child-data", "upload:3:5")?;
    assert!(seen.ready, "the child acquired before the kill");
    assert_eq!(seen.acked, ["upload-0", "upload-1"], "one request per ship");
    let killed_key = seen.started.last().ok_or("no request started")?.clone();
    assert_eq!(killed_key, "upload-2");

    // The store as the kill left it: the log ends at the last acknowledged snapshot, and the
    // killed ship (at the next position) left some of its segments and no manifest.
    let r = replica(&store, None).await?;
    let org = OrgId::new(ORG)?;
    let log = r.history(&org).await?;
    let head = log.last().ok_or("empty log")?;
    assert!(head.is_snapshot(), "the last entry is upload-1's snapshot");
    let killed = head.seq() + 1;
    let orphans = snap_objects(&store, killed, ".seg.zst")?;
    let whole = snap_objects(&store, head.seq(), ".seg.zst")?.len();
    assert!(
        orphans.len() >= 5 && orphans.len() < whole,
        "the kill landed mid-upload: {} of about {whole} segments landed",
        orphans.len()
    );
    assert!(snap_objects(&store, killed, ".manifest.json")?.is_empty());

    // The next writer hydrates the acknowledged state and serves.
    let next = registry(&dir.path().join("next-data"), r.clone(), "next", settings())?;
    serve(&next, "after-kill").await?;
    next.shutdown().await;

    // Retention deletes the dead ship's segments (its position is below the head now: the
    // next writer's claim took it) and keeps everything the newest state needs.
    let report = r
        .retain(
            &org,
            &Retention {
                keep_snapshots: 1,
                keep_ms: 0,
                window_ms: 0,
                level_ms: 0,
            },
        )
        .await?;
    assert_eq!(
        snap_objects(&store, killed, "")?,
        Vec::<String>::new(),
        "retention left the killed ship's objects: {report:?}"
    );

    let mut acked = seen.acked;
    acked.push("after-kill".into());
    common::oracle::exactly_once(&r, ORG, &acked, &[&killed_key], dir.path()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_during_a_streaming_hydrate_installs_nothing() -> R {
    const TEST: &str = "kill_during_a_streaming_hydrate_installs_nothing";
    if let Some(spec) = common::child_role() {
        return child(spec).await;
    }
    let dir = tempfile::tempdir()?;
    let store = dir.path().join("store");
    let r = replica(&store, None).await?;
    let seed = registry(&dir.path().join("seed-data"), r.clone(), "seed", settings())?;
    let acked = ["seed-0", "seed-1"];
    for key in acked {
        serve(&seed, key).await?;
    }
    seed.shutdown().await;

    // The child's acquire finds no file of its own on this data directory and hydrates the
    // ~64 segments: killed after the 20th arrived.
    let seen = run_child(TEST, dir.path(), "child-data", "hydrate:20")?;
    assert!(!seen.ready, "the child was killed inside its acquire");
    let org_dir = dir.path().join("child-data/orgs").join(ORG);
    let files = |dir: &Path| -> Result<Vec<String>, BoxErr> {
        let mut names = Vec::new();
        for e in std::fs::read_dir(dir)? {
            names.push(e?.file_name().to_string_lossy().into_owned());
        }
        Ok(names)
    };
    let left = files(&org_dir)?;
    assert!(
        !left
            .iter()
            .any(|n| n.ends_with(".db") || n.contains(".db-")),
        "a database file was installed by a killed hydrate: {left:?}"
    );
    let temps: Vec<&String> = left.iter().filter(|n| n.contains(".db.hydrate-")).collect();
    assert_eq!(temps.len(), 1, "the hydrate was killed mid-way: {left:?}");
    assert!(temps[0].starts_with('.'), "the temp file is hidden");

    // The next writer on the same data directory removes the dead claim's files, temp file
    // included, hydrates and serves.
    let next = registry(
        &dir.path().join("child-data"),
        r.clone(),
        "next",
        settings(),
    )?;
    serve(&next, "after-kill").await?;
    let left = files(&org_dir)?;
    assert!(
        !left.iter().any(|n| n.contains(".hydrate-")),
        "the killed hydrate's temp file is still there: {left:?}"
    );
    next.shutdown().await;

    let mut all: Vec<String> = acked.iter().map(|k| (*k).to_owned()).collect();
    all.push("after-kill".into());
    common::oracle::exactly_once(&r, ORG, &all, &[], dir.path()).await
}
