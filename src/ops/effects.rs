//! `idem effects` (list an org's external effects by state, from its newest snapshot) and
//! `idem resolve` (settle an AMBIGUOUS effect as executed or not, recorded with who and when).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use idem_org::Registry;
use idem_org::idem::effect::{self, Effect, Resolution};
use serde_json::{Value, json};

use super::{history, open, open_read_only, org_id, print_json, rfc3339};

/// `idem effects`.
#[derive(Debug, Args)]
pub struct EffectsArgs {
    /// The org id.
    org: String,
    /// Store URL.
    #[arg(long)]
    store: String,
    /// Only effects in this state: reserved, committed, failed, ambiguous.
    #[arg(long, value_parser = parse_state)]
    state: Option<effect::State>,
    /// Print as JSON.
    #[arg(long)]
    json: bool,
}

/// `idem resolve`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("outcome").required(true).args(["executed", "not_executed"])))]
pub struct ResolveArgs {
    /// The org id.
    org: String,
    /// The effect key.
    key: String,
    /// The effect did execute (give its result with --result).
    #[arg(long, requires = "result")]
    executed: bool,
    /// The effect's result, stored and replayed to every later call (with --executed).
    #[arg(long)]
    result: Option<String>,
    /// The effect did not execute: a later call runs it again.
    #[arg(long)]
    not_executed: bool,
    /// Who resolves it (recorded with the time).
    #[arg(long)]
    by: String,
    /// Store URL.
    #[arg(long)]
    store: String,
    /// Claim the org even while another writer's lease is live (fences that writer).
    #[arg(long)]
    force: bool,
    /// Local scratch directory for the org database (default: a temp dir).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Print as JSON.
    #[arg(long)]
    json: bool,
}

fn parse_state(s: &str) -> Result<effect::State, String> {
    effect::State::parse(s)
        .ok_or_else(|| format!("unknown state {s:?}: reserved, committed, failed or ambiguous"))
}

fn effect_json(e: &Effect) -> Value {
    json!({
        "key": e.key,
        "state": e.state.as_str(),
        "attempt": e.attempt_hex(),
        "attempts": e.attempts,
        "holder": e.holder,
        "lease_until": rfc3339(e.lease_until_ms),
        "created": rfc3339(e.created_ms),
        "updated": rfc3339(e.updated_ms),
        "error": e.error,
        "result": e.result.as_ref().map(|r| String::from_utf8_lossy(r).into_owned()),
        "resolved_by": e.resolved_by,
    })
}

/// Lists the effects of the org's newest published snapshot (the acknowledged state).
///
/// # Errors
/// Bad store URL or org id, unknown org, store or snapshot failures.
pub async fn effects(a: EffectsArgs) -> Result<ExitCode, String> {
    let replica = open_read_only(&a.store)?;
    let org = org_id(&a.org)?;
    history(&replica, &org).await?;
    let rows = match crate::store::restored::restore(&replica, &org, None).await? {
        None => Vec::new(),
        Some(r) => effect::list(&r.open()?, a.state)
            .map_err(|e| format!("reading the newest snapshot: {}", crate::chain(&e)))?,
    };
    if a.json {
        let list: Vec<Value> = rows.iter().map(effect_json).collect();
        print_json(&json!({"org": org.as_str(), "effects": list}));
    } else {
        for e in &rows {
            outln!(
                "{}\t{}\tattempt {}\tupdated {}\t{}",
                e.key,
                e.state,
                e.attempt_hex(),
                rfc3339(e.updated_ms),
                e.error.as_deref().unwrap_or("")
            );
        }
        let which = a.state.map_or(String::new(), |s| format!("{s} "));
        outln!("{} {which}effects in org {org}", rows.len());
    }
    Ok(ExitCode::SUCCESS)
}

/// Acquires the org (a short-lived writer), resolves the AMBIGUOUS effect, ships, releases.
///
/// # Errors
/// Bad input, unknown org, a live writer (without `--force`), an effect that is not AMBIGUOUS.
pub async fn resolve(a: ResolveArgs) -> Result<ExitCode, String> {
    let replica = open(&a.store).await?;
    let org = org_id(&a.org)?;
    history(&replica, &org).await?;
    let resolution = match (a.executed, a.result) {
        (true, Some(r)) => Resolution::Executed(r.into_bytes()),
        (true, None) => return Err("--executed needs --result".into()),
        (false, _) => Resolution::NotExecuted,
    };
    // Look before claiming: a claim fences the org's live writer, which is only worth it
    // when the newest published state holds something to resolve.
    let published = match crate::store::restored::restore(&replica, &org, None).await? {
        None => None,
        Some(r) => effect::get(&r.open()?, &a.key)
            .map_err(|e| format!("reading the newest snapshot: {}", crate::chain(&e)))?,
    };
    match published.as_ref().map(|e| e.state) {
        None => return Err(format!("org {org}: no effect {:?} in the store", a.key)),
        Some(s @ (effect::State::Committed | effect::State::Failed)) => {
            return Err(format!(
                "org {org}: effect {:?} is already {s}: nothing to resolve (nothing claimed)",
                a.key
            ));
        }
        Some(_) => {}
    }
    let scratch = match &a.data {
        Some(_) => None,
        None => Some(tempfile::tempdir().map_err(|e| format!("cannot create a temp dir: {e}"))?),
    };
    let data = a
        .data
        .clone()
        .or_else(|| scratch.as_ref().map(|t| t.path().to_owned()))
        .ok_or("no data directory")?;
    let registry = Registry::builder(
        &data,
        replica,
        format!("idem-resolve-{}", std::process::id()),
    )
    .settings(idem_org::Settings {
        force_claim: a.force,
        max_open_orgs: 1,
        ..idem_org::Settings::default()
    })
    .build()
    .map_err(|e| crate::chain(&e))?;
    let handle = registry
        .acquire(&org)
        .await
        .map_err(|e| super::about(&org, &crate::chain(&e)))?;
    let resolved = handle
        .resolve(&a.key, resolution, &a.by)
        .await
        .map_err(|e| crate::chain(&e));
    let released = handle.release().await.map_err(|e| crate::chain(&e));
    let row = resolved?;
    released?;
    if a.json {
        print_json(&json!({"org": org.as_str(), "effect": effect_json(&row)}));
    } else {
        outln!(
            "resolved effect {} in org {org} as {} by {}",
            row.key,
            row.state,
            a.by
        );
    }
    Ok(ExitCode::SUCCESS)
}
