//! `idem prune`: a short-lived writer that prunes old idempotency keys, org by org.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::SystemTime;

use idem_org::Registry;
use serde_json::json;

use super::{PruneArgs, open, org_id};

/// Prunes every (or each given) org: acquire (respecting live leases unless `--force`),
/// delete keys applied before the cutoff, ship, release. One org's failure does not stop
/// the others; the exit code is non-zero if any failed.
///
/// # Errors
/// Bad store URL or org id, store unreachable.
pub async fn prune(a: PruneArgs) -> Result<ExitCode, String> {
    let replica = open(&a.store).await?;
    let orgs = if a.orgs.is_empty() {
        replica.orgs().await.map_err(|e| crate::chain(&e))?
    } else {
        a.orgs.iter().map(|o| org_id(o)).collect::<Result<_, _>>()?
    };
    let cutoff = SystemTime::now()
        .checked_sub(a.older_than)
        .ok_or("--older-than reaches before the Unix epoch")?;
    let scratch = match &a.data {
        Some(_) => None,
        None => Some(tempfile::tempdir().map_err(|e| format!("cannot create a temp dir: {e}"))?),
    };
    let data = a
        .data
        .clone()
        .or_else(|| scratch.as_ref().map(|t| t.path().to_owned()))
        .ok_or("no data directory")?;
    let writer = a
        .writer
        .clone()
        .unwrap_or_else(|| format!("idem-prune-{}", std::process::id()));
    let registry = Registry::builder(&data, replica.clone(), writer)
        .settings(idem_org::Settings {
            force_claim: a.force,
            max_open_orgs: 1,
            ..idem_org::Settings::default()
        })
        .build()
        .map_err(|e| crate::chain(&e))?;
    let bar = if std::io::stderr().is_terminal() && !a.json {
        indicatif::ProgressBar::new(orgs.len() as u64)
    } else {
        indicatif::ProgressBar::hidden()
    };
    let (mut deleted, mut results) = (0u64, Vec::new());
    for org in &orgs {
        bar.set_message(org.to_string());
        let r = prune_one(&registry, &replica, org, cutoff).await;
        if let Ok(n) = r {
            deleted += n;
        }
        results.push((org.clone(), r));
        bar.inc(1);
    }
    bar.finish_and_clear();
    let failed: Vec<_> = results.iter().filter(|(_, r)| r.is_err()).collect();
    if a.json {
        let rows: Vec<_> = results
            .iter()
            .map(|(o, r)| match r {
                Ok(n) => json!({"org": o.as_str(), "deleted": n}),
                Err(e) => json!({"org": o.as_str(), "error": e}),
            })
            .collect();
        super::print_json(&json!({"deleted": deleted, "orgs": rows, "failed": failed.len()}));
    } else {
        for (o, r) in &failed {
            if let Err(e) = r {
                eprintln!("idem: org {o}: {e}");
            }
        }
        println!(
            "pruned {deleted} keys older than {} in {} of {} orgs; {} failed",
            humantime::format_duration(a.older_than),
            results.len() - failed.len(),
            results.len(),
            failed.len()
        );
    }
    Ok(if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

async fn prune_one(
    registry: &Registry,
    replica: &idem_replica::Replica,
    org: &idem_replica::OrgId,
    cutoff: SystemTime,
) -> Result<u64, String> {
    let history = replica.history(org).await.map_err(|e| crate::chain(&e))?;
    if history.is_empty() {
        // A folder without a log (a local store keeps empty folders after deletes): nothing
        // to prune, and no reason to claim it.
        return Ok(0);
    }
    let handle = registry.acquire(org.as_str()).await.map_err(|e| {
        let msg = crate::chain(&e);
        if msg.contains("leased by") {
            format!("{msg}; skipped (a live writer holds it: retry later or use --force)")
        } else {
            msg
        }
    })?;
    let pruned = handle.prune(cutoff).await.map_err(|e| crate::chain(&e));
    let released = handle.release().await.map_err(|e| crate::chain(&e));
    let n = pruned?;
    released?;
    Ok(n)
}
