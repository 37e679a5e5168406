//! P3s: bytes to the store per acknowledged 1 KB write with full snapshots included, idem
//! beside Litestream, at each database size, in one run.
//!
//! Each row preloads a database of the size, then writes 1 KB rows at full rate for the row's
//! length (35 s by default: longer than Litestream's 30 s L1 compaction interval, so its
//! first compaction falls inside the row).
//!
//! - **idem**: 8 clients through one org at the default policy (a full snapshot the policy
//!   ships during the row counts), then one forced full snapshot at the end of the row
//!   ([`idem_org::Org::full_snapshot_next`]). Bytes are every object the row added to the
//!   store (blobs, log entries, lease renewals), retention off so nothing added is deleted.
//! - **Litestream** (the real binary, defaults: sync every 1 s to L0, L1 every 30 s, L2
//!   every 5 min, L3 every hour, a snapshot every 24 h, L0 kept 5 min): one connection
//!   committing one row per transaction, paced at the rate idem acknowledged in the same
//!   row (so both databases grow alike, and a sync carries as many commits); bytes are every file written to the replica during
//!   the row at every level, polled every 50 ms so a compacted-away file still counts.
//!
//! Both sides exclude the upload of the preloaded database that starts the row: idem's first
//! full snapshot, and Litestream's first L0 file with the first L1 compaction that rewrites
//! it (the row opens after that compaction, so its own L1 compactions hold only the row's
//! pages).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use idem_org::replica::OrgId;
use idem_org::{RegistrySettings, rusqlite};

use super::BenchResult;
use super::group::{acked_row_with, registry_with};
use super::growth::{ROW, end_of_row_full, preload, write_1k};
use super::litestream::{find, l0};
use super::uploaded::Uploaded;

/// What one idem row cost.
struct Idem {
    acks: u64,
    deltas_per_ack: f64,
    ships_per_ack: f64,
    store_per_ack: f64,
    forced: u64,
}

/// What one Litestream row cost.
struct Lite {
    commits: usize,
    l0_per_tx: f64,
    all_per_tx: f64,
    /// Levels written to during the row: (level, files, bytes).
    levels: Vec<(String, usize, u64)>,
}

