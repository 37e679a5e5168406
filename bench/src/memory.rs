//! P8: peak resident memory of ship, hydrate, restore and verify of one large org, each run
//! as a child process of this binary on a local-directory store, so each figure is one
//! operation's whole process. The `idem` commands run as `idem-bench idem …`: the same
//! library code as the `idem` binary (`idem_cli::AS_IDEM`), with no second binary to find.
//!
//! The peak is measured, not estimated: the child runs with `IDEM_REPORT_PEAK_RSS=1` and
//! prints the kernel's high-water mark of its resident set (`VmHWM` of `/proc/self/status`)
//! as it exits (`idem_cli::main_with`); this parses that line. The rows:
//!
//! - ship: `idem import ORG --from FILE --store URL` (the file becomes the org's first full
//!   snapshot);
//!   When import cannot ship the size at all, `idem-bench --child ship` ships it instead: a
//!   registry's org filled by one request ships it as its first full snapshot;
//! - hydrate: `idem-bench --child hydrate`: a registry acquires the org (claim + hydrate +
//!   open) and shuts down;
//! - restore: `idem restore ORG --store URL --to OUT`;
//! - verify: `idem verify ORG --store URL`.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use idem_org::replica::{OrgId, Replica};
use idem_org::{Registry, replica, rusqlite};

use idem_cli::AS_IDEM;

use super::BenchResult;
use super::growth::ROW;

/// The org every row uses.
const ORG: &str = "big";

/// The target of issue 17 at 4 GB.
const TARGET_MIB: f64 = 256.0;

/// Prints the P8 table for databases of `sizes` MB.
///
/// # Errors
/// Creating the database or the store; a child that fails is a row, not an error.
pub async fn run(dir: &Path, sizes: &[u64]) -> BenchResult<()> {
    let exe = std::env::current_exe()?;
    outln!(
        "\nP8 peak RSS of one operation's process (VmHWM read by the child at exit), local-directory store; target <= {TARGET_MIB:.0} MiB at 4 GB"
    );
    outln!("| operation | database | peak RSS MiB | time | MB/s |");
    outln!("|---|---|---|---|---|");
    for &mb in sizes {
        let free = free_bytes(dir);
        // The database, the store's compressed copy, a hydrated and a restored copy, and
        // import's private copy of the file all exist at some moment.
        let need = mb * (1 << 20) * 4 + (1 << 30);
        if let Some(free) = free
            && free < need
        {
            outln!(
                "| (all) | {mb} MB | skipped: needs {:.1} GB free, {:.1} GB free | | |",
                need as f64 / 1e9,
                free as f64 / 1e9
            );
            continue;
        }
        let work = dir.join(format!("p8-{mb}"));
        let _ = std::fs::remove_dir_all(&work);
        std::fs::create_dir_all(&work)?;
        let db = work.join("source.db");
        let d = db.clone();
        tokio::task::spawn_blocking(move || create(&d, mb)).await??;
        let bytes = std::fs::metadata(&db)?.len();
        let store = work.join("store");
        std::fs::create_dir_all(&store)?;
        let url = format!("file://{}", store.display());
        let label = if bytes < 1 << 30 {
            format!("{:.0} MiB", bytes as f64 / f64::from(1u32 << 20))
        } else {
            format!("{:.2} GiB", bytes as f64 / f64::from(1u32 << 30))
        };
        let row = |op: &str, args: Vec<std::ffi::OsString>| match child(&exe, &args) {
            Ok((kib, took)) => {
                outln!(
                    "| {op} | {label} | {:.0} | {} | {:.0} |",
                    kib as f64 / 1024.0,
                    super::ms(took),
                    bytes as f64 / 1e6 / took.as_secs_f64().max(f64::MIN_POSITIVE)
                );
                true
            }
            Err(e) => {
                outln!("| {op} | {label} | failed: {} | | |", crate::chain(&*e));
                false
            }
        };
        let os = |s: &str| std::ffi::OsString::from(s);
        let path = |p: &Path| p.as_os_str().to_owned();
        let imported = row(
            "ship (`idem import`)",
            vec![
                os(AS_IDEM),
                os("import"),
                os(ORG),
                os("--from"),
                path(&db),
                os("--store"),
                os(&url),
            ],
        );
        let data = work.join("data");
        // The rows after need a published snapshot: when import cannot ship this size, the
        // org ships it from a registry (its first full snapshot), measured the same way.
        if !imported
            && !row(
                "ship (org's first full snapshot, `idem-bench --child ship`)",
                vec![
                    os("--child"),
                    os("ship"),
                    os("--store"),
                    path(&store),
                    os("--org"),
                    os(ORG),
                    os("--dir"),
                    path(&work.join("ship-data")),
                    os("--rss-mb"),
                    os(&mb.to_string()),
                ],
            )
        {
            outln!("| hydrate, restore, verify | {label} | skipped: nothing was shipped | | |");
            let _ = std::fs::remove_dir_all(&work);
            continue;
        }
        let _ = std::fs::remove_dir_all(work.join("ship-data"));
        row(
            "hydrate (registry acquire)",
            vec![
                os("--child"),
                os("hydrate"),
                os("--store"),
                path(&store),
                os("--org"),
                os(ORG),
                os("--dir"),
                path(&data),
            ],
        );
        let _ = std::fs::remove_dir_all(&data);
        let out = work.join("restored.db");
        row(
            "restore (`idem restore`)",
            vec![
                os(AS_IDEM),
                os("restore"),
                os(ORG),
                os("--store"),
                os(&url),
                os("--to"),
                path(&out),
            ],
        );
        let _ = std::fs::remove_file(&out);
        row(
            "verify (`idem verify`)",
            vec![os(AS_IDEM), os("verify"), os(ORG), os("--store"), os(&url)],
        );
        let _ = std::fs::remove_dir_all(&work);
    }
    Ok(())
}

