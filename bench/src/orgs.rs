//! P7: thousands of orgs in one process (issue 16), each row measured in this run:
//!
//! - **many orgs open**: RSS and threads of this process with N orgs open, and a cold first
//!   request (claim + hydrate + open + ship) against a warm one, p50/p99;
//! - **spread**: 32 clients over 2,000 orgs against the same over 50 (acked/s, p50);
//! - **rolling upgrade**: writer A holds M orgs, writer B (another `Replica`: its own process
//!   lease and data directory) starts taking requests while A shuts down; per org, the time
//!   from the start of A's shutdown to its first ack on B, and what B's first ships uploaded;
//! - **idle**: store requests an hour while 100 touched orgs sit idle, on the S3 API when
//!   `IDEM_S3_BUCKET` and `AWS_ENDPOINT` are set (run it under `scripts/s3-server`), else on
//!   the local-directory store (the counts are the same requests).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_org::replica::{OrgId, Replica, StoreRequests};
use idem_org::{ErrorKind, Registry, RegistrySettings, replica};

use super::group::write;
use super::{BenchResult, ms, quantile};

/// Sizes of the rows.
pub(crate) struct Sizes {
    /// Orgs opened in the first row.
    pub open: usize,
    /// Orgs of the rolling upgrade.
    pub upgrade: usize,
    /// Orgs of the wide spread row (the narrow one is 50).
    pub spread: usize,
    /// Idle window.
    pub idle: Duration,
}

impl Sizes {
    pub(crate) fn new(quick: bool, orgs: usize) -> Sizes {
        if quick {
            Sizes {
                open: 200,
                upgrade: 100,
                spread: 200,
                idle: Duration::from_secs(1),
            }
        } else {
            Sizes {
                open: orgs,
                upgrade: 1_000,
                spread: 2_000,
                idle: Duration::from_secs(30),
            }
        }
    }
}

/// Runs P7 and prints its table.
///
/// # Errors
/// The first request or store error.
pub(crate) async fn run(dir: &Path, sizes: Sizes, time: Duration) -> BenchResult<()> {
    outln!();
    outln!("P7: thousands of orgs in one process (local-directory store unless noted)");
    outln!("| measure | value |");
    outln!("|---|---|");
    many_open(&dir.join("p7-open"), sizes.open).await?;
    spread(&dir.join("p7-spread"), sizes.spread, time).await?;
    rolling_upgrade(&dir.join("p7-upgrade"), sizes.upgrade).await?;
    idle(&dir.join("p7-idle"), sizes.idle).await?;
    Ok(())
}

/// A registry over the local-directory store in `store`, with its data in `data`.
async fn registry(store: &Path, data: &Path, writer: &str) -> BenchResult<(Replica, Registry)> {
    let store = Replica::local_store(store)?;
    let replica = Replica::open(store, "", replica::Settings::default()).await?;
    let registry = build(&replica, data, writer)?;
    Ok((replica, registry))
}

fn build(replica: &Replica, data: &Path, writer: &str) -> BenchResult<Registry> {
    let settings = RegistrySettings {
        max_open_orgs: 20_000,
        ..RegistrySettings::default()
    };
    Ok(Registry::builder(data, replica.clone(), writer)
        .settings(settings)
        .on_open(|c| c.execute_batch("CREATE TABLE IF NOT EXISTS t (k TEXT, v BLOB)"))
        .build()?)
}

fn org(i: usize) -> BenchResult<OrgId> {
    Ok(OrgId::new(&format!("org-{i:05}"))?)
}

/// 64 KiB of random bytes: an org whose full snapshot costs about that much.
fn bulk(
    tx: &idem_org::rusqlite::Transaction<'_>,
    key: &str,
) -> idem_org::rusqlite::Result<Vec<u8>> {
    tx.execute("INSERT INTO t VALUES (?1, randomblob(65536))", [key])?;
    Ok(Vec::new())
}

/// One request per org in `orgs`, `clients` at a time; each request's latency.
pub(crate) async fn each_once(
    registry: &Registry,
    orgs: std::ops::Range<usize>,
    key: &'static str,
    clients: usize,
) -> BenchResult<Vec<Duration>> {
    each_once_with(registry, orgs, key, clients, write).await
}

