//! `idem check-store URL`: is this store safe and usable for idem?

use std::process::ExitCode;

use futures::TryStreamExt;
use idem_base::Stopwatch;
use idem_org::object_store::ObjectStoreExt;
use idem_org::replica::{OrgId, Settings, Snapshot};
use idem_org::{object_store, replica, rusqlite};
use serde_json::json;

use super::CheckStoreArgs;

/// Runs the create-only probe (`Replica::open`), then a claim / ship / release / claim /
/// hydrate round trip on a scratch org, checks the hydrated data, and deletes the scratch org.
///
/// # Errors
/// The first step that fails, as one line.
pub async fn check_store(a: CheckStoreArgs) -> Result<ExitCode, String> {
    let url = crate::store::parse(&a.url)?;
    let mut nonce = [0u8; 8];
    getrandom::fill(&mut nonce).map_err(|e| format!("random source: {e}"))?;
    // The scratch org lives under a prefix of its own, beside (never inside) the store's
    // `orgs/`: a local directory keeps empty folders after its objects are deleted, and those
    // must not show up as orgs for `prune` or `verify`.
    let scratch = url.join(&format!("idem-check-{}", hex::encode(nonce)));
    let t0 = Stopwatch::start();
    let replica = crate::store::open(&scratch, Settings::default()).await?;
    let probe_ms = t0.elapsed().as_secs_f64() * 1000.0;
    let org = OrgId::new("check").map_err(|e| e.to_string())?;
    let step =
        |what: &'static str| move |e: replica::Error| format!("{what}: {}", crate::chain(&e));

    let t1 = Stopwatch::start();
    let result = async {
        let mut claim = replica
            .claim(&org, "idem-check-a", false)
            .await
            .map_err(step("claim"))?;
        let conn = rusqlite::Connection::open_in_memory().map_err(|e| e.to_string())?;
        conn.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (4242);")
            .map_err(|e| e.to_string())?;
        let snap = Snapshot::take(&conn, |_| Ok(1)).map_err(step("snapshot"))?;
        let shipped = replica.ship(&mut claim, snap).await.map_err(step("ship"))?;
        replica.release(&mut claim).await.map_err(step("release"))?;
        let mut next = replica
            .claim(&org, "idem-check-b", false)
            .await
            .map_err(step("second claim"))?;
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let dest = dir.path().join("check.db");
        replica
            .hydrate(&mut next, &dest)
            .await
            .map_err(step("hydrate"))?;
        let x: i64 = rusqlite::Connection::open(&dest)
            .and_then(|c| c.query_row("SELECT x FROM t", [], |r| r.get(0)))
            .map_err(|e| format!("reading the hydrated copy: {e}"))?;
        if x != 4242 || next.round() <= claim.round() {
            return Err("hydrated data or round does not match what was shipped".to_owned());
        }
        Ok::<_, String>(shipped.compressed_bytes)
    }
    .await;
    let trip_ms = t1.elapsed().as_secs_f64() * 1000.0;
    cleanup(&scratch).await;
    let bytes = result?;
    if a.json {
        super::print_json(&json!({
            "ok": true, "probe_ms": probe_ms, "round_trip_ms": trip_ms, "shipped_bytes": bytes,
        }));
    } else {
        outln!(
            "store ok: create-only probe {probe_ms:.0} ms; claim, ship ({bytes} bytes), release, claim, hydrate {trip_ms:.0} ms"
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Deletes every object under the scratch prefix (best effort), and on a local store the
/// folders the deletes leave behind: the check leaves nothing.
async fn cleanup(scratch: &crate::store::StoreUrl) {
    let path = object_store::path::Path::from(scratch.prefix());
    let listed: Result<Vec<_>, _> = scratch.store().list(Some(&path)).try_collect().await;
    for meta in listed.unwrap_or_default() {
        let _ = scratch.store().delete(&meta.location).await;
    }
    if let Some(root) = scratch.local_root() {
        // The scratch prefix is this run's own (a random name), so the whole folder goes.
        let _ = std::fs::remove_dir_all(root.join(scratch.prefix()));
    }
}
