//! P9c, the registry on the journal (`docs/design.md` 3g, "The org layer on the journal";
//! issue 28): a real [`Registry`] with `RegistrySettings::journal` on, N orgs (100 and
//! 1,000) each with one request in flight at a time, beside the same registry on the
//! per-org path (journal off), on the local directory and on the latency-shaped store, in
//! one run.
//!
//! Each cell is a fresh store and data directory. Every org is acquired first (a first
//! request each, 64 at a time); then one client per org loops `registry.once(org, key,
//! insert one 100-byte row)` for the row's time. A request's latency runs from the call to
//! its answer. Requests per ack count every store request the registry's replica made
//! meanwhile (batches, J5 checkpoints, confirmations, lease renewals; on the per-org path
//! its ships), by kind; PUT dollars at S3 Standard's $5 per million PUTs (P9b's helper).
//! Then `registry.shutdown()` releases the N orgs, open and idle: its wall time and store
//! requests are the graceful-release row.
//!
//! The targets are judged on the latency-shaped column against the shape's nominal round
//! trip (s3: p50 28 ms, p99 75 ms); the PUTs as realized in the row (delay, the timer's
//! lateness on a loaded machine, the local write) are printed beside them.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_org::replica::{self, OrgId, Replica, StoreRequests};
use idem_org::{JournalSettings, Registry, RegistrySettings};
use idem_replica::latency::{Op, Shape};

use crate::group::write;
use crate::orgs::each_once;
use crate::p10::{Column, Latency, row, table_header};
use crate::{BenchResult, ms, quantile};

/// Orgs acquired at once during the warm-up.
const WARM_CLIENTS: usize = 64;

/// What one cell measured.
struct Cell {
    /// P9b's cell: acks/s, ack p50 / p99, requests per ack, PUT dollars per million acks.
    summary: String,
    /// Store requests per ack, by kind.
    kinds: String,
    p50: Duration,
    p99: Duration,
    per_ack: f64,
    /// The store's PUTs during the load, as realized: p50, p99.
    rtt: (Duration, Duration),
    /// Mean orgs acknowledged per PUT during the load.
    acks_per_put: f64,
    /// This process's CPU during the load: user and system seconds per wall second.
    cpu: (f64, f64),
    /// `registry.shutdown()` with every org open.
    release: Duration,
    release_cost: StoreRequests,
    release_failed: usize,
}

/// Runs P9c and prints its table.
///
/// # Errors
/// The first request or store error.
pub(crate) async fn run(
    dir: &Path,
    quick: bool,
    latency: Latency,
    time: Duration,
) -> BenchResult<()> {
    let mut columns = vec![Column { shape: None }];
    if let Latency::Shaped(shape) = latency {
        columns.push(Column { shape: Some(shape) });
    }
    let counts: &[usize] = if quick { &[20, 100] } else { &[100, 1_000] };
    // The nominal round trip the targets are judged against.
    let rtt = match latency {
        Latency::Shaped(Shape::Constant(d)) => Some((d, d)),
        Latency::Shaped(Shape::LogNormal { p50, sigma }) => {
            Some((p50, p50.mul_f64((sigma * 2.326).exp())))
        }
        Latency::None => None,
    };
    outln!();
    outln!(
        "P9c: the registry on the journal: N orgs, one client each with one request in flight (one 100-byte row), {:.1} s per cell after every org is acquired; journal (window {}, section budget {} KiB) beside the per-org path, {latency} beside the local directory",
        time.as_secs_f64(),
        JournalSettings::default().window,
        JournalSettings::default().section_bytes >> 10,
    );
    table_header(&columns, "measure", "target (issue 28, latency-shaped)");
    let mut seed = 0u64;
    for &n in counts {
        for journal in [true, false] {
            let mut cells = Vec::new();
            for (c, column) in columns.iter().enumerate() {
                seed += 1;
                let work = dir.join(format!("p9c-{n}-{}-{c}", u8::from(journal)));
                let cell = one_cell(&work, column, n, journal, time, seed).await;
                let _ = std::fs::remove_dir_all(&work);
                cells.push(cell?);
            }
            print_rows(n, journal, &cells, rtt);
        }
    }
    Ok(())
}

