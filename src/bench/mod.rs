//! `idem bench`: the side-by-side benchmark table (P1–P7 of BENCHMARKS.md), in one run.
//!
//! Every row is measured in this process run, so ratios compare like with like on a noisy
//! shared machine. `--quick` shrinks every size for a CI smoke run.

mod dedup;
mod group;
mod growth;
mod hydrate;
mod litestream;
mod orgs;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

/// `idem bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Tiny sizes and short rows: checks the command works (CI smoke run).
    #[arg(long)]
    quick: bool,
    /// Seconds per throughput row.
    #[arg(long, default_value_t = 3.0)]
    secs: f64,
    /// Also run the 1 GB row of P3.
    #[arg(long)]
    gigabyte: bool,
    /// The Litestream binary for P4 (default: `litestream` on PATH; the row says when absent).
    #[arg(long)]
    litestream: Option<PathBuf>,
    /// Only these parts (e.g. `--only p1,p2`).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Orgs opened in P7's first row (thousands of orgs in one process).
    #[arg(long, default_value_t = 10_000)]
    orgs: usize,
    /// Working directory (default: a temporary directory).
    #[arg(long)]
    dir: Option<PathBuf>,
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

/// Runs the selected parts and prints their tables.
///
/// # Errors
/// One line describing the failure.
pub async fn run(args: BenchArgs) -> Result<ExitCode, String> {
    let tmp = tempfile::tempdir().map_err(|e| format!("temporary directory: {e}"))?;
    let dir = args.dir.clone().unwrap_or_else(|| tmp.path().to_owned());
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    println!(
        "idem bench: {} cores, quick={}, {:.1} s per throughput row; dir {}",
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
