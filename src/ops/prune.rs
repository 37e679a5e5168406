//! `idem prune`: a short-lived writer that prunes old idempotency keys, org by org.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use idem_org::{Registry, replica};
use serde_json::json;

use super::scratch::Scratch;
use super::{PruneArgs, org_id};

/// Prunes every (or each given) org: acquire (respecting live leases unless `--force`),
/// delete keys older than `--older-than` (by the earlier of this host's clock and the
/// store's, read by each org's prune), ship, release. One org's failure does not stop
/// the others; the exit code is non-zero if any failed. An org a live writer holds is
/// skipped and counted apart, not a failure: beside a running server, a cron job stays green.
///
/// Before anything is claimed, this host's clock is checked against the store's (a probe
/// object's Last-Modified: one PUT, HEAD and DELETE), and the run is refused past
/// `--max-clock-skew` (I15); each org's prune checks again (`Org::prune`).
///
/// # Errors
/// Bad store URL or org id, store unreachable, this host's clock contradicted by the store's.
pub async fn prune(a: PruneArgs) -> Result<ExitCode, String> {
    let settings = replica::Settings {
        max_clock_skew_ms: u64::try_from(a.max_clock_skew.as_millis()).unwrap_or(u64::MAX),
        ..replica::Settings::default()
    };
    let replica = crate::store::open(&crate::store::parse(&a.store)?, settings).await?;
    replica
        .store_time("prune")
        .await
        .map_err(|e| format!("{}; nothing was pruned", crate::chain(&e)))?;
    let orgs = if a.orgs.is_empty() {
        replica.orgs().await.map_err(|e| crate::chain(&e))?
    } else {
        a.orgs.iter().map(|o| org_id(o)).collect::<Result<_, _>>()?
    };
    let writer = a
        .writer
        .clone()
        .unwrap_or_else(|| format!("idem-prune-{}", std::process::id()));
    let scratch = Scratch::open(a.data.as_deref(), replica.clone(), writer, a.force)?;
    let registry = &scratch.registry;
    let bar = if std::io::stderr().is_terminal() && !a.json {
        indicatif::ProgressBar::new(orgs.len() as u64)
    } else {
        indicatif::ProgressBar::hidden()
    };
    let named = !a.orgs.is_empty();
    let (mut deleted, mut results) = (0u64, Vec::new());
    for org in &orgs {
        bar.set_message(org.to_string());
        let r = prune_one(registry, &replica, org, a.older_than, named).await;
        if let Ok(Pruned::Deleted(n)) = r {
            deleted += n;
        }
        results.push((org.clone(), r));
        bar.inc(1);
    }
    bar.finish_and_clear();
    let failed: Vec<_> = results.iter().filter(|(_, r)| r.is_err()).collect();
    let skipped: Vec<_> = results
        .iter()
        .filter_map(|(o, r)| match r {
            Ok(Pruned::Skipped(holder)) => Some((o, holder)),
            _ => None,
        })
        .collect();
    if a.json {
        let rows: Vec<_> = results
            .iter()
            .map(|(o, r)| match r {
                Ok(Pruned::Deleted(n)) => json!({"org": o.as_str(), "deleted": n}),
                Ok(Pruned::Skipped(holder)) => json!({"org": o.as_str(), "skipped": holder}),
                Err(e) => json!({"org": o.as_str(), "error": e}),
            })
            .collect();
        super::print_json(&json!({
            "deleted": deleted,
            "orgs": rows,
            "skipped": skipped.len(),
            "failed": failed.len(),
        }));
    } else {
        for (o, holder) in &skipped {
            errln!(
                "idem: org {o}: skipped, held by live writer {holder} (retry later, or --force)"
            );
        }
        for (o, r) in &failed {
            if let Err(e) = r {
                errln!("idem: {}", super::about(o, e));
            }
        }
        outln!(
            "pruned {deleted} keys older than {} in {} of {} orgs; {} skipped (held by a live writer); {} failed",
            humantime::format_duration(a.older_than),
            results.len() - failed.len() - skipped.len(),
            results.len(),
            skipped.len(),
            failed.len()
        );
    }
    Ok(if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// What pruning one org did.
enum Pruned {
    /// Keys deleted.
    Deleted(u64),
    /// A live writer holds the org (its writer id): not touched.
    Skipped(String),
}

async fn prune_one(
    registry: &Registry,
    replica: &replica::Replica,
    org: &replica::OrgId,
    window: Duration,
    named: bool,
) -> Result<Pruned, String> {
    let history = replica.history(org).await.map_err(|e| crate::chain(&e))?;
    if history.is_empty() {
        // A folder without a log (a local store keeps empty folders after deletes): nothing
        // to prune, and no reason to claim it. An org named on the command line must exist.
        if named {
            return Err("does not exist in the store".into());
        }
        return Ok(Pruned::Deleted(0));
    }
    let handle = match registry.acquire(org).await {
        Ok(h) => h,
        Err(idem_org::Error::Replica { source, .. })
            if matches!(*source, replica::Error::LeaseHeld { .. }) =>
        {
            let replica::Error::LeaseHeld { holder, .. } = *source else {
                return Err("lease held".into());
            };
            return Ok(Pruned::Skipped(holder));
        }
        Err(e) => return Err(crate::chain(&e)),
    };
    let pruned = handle.prune(window).await.map_err(|e| crate::chain(&e));
    let released = handle.release().await.map_err(|e| crate::chain(&e));
    let n = pruned?;
    released?;
    Ok(Pruned::Deleted(n))
}