/// Prints one mode's rows for `n` orgs.
fn print_rows(n: usize, journal: bool, cells: &[Cell], rtt: Option<(Duration, Duration)>) {
    let mode = if journal {
        "journal"
    } else {
        "per-org path (journal off)"
    };
    let (target, release_target) = match (journal, rtt) {
        (true, Some((p50, p99))) => (
            format!(
                "≤ 0.1 req/ack; p50 ≤ 2 × RTT p50 ({}), p99 ≤ 3 × RTT p99 ({})",
                ms(p50 * 2),
                ms(p99 * 3)
            ),
            if n >= 1_000 {
                "≤ 1 s for 1,000 orgs"
            } else {
                "(≤ 1 s for 1,000 orgs)"
            },
        ),
        (true, None) => ("≤ 0.1 req/ack".to_owned(), "≤ 1 s for 1,000 orgs"),
        (false, _) => ("(comparison)".to_owned(), "(comparison)"),
    };
    let each = |f: &dyn Fn(&Cell) -> String| cells.iter().map(f).collect::<Vec<_>>();
    row(
        &format!("{n} orgs, {mode}: acks/s, ack p50 / p99, req/ack, PUT $ per M acks"),
        &each(&|c| c.summary.clone()),
        &target,
    );
    row(
        &format!(
            "{n} orgs, {mode}: requests per ack by kind; acks per PUT; process CPU (user + sys, in cores)"
        ),
        &each(&|c| {
            format!(
                "{}; {:.1} acks/PUT; CPU {:.2} + {:.2} of {} cores",
                c.kinds,
                c.acks_per_put,
                c.cpu.0,
                c.cpu.1,
                std::thread::available_parallelism().map_or(0, |n| n.get())
            )
        }),
        "",
    );
    row(
        &format!("{n} orgs, {mode}: store PUTs as realized in that row, p50 / p99"),
        &each(&|c| format!("{} / {}", ms(c.rtt.0), ms(c.rtt.1))),
        "the RTT",
    );
    row(
        &format!("graceful release of {n} orgs, {mode}: wall, store requests"),
        &each(&|c| {
            let failed = if c.release_failed == 0 {
                String::new()
            } else {
                format!(", {} releases failed", c.release_failed)
            };
            format!(
                "{}, {} requests ({}){failed}",
                ms(c.release),
                c.release_cost.total(),
                kinds_of(&c.release_cost, 1)
            )
        }),
        release_target,
    );
    if let (true, Some((p50, p99)), Some(shaped)) = (journal, rtt, cells.get(1)) {
        let yes = |ok: bool| if ok { "met" } else { "NOT met" };
        let mut verdict = format!(
            "req/ack {}, p50 {}, p99 {}",
            yes(shaped.per_ack <= 0.1),
            yes(shaped.p50 <= p50 * 2),
            yes(shaped.p99 <= p99 * 3),
        );
        if n >= 1_000 {
            verdict.push_str(&format!(
                ", release {}",
                yes(shaped.release <= Duration::from_secs(1) && shaped.release_failed == 0)
            ));
        }
        let mut verdicts = vec![String::from("—"); cells.len()];
        verdicts[1] = verdict;
        row(
            &format!("{n} orgs, journal: against the targets"),
            &verdicts,
            "",
        );
    }
}

/// Requests of `cost` per `per` (an ack count; 1 for plain counts), the kinds that
/// occurred.
fn kinds_of(cost: &StoreRequests, per: usize) -> String {
    let per = per.max(1) as f64;
    let kinds = [
        ("PUT", cost.put),
        ("GET", cost.get),
        ("HEAD", cost.head),
        ("LIST", cost.list),
        ("DELETE", cost.delete),
        ("COPY", cost.copy),
        ("multipart", cost.multipart),
    ];
    let shown: Vec<String> = kinds
        .iter()
        .filter(|(_, v)| *v > 0)
        .map(|(k, v)| {
            if per == 1.0 {
                format!("{v} {k}")
            } else {
                format!("{:.4} {k}", *v as f64 / per)
            }
        })
        .collect();
    if shown.is_empty() {
        "none".to_owned()
    } else {
        shown.join(", ")
    }
}

