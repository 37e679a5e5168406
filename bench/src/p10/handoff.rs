//! P10's handoff rows: a cold acquire after a graceful release (requests, round trips on the
//! critical path, wall time), a rolling upgrade (A shuts down as on SIGTERM, its clients move
//! to B) and a crash takeover (A stops reaching the store at once, as on kill -9, and B takes
//! its orgs when its lease lapses).
//!
//! In the handoff rows every org has a client sending it one request a second (the orgs'
//! phases spread over the second, none at the instant of the event); at the event the
//! clients move to B, retrying a refused request every [`RETRY`] until B acknowledges it.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem_org::{ErrorKind, Registry};
use idem_replica::fault::{Fault, FaultStore, Op};

use super::{Column, default_lease_ms, org, path_label, registry, row};
use crate::group::write;
use crate::orgs::each_once;
use crate::{BenchResult, ms, quantile};

/// A client's pause before it resends a refused request.
const RETRY: Duration = Duration::from_millis(50);

/// Each org's request spacing.
const SPACING: Duration = Duration::from_secs(1);

/// How long the clients run on A before the event: every org is acknowledged on A first.
const ON_A: Duration = Duration::from_secs(2);

/// The lease of the crash row, in ms: short, so the row waits seconds, not the default 30.
const CRASH_LEASE_MS: u64 = 2_000;

/// The warm watcher's poll on the crash row's B, in ms: the default poll (1 s) scaled with
/// the lease as the default lease (30 s) is, so B reads A's renewals as often per term as a
/// default deployment does (66 ms). The judgement of a dead holder counts from the first read
/// of its last renewal (`docs/design.md` 3, I15); at the default poll and this short lease B
/// would read only every third renewal or so, which no default deployment does.
const CRASH_POLL_MS: u64 = CRASH_LEASE_MS * idem_org::WARM_POLL_MS / 30_000;

/// The row gives up when B has not acknowledged every org by then.
const GIVE_UP: Duration = Duration::from_secs(300);

/// Orgs the setup of a handoff row opens on A at once.
const SETUP_CLIENTS: usize = 64;

/// Opens orgs `0..n` on `a` with one request each, [`SETUP_CLIENTS`] at once; returns the
/// cell saying how long that took, timed apart from the row it prepares.
async fn setup(a: &Registry, n: usize) -> BenchResult<String> {
    let began = Instant::now();
    each_once(a, 0..n, "warm", SETUP_CLIENTS).await?;
    Ok(ms(began.elapsed()))
}

/// Sorted durations, as "p50 / p99 / max".
fn spread(sorted: &[Duration]) -> String {
    format!(
        "{} / {} / {}",
        ms(quantile(sorted, 0.5)),
        ms(quantile(sorted, 0.99)),
        ms(quantile(sorted, 1.0))
    )
}

/// Cold acquires on B of `n` small orgs that registry A served and released, one at a time
/// so each one's trace is its own; then each org's first request on B.
pub(crate) async fn acquire(dir: &Path, columns: &[Column], n: usize) -> BenchResult<()> {
    let (mut acquire_cells, mut first_cells) = (Vec::new(), Vec::new());
    for (c, column) in columns.iter().enumerate() {
        let work = dir.join(format!("p10-acquire-{c}"));
        let store = column.traced_store(&work.join("store"), 10)?;
        let a = registry(
            store.clone(),
            &work.join("a"),
            "a",
            default_lease_ms(),
            None,
        )
        .await?;
        for key in ["r1", "r2", "r3"] {
            each_once(&a, 0..n, key, 16).await?;
        }
        a.shutdown().await;
        let b = registry(
            store.clone(),
            &work.join("b"),
            "b",
            default_lease_ms(),
            None,
        )
        .await?;
        // B's own process lease is written by its first claim: one org is acquired first so
        // every traced acquire is a steady-state one.
        each_once(&b, n..n + 1, "first", 1).await?;
        let (mut acq, mut first) = (Traced::default(), Traced::default());
        for i in 0..n {
            let id = org(i)?;
            acq.measure(&b, &store, b.acquire(&id)).await?;
            let once = b.once(&id, "after", |tx| write(tx, "after"));
            first.measure(&b, &store, once).await?;
        }
        b.shutdown().await;
        let _ = std::fs::remove_dir_all(&work);
        acquire_cells.push(acq.cell());
        first_cells.push(first.cell());
    }
    row(
        &format!(
            "cold acquire after a graceful release by another registry (claim + hydrate + open), {n} orgs: store requests, round trips on the critical path p50 (max), wall p50 / p99"
        ),
        &acquire_cells,
        "≤ 5 sequential round trips",
    );
    row(
        "its first request on the new holder (first ship): same columns",
        &first_cells,
        "1 round trip",
    );
    Ok(())
}

