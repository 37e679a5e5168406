//! P10: on S3's latency (issue 27). Every row runs twice in this run, side by side: on the
//! plain local-directory store and on the same store behind `idem_replica::latency`'s
//! latency-shaped wrapper (`--latency`, default `s3`: lognormal, p50 28 ms, p99 about 75 ms),
//! where each sequential round trip costs what it costs on S3 (I16).
//!
//! - one org at 1 / 8 / 64 / 256 clients, and 32 clients over 50 and over 2,000 orgs:
//!   acked/s, ack p50/p99, store requests per ack;
//! - a cold acquire after a graceful release by another registry: store requests, round trips
//!   on the critical path, wall time (`handoff.rs`);
//! - a rolling upgrade and a crash takeover of 1,000 orgs: per-org gaps (`handoff.rs`).
//!
//! Rows go through the public APIs (`Registry`, `Replica`) only, so they measure whatever
//! the protocol does today.

mod handoff;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use idem_org::object_store::ObjectStore;
use idem_org::replica::{OrgId, Replica};
use idem_org::{Registry, RegistrySettings, replica};
use idem_replica::latency::{LatencyStore, Shape, Shapes};

use super::{BenchResult, ms};

/// The latency P10's second column runs on: `s3`, `const:MS`, or `none` (no second column).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Latency {
    /// No latency-shaped column.
    None,
    /// Every request delayed by a draw from this shape.
    Shaped(Shape),
}

impl std::str::FromStr for Latency {
    type Err = String;

    fn from_str(s: &str) -> Result<Latency, String> {
        match s {
            "none" => Ok(Latency::None),
            "s3" => Ok(Latency::Shaped(Shape::s3())),
            _ => match s.strip_prefix("const:").map(str::parse::<f64>) {
                Some(Ok(ms)) if ms.is_finite() && ms >= 0.0 => Ok(Latency::Shaped(
                    Shape::Constant(Duration::from_secs_f64(ms / 1e3)),
                )),
                _ => Err(format!("latency {s:?}: expected s3, const:MS or none")),
            },
        }
    }
}

impl std::fmt::Display for Latency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Latency::None => write!(f, "none"),
            Latency::Shaped(Shape::Constant(d)) => write!(f, "constant {}", ms(*d)),
            Latency::Shaped(Shape::LogNormal { p50, sigma }) => {
                let p99 = p50.mul_f64((sigma * 2.326).exp());
                write!(f, "lognormal p50 {}, p99 {}", ms(*p50), ms(p99))
            }
        }
    }
}

/// The ship window of P10's registries (`--ship-window`), set once before the rows run.
pub(crate) static SHIP_WINDOW: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// P10's registries ship through the journal (`--p10-journal`, `docs/design.md` 3g), set
/// once before the rows run.
pub(crate) static JOURNAL: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// The latency-shaped column wraps an in-memory store rather than a local directory
/// (`--latency-over memory`), set once before the rows run. S3 creates, renames and lists
/// its objects on its own servers; a local directory under the wrapper charges that work
/// (file creates, fsyncs, directory scans) to this host's cores, beside the registries'.
pub(crate) static SHAPED_OVER_MEMORY: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// ", journal" in a row's label when [`JOURNAL`] is set, else "".
pub(crate) fn path_label() -> &'static str {
    if JOURNAL.load(std::sync::atomic::Ordering::Relaxed) {
        ", journal"
    } else {
        ""
    }
}

/// Which of P10's rows run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rows {
    /// Every row.
    All,
    /// Only the one-org rows (1 / 8 / 64 / 256 clients).
    OneOrg,
}

impl std::str::FromStr for Rows {
    type Err = String;

    fn from_str(s: &str) -> Result<Rows, String> {
        match s {
            "all" => Ok(Rows::All),
            "one-org" => Ok(Rows::OneOrg),
            _ => Err(format!("p10 rows {s:?}: expected all or one-org")),
        }
    }
}

/// Sizes of P10's rows.
pub(crate) struct Sizes {
    /// Seconds per throughput row.
    pub time: Duration,
    /// Orgs of the wide spread row (the narrow one is 50).
    pub spread: usize,
    /// Orgs whose cold acquire is traced, one after another.
    pub acquires: usize,
    /// Orgs of the rolling upgrade and of the crash takeover.
    pub handoff: usize,
    /// Run only the rolling-upgrade and crash-takeover rows (`--only p10-handoff`).
    pub handoff_only: bool,
}

impl Sizes {
    pub(crate) fn new(quick: bool, time: Duration) -> Sizes {
        if quick {
            Sizes {
                time,
                spread: 200,
                acquires: 5,
                handoff: 50,
                handoff_only: false,
            }
        } else {
            Sizes {
                time,
                spread: 2_000,
                acquires: 50,
                handoff: 1_000,
                handoff_only: false,
            }
        }
    }
}

