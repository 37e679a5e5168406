//! Operator commands: prune (cron), orgs, inspect, snapshots, restore, verify, check-store,
//! import.

mod check_store;
mod clone;
mod effects;
mod import;
mod orgs;
mod prune;
mod read;
mod resolve;
mod scratch;

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use idem_org::replica;
use idem_org::replica::{OrgId, Replica};

pub use check_store::check_store;
pub use clone::clone;
pub(crate) use effects::effect_json;
pub use effects::{EffectsArgs, effects};
pub use import::import;
pub use orgs::orgs;
pub use prune::prune;
pub use read::{inspect, restore, snapshots, verify};
pub use resolve::{ResolveArgs, resolve};

/// `idem prune`.
#[derive(Debug, Args)]
pub struct PruneArgs {
    /// Store URL: a path, file://, memory://, s3://bucket/prefix, gs://, az://.
    #[arg(long)]
    store: String,
    /// Delete keys applied longer ago than this (e.g. 7d, 36h).
    #[arg(long, value_parser = humantime::parse_duration)]
    older_than: Duration,
    /// Only these orgs (repeatable); default: every org in the store.
    #[arg(long = "org")]
    orgs: Vec<String>,
    /// Claim orgs even while another writer's lease is live (fences that writer).
    #[arg(long)]
    force: bool,
    /// Local scratch directory for the org databases (default: a temp dir).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Writer id recorded in claims (default: `idem-prune-<pid>`).
    #[arg(long)]
    writer: Option<String>,
    /// Refuse to prune (exit 1, nothing deleted) when this host's clock and the store's
    /// (the Last-Modified of an object this run writes) disagree by more than this.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5m")]
    max_clock_skew: Duration,
    /// Print the results as JSON.
    #[arg(long)]
    json: bool,
}

/// Commands taking one org: `inspect`, `snapshots`.
#[derive(Debug, Args)]
pub struct OrgArgs {
    /// The org id.
    org: String,
    /// Store URL.
    #[arg(long)]
    store: String,
    /// Print as JSON.
    #[arg(long)]
    json: bool,
}

/// `idem orgs`.
#[derive(Debug, Args)]
pub struct OrgsArgs {
    /// Store URL: a path, file://, memory://, s3://bucket/prefix, gs://, az://; the orgs
    /// under its prefix are listed.
    store: String,
    /// Print as JSON: an array of {org, seq, head, round, writer, at, released, holder_addr}.
    #[arg(long)]
    json: bool,
}

/// `idem restore`.
#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// The org id.
    org: String,
    /// Store URL.
    #[arg(long)]
    store: String,
    /// Destination SQLite file (must not exist).
    #[arg(long)]
    to: PathBuf,
    /// Log position (seq) of a snapshot or delta to restore (point in time; `idem snapshots`
    /// lists them); default: the newest.
    #[arg(long, conflicts_with = "at_time")]
    at: Option<u64>,
    /// A moment (RFC 3339, e.g. 2026-12-02T10:15:00Z): restore the newest position published
    /// at or before it (by its writer's clock, the `at` column of `idem snapshots`); an error
    /// names the oldest kept position when the moment is before every one.
    #[arg(long, value_parser = parse_moment)]
    at_time: Option<u64>,
}

/// `--at-time`: an RFC 3339 moment as ms since the Unix epoch.
///
/// # Errors
/// Not RFC 3339, or before the epoch: the message clap prints.
fn parse_moment(s: &str) -> Result<u64, String> {
    let t = humantime::parse_rfc3339_weak(s)
        .map_err(|e| format!("{s:?} is not an RFC 3339 time (e.g. 2026-12-02T10:15:00Z): {e}"))?;
    let since = t
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|_| format!("{s:?} is before 1970"))?;
    u64::try_from(since.as_millis()).map_err(|_| format!("{s:?} is too far in the future"))
}

