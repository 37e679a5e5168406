//! `idem-demo`: the rolling-upgrade demo over real OS processes.
//!
//! Replica A serves; clients send transfers. A third of the way in, replica B starts, the
//! clients are routed to it and A gets SIGTERM (it releases every org). Two thirds in, once
//! A has exited, replica C starts, the clients move to it and B is killed with SIGKILL (C
//! waits out B's lease). Then the store is audited: every acknowledged request applied
//! exactly once.
#![forbid(unsafe_code)]
// A tool measures the host's real time (latencies, deadlines, gaps between events), so it
// reads `Instant` itself; clippy.toml's rule keeps time injected where decisions are made,
// in the product crates, and this crate makes none.
#![allow(clippy::disallowed_methods)]
// Output goes through `outln!` and `errln!`: `println!` and `eprintln!` panic on a failed write.
#![deny(clippy::print_stdout, clippy::print_stderr)]

#[macro_use]
extern crate idem_cli;

mod audit;
mod client;
mod outside;
mod replica;
mod report;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use clap::Parser;
use idem_cli::{chain, ledger, store};
use idem_org::replica as idem_replica;
use tokio::sync::watch;

use client::Shared;
use replica::ReplicaProc;

/// `idem-demo` options.
#[derive(Debug, Parser)]
#[command(name = "idem-demo", version)]
pub struct DemoArgs {
    /// Number of orgs (tenants): hundreds by default, each moved through both handoffs.
    #[arg(long, default_value_t = 300)]
    orgs: usize,
    /// Number of distinct requests (idempotency keys).
    #[arg(long, default_value_t = 6000)]
    requests: usize,
    /// Concurrent clients.
    #[arg(long, default_value_t = 32)]
    clients: usize,
    /// Accounts per org.
    #[arg(long, default_value_t = 5)]
    accounts: usize,
    /// Advisory lease of each replica in ms: a successor claims a SIGKILLed replica's orgs
    /// once it has seen its lease unrenewed this long plus a tenth.
    #[arg(long, default_value_t = 2_000, value_parser = idem_cli::lease_ms_arg)]
    lease_ms: u64,
    /// Workload seed.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Working directory (store, data, replica logs); a temp dir, deleted after, if unset.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
    /// Run every replica with `--journal` (`docs/design.md` 3g): each process's orgs ship in
    /// one journal run, the kill's successor takes them by one adopt seal, and the audit
    /// reads them through the journal.
    #[arg(long)]
    journal: bool,
}

/// One handoff as the demo measured it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Handoff {
    /// What happened.
    pub what: String,
    /// When, ms since the demo start.
    pub at_ms: f64,
    /// Per org, the gap between its last ack before the event and its first ack after
    /// it, ms: the median, the 99th percentile and the longest.
    pub org_gap_p50_ms: f64,
    /// See `org_gap_p50_ms`.
    pub org_gap_p99_ms: f64,
    /// See `org_gap_p50_ms`.
    pub max_org_gap_ms: f64,
    /// Per org, what it waited on requests across the event, ms (the event's delay plus one
    /// ordinary ack): the longest first-send-to-ack time among its requests in flight at
    /// the event and its first request after it (`report::org_waits_ms`). The gap is this plus the time until a client sent the org
    /// a request at all. Median, 99th percentile, longest.
    pub org_wait_p50_ms: f64,
    /// See `org_wait_p50_ms`.
    pub org_wait_p99_ms: f64,
    /// See `org_wait_p50_ms`.
    pub max_org_wait_ms: f64,
    /// Orgs acknowledged after the event (those the gaps and waits are of).
    pub orgs: usize,
}

fn main() -> ExitCode {
    if let Some(code) = idem_cli::run_as_idem() {
        return code;
    }
    idem_cli::main_with("idem-demo", "warn", run(DemoArgs::parse()))
}