/// One column of the table: a store kind and how to build a fresh one.
#[derive(Clone, Copy)]
pub(crate) struct Column {
    /// The shape of the wrapper; `None` for the plain local directory.
    pub shape: Option<Shape>,
}

impl Column {
    /// A fresh store in `dir`: the local directory, behind the latency wrapper when shaped.
    /// The store under a shaped column's wrapper is an in-memory one with
    /// [`SHAPED_OVER_MEMORY`].
    pub(crate) fn store(&self, dir: &Path, seed: u64) -> BenchResult<Arc<dyn ObjectStore>> {
        Ok(match self.shape {
            None => Replica::local_store(dir)?,
            Some(shape) => Arc::new(LatencyStore::new(under(dir)?, Shapes::all(shape), seed)),
        })
    }

    /// [`Column::store`] always behind the wrapper, for its traces: with no delay on the
    /// plain column, which then only records.
    pub(crate) fn traced_store(&self, dir: &Path, seed: u64) -> BenchResult<Arc<LatencyStore>> {
        let (inner, shape) = match self.shape {
            None => (Replica::local_store(dir)?, Shape::Constant(Duration::ZERO)),
            Some(shape) => (under(dir)?, shape),
        };
        Ok(Arc::new(LatencyStore::new(inner, Shapes::all(shape), seed)))
    }
}

/// What a shaped column's wrapper delays: the local directory `dir`, or an in-memory store
/// with [`SHAPED_OVER_MEMORY`].
fn under(dir: &Path) -> BenchResult<Arc<dyn ObjectStore>> {
    if SHAPED_OVER_MEMORY.load(std::sync::atomic::Ordering::Relaxed) {
        Ok(Arc::new(idem_org::object_store::memory::InMemory::new()))
    } else {
        Ok(Replica::local_store(dir)?)
    }
}

/// A registry named `writer` over `store` (a `Replica` of its own: its own process lease),
/// with its data in `data` and a lease of `lease_ms`; with `warm` = `Some(poll_ms)`, the warm
/// takeover on with its default settings but that poll, as `idem serve` runs it.
pub(crate) async fn registry(
    store: Arc<dyn ObjectStore>,
    data: &Path,
    writer: &str,
    lease_ms: u64,
    warm: Option<u64>,
) -> BenchResult<Registry> {
    let settings = replica::Settings {
        lease_ms,
        ship_window: SHIP_WINDOW.load(std::sync::atomic::Ordering::Relaxed),
        ..replica::Settings::default()
    };
    let replica = Replica::open(store, "", settings).await?;
    let settings = RegistrySettings {
        max_open_orgs: 20_000,
        warm: idem_org::WarmSettings {
            enabled: warm.is_some(),
            poll_ms: warm.unwrap_or(idem_org::WARM_POLL_MS),
            ..idem_org::WarmSettings::default()
        },
        journal: idem_org::JournalSettings {
            enabled: JOURNAL.load(std::sync::atomic::Ordering::Relaxed),
            ..idem_org::JournalSettings::default()
        },
        ..RegistrySettings::default()
    };
    Ok(Registry::builder(data, replica, writer)
        .settings(settings)
        .on_open(|c| c.execute_batch("CREATE TABLE IF NOT EXISTS t (k TEXT, v BLOB)"))
        .build()?)
}

/// The default lease of a replica, in ms.
pub(crate) fn default_lease_ms() -> u64 {
    replica::Settings::default().lease_ms
}

pub(crate) fn org(i: usize) -> BenchResult<OrgId> {
    Ok(OrgId::new(&format!("org-{i:05}"))?)
}

/// Runs P10 and prints its table.
///
/// # Errors
/// The first request or store error.
pub(crate) async fn run(dir: &Path, latency: Latency, sizes: Sizes, rows: Rows) -> BenchResult<()> {
    let mut columns = vec![Column { shape: None }];
    if let Latency::Shaped(shape) = latency {
        columns.push(Column { shape: Some(shape) });
    }
    outln!();
    outln!(
        "P10: on S3's latency: local directory beside the same store with each request delayed ({latency}), {:.1} s per throughput row, ship window {}",
        sizes.time.as_secs_f64(),
        SHIP_WINDOW.load(std::sync::atomic::Ordering::Relaxed)
    );
    table_header(&columns, "measure", "target (on S3)");
    if !sizes.handoff_only {
        one_org(dir, &columns, sizes.time).await?;
        if rows == Rows::OneOrg {
            return Ok(());
        }
        spread(dir, &columns, sizes.spread, sizes.time).await?;
        handoff::acquire(dir, &columns, sizes.acquires).await?;
    }
    handoff::rolling(dir, &columns, sizes.handoff).await?;
    handoff::crash(dir, &columns, sizes.handoff).await?;
    Ok(())
}

