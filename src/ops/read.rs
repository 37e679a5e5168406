//! Read-only operator commands: inspect, snapshots, restore, verify.

use std::io::IsTerminal;
use std::process::ExitCode;

use idem_org::idem;
use idem_org::replica::LogEntry;
use serde_json::{Value, json};

use super::{
    OrgArgs, RestoreArgs, VerifyArgs, history, open_read_only, org_id, print_json, rfc3339,
};

/// A published position (snapshot or delta) as JSON; `None` for claims and releases.
fn position_json(e: &LogEntry) -> Option<Value> {
    let s = e.stored()?;
    let mut v = json!({
        "seq": e.seq(), "kind": e.kind_name(), "round": e.round(), "writer": e.writer(),
        "at": rfc3339(e.at_ms()), "bytes": s.bytes, "compressed_bytes": s.compressed_bytes,
        "commit": s.commit,
    });
    if let Some(d) = e.delta() {
        v["base"] = d.base.into();
        v["changed_pages"] = d.changed_pages.into();
    }
    Some(v)
}

fn snapshot_json(e: &LogEntry) -> Option<Value> {
    position_json(e).filter(|v| v["kind"] == "snapshot")
}

/// `idem inspect ORG`: rounds, history, lease, newest snapshot and key count.
///
/// # Errors
/// Bad store URL or org id, unknown org, store or snapshot failures.
pub async fn inspect(a: OrgArgs) -> Result<ExitCode, String> {
    let replica = open_read_only(&a.store)?;
    let org = org_id(&a.org)?;
    let log = history(&replica, &a.store, &org).await?;
    let lease = replica.lease(&org).await.map_err(|e| crate::chain(&e))?;
    // A Release at the head of the log ends a lease at once. Otherwise it holds until a
    // claimant has seen it unchanged for a whole watch (I15): this command has never watched
    // it, so it answers what a claim from here would wait (`claim_wait_ms`), and shows the
    // holder's own expiry (the process lease's, else the org lease's) as the holder's clock.
    let hold = match &lease {
        Some(l) => Some(
            replica
                .lease_hold(&org, l)
                .await
                .map_err(|e| crate::chain(&e))?,
        ),
        None => None,
    };
    let holder_expires_at_ms = match (&lease, &hold) {
        (Some(l), Some(h)) => h
            .process
            .as_ref()
            .map_or(l.expires_at_ms, |p| p.expires_at_ms),
        _ => 0,
    };
    let claim_wait_ms = hold.as_ref().map_or(0, |h| h.wait_ms);
    let released = lease.as_ref().is_some_and(|l| {
        log.last()
            .is_some_and(|e| e.kind_name() == "release" && e.round() >= l.round)
    });
    let claims: Vec<u64> = log
        .iter()
        .filter(|e| e.is_claim())
        .map(LogEntry::round)
        .collect();
    let newest = log.iter().rev().find_map(snapshot_json);
    let position = log.iter().rev().find_map(position_json);
    let deltas_after = newest.as_ref().map_or(0, |s| {
        log.iter()
            .filter(|e| e.is_delta() && Some(e.seq()) > s["seq"].as_u64())
            .count()
    });
    let keys = match crate::store::restored::restore(&replica, &org, None).await? {
        None => idem::Stats::default(),
        Some(r) => idem::stats(&r.open()?)
            .map_err(|e| format!("reading the newest snapshot: {}", crate::chain(&e)))?,
    };
    let (applied, failed) = (keys.applied_keys, keys.failed_only_keys);
    let entries: Vec<Value> = log
        .iter()
        .map(|e| json!({"seq": e.seq(), "kind": e.kind_name(), "round": e.round(), "writer": e.writer(), "at": rfc3339(e.at_ms())}))
        .collect();
    let current = log.iter().map(LogEntry::round).max().unwrap_or(0);
    let head = log.last().map(|e| e.kind_name()).unwrap_or("none");
    // Clones naming this org's segments: deleting its objects would break them (2e).
    let clones = replica
        .clones_of(&org)
        .await
        .map_err(|e| crate::chain(&e))?;
    let clones_json: Vec<Value> = clones
        .iter()
        .map(|c| json!({"org": c.clone.as_str(), "snapshot": c.snapshot, "segments": c.segments}))
        .collect();
    let lease_json = lease.as_ref().map(|l| {
        json!({
            "writer": l.writer, "round": l.round, "released": released,
            "holder_expires_at": rfc3339(holder_expires_at_ms),
            "claim_wait_ms": if released { 0 } else { claim_wait_ms },
        })
    });
    if a.json {
        print_json(&json!({
            "org": org.as_str(), "current_round": current, "claims": claims, "head": head,
            "lease": lease_json, "newest_snapshot": newest, "newest_position": position,
            "deltas_after_snapshot": deltas_after,
            "applied_keys": applied, "failed_keys": failed, "history": entries,
            "clones": clones_json,
        }));
        return Ok(ExitCode::SUCCESS);
    }
    outln!("org            {org}");
    outln!(
        "rounds         {} claims, current round {current}, head entry {head}",
        claims.len()
    );
    match &lease {
        Some(l) if released => outln!(
            "lease          writer {} round {}, released",
            l.writer,
            l.round
        ),
        Some(l) => outln!(
            "lease          writer {} round {}: a claim waits {} without a renewal (holder's clock: until {})",
            l.writer,
            l.round,
            humantime::format_duration(std::time::Duration::from_millis(claim_wait_ms)),
            rfc3339(holder_expires_at_ms)
        ),
        None => outln!("lease          none"),
    }
    match &newest {
        Some(s) => outln!(
            "newest snap    seq {} round {} by {} at {}: {} bytes ({} stored), commit {}",
            s["seq"],
            s["round"],
            s["writer"],
            s["at"],
            s["bytes"],
            s["compressed_bytes"],
            s["commit"]
        ),
        None => outln!("newest snap    none"),
    }
    if let Some(p) = &position {
        outln!(
            "newest state   seq {} (commit {}): the snapshot + {deltas_after} deltas",
            p["seq"],
            p["commit"]
        );
    }
    outln!("keys           {applied} applied, {failed} with failed attempts only");
    if !clones.is_empty() {
        let names: Vec<String> = clones
            .iter()
            .map(|c| {
                format!(
                    "{} ({} segments of seq {})",
                    c.clone, c.segments, c.snapshot
                )
            })
            .collect();
        outln!(
            "clones         {}: they name this org's segments; delete them first",
            names.join(", ")
        );
    }
    outln!("history        {} entries (last 10):", log.len());
    for e in log.iter().rev().take(10).rev() {
        outln!(
            "  {:>6}  {:<8} round {:<4} {:<20} {}",
            e.seq(),
            e.kind_name(),
            e.round(),
            e.writer(),
            rfc3339(e.at_ms())
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `idem snapshots ORG`: every kept position: snapshots, deltas and level-file sections
/// (each a valid `restore --at`).
///
/// # Errors
/// As [`inspect`].
pub async fn snapshots(a: OrgArgs) -> Result<ExitCode, String> {
    let replica = open_read_only(&a.store)?;
    let org = org_id(&a.org)?;
    let log = history(&replica, &a.store, &org).await?;
    let mut snaps: Vec<Value> = log.iter().filter_map(position_json).collect();
    // Positions of closed chains whose deltas retention thinned live on in level files.
    let levels = replica
        .level_positions(&org)
        .await
        .map_err(|e| crate::chain(&e))?;
    for p in levels
        .iter()
        .filter(|p| !log.iter().any(|e| e.seq() == p.seq))
    {
        snaps.push(json!({
            "seq": p.seq, "kind": "level", "round": p.round, "writer": "",
            "at": rfc3339(p.at_ms), "bytes": p.bytes, "compressed_bytes": p.compressed_bytes,
            "commit": p.commit, "snapshot": p.snapshot, "positions": p.positions,
        }));
    }
    snaps.sort_by_key(|v| v["seq"].as_u64().unwrap_or(0));
    if a.json {
        print_json(&Value::Array(snaps));
        return Ok(ExitCode::SUCCESS);
    }
    let header = [
        "seq", "kind", "round", "writer", "at", "bytes", "stored", "commit",
    ];
    let fields = [
        "seq",
        "kind",
        "round",
        "writer",
        "at",
        "bytes",
        "compressed_bytes",
        "commit",
    ];
    let cell = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    };
    let rows: Vec<Vec<String>> = snaps
        .iter()
        .map(|s| fields.iter().map(|f| cell(&s[*f])).collect())
        .collect();
    // Every column as wide as its widest cell; text left-aligned, numbers right-aligned.
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            rows.iter()
                .map(|r| r[i].len())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: &[String]| {
        let parts: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| match i {
                1 | 3 | 4 => format!("{c:<w$}", w = widths[i]),
                _ => format!("{c:>w$}", w = widths[i]),
            })
            .collect();
        outln!("{}", parts.join("  ").trim_end());
    };
    line(&header.map(str::to_owned));
    for r in &rows {
        line(r);
    }
    if let (Some(first), Some(last)) = (snaps.first(), snaps.last()) {
        outln!();
        outln!(
            "window: {} positions, seq {} ({}) to seq {} ({}); restore one with --at SEQ or --at-time TIME",
            snaps.len(),
            first["seq"],
            cell(&first["at"]),
            last["seq"],
            cell(&last["at"])
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `idem restore ORG --to FILE [--at SEQ | --at-time TIME]`: a verified published position
/// (a snapshot and the deltas up to SEQ, or up to the newest one published at or before
/// TIME) as a plain SQLite file.
///
/// # Errors
/// Destination exists, unknown org or position, checksum or integrity failure.
pub async fn restore(a: RestoreArgs) -> Result<ExitCode, String> {
    if let Some(parent) = a.to.parent()
        && !parent.as_os_str().is_empty()
        && !parent.is_dir()
    {
        return Err(format!(
            "{}: the directory {} does not exist",
            a.to.display(),
            parent.display()
        ));
    }
    if a.to.exists() {
        return Err(format!(
            "{} already exists; restore writes a new file",
            a.to.display()
        ));
    }
    let replica = open_read_only(&a.store)?;
    let org = org_id(&a.org)?;
    history(&replica, &a.store, &org).await?;
    let at = match a.at_time {
        Some(ms) => Some(
            replica
                .position_at_time(&org, ms)
                .await
                .map_err(|e| crate::chain(&e))?,
        ),
        None => a.at,
    };
    let progress = std::sync::Arc::new(idem_org::replica::RestoreProgress::default());
    let restoring = replica.restore_with_progress(&org, at, &a.to, progress.clone());
    let got = with_bytes_bar(restoring, &progress)
        .await
        .map_err(|e| crate::chain(&e))?;
    match got.snapshot {
        Some(s) => {
            outln!(
                "restored org {org} at seq {} (snapshot seq {} + {} deltas, round {}, commit {}) to {}",
                got.position.unwrap_or(s.seq),
                s.seq,
                got.deltas,
                s.round,
                got.commit,
                a.to.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        None => Err(format!("org {org} has no snapshot yet")),
    }
}

/// Runs `fut` with a bar of the bytes it downloads on a terminal's stderr (hidden in cron
/// and pipes, as `prune`'s is).
async fn with_bytes_bar<T>(
    fut: impl std::future::Future<Output = T>,
    progress: &idem_org::replica::RestoreProgress,
) -> T {
    use std::sync::atomic::Ordering;
    if !std::io::stderr().is_terminal() {
        return fut.await;
    }
    let bar = indicatif::ProgressBar::new(0).with_style(
        indicatif::ProgressStyle::with_template("{bar:30} {bytes}/{total_bytes} {elapsed}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let mut fut = std::pin::pin!(fut);
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(100));
    let out = loop {
        tokio::select! {
            out = &mut fut => break out,
            _ = tick.tick() => {
                bar.set_length(progress.total.load(Ordering::Relaxed));
                bar.set_position(progress.downloaded.load(Ordering::Relaxed));
            }
        }
    };
    bar.finish_and_clear();
    out
}

/// `idem verify [ORG]`: sha256, size and SQLite integrity of every published snapshot.
///
/// # Errors
/// Bad store URL or org id, unknown org, store unreachable. Faults found give exit 1.
pub async fn verify(a: VerifyArgs) -> Result<ExitCode, String> {
    let replica = open_read_only(&a.store)?;
    let orgs = match &a.org {
        Some(o) => {
            let id = org_id(o)?;
            history(&replica, &a.store, &id).await?;
            vec![id]
        }
        None => replica.orgs().await.map_err(|e| crate::chain(&e))?,
    };
    let (mut ok, mut faults, mut rows) = (0usize, Vec::new(), Vec::new());
    // A bar per org on a terminal's stderr; hidden in cron, pipes and with --json.
    let bar = if std::io::stderr().is_terminal() && !a.json {
        indicatif::ProgressBar::new(orgs.len() as u64)
    } else {
        indicatif::ProgressBar::hidden()
    };
    for org in &orgs {
        bar.set_message(org.to_string());
        bar.inc(1);
        let report = replica
            .verify(org)
            .await
            .map_err(|e| super::about(org, &crate::chain(&e)))?;
        ok += report.ok.len();
        let failed: Vec<Value> = report
            .failed
            .iter()
            .map(|(seq, e)| {
                faults.push(format!("org {org}: seq {seq}: {}", crate::chain(e)));
                json!({"seq": seq, "error": crate::chain(e)})
            })
            .collect();
        rows.push(json!({"org": org.as_str(), "ok": report.ok, "failed": failed}));
    }
    bar.finish_and_clear();
    if a.json {
        print_json(&json!({"orgs": rows, "ok": ok, "faults": faults.len()}));
    } else {
        for f in &faults {
            errln!("idem: {f}");
        }
        outln!(
            "verified {} orgs: {ok} snapshots and deltas ok, {} faulty",
            orgs.len(),
            faults.len()
        );
    }
    Ok(if faults.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