/// [`each_once`] with another write per request.
async fn each_once_with(
    registry: &Registry,
    orgs: std::ops::Range<usize>,
    key: &'static str,
    clients: usize,
    write: super::group::Write,
) -> BenchResult<Vec<Duration>> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(orgs.start));
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (registry, next, end) = (registry.clone(), next.clone(), orgs.end);
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= end {
                    return Ok::<_, Box<dyn std::error::Error + Send + Sync>>(lat);
                }
                let id = OrgId::new(&format!("org-{i:05}"))?;
                let began = Instant::now();
                registry.once(&id, key, move |tx| write(tx, key)).await?;
                lat.push(began.elapsed());
            }
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    all.sort_unstable();
    Ok(all)
}

/// Threads and resident memory of this process, from `/proc/self/status`.
fn process_status() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (field("Threads:"), field("VmRSS:") * 1024)
}

async fn many_open(dir: &Path, n: usize) -> BenchResult<()> {
    let (_, reg) = registry(&dir.join("store"), &dir.join("data"), "p7").await?;
    let (threads0, rss0) = process_status();
    let cold = each_once(&reg, 0..n, "cold", 16).await?;
    let warm = each_once(&reg, 0..n, "warm", 16).await?;
    let (threads, rss) = process_status();
    let open = reg.open_orgs().len();
    outln!(
        "| {n} orgs touched: open / threads / RSS | {open} / {threads} (before: {threads0}) / {:.0} MiB (before: {:.0} MiB) |",
        rss as f64 / (1 << 20) as f64,
        rss0 as f64 / (1 << 20) as f64
    );
    outln!(
        "| cold first request (claim + hydrate + open + ship) p50 / p99 | {} / {} |",
        ms(quantile(&cold, 0.5)),
        ms(quantile(&cold, 0.99))
    );
    outln!(
        "| warm request (open org) p50 / p99 | {} / {} |",
        ms(quantile(&warm, 0.5)),
        ms(quantile(&warm, 0.99))
    );
    reg.shutdown().await;
    Ok(())
}

