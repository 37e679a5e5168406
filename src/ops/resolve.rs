//! `idem resolve`: settle an AMBIGUOUS effect — a reservation whose lease lapsed included — as
//! executed or not, recorded with who and when.
//!
//! ```text
//! --via ADDR ─► POST ADDR/orgs/{org}/effects/{key}/resolve: the server holding the org
//!               resolves it itself (Org::resolve); nothing is claimed, nobody is fenced
//! otherwise  ─► read the newest published state; refuse before any claim when there is
//!               nothing to resolve (absent, committed, failed, or in progress by this
//!               host's clock)
//!            ─► claim the org as a short-lived writer (a live holder's lease refuses it,
//!               naming the holder and its address, unless --force fences it)
//!            ─► resolve as that writer: a reservation another writer made lapses one lease
//!               term after this claim, on this process's clock (I15), so a forced claim over
//!               a live holder never resolves what its executor may still run; it waits
//!               that term out first
//!            ─► ship, release
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use idem_org::Error;
use idem_org::idem::effect::{self, Effect, Resolution};
use serde_json::json;

use super::effects::effect_json;
use super::scratch::Scratch;
use super::{history, open, org_id, print_json, rfc3339};

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
    /// Store URL (not needed with --via).
    #[arg(long, required_unless_present = "via")]
    store: Option<String>,
    /// Resolve through the server that holds the org, at this address (e.g.
    /// http://10.0.0.7:8080, as a refusal names it): its admin route resolves it itself,
    /// so nothing is claimed and the server is not fenced.
    #[arg(long, conflicts_with_all = ["force", "data", "store"])]
    via: Option<String>,
    /// Claim the org even while another writer's lease is live (fences that writer; the
    /// resolve then waits one lease term of the reservation, so it never settles what that
    /// writer's executor may still run).
    #[arg(long)]
    force: bool,
    /// Local scratch directory for the org database (default: a temp dir).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Print as JSON.
    #[arg(long)]
    json: bool,
}

/// Resolves the effect: through `--via`, or as a short-lived writer of the org.
///
/// # Errors
/// Bad input, unknown org, nothing to resolve (refused before any claim), a live writer
/// (without `--force`: refused before any claim, naming it), the server's refusal (`--via`).
pub async fn resolve(a: ResolveArgs) -> Result<ExitCode, String> {
    let org = org_id(&a.org)?;
    let resolution = match (a.executed, &a.result) {
        (true, Some(r)) => Resolution::Executed(r.clone().into_bytes()),
        (true, None) => return Err("--executed needs --result".into()),
        (false, _) => Resolution::NotExecuted,
    };
    if let Some(via) = &a.via {
        return through(via, &org, &a, &resolution).await;
    }
    let store = a.store.as_deref().ok_or("--store or --via is needed")?;
    let replica = open(store).await?;
    history(&replica, store, &org).await?;
    // Look before claiming: a claim fences the org's live writer, which is only worth it
    // when the newest published state holds something to resolve.
    let published = match crate::store::restored::restore(&replica, &org, None).await? {
        None => None,
        Some(r) => effect::get(&r.open()?, &a.key)
            .map_err(|e| format!("reading the newest snapshot: {}", crate::chain(&e)))?,
    };
    let Some(stored) = published else {
        return Err(format!("org {org}: no effect {:?} in the store", a.key));
    };
    let seen = stored.as_judged(&effect::Options::new());
    match seen.state {
        s @ (effect::State::Committed | effect::State::Failed) => {
            return Err(format!(
                "org {org}: effect {:?} is already {s}: nothing to resolve (nothing claimed)",
                a.key
            ));
        }
        effect::State::Reserved => {
            return Err(format!(
                "org {org}: effect {:?} is in progress by {} until {} by this host's clock: \
                 nothing claimed; resolve it once its lease has passed, or through its holder \
                 (--via ADDR)",
                a.key,
                seen.holder_or_attempt(),
                rfc3339(seen.lease_until_ms)
            ));
        }
        effect::State::Ambiguous => {}
    }
    let scratch = Scratch::open(
        a.data.as_deref(),
        replica,
        format!("idem-resolve-{}", std::process::id()),
        a.force,
    )?;
    let registry = &scratch.registry;
    let handle = registry
        .acquire(&org)
        .await
        .map_err(|e| held_elsewhere(&org, &a, &e))?;
    let resolved = resolve_waiting(&handle, &a.key, resolution, &a.by).await;
    let released = handle.release().await.map_err(|e| crate::chain(&e));
    let row = resolved?;
    released?;
    print_resolved(&org, &row, &a.by, a.json);
    Ok(ExitCode::SUCCESS)
}