/// Prints the P3s table.
///
/// # Errors
/// The first request, store or Litestream failure.
pub async fn run(
    dir: &Path,
    quick: bool,
    gigabyte: bool,
    time: Duration,
    litestream: Option<&Path>,
) -> BenchResult<()> {
    let mut sizes: Vec<u64> = if quick { vec![1] } else { vec![1, 10, 100] };
    if gigabyte {
        sizes.push(1024);
    }
    let bin = find(litestream);
    outln!(
        "\nP3s bytes to the store per acknowledged 1 KB write, full snapshots included, idem beside Litestream: {:.0} s per row",
        time.as_secs_f64()
    );
    outln!(
        "| database | idem acks | idem bytes/ack: deltas | + policy's fulls | all objects incl. end-of-row full snapshot | end-of-row snapshot | Litestream commits | Litestream bytes/tx: L0 | all levels | levels written | idem (incl. snapshot) / Litestream (all levels) |"
    );
    outln!("|---|---|---|---|---|---|---|---|---|---|---|");
    for mb in sizes {
        let idem = idem_row(&dir.join(format!("p3s-{mb}")), mb, time).await?;
        let rate = idem.acks as f64 / time.as_secs_f64();
        let lite = match &bin {
            Some(bin) => {
                let (bin, work) = (bin.clone(), dir.join(format!("p3s-litestream-{mb}")));
                let w = work.clone();
                let got =
                    tokio::task::spawn_blocking(move || litestream_row(&bin, &w, mb, time, rate))
                        .await??;
                let _ = std::fs::remove_dir_all(&work);
                Some(got)
            }
            None => None,
        };
        let (lc, ll0, lall, levels, ratio) = match &lite {
            Some(l) => (
                l.commits.to_string(),
                format!("{:.0}", l.l0_per_tx),
                format!("{:.0}", l.all_per_tx),
                l.levels
                    .iter()
                    .map(|(lvl, n, b)| format!("{lvl}: {n} files {:.2} MB", *b as f64 / 1e6))
                    .collect::<Vec<_>>()
                    .join(", "),
                format!(
                    "{:.2}x",
                    idem.store_per_ack / l.all_per_tx.max(f64::MIN_POSITIVE)
                ),
            ),
            None => (
                "not run (no `litestream` binary)".into(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
            ),
        };
        outln!(
            "| {mb} MB | {} | {:.0} | {:.0} | {:.0} | {:.2} MB | {lc} | {ll0} | {lall} | {levels} | {ratio} |",
            idem.acks,
            idem.deltas_per_ack,
            idem.ships_per_ack,
            idem.store_per_ack,
            idem.forced as f64 / 1e6
        );
    }
    Ok(())
}

async fn idem_row(work: &Path, mb: u64, time: Duration) -> BenchResult<Idem> {
    let _ = std::fs::remove_dir_all(work);
    let settings = RegistrySettings {
        retain_every_ships: 0,
        ..RegistrySettings::default()
    };
    let reg = registry_with(work, settings).await?;
    let org = reg.acquire(&OrgId::new("acme")?).await?;
    preload(&org, mb).await?;
    let window = Uploaded::start(&work.join("store"), Duration::ZERO);
    let before = org.stats();
    let row = acked_row_with(&org, 8, time, write_1k).await?;
    let mid = org.stats();
    let forced = end_of_row_full(&org, "end-of-row").await?;
    let stored = window.finish().bytes();
    reg.shutdown().await;
    let _ = std::fs::remove_dir_all(work);
    let acks = row.acks + 1;
    let fulls = mid.full_bytes - before.full_bytes;
    let per = |b: u64| b as f64 / acks as f64;
    Ok(Idem {
        acks,
        deltas_per_ack: per(row.bytes_shipped.saturating_sub(fulls)),
        ships_per_ack: per(row.bytes_shipped),
        store_per_ack: per(stored),
        forced,
    })
}

/// Litestream over a fresh database preloaded with `mb` MB of 1 KB rows, committing one 1 KB
/// row per transaction at `rate` a second for `time`: idem's acknowledged rate in the same
/// row, so both databases grow alike and each sync carries as many commits.
fn litestream_row(bin: &Path, dir: &Path, mb: u64, time: Duration, rate: f64) -> BenchResult<Lite> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    let (db, replica) = (dir.join("db.sqlite"), dir.join("replica"));
    let conn = rusqlite::Connection::open(&db)?;
    conn.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; CREATE TABLE t (k TEXT, v BLOB);",
    )?;
    conn.execute(
        &format!(
            "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < ?1)
             INSERT INTO t SELECT 'pre' || i, {ROW} FROM c"
        ),
        [i64::try_from(mb * 1024)?],
    )?;
    let mut child = Command::new(bin)
        .arg("replicate")
        .arg(&db)
        .arg(format!("file://{}", replica.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let out = (|| {
        // Its first sync uploads the whole preloaded database; the row starts after it.
        let ready = Instant::now() + Duration::from_secs(60 + mb / 10);
        while l0(&replica) == 0 {
            if Instant::now() > ready {
                return Err("litestream wrote no replica file in time".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // Its first L1 compaction rewrites that upload (the whole database) into L1; the row
        // starts after it, as idem's starts after its first full snapshot, so both count
        // what the row's writes cost.
        let l1 = replica.join("ltx").join("1");
        let compacted = Instant::now() + Duration::from_secs(45 + mb / 10);
        while std::fs::read_dir(&l1).map_or(0, |rd| rd.flatten().count()) == 0 {
            if Instant::now() > compacted {
                return Err("litestream compacted nothing into L1 in time".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(500));
        let window = Uploaded::start(&replica, Duration::from_millis(50));
        let started = Instant::now();
        let gap = Duration::from_secs_f64(1.0 / rate.max(1.0));
        let mut commits = 0usize;
        let mut insert = conn.prepare(&format!("INSERT INTO t VALUES (?1, {ROW})"))?;
        while started.elapsed() < time {
            commits += 1;
            insert.execute([format!("k{commits}")])?;
            if let Some(wait) =
                (started + gap * u32::try_from(commits)?).checked_duration_since(Instant::now())
            {
                std::thread::sleep(wait);
            }
        }
        // Litestream syncs every second: two syncs later the last commit is in L0.
        std::thread::sleep(Duration::from_millis(2500));
        let tally = window.finish();
        let level = |p: &Path| {
            let mut c = p.components().map(|c| c.as_os_str().to_string_lossy());
            match (c.next().as_deref(), c.next()) {
                (Some("ltx"), Some(l)) => format!("L{l}"),
                (first, _) => first.unwrap_or("").to_owned(),
            }
        };
        let levels: Vec<(String, usize, u64)> = tally
            .by(level)
            .into_iter()
            .map(|(l, (n, b))| (l, n, b))
            .collect();
        let l0_bytes = levels
            .iter()
            .find(|(l, ..)| l == "L0")
            .map_or(0, |(_, _, b)| *b);
        let per = |b: u64| b as f64 / commits.max(1) as f64;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(Lite {
            commits,
            l0_per_tx: per(l0_bytes),
            all_per_tx: per(tally.bytes()),
            levels,
        })
    })();
    let _ = child.kill();
    let _ = child.wait();
    out
}