/// A registry over `store` with the journal on or off.
async fn registry(
    store: Arc<dyn idem_org::object_store::ObjectStore>,
    data: &Path,
    journal: bool,
) -> BenchResult<Registry> {
    let replica = Replica::open(store, "", replica::Settings::default()).await?;
    let settings = RegistrySettings {
        max_open_orgs: 20_000,
        journal: JournalSettings {
            enabled: journal,
            ..JournalSettings::default()
        },
        ..RegistrySettings::default()
    };
    Ok(Registry::builder(data, replica, "p9c")
        .settings(settings)
        .on_open(|c| c.execute_batch("CREATE TABLE IF NOT EXISTS t (k TEXT, v BLOB)"))
        .build()?)
}

/// One cell: `n` orgs warmed up, loaded for `time` with one request in flight each, then
/// released by a shutdown.
async fn one_cell(
    work: &Path,
    column: &Column,
    n: usize,
    journal: bool,
    time: Duration,
    seed: u64,
) -> BenchResult<Cell> {
    let store = column.traced_store(&work.join("store"), seed)?;
    let reg = registry(store.clone(), &work.join("data"), journal).await?;
    // Every org acquired (claimed, hydrated, opened, first commit acknowledged): the rows
    // measure steady load, not acquisition.
    each_once(&reg, 0..n, "warmup", WARM_CLIENTS).await?;
    let before = reg.replica().store_requests();
    let trace = store.trace();
    let cpu_before = cpu_seconds();
    let started = Instant::now();
    let deadline = started + time;
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let reg = reg.clone();
        tasks.push(tokio::spawn(async move {
            let id = OrgId::new(&format!("org-{i:05}"))?;
            let mut lat = Vec::new();
            for r in 0u64.. {
                if Instant::now() >= deadline {
                    break;
                }
                let key = format!("r{r}");
                let k = key.clone();
                let began = Instant::now();
                reg.once(&id, &key, move |tx| write(tx, &k)).await?;
                lat.push(began.elapsed());
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(lat)
        }));
    }
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await??);
    }
    let wall = started.elapsed();
    let cpu_after = cpu_seconds();
    let cpu = (
        (cpu_after.0 - cpu_before.0) / wall.as_secs_f64(),
        (cpu_after.1 - cpu_before.1) / wall.as_secs_f64(),
    );
    let cost = reg.replica().store_requests().since(&before);
    let mut puts: Vec<Duration> = trace
        .finish()
        .requests
        .iter()
        .filter(|q| q.op == Op::Put)
        .map(|q| q.end.saturating_duration_since(q.start))
        .collect();
    puts.sort_unstable();
    latencies.sort_unstable();
    let acks = latencies.len().max(1);
    let (p50, p99) = (quantile(&latencies, 0.5), quantile(&latencies, 0.99));
    let kinds = kinds_of(&cost, acks);
    let summary = crate::p9b::ack_cell(&mut latencies, wall, &cost);
    // The graceful release: every org open and idle.
    let open = reg.open_orgs().len();
    if open != n {
        return Err(format!("{open} orgs open before the release, expected {n}").into());
    }
    let before = reg.replica().store_requests();
    let began = Instant::now();
    let results = reg.shutdown().await;
    let release = began.elapsed();
    let release_cost = reg.replica().store_requests().since(&before);
    Ok(Cell {
        summary,
        kinds,
        p50,
        p99,
        per_ack: cost.total() as f64 / acks as f64,
        rtt: (quantile(&puts, 0.5), quantile(&puts, 0.99)),
        acks_per_put: acks as f64 / cost.put.max(1) as f64,
        cpu,
        release,
        release_cost,
        release_failed: results.iter().filter(|(_, r)| r.is_err()).count(),
    })
}

/// This process's user and system CPU seconds so far, every thread (`/proc/self/stat`, in
/// clock ticks of 10 ms, Linux's `USER_HZ`); zeros where it cannot be read.
pub(crate) fn cpu_seconds() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at the state, field 3;
    // utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let field = |i: usize| {
        rest.split_whitespace()
            .nth(i - 3)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
            / 100.0
    };
    (field(14), field(15))
}