/// Runs the demo; exit code 1 on any violation.
///
/// # Errors
/// Setup failures (directories, spawning replicas, opening the store).
pub async fn run(a: DemoArgs) -> Result<ExitCode, String> {
    if a.orgs == 0 || a.requests == 0 || a.clients == 0 || a.accounts < 2 {
        return Err(
            "--orgs, --requests and --clients must be at least 1, --accounts at least 2".into(),
        );
    }
    let started = Instant::now();
    let (_tmp, dir) = match &a.dir {
        Some(d) => {
            // A previous run's store and data would be audited as this run's: refuse them.
            if std::fs::read_dir(d).is_ok_and(|mut e| e.next().is_some()) {
                return Err(format!(
                    "--dir {} is not empty (a previous run?): give a new or empty directory",
                    d.display()
                ));
            }
            std::fs::create_dir_all(d)
                .map_err(|e| format!("cannot create {}: {e}", d.display()))?;
            (None, d.clone())
        }
        None => {
            let t = tempfile::tempdir().map_err(|e| format!("cannot create a temp dir: {e}"))?;
            let p = t.path().to_owned();
            (Some(t), p)
        }
    };
    let store = dir.join("store");
    let data = dir.join("data");
    let orgs: Vec<String> = (0..a.orgs).map(|i| format!("org-{i:03}")).collect();
    let requests = client::workload(a.orgs, a.requests, a.accounts, a.seed);
    if !a.json {
        errln!(
            "idem-demo: {} orgs, {} requests, {} clients; store {}",
            a.orgs,
            a.requests,
            a.clients,
            store.display()
        );
    }
    let say = |msg: String| {
        if !a.json {
            errln!("  {:>7.2}s  {msg}", started.elapsed().as_secs_f64());
        }
    };

    let rep_a = ReplicaProc::start("A", &store, &data, &dir, a.lease_ms, a.journal).await?;
    say(format!("replica A serving at {}", rep_a.url));
    let (acked_tx, mut acked_rx) = watch::channel(0usize);
    let (phase_tx, _) = watch::channel(0u8);
    let shared = Arc::new(Shared {
        target: RwLock::new(rep_a.url.clone()),
        next: AtomicUsize::new(0),
        acked: acked_tx,
        phase: phase_tx,
        stats: Mutex::new(client::Stats::default()),
        orgs: orgs.clone(),
        requests,
    });
    let clients: Vec<_> = (0..a.clients)
        .map(|_| tokio::spawn(client::client(shared.clone())))
        .collect();

    // Each handoff fires when the previous third is nearly acknowledged, so requests of
    // that third are still in flight (and get retried) across the handoff.
    let third = a.requests / 3;
    let trigger = |phase: usize| (third * phase).saturating_sub(a.clients / 2).max(1);
    let mut events: Vec<(String, Instant)> = Vec::new();

    // Halfway to the first handoff, an operator on the host reads every served database.
    let _ = acked_rx.wait_for(|n| *n >= trigger(1) / 2).await;
    let outside = outside::read_all(&data).await;
    say(format!(
        "outside reader: {} of {} served database files refused (database is locked)",
        outside.refused, outside.files
    ));

    let _ = acked_rx.wait_for(|n| *n >= trigger(1)).await;
    let rep_b = ReplicaProc::start("B", &store, &data, &dir, a.lease_ms, a.journal).await?;
    say(format!(
        "replica B serving at {}; clients re-routed to B",
        rep_b.url
    ));
    set_target(&shared, &rep_b.url);
    let t_term = Instant::now();
    events.push(("SIGTERM A (graceful handoff to B)".into(), t_term));
    shared.phase.send_replace(1);
    say("SIGTERM replica A: it releases every org".into());
    rep_a.terminate().await?;
    say(format!(
        "replica A exited 0 after {:.0} ms",
        t_term.elapsed().as_secs_f64() * 1000.0
    ));

    let _ = acked_rx.wait_for(|n| *n >= trigger(2)).await;
    let rep_c = ReplicaProc::start("C", &store, &data, &dir, a.lease_ms, a.journal).await?;
    say(format!(
        "replica C serving at {}; clients re-routed to C",
        rep_c.url
    ));
    set_target(&shared, &rep_c.url);
    let t_kill = Instant::now();
    events.push(("SIGKILL B (C waits out B's lease)".into(), t_kill));
    shared.phase.send_replace(2);
    rep_b.kill().await?;
    say(format!(
        "SIGKILL replica B; C claims each org once it has seen B's {} ms lease unrenewed for a term and a tenth",
        a.lease_ms
    ));

    for c in clients {
        let _ = c.await;
    }
    say("all requests acknowledged; SIGTERM replica C".into());
    rep_c.terminate().await?;

    let stats = std::mem::take(&mut *shared.stats.lock().unwrap_or_else(|p| p.into_inner()));
    let replica = store::open(
        &store::parse(&store.display().to_string())?,
        idem_replica::Settings::default(),
    )
    .await?;
    say("auditing the store's newest published states".into());
    let audit = audit::audit(&replica, &orgs, &stats.acked).await;
    let handoffs: Vec<Handoff> = events
        .iter()
        .map(|(what, t)| {
            let gaps = report::org_gaps_ms(&stats.ack_times, *t);
            let (p50, p99, max) = report::spread(&gaps);
            let (w50, w99, wmax) = report::spread(&report::org_waits_ms(&stats.ack_times, *t));
            Handoff {
                what: what.clone(),
                at_ms: t.duration_since(started).as_secs_f64() * 1000.0,
                org_gap_p50_ms: p50,
                org_gap_p99_ms: p99,
                max_org_gap_ms: max,
                org_wait_p50_ms: w50,
                org_wait_p99_ms: w99,
                max_org_wait_ms: wmax,
                orgs: gaps.len(),
            }
        })
        .collect();
    let summary = report::Summary::new(&a, &stats, &audit, &outside, handoffs, started.elapsed());
    summary.print(a.json);
    if a.dir.is_some() && !a.json {
        errln!("replica logs and the store are in {}", dir.display());
    }
    Ok(if summary.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn set_target(sh: &Shared, url: &str) {
    *sh.target.write().unwrap_or_else(|p| p.into_inner()) = url.to_owned();
}