/// Per-step measurements of [`acquire`].
#[derive(Default)]
struct Traced {
    requests: Vec<u64>,
    depth: Vec<usize>,
    wall: Vec<Duration>,
}

impl Traced {
    async fn measure<T>(
        &mut self,
        reg: &Registry,
        store: &idem_replica::latency::LatencyStore,
        step: impl std::future::Future<Output = Result<T, idem_org::Error>>,
    ) -> BenchResult<()> {
        let before = reg.replica().store_requests();
        let trace = store.trace();
        let began = Instant::now();
        step.await?;
        self.wall.push(began.elapsed());
        let recorded = trace.finish();
        self.requests
            .push(reg.replica().store_requests().since(&before).total());
        self.depth.push(recorded.depth());
        Ok(())
    }

    fn cell(mut self) -> String {
        self.requests.sort_unstable();
        self.depth.sort_unstable();
        self.wall.sort_unstable();
        let mid = |v: &[u64]| v.get(v.len() / 2).copied().unwrap_or(0);
        let depth: Vec<u64> = self.depth.iter().map(|&d| d as u64).collect();
        format!(
            "{} req, {} round trips (max {}), {} / {}",
            mid(&self.requests),
            mid(&depth),
            depth.last().copied().unwrap_or(0),
            ms(quantile(&self.wall, 0.5)),
            ms(quantile(&self.wall, 0.99))
        )
    }
}

/// What one org's client saw: its last ack on A before the event, its first ack on B, and
/// when it first sent that request (to A or to B: from then on it waits for the handoff).
struct Seen {
    last_a: Option<Instant>,
    first_b: Instant,
    sent_b: Instant,
}

/// What a handoff row saw: the event's instant, each org's [`Seen`], and the process's CPU
/// seconds (user + system, every thread: A, B and the clients) from `mark` after the event
/// to the last org's first ack on B.
struct Handoff {
    at: Instant,
    seen: Vec<Seen>,
    cpu_s: f64,
    wall: Duration,
}

impl Handoff {
    /// CPU per org (core-ms) and the share of the host's cores it kept busy, from the mark
    /// to the last first ack on B: the handoff's cost, which the host's noise moves less
    /// than its wall time.
    fn cpu_cell(&self) -> String {
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get()) as f64;
        let wall = self.wall.as_secs_f64().max(1e-9);
        format!(
            "{:.2} core-ms per org; {:.0}% of {cores} cores over {}",
            self.cpu_s * 1e3 / self.seen.len().max(1) as f64,
            100.0 * self.cpu_s / (wall * cores),
            ms(self.wall)
        )
    }
}

