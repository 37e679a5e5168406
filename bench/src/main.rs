//! `idem-bench`: the side-by-side benchmark table (P1–P11 of BENCHMARKS.md), in one run.
//!
//! Every row is measured in this process run, so ratios compare like with like on a noisy
//! shared machine. `--quick` shrinks every size for a CI smoke run. P8 runs each operation
//! as a child process of this binary; `--child` is that child's entry point.
#![forbid(unsafe_code)]
// A tool measures the host's real time (latencies, deadlines, gaps between events), so it
// reads `Instant` itself; clippy.toml's rule keeps time injected where decisions are made,
// in the product crates, and this crate makes none.
#![allow(clippy::disallowed_methods)]
// Output goes through `outln!` and `errln!`: `println!` and `eprintln!` panic on a failed write.
#![deny(clippy::print_stdout, clippy::print_stderr)]

#[macro_use]
extern crate idem_cli;

mod clones;
mod dedup;
mod group;
mod growth;
mod hydrate;
mod litestream;
mod memory;
mod orgs;
mod p10;
mod p9b;
mod p9c;
mod resnapshot;
mod uploaded;
mod versus;
mod window;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use idem_cli::{PEAK_RSS_ENV, PEAK_RSS_LINE, chain, store};

/// The `--segment-kib` help, naming the replica's default segment size as built.
fn segment_kib_help() -> String {
    format!(
        "Segment sizes P9 compares, in KiB (default: the replica's default, {} KiB)",
        idem_org::replica::Settings::default().segment_bytes >> 10
    )
}

/// `idem-bench`.
#[derive(Debug, Parser)]
#[command(name = "idem-bench", version)]
pub struct BenchArgs {
    /// Tiny sizes and short rows: checks the command works (CI smoke run).
    #[arg(long)]
    quick: bool,
    /// Seconds per throughput row.
    #[arg(long, default_value_t = 3.0)]
    secs: f64,
    /// Also run the 1 GB rows of P3 and P3s, and P8 at 4 GB besides 1 GB.
    #[arg(long)]
    gigabyte: bool,
    /// Seconds per row of P3s (idem beside Litestream with full snapshots included): longer
    /// than Litestream's 30 s L1 compaction interval, so one falls inside each row.
    #[arg(long, default_value_t = 35.0)]
    compare_secs: f64,
    /// Database sizes of P8 in MB (default 1024, plus 4096 with `--gigabyte`; 8 and 32 with
    /// `--quick`).
    #[arg(long, value_delimiter = ',')]
    rss_mb: Vec<u64>,
    /// Database size of P9 in MB (default 1024; 4 with `--quick`).
    #[arg(long)]
    p9_mb: Option<u64>,
    /// Segment sizes P9 compares, in KiB (default: the replica's default).
    #[arg(long, value_delimiter = ',', help = segment_kib_help())]
    segment_kib: Vec<usize>,
    /// The Litestream binary for P4 (default: `litestream` on PATH; the row says when absent).
    #[arg(long)]
    litestream: Option<PathBuf>,
    /// Only these parts (e.g. `--only p1,p2`; `p10-handoff` runs only P10's rolling-upgrade
    /// and crash-takeover rows, `p9b-takeover` only P9b's crash takeover).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Orgs of P10's rolling-upgrade and crash-takeover rows (default 1000; 50 with
    /// `--quick`).
    #[arg(long)]
    handoff_orgs: Option<usize>,
    /// Orgs opened in P7's first row (thousands of orgs in one process).
    #[arg(long, default_value_t = 10_000)]
    orgs: usize,
    /// The latency P10 runs beside the plain local directory: `s3` (lognormal, p50 28 ms,
    /// p99 75 ms), `const:MS` (every request MS milliseconds), or `none` (local only).
    #[arg(long, default_value = "s3")]
    latency: p10::Latency,
    /// What P10's latency-shaped column delays: `local` (a local directory, whose file
    /// creates and scans run on this host's cores) or `memory` (an in-memory store: the
    /// store's own work off the host's cores, as on S3).
    #[arg(long, default_value = "local", value_parser = ["local", "memory"])]
    latency_over: String,
    /// Pipelined ships P10's registries keep in flight per org (`docs/design.md` 3e), 1 to
    /// 8; 1 ships one at a time.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=8))]
    ship_window: u64,
    /// P10's registries ship every org through one journal run per process
    /// (`docs/design.md` 3g), as `idem serve --journal` does.
    #[arg(long)]
    p10_journal: bool,
    /// P10's rows: `all`, or only `one-org` (one org at 1 / 8 / 64 / 256 clients).
    #[arg(long, default_value = "all")]
    p10_rows: p10::Rows,
    /// Working directory (default: a temporary directory).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Internal: run one operation of P8 as its child process (`hydrate`, or `ship` of
    /// `--rss-mb` MiB).
    #[arg(long, hide = true, requires_all = ["store", "org", "dir"])]
    child: Option<String>,
    /// Internal: the child's local-directory store.
    #[arg(long, hide = true)]
    store: Option<PathBuf>,
    /// Internal: the child's org.
    #[arg(long, hide = true)]
    org: Option<String>,
}

impl BenchArgs {
    fn wants(&self, part: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|p| p.eq_ignore_ascii_case(part))
    }

    fn row_time(&self) -> Duration {
        Duration::from_secs_f64(if self.quick { 0.3 } else { self.secs.max(0.1) })
    }
}

/// A bench failure, rendered as one line.
pub(crate) type BenchResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn main() -> ExitCode {
    if let Some(code) = idem_cli::run_as_idem() {
        return code;
    }
    idem_cli::main_with("idem-bench", "warn", run(BenchArgs::parse()))
}