/// `idem clone`.
#[derive(Debug, Args)]
pub struct CloneArgs {
    /// The org to copy (only read).
    src: String,
    /// The new org (must have no log entry in the store).
    dst: String,
    /// Store URL (both orgs are in it).
    #[arg(long)]
    store: String,
    /// Log position (seq) of SRC to copy; default: the newest.
    #[arg(long, conflicts_with = "at_time")]
    at: Option<u64>,
    /// A moment (RFC 3339): copy SRC's newest position published at or before it.
    #[arg(long, value_parser = parse_moment)]
    at_time: Option<u64>,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// `idem import`.
#[derive(Debug, Args)]
pub struct ImportArgs {
    /// The new org's id.
    org: String,
    /// The SQLite database to import (any page size, any journal mode; its application may
    /// keep writing). Only read: nothing is created or changed beside it. One committed
    /// state is copied into $TMPDIR (room for one copy needed) and shipped from there in
    /// bounded memory.
    #[arg(long)]
    from: PathBuf,
    /// Store URL.
    #[arg(long)]
    store: String,
    /// The longest reading FILE may take: waiting for another process's exclusive lock, then
    /// one copy pass (while it runs, the tenant's checkpoints stay behind the copied state and
    /// its WAL grows by what it commits). Past it the import fails, nothing imported.
    #[arg(long, value_parser = import::parse_timeout, default_value = "5m")]
    timeout: Duration,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// `idem verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// Only this org; default: every org in the store.
    org: Option<String>,
    /// Store URL.
    #[arg(long)]
    store: String,
    /// Print as JSON.
    #[arg(long)]
    json: bool,
}

/// `idem check-store`.
#[derive(Debug, Args)]
pub struct CheckStoreArgs {
    /// Store URL to check.
    url: String,
    /// Print as JSON.
    #[arg(long)]
    json: bool,
}

async fn open(store: &str) -> Result<Replica, String> {
    crate::store::open(&crate::store::parse(store)?, replica::Settings::default()).await
}

/// Opens for commands that only read: no create-only probe, nothing written, so read-only
/// credentials suffice; a local store directory must already exist (a mistyped path is an
/// error, never an empty store).
fn open_read_only(store: &str) -> Result<Replica, String> {
    crate::store::open_read_only(
        &crate::store::parse_existing(store)?,
        replica::Settings::default(),
    )
}

/// `org X: why`, unless `why` already names the org (no repeated prefixes).
pub(crate) fn about(org: &OrgId, why: &str) -> String {
    if why.starts_with(&format!("org {org}")) {
        why.to_owned()
    } else {
        format!("org {org}: {why}")
    }
}

fn org_id(org: &str) -> Result<OrgId, String> {
    OrgId::new(org).map_err(|e| e.to_string())
}

/// The org's history (a journal org's included); an org without any entry is unknown, and
/// the error names the prefixes of `store` (the URL `replica` was opened on) that do hold
/// orgs.
async fn history(
    replica: &Replica,
    store: &str,
    org: &OrgId,
) -> Result<Vec<replica::LogEntry>, String> {
    // A journal org's log holds format-5 claims and checkpoints (docs/design.md 3g): read
    // with the journal's reader, which also reads every per-org entry.
    let h = match replica.history(org).await {
        Err(replica::Error::JournalRequired { .. }) => replica.journal_history(org).await,
        other => other,
    }
    .map_err(|e| about(org, &crate::chain(&e)))?;
    if h.is_empty() {
        return Err(match crate::store::parse_existing(store) {
            Ok(url) => crate::store::org_not_found(&url, org).await,
            Err(_) => format!("org {org} not found under {store}"),
        });
    }
    Ok(h)
}

fn rfc3339(ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + Duration::from_millis(ms);
    humantime::format_rfc3339_millis(t).to_string()
}

fn print_json(v: &serde_json::Value) {
    match serde_json::to_string_pretty(v) {
        Ok(s) => outln!("{s}"),
        Err(e) => errln!("idem: cannot render JSON: {e}"),
    }
}