/// Runs every org's client on A, fires `event` after [`ON_A`] (the clients move to B at that
/// instant), and returns what it saw, with the CPU counted from `mark` after the event.
async fn handoff<E, F>(
    a: &Registry,
    b: &Registry,
    n: usize,
    mark: Duration,
    event: E,
) -> BenchResult<Handoff>
where
    E: FnOnce() -> F,
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let moved = Arc::new(AtomicBool::new(false));
    let event_at = Arc::new(std::sync::OnceLock::<Instant>::new());
    let start = tokio::time::Instant::now();
    let mut clients = Vec::new();
    for i in 0..n {
        let (a, b, moved, event_at) = (a.clone(), b.clone(), moved.clone(), event_at.clone());
        // Half a slot off the whole seconds: no org's request is due at the very instant
        // of the event (ON_A after the start), where which registry got it was a race.
        let phase = SPACING.mul_f64((i as f64 + 0.5) / n.max(1) as f64);
        clients.push(tokio::spawn(async move {
            let id = org(i)?;
            let mut last_a = None;
            let mut next = start + phase;
            for tick in 0u64.. {
                tokio::time::sleep_until(next).await;
                next += SPACING;
                let key = format!("h{tick}");
                let sent_b = Instant::now();
                if !moved.load(Ordering::SeqCst) {
                    let k = key.clone();
                    if a.once(&id, &key, move |tx| write(tx, &k)).await.is_ok() {
                        // An ack A gives after the event is not counted: a killed process
                        // acknowledges nothing.
                        let now = Instant::now();
                        if event_at.get().is_none_or(|&e| now < e) {
                            last_a = Some(now);
                        }
                        continue;
                    }
                }
                loop {
                    let k = key.clone();
                    match b.once(&id, &key, move |tx| write(tx, &k)).await {
                        Ok(_) => {
                            let first_b = Instant::now();
                            return Ok::<_, Box<dyn std::error::Error + Send + Sync>>(Seen {
                                last_a,
                                first_b,
                                sent_b,
                            });
                        }
                        Err(e)
                            if e.kind() == ErrorKind::Retry || e.kind() == ErrorKind::Reacquire =>
                        {
                            tokio::time::sleep(RETRY).await;
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
            }
            Err("client loop ended".into())
        }));
    }
    tokio::time::sleep(ON_A).await;
    let fired = event();
    let at = Instant::now();
    let _ = event_at.set(at);
    moved.store(true, Ordering::SeqCst);
    let fired = tokio::spawn(fired);
    // The CPU reading at the mark, taken by its own task so the clients' awaits never delay
    // it (a crash row's mark falls while every client still waits for B).
    let marked = tokio::spawn(async move {
        tokio::time::sleep_until((at + mark).into()).await;
        (Instant::now(), crate::p9c::cpu_seconds())
    });
    let mut seen = Vec::new();
    let all = async {
        for c in clients {
            seen.push(c.await??);
        }
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    };
    tokio::time::timeout(GIVE_UP, all)
        .await
        .map_err(|_| format!("B did not acknowledge every org within {GIVE_UP:?}"))??;
    fired.await?;
    let ((from, (user0, sys0)), (user1, sys1)) = (marked.await?, crate::p9c::cpu_seconds());
    let last = seen.iter().map(|s| s.first_b).max().unwrap_or(from);
    Ok(Handoff {
        at,
        seen,
        cpu_s: (user1 + sys1 - user0 - sys0).max(0.0),
        wall: last.saturating_duration_since(from),
    })
}

/// Gaps from each org's last ack on A (the event when it had none) to its first on B.
fn gaps(at: Instant, seen: &[Seen]) -> Vec<Duration> {
    let mut gaps: Vec<Duration> = seen
        .iter()
        .map(|s| s.first_b.duration_since(s.last_a.unwrap_or(at)))
        .collect();
    gaps.sort_unstable();
    gaps
}

/// Rolling upgrade: A shuts down (its `shutdown`, as on SIGTERM) while B, another instance
/// over the same store, takes the clients.
pub(crate) async fn rolling(dir: &Path, columns: &[Column], n: usize) -> BenchResult<()> {
    let (mut gap_cells, mut after_cells, mut shutdown_cells) = (Vec::new(), Vec::new(), Vec::new());
    let (mut setup_cells, mut warm_cells, mut cpu_cells) = (Vec::new(), Vec::new(), Vec::new());
    let mut wait_cells = Vec::new();
    for (c, column) in columns.iter().enumerate() {
        let work = dir.join(format!("p10-rolling-{c}"));
        let store = column.store(&work.join("store"), 20)?;
        // Both run the warm takeover, as `idem serve` does.
        let a = registry(
            store.clone(),
            &work.join("a"),
            "a",
            default_lease_ms(),
            Some(idem_org::WARM_POLL_MS),
        )
        .await?;
        let b = registry(
            store,
            &work.join("b"),
            "b",
            default_lease_ms(),
            Some(idem_org::WARM_POLL_MS),
        )
        .await?;
        setup_cells.push(setup(&a, n).await?);
        let took_us = Arc::new(AtomicU64::new(0));
        let (stopping, took_in) = (a.clone(), took_us.clone());
        let seen = handoff(&a, &b, n, Duration::ZERO, move || async move {
            let began = Instant::now();
            stopping.shutdown().await;
            took_in.store(began.elapsed().as_micros() as u64, Ordering::SeqCst);
        })
        .await?;
        cpu_cells.push(seen.cpu_cell());
        let Handoff { at, seen, .. } = seen;
        let mut after: Vec<Duration> = seen.iter().map(|s| s.first_b.duration_since(at)).collect();
        after.sort_unstable();
        let mut waits: Vec<Duration> = seen
            .iter()
            .map(|s| s.first_b.duration_since(s.sent_b))
            .collect();
        waits.sort_unstable();
        wait_cells.push(spread(&waits));
        gap_cells.push(spread(&gaps(at, &seen)));
        after_cells.push(spread(&after));
        shutdown_cells.push(ms(Duration::from_micros(took_us.load(Ordering::SeqCst))));
        warm_cells.push(format!("{} of {n}", b.warm_claims()));
        b.shutdown().await;
        let _ = std::fs::remove_dir_all(&work);
    }
    row(
        &format!(
            "rolling upgrade of {n} orgs{} (A shuts down, clients move to B): gap from last ack on A to first on B p50 / p99 / max",
            path_label()
        ),
        &gap_cells,
        "p99 ≤ 1 s plus the request spacing (1 s)",
    );
    // Each client sends once a second, so an org's first request after the shutdown goes
    // out up to a second after it: this row's floor is the spacing plus one ack, wherever
    // B stands. The handoff's own delay is what the next row's clients waited.
    row(
        "rolling upgrade: from A's shutdown to each org's first ack on B p50 / p99 / max",
        &after_cells,
        "p99 ≤ 1 s plus the request spacing (1 s)",
    );
    row(
        "rolling upgrade: each org's first request answered by B, from its send to its ack (what its client waited) p50 / p99 / max",
        &wait_cells,
        "p99 ≤ 1 s",
    );
    row("rolling upgrade: A's shutdown took", &shutdown_cells, "");
    row(
        "rolling upgrade: process CPU (A, B, clients) from A's shutdown to the last first ack on B",
        &cpu_cells,
        "",
    );
    row(
        "rolling upgrade: orgs B's watcher claimed before a request opened them",
        &warm_cells,
        "",
    );
    row(
        &format!("rolling upgrade: setup, {n} orgs opened on A ({SETUP_CLIENTS} at once)"),
        &setup_cells,
        "",
    );
    Ok(())
}

/// Crash takeover: A's store stops answering it at once (no renewal, no release, no ship
/// reaches the store: as after kill -9), the clients move to B.
pub(crate) async fn crash(dir: &Path, columns: &[Column], n: usize) -> BenchResult<()> {
    let (mut lapse_cells, mut gap_cells) = (Vec::new(), Vec::new());
    let (mut setup_cells, mut warm_cells, mut cpu_cells) = (Vec::new(), Vec::new(), Vec::new());
    let lease = Duration::from_millis(CRASH_LEASE_MS);
    for (c, column) in columns.iter().enumerate() {
        let work = dir.join(format!("p10-crash-{c}"));
        let store = column.store(&work.join("store"), 30)?;
        let severed = Arc::new(FaultStore::new(store.clone()));
        // A's watcher is off: once severed it could only log failed LISTs.
        let a = registry(severed.clone(), &work.join("a"), "a", CRASH_LEASE_MS, None).await?;
        let b = registry(
            store,
            &work.join("b"),
            "b",
            CRASH_LEASE_MS,
            Some(CRASH_POLL_MS),
        )
        .await?;
        setup_cells.push(setup(&a, n).await?);
        let kill = severed.clone();
        let seen = handoff(&a, &b, n, lease, move || {
            for op in [Op::Put, Op::Get, Op::Delete, Op::List] {
                kill.inject_times(op, "", 1, u64::MAX, Fault::FailBefore);
            }
            async {}
        })
        .await?;
        cpu_cells.push(seen.cpu_cell());
        let Handoff { at, seen, .. } = seen;
        let lapsed = at + lease;
        let mut after: Vec<Duration> = seen
            .iter()
            .map(|s| s.first_b.saturating_duration_since(lapsed))
            .collect();
        after.sort_unstable();
        lapse_cells.push(spread(&after));
        gap_cells.push(spread(&gaps(at, &seen)));
        warm_cells.push(format!("{} of {n}", b.warm_claims()));
        // A's orgs hold its replica (and so its lease renewals) until they are closed: a
        // severed A that was only dropped would go on failing writes through later rows.
        a.shutdown().await;
        b.shutdown().await;
        let _ = std::fs::remove_dir_all(&work);
    }
    row(
        &format!(
            "crash takeover of {n} orgs{} (A stops reaching the store, lease {}, B's watcher polls every {CRASH_POLL_MS} ms): from the lease's lapse (kill + lease) to each org's first ack on B p50 / p99 / max",
            path_label(),
            ms(lease)
        ),
        &lapse_cells,
        "p99 ≤ 1 s (every org within lease + 1 s)",
    );
    row(
        "crash takeover: gap from last ack on A to first on B p50 / p99 / max",
        &gap_cells,
        "lease + 1 s plus the request spacing",
    );
    row(
        "crash takeover: process CPU (A, B, clients) from the lease's lapse to the last first ack on B",
        &cpu_cells,
        "",
    );
    row(
        "crash takeover: orgs B claimed in the background (remembered refusals)",
        &warm_cells,
        "",
    );
    row(
        &format!("crash takeover: setup, {n} orgs opened on A ({SETUP_CLIENTS} at once)"),
        &setup_cells,
        "",
    );
    Ok(())
}
