//! Operator commands: prune, inspect, snapshots, restore, verify, check-store.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

/// `idem prune`.
#[derive(Debug, Args)]
pub struct PruneArgs {
    /// Store URL.
    #[arg(long)]
    store: String,
}

/// Commands taking one org.
#[derive(Debug, Args)]
pub struct OrgArgs {
    /// The org id.
    org: String,
    /// Store URL.
    #[arg(long)]
    store: String,
}

/// `idem restore`.
#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// The org id.
    org: String,
    /// Store URL.
    #[arg(long)]
    store: String,
    /// Destination SQLite file.
    #[arg(long)]
    to: PathBuf,
}

/// `idem verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// Store URL.
    #[arg(long)]
    store: String,
}

/// `idem check-store`.
#[derive(Debug, Args)]
pub struct CheckStoreArgs {
    /// Store URL.
    url: String,
}

/// Stub.
pub async fn prune(_a: PruneArgs) -> Result<ExitCode, String> {
    Err("not implemented".into())
}
/// Stub.
pub async fn inspect(_a: OrgArgs) -> Result<ExitCode, String> {
    Err("not implemented".into())
}
/// Stub.
pub async fn snapshots(_a: OrgArgs) -> Result<ExitCode, String> {
    Err("not implemented".into())
}
/// Stub.
pub async fn restore(_a: RestoreArgs) -> Result<ExitCode, String> {
    Err("not implemented".into())
}
/// Stub.
pub async fn verify(_a: VerifyArgs) -> Result<ExitCode, String> {
    Err("not implemented".into())
}
/// Stub.
pub async fn check_store(_a: CheckStoreArgs) -> Result<ExitCode, String> {
    Err("not implemented".into())
}