/// A database of about `mb` MiB of 1 KB rows, written fast: no journal, no fsync (a crash
/// only loses a bench input).
fn create(path: &Path, mb: u64) -> BenchResult<()> {
    let conn = rusqlite::Connection::open(path)?;
    conn.execute_batch(
        "PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF; CREATE TABLE t (k TEXT, v BLOB);",
    )?;
    fill(&conn, mb)?;
    Ok(())
}

/// Inserts about `mb` MiB of 1 KB rows into `t` (three fill a 4 KiB page).
fn fill(conn: &rusqlite::Connection, mb: u64) -> rusqlite::Result<usize> {
    conn.execute(
        &format!(
            "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < ?1)
             INSERT INTO t SELECT 'pre' || i, {ROW} FROM c"
        ),
        [i64::try_from(mb * 768).unwrap_or(i64::MAX)],
    )
}

/// Runs this binary with `args` (`idem …` or `--child …`) and the peak-RSS report on; its peak in KiB and its wall time.
fn child(exe: &Path, args: &[std::ffi::OsString]) -> BenchResult<(u64, Duration)> {
    let began = Instant::now();
    let out = Command::new(exe)
        .args(args)
        .env(crate::PEAK_RSS_ENV, "1")
        .env_remove("IDEM_LOG")
        .output()?;
    let took = began.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        let said: Vec<&str> = stderr
            .lines()
            .filter(|l| !l.starts_with(crate::PEAK_RSS_LINE))
            .collect();
        let said = said.join("; ");
        let cut = said
            .char_indices()
            .nth(600)
            .map_or(said.as_str(), |(i, _)| &said[..i]);
        return Err(format!("{} ({cut})", out.status).into());
    }
    let kib = stderr
        .lines()
        .find_map(|l| l.strip_prefix(crate::PEAK_RSS_LINE))
        .and_then(|v| v.trim().parse().ok())
        .ok_or("the child printed no peak RSS line")?;
    Ok((kib, took))
}

/// Free bytes on the file system holding `dir`, from `df` (none when it cannot tell).
fn free_bytes(dir: &Path) -> Option<u64> {
    let out = Command::new("df").arg("-Pk").arg(dir).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let kib: u64 = text
        .lines()
        .nth(1)?
        .split_whitespace()
        .nth(3)?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// `idem-bench --child hydrate`: acquires `org` through a registry over the local-directory
/// store `store` with its data in `data` (claim, hydrate, open), then shuts down.
///
/// # Errors
/// The org has no snapshot; store, claim or hydrate failures.
pub async fn hydrate_child(store: &Path, org: &str, data: &Path) -> BenchResult<()> {
    let replica = Replica::open(
        Replica::local_store(store)?,
        "",
        replica::Settings::default(),
    )
    .await?;
    let id = OrgId::new(org)?;
    if !replica.history(&id).await?.iter().any(|e| e.is_snapshot()) {
        return Err(format!("org {id} has no snapshot to hydrate").into());
    }
    let registry = Registry::builder(data, replica, "bench-hydrate").build()?;
    let org = registry.acquire(&id).await?;
    let round = org.round();
    drop(org);
    for (id, result) in registry.shutdown().await {
        result.map_err(|e| format!("org {id}: shutdown: {}", crate::chain(&e)))?;
    }
    outln!("hydrated org round {round}");
    Ok(())
}

/// `idem-bench --child ship`: a registry acquires the new org `org`, one request fills it
/// with about `mb` MiB of 1 KB rows, and its ship (the claim's first, a full snapshot)
/// publishes them; then it shuts down.
///
/// # Errors
/// Store, claim, request or ship failures.
pub async fn ship_child(store: &Path, org: &str, data: &Path, mb: u64) -> BenchResult<()> {
    let replica = Replica::open(
        Replica::local_store(store)?,
        "",
        replica::Settings::default(),
    )
    .await?;
    let registry = Registry::builder(data, replica, "bench-ship").build()?;
    let org = registry.acquire(&OrgId::new(org)?).await?;
    org.once("fill", move |tx| {
        tx.execute_batch("CREATE TABLE IF NOT EXISTS t (k TEXT, v BLOB)")?;
        fill(tx, mb)?;
        Ok::<_, rusqlite::Error>(Vec::new())
    })
    .await?;
    let stats = org.stats();
    drop(org);
    for (id, result) in registry.shutdown().await {
        result.map_err(|e| format!("org {id}: shutdown: {}", crate::chain(&e)))?;
    }
    outln!(
        "shipped {} full snapshots, {} bytes",
        stats.full_ships,
        stats.full_bytes
    );
    Ok(())
}