/// Prints a table's header: `first`, one column per store column, `last`.
pub(crate) fn table_header(columns: &[Column], first: &str, last: &str) {
    let names: Vec<&str> = columns
        .iter()
        .map(|c| match c.shape {
            None => "local directory",
            Some(_) => "latency-shaped",
        })
        .collect();
    outln!("| {first} | {} | {last} |", names.join(" | "));
    outln!("|---|{}---|", "---|".repeat(columns.len()));
}

/// Prints one table row: a measure, one cell per column, the target.
pub(crate) fn row(measure: &str, cells: &[String], target: &str) {
    outln!("| {measure} | {} | {target} |", cells.join(" | "));
}

/// A throughput row's cell: acked/s, p50, p99, store requests per ack.
fn load_cell(rps: f64, p50: Duration, p99: Duration, per_ack: f64) -> String {
    format!(
        "{rps:.0}/s, {} / {}, {per_ack:.2} req/ack",
        ms(p50),
        ms(p99)
    )
}

async fn one_org(dir: &Path, columns: &[Column], time: Duration) -> BenchResult<()> {
    let mut rates = vec![Vec::new(); columns.len()];
    for clients in [1usize, 8, 64, 256] {
        let mut cells = Vec::new();
        // The store's PUTs as this run realized them (the draw, the timer's lateness on a
        // loaded machine, the local write): what the 1- and 64-client rows' targets are
        // measured against, beside the shape's nominal 28 ms.
        let mut realized = Vec::new();
        for (c, column) in columns.iter().enumerate() {
            let work = dir.join(format!("p10-one-{clients}-{c}"));
            let store = column.traced_store(&work.join("store"), clients as u64)?;
            let reg = registry(
                store.clone(),
                &work.join("data"),
                "p10",
                default_lease_ms(),
                None,
            )
            .await?;
            let org = reg.acquire(&OrgId::new("acme")?).await?;
            let before = reg.replica().store_requests();
            let trace = store.trace();
            let r = crate::group::acked_row(&org, clients, time).await?;
            let mut puts: Vec<Duration> = trace
                .finish()
                .requests
                .iter()
                .filter(|q| q.op == idem_replica::latency::Op::Put)
                .map(|q| q.end.saturating_duration_since(q.start))
                .collect();
            puts.sort_unstable();
            realized.push(format!(
                "{} / {}",
                ms(crate::quantile(&puts, 0.5)),
                ms(crate::quantile(&puts, 0.99))
            ));
            let requests = reg.replica().store_requests().since(&before).total();
            reg.shutdown().await;
            let _ = std::fs::remove_dir_all(&work);
            cells.push(load_cell(
                r.rps,
                r.p50,
                r.p99,
                requests as f64 / r.acks.max(1) as f64,
            ));
            rates[c].push(r.rps);
        }
        let target = match clients {
            1 => "p50 ≤ RTT p50 + 5 ms (33 ms), p99 ≤ RTT p99 + 20 ms (95 ms)",
            64 => "p50 ≤ 2 × RTT p50 (56 ms), p99 ≤ 250 ms",
            _ => "",
        };
        row(
            &format!("one org, {clients} clients: acked/s, ack p50 / p99, store requests/ack"),
            &cells,
            target,
        );
        if clients == 1 || clients == 64 {
            row(
                "its store PUTs as realized in that row (delay + local write): p50 / p99",
                &realized,
                "the RTT the row above is judged against",
            );
        }
    }
    let ratios: Vec<String> = rates
        .iter()
        .map(|r| format!("{:.1}x", r[2] / r[0].max(f64::MIN_POSITIVE)))
        .collect();
    row("one org, 64:1 clients throughput", &ratios, "≥ 30x");
    Ok(())
}

async fn spread(dir: &Path, columns: &[Column], wide: usize, time: Duration) -> BenchResult<()> {
    for orgs in [50, wide] {
        let mut cells = Vec::new();
        for (c, column) in columns.iter().enumerate() {
            let work = dir.join(format!("p10-spread-{orgs}-{c}"));
            let store = column.store(&work.join("store"), orgs as u64)?;
            let reg = registry(store, &work.join("data"), "p10", default_lease_ms(), None).await?;
            let (rps, p50, p99, per_ack) =
                crate::orgs::load(reg.replica(), &reg, orgs, time, 64).await?;
            reg.shutdown().await;
            let _ = std::fs::remove_dir_all(&work);
            cells.push(load_cell(rps, p50, p99, per_ack));
        }
        row(
            &format!("32 clients over {orgs} orgs: acked/s, ack p50 / p99, store requests/ack"),
            &cells,
            "",
        );
    }
    Ok(())
}