/// Runs the selected parts and prints their tables.
///
/// # Errors
/// One line describing the failure.
pub async fn run(args: BenchArgs) -> Result<ExitCode, String> {
    if let Some(child) = &args.child {
        return run_child(child, &args).await;
    }
    let tmp = tempfile::tempdir().map_err(|e| format!("temporary directory: {e}"))?;
    let dir = args.dir.clone().unwrap_or_else(|| tmp.path().to_owned());
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    outln!(
        "idem-bench: {} cores, quick={}, {:.1} s per throughput row; dir {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        args.quick,
        args.row_time().as_secs_f64(),
        dir.display()
    );
    fn fail(part: &'static str) -> impl Fn(Box<dyn std::error::Error + Send + Sync>) -> String {
        move |e| format!("{part}: {}", crate::chain(&*e))
    }
    if args.wants("p1") {
        dedup::run(&dir, args.quick).map_err(fail("p1"))?;
    }
    if args.wants("p2") {
        group::p2(&dir, args.row_time()).await.map_err(fail("p2"))?;
    }
    if args.wants("p3") {
        growth::run(
            &dir,
            args.quick,
            args.gigabyte,
            args.row_time(),
            args.litestream.as_deref(),
        )
        .await
        .map_err(fail("p3"))?;
    }
    if args.wants("p3s") {
        let secs = if args.quick {
            1.0
        } else {
            args.compare_secs.max(0.1)
        };
        versus::run(
            &dir,
            args.quick,
            args.gigabyte,
            Duration::from_secs_f64(secs),
            args.litestream.as_deref(),
        )
        .await
        .map_err(fail("p3s"))?;
    }
    if args.wants("p4") {
        litestream::run(
            &dir,
            args.quick,
            args.litestream.as_deref(),
            args.row_time(),
        )
        .await
        .map_err(fail("p4"))?;
    }
    if args.wants("p5") {
        hydrate::run(&dir, args.quick).await.map_err(fail("p5"))?;
        hydrate::chain(&dir, args.quick).await.map_err(fail("p5"))?;
    }
    if args.wants("p6") {
        group::p6(&dir, args.row_time()).await.map_err(fail("p6"))?;
    }
    if args.wants("p7") {
        orgs::run(
            &dir,
            orgs::Sizes::new(args.quick, args.orgs),
            args.row_time(),
        )
        .await
        .map_err(fail("p7"))?;
    }
    if args.wants("p8") {
        let sizes = match (args.rss_mb.is_empty(), args.quick, args.gigabyte) {
            (false, ..) => args.rss_mb.clone(),
            (true, true, _) => vec![8, 32],
            (true, false, false) => vec![1024],
            (true, false, true) => vec![1024, 4096],
        };
        memory::run(&dir, &sizes).await.map_err(fail("p8"))?;
    }
    if args.wants("p9") {
        let mb = args.p9_mb.unwrap_or(if args.quick { 4 } else { 1024 });
        resnapshot::run(&dir, mb, &args.segment_kib)
            .await
            .map_err(fail("p9"))?;
    }
    let takeover_only = !args.wants("p9b") && args.wants("p9b-takeover");
    if args.wants("p9b") || takeover_only {
        p9b::run(&dir, args.quick, args.latency, takeover_only)
            .await
            .map_err(fail("p9b"))?;
    }
    if args.wants("p9c") {
        p9c::run(&dir, args.quick, args.latency, args.row_time())
            .await
            .map_err(fail("p9c"))?;
    }
    let handoff_only = !args.wants("p10") && args.wants("p10-handoff");
    if args.wants("p10") || handoff_only {
        p10::SHIP_WINDOW.store(args.ship_window, std::sync::atomic::Ordering::Relaxed);
        p10::JOURNAL.store(args.p10_journal, std::sync::atomic::Ordering::Relaxed);
        let memory = args.latency_over == "memory";
        p10::SHAPED_OVER_MEMORY.store(memory, std::sync::atomic::Ordering::Relaxed);
        let mut sizes = p10::Sizes::new(args.quick, args.row_time());
        sizes.handoff = args.handoff_orgs.unwrap_or(sizes.handoff);
        sizes.handoff_only = handoff_only;
        p10::run(&dir, args.latency, sizes, args.p10_rows)
            .await
            .map_err(fail("p10"))?;
    }
    if args.wants("p11") {
        window::run(&dir, args.quick).await.map_err(fail("p11"))?;
    }
    if args.wants("p11") || args.wants("p11b") {
        clones::run(&dir, args.quick).await.map_err(fail("p11b"))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `idem-bench --child OP`: one operation of P8, in its own process.
async fn run_child(child: &str, args: &BenchArgs) -> Result<ExitCode, String> {
    let (Some(store), Some(org), Some(dir)) = (&args.store, &args.org, &args.dir) else {
        return Err("--child needs --store, --org and --dir".into());
    };
    match child {
        "hydrate" => memory::hydrate_child(store, org, dir)
            .await
            .map_err(|e| format!("hydrate: {}", crate::chain(&*e)))?,
        "ship" => {
            let mb = args.rss_mb.first().copied().unwrap_or(1);
            memory::ship_child(store, org, dir, mb)
                .await
                .map_err(|e| format!("ship: {}", crate::chain(&*e)))?
        }
        other => return Err(format!("unknown --child {other} (known: hydrate, ship)")),
    }
    Ok(ExitCode::SUCCESS)
}

/// The `q`-quantile of sorted durations.
pub(crate) fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

/// Formats a duration in milliseconds with two decimals (microseconds below 1 ms).
pub(crate) fn ms(d: Duration) -> String {
    if d < Duration::from_millis(1) {
        format!("{:.1} µs", d.as_secs_f64() * 1e6)
    } else {
        format!("{:.2} ms", d.as_secs_f64() * 1e3)
    }
}
