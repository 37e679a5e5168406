//! Command-line definitions (clap derive) and dispatch.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// Exactly-once request execution over one SQLite database per tenant, shipped to object
/// storage before every acknowledgement.
#[derive(Debug, Parser)]
#[command(name = "idem", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Rolling-upgrade demo: replica processes, a SIGTERM handoff, a SIGKILL takeover, then an
    /// exactly-once audit of the store.
    Demo(crate::demo::DemoArgs),
    /// Serve the ledger over HTTP (POST /orgs/{org}/transfers with Idempotency-Key).
    Serve(ServeArgs),
    /// Delete idempotency keys older than a cutoff in every (or the given) org; for cron.
    Prune(crate::ops::PruneArgs),
    /// Show an org's rounds, history, lease, newest snapshot and key count.
    Inspect(crate::ops::OrgArgs),
    /// List an org's published positions: full snapshots and the deltas after them.
    Snapshots(crate::ops::OrgArgs),
    /// Restore an org's newest (or a given) snapshot to a SQLite file.
    Restore(crate::ops::RestoreArgs),
    /// Check checksums and SQLite integrity of every published snapshot; non-zero on a fault.
    Verify(crate::ops::VerifyArgs),
    /// Probe a store: create-only puts, then a claim / ship / hydrate round trip.
    CheckStore(crate::ops::CheckStoreArgs),
    /// List an org's external effects (from its newest snapshot), e.g. `--state ambiguous`.
    Effects(crate::ops::EffectsArgs),
    /// Resolve an AMBIGUOUS external effect as executed (with its result) or not executed.
    Resolve(crate::ops::ResolveArgs),
    /// Benchmarks side by side in one run (P1-P6 of BENCHMARKS.md); `--quick` for a smoke run.
    Bench(crate::bench::BenchArgs),
}

/// `idem serve`.
#[derive(Debug, Args)]
struct ServeArgs {
    /// Store URL: a path, file://, memory://, s3://bucket/prefix, gs://, az://.
    #[arg(long)]
    store: String,
    /// Address to listen on; port 0 picks a free port (printed on stdout).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: String,
    /// Local data directory for org databases (a cache; the store is the authority).
    #[arg(long, default_value = "idem-data")]
    data: PathBuf,
    /// Writer id recorded in claims and leases (default: `idem-serve-<id of --data>`, an id
    /// kept in DATA/home.id, so a restart on the same data directory keeps it). Each process
    /// also has its own instance, so two live processes with one id never take orgs from
    /// each other; a restart that finds the data directory's lock free (the old process is
    /// gone) claims its orgs at once instead of waiting out their leases.
    #[arg(long)]
    writer: Option<String>,
    /// Run the in-process pruner this often (e.g. 1h).
    #[arg(long, value_parser = humantime::parse_duration)]
    prune_every: Option<Duration>,
    /// With --prune-every: delete keys applied longer ago than this.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "7d")]
    prune_older_than: Duration,
    /// Advisory lease length in ms: how long another replica waits before it claims the
    /// orgs of a writer that died without releasing them (SIGTERM releases at once).
    #[arg(long, default_value_t = 30_000)]
    lease_ms: u64,
    /// Claim orgs even when another writer's lease is live, fencing that writer (operator
    /// override, e.g. when a host is known dead).
    #[arg(long)]
    force_claim: bool,
    /// After SIGTERM: how long open connections may take to finish (a slow or half-sent
    /// body, an idle keep-alive) before every org is released anyway and the process exits 0.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    drain_timeout: Duration,
}

impl Cli {
    /// Log filter used when `IDEM_LOG` is unset.
    pub fn default_log(&self) -> &'static str {
        match self.command {
            Command::Serve(_) => "info",
            _ => "warn",
        }
    }

    /// Runs the command.
    ///
    /// # Errors
    /// One line describing the failure.
    pub async fn run(self) -> Result<ExitCode, String> {
        match self.command {
            Command::Demo(a) => crate::demo::run(a).await,
            Command::Serve(a) => {
                let writer = match a.writer {
                    Some(w) => w,
                    None => {
                        std::fs::create_dir_all(&a.data).map_err(|e| {
                            format!("cannot create data directory {}: {e}", a.data.display())
                        })?;
                        let id = idem_org::home_id(&a.data).map_err(|e| {
                            format!("cannot read the id of {}: {e}", a.data.display())
                        })?;
                        format!("idem-serve-{id}")
                    }
                };
                crate::serve::run(crate::serve::ServeConfig {
                    store: a.store,
                    listen: a.listen,
                    data: a.data,
                    writer,
                    lease_ms: a.lease_ms,
                    force_claim: a.force_claim,
                    prune_every: a.prune_every,
                    prune_older_than: a.prune_older_than,
                    drain_timeout: a.drain_timeout,
                })
                .await
                .map(|()| ExitCode::SUCCESS)
            }
            Command::Prune(a) => crate::ops::prune(a).await,
            Command::Inspect(a) => crate::ops::inspect(a).await,
            Command::Snapshots(a) => crate::ops::snapshots(a).await,
            Command::Restore(a) => crate::ops::restore(a).await,
            Command::Verify(a) => crate::ops::verify(a).await,
            Command::CheckStore(a) => crate::ops::check_store(a).await,
            Command::Effects(a) => crate::ops::effects(a).await,
            Command::Resolve(a) => crate::ops::resolve(a).await,
            Command::Bench(a) => crate::bench::run(a).await,
        }
    }
}
