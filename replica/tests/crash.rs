//! A real child process killed with SIGKILL mid-ship: the latest published snapshot is
//! unaffected and hydrates. The test binary re-runs itself as the child.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;

use idem_replica::{FailPoint, Failpoints, OrgId, Replica, Settings, Snapshot, SystemClock};

const CHILD_ENV: &str = "IDEM_REPLICA_CRASH_CHILD";
const TEST_NAME: &str = "killed_mid_ship_leaves_latest_snapshot_intact";

#[derive(Debug)]
struct Announce;

#[async_trait::async_trait]
impl Failpoints for Announce {
    async fn hit(&self, point: FailPoint, _org: &OrgId) -> Result<(), String> {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "CHILD at {point:?}");
        let _ = out.flush();
        Ok(())
    }
}

type R = Result<(), Box<dyn std::error::Error + Send + Sync>>;

async fn child(dir: &str) -> R {
    let store = Replica::local_store(std::path::Path::new(dir))?;
    let r = Replica::open_with(
        store,
        "",
        Settings::default(),
        Arc::new(SystemClock),
        Some(Arc::new(Announce)),
    )
    .await?;
    let org = OrgId::new("crash")?;
    let mut claim = r
        .claim(&org, &format!("child-{}", std::process::id()), true)
        .await?;
    let conn = rusqlite::Connection::open_in_memory()?;
    let mut noise = vec![0u8; 6 << 20];
    getrandom::fill(&mut noise)?;
    conn.execute_batch("CREATE TABLE big(b BLOB); CREATE TABLE t(id INTEGER PRIMARY KEY);")?;
    conn.execute("INSERT INTO big VALUES (?1)", [noise])?;
    for _ in 0..1000 {
        conn.execute("INSERT INTO t DEFAULT VALUES", [])?;
        let snap = Snapshot::take(&conn, |c| {
            c.query_row("SELECT count(*) FROM t", [], |r| r.get::<_, i64>(0))
                .map(|n| n as u64)
        })?;
        let commit = snap.commit();
        let shipped = r.ship(&mut claim, snap).await?;
        println!("CHILD shipped {} {commit}", shipped.seq);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_mid_ship_leaves_latest_snapshot_intact() -> R {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        return child(&dir).await;
    }
    let tmp = tempfile::tempdir()?;
    let store_dir = tmp.path().join("store");
    let exe = std::env::current_exe()?;
    let org = OrgId::new("crash")?;
    // Kill at a different seam each run: while compressing/uploading the blob, right after
    // the upload, right after the entry was created.
    for (run, kill_at) in ["ShipBeforeUpload", "ShipAfterUpload", "ShipAfterPublish"]
        .iter()
        .enumerate()
    {
        let mut child = Command::new(&exe)
            .args(["--exact", TEST_NAME, "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, &store_dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let mut acked_commit = 0u64;
        let mut shipped = 0;
        let mut killed = false;
        while let Some(Ok(line)) = lines.next() {
            if let Some(rest) = line.strip_prefix("CHILD shipped ") {
                shipped += 1;
                acked_commit = rest
                    .split(' ')
                    .nth(1)
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(0);
            } else if shipped >= 2 + run && line == format!("CHILD at {kill_at}") {
                child.kill()?; // SIGKILL
                killed = true;
                break;
            }
        }
        let _ = child.wait();
        assert!(
            killed && acked_commit > 0,
            "run {run}: child ended before the kill point"
        );

        let r = Replica::open(Replica::local_store(&store_dir)?, "", Settings::default()).await?;
        let report = r.verify(&org).await?;
        assert!(report.failed.is_empty(), "run {run}: {:?}", report.failed);
        let dest = tmp.path().join(format!("hydrated-{run}.db"));
        let h = r.restore(&org, None, &dest).await?;
        assert!(
            h.commit >= acked_commit,
            "run {run}: acked commit {acked_commit} lost (got {})",
            h.commit
        );
        let conn = rusqlite::Connection::open(&dest)?;
        let n: i64 = conn.query_row("SELECT count(*) FROM t", [], |r| r.get(0))?;
        assert_eq!(n as u64, h.commit);
        let ok: String = conn.query_row("PRAGMA integrity_check", [], |r| r.get(0))?;
        assert_eq!(ok, "ok");
    }
    Ok(())
}
