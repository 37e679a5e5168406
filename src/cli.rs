//! Command-line definitions (clap derive) and dispatch.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    /// Serve the ledger over HTTP (POST /orgs/{org}/transfers with Idempotency-Key).
    Serve(crate::serve::ServeArgs),
    /// Delete idempotency keys older than a cutoff in every (or the given) org; for cron.
    Prune(crate::ops::PruneArgs),
    /// List the orgs a store holds (under its prefix), with the head of each org's log.
    Orgs(crate::ops::OrgsArgs),
    /// Show an org's rounds, history, lease, newest snapshot and key count.
    Inspect(crate::ops::OrgArgs),
    /// List an org's published positions: full snapshots and the deltas after them.
    Snapshots(crate::ops::OrgArgs),
    /// Restore an org's newest (or a given) published position — a snapshot plus its
    /// deltas, verified — to a new SQLite file.
    Restore(crate::ops::RestoreArgs),
    /// Check every published snapshot (checksums, SQLite integrity) and every delta chain
    /// (replayed against its checksums); non-zero on a fault.
    Verify(crate::ops::VerifyArgs),
    /// Import an existing SQLite database as a new org's first snapshot (refused when the
    /// org already has a log); streamed through a copy in $TMPDIR, in bounded memory.
    Import(crate::ops::ImportArgs),
    /// Copy an org's state at a published position into a new org (its first snapshot,
    /// released); refused when the new org already has a log.
    Clone(crate::ops::CloneArgs),
    /// Probe a store: create-only puts, then a claim / ship / hydrate round trip.
    CheckStore(crate::ops::CheckStoreArgs),
    /// List an org's external effects (from its newest snapshot), e.g. `--state ambiguous`.
    Effects(crate::ops::EffectsArgs),
    /// Resolve an AMBIGUOUS external effect as executed (with its result) or not executed.
    Resolve(crate::ops::ResolveArgs),
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
            Command::Serve(a) => crate::serve::run(a).await.map(|()| ExitCode::SUCCESS),
            Command::Prune(a) => crate::ops::prune(a).await,
            Command::Orgs(a) => crate::ops::orgs(a).await,
            Command::Inspect(a) => crate::ops::inspect(a).await,
            Command::Snapshots(a) => crate::ops::snapshots(a).await,
            Command::Restore(a) => crate::ops::restore(a).await,
            Command::Verify(a) => crate::ops::verify(a).await,
            Command::Import(a) => crate::ops::import(a).await,
            Command::Clone(a) => crate::ops::clone(a).await,
            Command::CheckStore(a) => crate::ops::check_store(a).await,
            Command::Effects(a) => crate::ops::effects(a).await,
            Command::Resolve(a) => crate::ops::resolve(a).await,
        }
    }
}
