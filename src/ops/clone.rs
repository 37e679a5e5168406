//! `idem clone SRC DST [--at SEQ | --at-time TIME]`: a new org whose first snapshot is another
//! org's state at one published position (a preview, a migration rehearsal, a tenant split).
//!
//! The position is restored, verified as any restore is (I10), into a private temp directory,
//! then shipped as DST's first snapshot under DST's own claim, which is released: a server
//! claims DST at once. DST must have no log entry at all; SRC is only read. The copy is
//! whole: segments are uploaded again under DST, not shared between the two orgs.

use std::process::ExitCode;

use serde_json::json;

use super::import::{WRITER_CLONE, finish_image, publish, refuse_existing};
use super::{CloneArgs, org_id, print_json};

/// Runs `idem clone`.
///
/// # Errors
/// Bad org ids (or SRC = DST) or store URL; DST already has a log; SRC has no position (at
/// that seq or time); a restore that fails its checks; store failures. Nothing is written
/// to DST on any error before its claim, and a failed ship releases the claim.
pub async fn clone(a: CloneArgs) -> Result<ExitCode, String> {
    let (src, dst) = (org_id(&a.src)?, org_id(&a.dst)?);
    if src == dst {
        return Err(format!("cannot clone org {src} into itself"));
    }
    let replica = super::open(&a.store).await?;
    refuse_existing(&replica, &dst).await?;
    super::history(&replica, &a.store, &src).await?;
    let at = match a.at_time {
        Some(ms) => Some(
            replica
                .position_at_time(&src, ms)
                .await
                .map_err(|e| crate::chain(&e))?,
        ),
        None => a.at,
    };
    let dir = tempfile::Builder::new()
        .prefix("idem-clone-")
        .tempdir()
        .map_err(|e| format!("cannot make a temp directory for the copy: {e}"))?;
    let path = dir.path().join("clone.db");
    let got = replica
        .restore(&src, at, &path)
        .await
        .map_err(|e| crate::chain(&e))?;
    let Some(snapshot) = got.snapshot else {
        return Err(format!("org {src} has no snapshot yet; nothing to clone"));
    };
    let position = got.position.unwrap_or(snapshot.seq);
    let image = path.clone();
    let (commit, _) = tokio::task::spawn_blocking(move || finish_image(&image, &image))
        .await
        .map_err(|e| format!("preparing the copy: {e}"))?
        .map_err(|e| crate::chain(&e))?;
    let shipped = publish(&replica, &dst, &path, commit, WRITER_CLONE).await?;
    if a.json {
        print_json(&json!({
            "src": src.as_str(), "dst": dst.as_str(), "at": position, "commit": commit,
            "snapshot_seq": shipped.seq, "round": shipped.round,
            "compressed_bytes": shipped.compressed_bytes,
        }));
    } else {
        outln!(
            "cloned org {src} at seq {position} (commit {commit}) into org {dst}: snapshot seq {} (round {}, {} bytes stored), released",
            shipped.seq,
            shipped.round,
            shipped.compressed_bytes
        );
    }
    Ok(ExitCode::SUCCESS)
}