/// 32 clients sending requests to orgs drawn uniformly from `orgs` for `time`; acked/s,
/// p50, p99, store requests per ack. Every org is opened first, `warm` at a time.
pub(crate) async fn load(
    replica: &Replica,
    reg: &Registry,
    orgs: usize,
    time: Duration,
    warm: usize,
) -> BenchResult<(f64, Duration, Duration, f64)> {
    // Every org opened first: the row measures load, not acquisition.
    each_once(reg, 0..orgs, "warmup", warm).await?;
    let before = replica.store_requests();
    let deadline = Instant::now() + time;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..32u64 {
        let reg = reg.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut rng = c.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            for i in 0u64.. {
                if Instant::now() >= deadline {
                    break;
                }
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let id = OrgId::new(&format!("org-{:05}", rng % orgs as u64))?;
                let key = format!("c{c}-{i}");
                let began = Instant::now();
                let k = key.clone();
                reg.once(&id, &key, move |tx| write(tx, &k)).await?;
                lat.push(began.elapsed());
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(lat)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let requests = replica.store_requests().since(&before).total();
    all.sort_unstable();
    let acks = all.len().max(1) as f64;
    Ok((
        all.len() as f64 / elapsed,
        quantile(&all, 0.5),
        quantile(&all, 0.99),
        requests as f64 / acks,
    ))
}

async fn spread(dir: &Path, wide: usize, time: Duration) -> BenchResult<()> {
    let (replica, reg) = registry(&dir.join("store"), &dir.join("data"), "p7").await?;
    let narrow = load(&replica, &reg, 50, time, 16).await?;
    let spread = load(&replica, &reg, wide, time, 16).await?;
    for (n, (rps, p50, p99, req)) in [(50, narrow), (wide, spread)] {
        outln!(
            "| 32 clients over {n} orgs: acked/s, p50, p99, store requests/ack | {rps:.0}/s, {}, {}, {req:.2} |",
            ms(p50),
            ms(p99)
        );
    }
    outln!(
        "| {wide} orgs / 50 orgs throughput | {:.2}x |",
        spread.0 / narrow.0.max(f64::MIN_POSITIVE)
    );
    reg.shutdown().await;
    Ok(())
}

async fn rolling_upgrade(dir: &Path, n: usize) -> BenchResult<()> {
    let store = Replica::local_store(&dir.join("store"))?;
    let ra = Replica::open(store.clone(), "", replica::Settings::default()).await?;
    let a = build(&ra, &dir.join("a"), "a")?;
    // Each org holds 64 KiB of incompressible rows, then a few small requests: a chain for B
    // to continue, whose full snapshot would cost about 64 KiB per org.
    each_once_with(&a, 0..n, "bulk", 16, bulk).await?;
    for key in ["r1", "r2", "r3"] {
        each_once(&a, 0..n, key, 16).await?;
    }
    let snapshot_bytes = {
        let (mut bytes, mut ships) = (0u64, 0u64);
        for org in a.open_orgs() {
            let s = org.stats();
            bytes += s.full_bytes;
            ships += s.full_ships;
        }
        bytes / ships.max(1)
    };
    let rb = Replica::open(store, "", replica::Settings::default()).await?;
    let b = build(&rb, &dir.join("b"), "b")?;
    let began = Instant::now();
    let shutdown = {
        let a = a.clone();
        tokio::spawn(async move {
            let released = a.shutdown().await;
            (
                began.elapsed(),
                released.iter().filter(|(_, r)| r.is_err()).count(),
            )
        })
    };
    let mut tasks = Vec::new();
    for i in 0..n {
        let b = b.clone();
        tasks.push(tokio::spawn(async move {
            let id = org(i)?;
            let mut tries = 0u32;
            loop {
                tries += 1;
                match b.once(&id, "after", |tx| write(tx, "after")).await {
                    Ok(_) => {
                        return Ok::<_, Box<dyn std::error::Error + Send + Sync>>((
                            began.elapsed(),
                            tries,
                        ));
                    }
                    // A client told to retry waits a little (the layer's Retry-After is whole
                    // seconds; a release usually lands sooner) and tries again.
                    Err(e) if e.kind() == ErrorKind::Retry || e.kind() == ErrorKind::Reacquire => {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }));
    }
    let mut gaps = Vec::new();
    let mut max_tries = 0;
    for t in tasks {
        let (gap, tries) = t.await??;
        gaps.push(gap);
        max_tries = max_tries.max(tries);
    }
    let (shutdown_took, failed) = shutdown.await?;
    gaps.sort_unstable();
    let (mut full, mut bytes) = (0u64, 0u64);
    for org in b.open_orgs() {
        let s = org.stats();
        full += s.full_ships;
        bytes += s.bytes_shipped;
    }
    outln!(
        "| rolling upgrade of {n} orgs (A shuts down, B takes requests): gap to first ack on B p50 / p99 / max | {} / {} / {} (max {max_tries} tries) |",
        ms(quantile(&gaps, 0.5)),
        ms(quantile(&gaps, 0.99)),
        ms(quantile(&gaps, 1.0))
    );
    outln!(
        "| A's shutdown (releases {} at a time) took | {} ({failed} releases failed) |",
        idem_org::SHUTDOWN_CONCURRENCY,
        ms(shutdown_took)
    );
    outln!(
        "| B's first ships: full snapshots / bytes uploaded per org (A's full snapshot: {snapshot_bytes} B) | {full} of {n} / {:.0} B |",
        bytes as f64 / n.max(1) as f64
    );
    b.shutdown().await;
    Ok(())
}

/// The store URL of the idle row: the bucket of `scripts/s3-server` when its environment is
/// set, else a local directory under `dir`; and what to call it.
fn idle_store(dir: &Path) -> (String, &'static str) {
    let prefix = format!("bench-p7-{}", std::process::id());
    match (
        std::env::var("IDEM_S3_BUCKET"),
        std::env::var("AWS_ENDPOINT"),
    ) {
        (Ok(bucket), Ok(_)) => (format!("s3://{bucket}/{prefix}"), "S3 API"),
        _ => (dir.join("store").display().to_string(), "local directory"),
    }
}

async fn idle(dir: &Path, window: Duration) -> BenchResult<()> {
    let (url, api) = idle_store(dir);
    let replica =
        crate::store::open(&crate::store::parse(&url)?, replica::Settings::default()).await?;
    let reg = build(&replica, &dir.join("data"), "p7")?;
    let n = 100;
    each_once(&reg, 0..n, "touch", 16).await?;
    let before: StoreRequests = replica.store_requests();
    tokio::time::sleep(window).await;
    let idle = replica.store_requests().since(&before);
    let per_hour = idle.total() as f64 * 3600.0 / window.as_secs_f64();
    outln!(
        "| store requests an hour, {n} touched orgs idle ({api}, lease 30 s, {:.0} s window) | {per_hour:.0} ({} PUT, {} GET, {} LIST in the window) |",
        window.as_secs_f64(),
        idle.put,
        idle.get,
        idle.list
    );
    reg.shutdown().await;
    Ok(())
}