/// Resolves as this process's writer; a reservation still inside its term by this writer's
/// observation is waited out once (at most one lease term), then resolved.
async fn resolve_waiting(
    handle: &idem_org::Org,
    key: &str,
    resolution: Resolution,
    by: &str,
) -> Result<Effect, String> {
    let first = handle.resolve(key, resolution.clone(), by).await;
    let until = match &first {
        Err(e) => match e.idem() {
            Some(idem_org::idem::Error::EffectInProgress { lease_until_ms, .. }) => *lease_until_ms,
            _ => return first.map_err(|e| crate::chain(&e)),
        },
        Ok(_) => return first.map_err(|e| crate::chain(&e)),
    };
    let now = idem_base::Clock::now_ms(&idem_base::SystemClock);
    let wait = until.saturating_sub(now).saturating_add(1);
    errln!(
        "idem: effect {key:?} was reserved by another writer: waiting {} ms (one lease term after \
         this claim, on this host's clock) before resolving it",
        wait
    );
    tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
    handle
        .resolve(key, resolution, by)
        .await
        .map_err(|e| crate::chain(&e))
}

/// The claim's refusal, naming the writer that holds the org and how to resolve through it.
fn held_elsewhere(org: &idem_org::replica::OrgId, a: &ResolveArgs, e: &Error) -> String {
    let holder = match e {
        Error::Replica { source, .. } => match &**source {
            idem_org::replica::Error::LeaseHeld { holder, .. } => Some(holder.clone()),
            _ => None,
        },
        _ => None,
    };
    let Some(holder) = holder else {
        return super::about(org, &crate::chain(e));
    };
    let how = match e.holder_addr() {
        Some(addr) => format!(
            "resolve through it: idem resolve {org} {:?} ... --via {addr}",
            a.key
        ),
        None => "it advertises no address: resolve through its process (its admin route \
                 POST /orgs/{org}/effects/{key}/resolve, or Org::resolve)"
            .to_owned(),
    };
    format!(
        "org {org} is held by live writer {holder}: nothing claimed; {how} (--force claims \
         anyway and fences it)"
    )
}

/// `--via`: the holder's admin route resolves it; nothing is claimed.
async fn through(
    via: &str,
    org: &idem_org::replica::OrgId,
    a: &ResolveArgs,
    resolution: &Resolution,
) -> Result<ExitCode, String> {
    let mut url = url::Url::parse(via).map_err(|e| format!("--via {via:?}: {e}"))?;
    url.path_segments_mut()
        .map_err(|()| format!("--via {via:?}: not a base URL"))?
        .pop_if_empty()
        .extend(["orgs", org.as_str(), "effects", &a.key, "resolve"]);
    let body = match resolution {
        Resolution::Executed(r) => json!({
            "outcome": "executed",
            "result": String::from_utf8_lossy(r),
            "by": a.by,
        }),
        Resolution::NotExecuted => json!({"outcome": "not_executed", "by": a.by}),
    };
    let resp = reqwest::Client::new()
        .post(url.clone())
        .json(&body)
        .send()
        .await
        .map_err(|e| format!("{url}: {}", crate::chain(&e)))?;
    let status = resp.status();
    let v: serde_json::Value = resp
        .json()
        .await
        .map_err(|e| format!("{url}: answered {status} without JSON: {e}"))?;
    if !status.is_success() {
        let why = v["error"].as_str().unwrap_or("no reason given");
        let holder = v["holder"]
            .as_str()
            .map(|h| format!(" (the org's holder is at {h})"))
            .unwrap_or_default();
        return Err(format!("{via} refused ({status}): {why}{holder}"));
    }
    if a.json {
        print_json(&v);
    } else {
        outln!(
            "resolved effect {} in org {org} as {} by {} (through {via})",
            v["effect"]["key"].as_str().unwrap_or(&a.key),
            v["effect"]["state"].as_str().unwrap_or("?"),
            a.by
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn print_resolved(org: &idem_org::replica::OrgId, row: &Effect, by: &str, json_out: bool) {
    if json_out {
        print_json(&json!({"org": org.as_str(), "effect": effect_json(row, row)}));
    } else {
        outln!(
            "resolved effect {} in org {org} as {} by {by}",
            row.key,
            row.state
        );
    }
}
