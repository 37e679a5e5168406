//! `idem clone SRC DST [--at SEQ | --at-time TIME]`: a new org whose first snapshot is another
//! org's state at one published position (a preview, a migration rehearsal, a tenant split).
//!
//! By reference (`Replica::clone_into`, `docs/design.md` 2e): DST's one snapshot is SRC's
//! state at the position; it names the segments of SRC's snapshot below the position that
//! the position left unchanged (a clone reference in SRC keeps them) and uploads only the
//! segments holding a changed page, so what is read and written follows what changed since
//! that snapshot, not the database's size. A position that cannot be shared (a snapshot an
//! earlier build stored whole, over 64 MiB changed since its snapshot) is restored, verified
//! as any restore is (I10), into a private temp directory and shipped whole. Both run under
//! DST's own claim, which is released: a server claims DST at once. DST must have no log
//! entry at all; SRC is only read, apart from the clone reference.

use std::process::ExitCode;

use idem_org::replica::{Claim, CloneOutcome, Error, OrgId, Replica};
use serde_json::json;

use super::import::{WRITER_CLONE, finish_image, refuse_existing};
use super::{CloneArgs, about, org_id, print_json};

/// How DST came to be.
struct Made {
    snapshot_seq: u64,
    round: u64,
    position: u64,
    commit: u64,
    /// Segments named, not copied (0 for a copy).
    shared: usize,
    /// Packed bytes written to the store.
    uploaded: u64,
    /// Why the position was copied, not shared.
    copied: Option<&'static str>,
}

/// Runs `idem clone`.
///
/// # Errors
/// Bad org ids (or SRC = DST) or store URL; DST already has a log; SRC has no position (at
/// that seq or time); a chain that fails its checks; store failures. Nothing is written to
/// DST on any error before its claim, and a failed clone releases the claim.
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
    let mut claim = replica
        .claim(&dst, WRITER_CLONE, false)
        .await
        .map_err(|e| about(&dst, &format!("claim: {}", crate::chain(&e))))?;
    // Another writer created the org between the check and the claim: leave it theirs.
    if claim.round() != 1 {
        let _ = replica.release(&mut claim).await;
        return Err(format!(
            "org {dst} was created in the store while cloning (claimed round {}); nothing was cloned",
            claim.round()
        ));
    }
    let made = match make(&replica, &mut claim, &src, at).await {
        Ok(m) => m,
        Err(e) => {
            let _ = replica.release(&mut claim).await;
            return Err(e);
        }
    };
    replica.release(&mut claim).await.map_err(|e| {
        about(
            &dst,
            &format!("release (the clone is published): {}", crate::chain(&e)),
        )
    })?;
    if a.json {
        print_json(&json!({
            "src": src.as_str(), "dst": dst.as_str(), "at": made.position, "commit": made.commit,
            "snapshot_seq": made.snapshot_seq, "round": made.round,
            "shared_segments": made.shared, "uploaded_bytes": made.uploaded,
            "copied": made.copied,
        }));
    } else {
        let how = match made.copied {
            None => format!("{} segments shared with {src}", made.shared),
            Some(why) => format!("copied whole: {why}"),
        };
        outln!(
            "cloned org {src} at seq {} (commit {}) into org {dst}: snapshot seq {} (round {}; {how}; {} bytes written), released",
            made.position,
            made.commit,
            made.snapshot_seq,
            made.round,
            made.uploaded
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Clones `src` at `at` under `claim`: by reference when it can, else as a whole copy.
async fn make(
    replica: &Replica,
    claim: &mut Claim,
    src: &OrgId,
    at: Option<u64>,
) -> Result<Made, String> {
    let dst = claim.org().clone();
    let fail = |e: Error| match e {
        Error::NoSuchSnapshot { .. } if at.is_none() => {
            format!("org {src} has no snapshot yet; nothing to clone")
        }
        e => about(&dst, &crate::chain(&e)),
    };
    let why = match replica.clone_into(claim, src, at).await.map_err(fail)? {
        CloneOutcome::Shared(c) => {
            return Ok(Made {
                snapshot_seq: c.snapshot.seq,
                round: c.snapshot.round,
                position: c.position,
                commit: c.commit,
                shared: c.shared_segments,
                uploaded: c.snapshot.uploaded_bytes,
                copied: None,
            });
        }
        CloneOutcome::Copy(why) => why,
    };
    let dir = tempfile::Builder::new()
        .prefix("idem-clone-")
        .tempdir()
        .map_err(|e| format!("cannot make a temp directory for the copy: {e}"))?;
    let path = dir.path().join("clone.db");
    let got = replica
        .restore(src, at, &path)
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
    let shipped = replica
        .ship_file(claim, &path, commit)
        .await
        .map_err(|e| about(&dst, &format!("ship: {}", crate::chain(&e))))?;
    Ok(Made {
        snapshot_seq: shipped.seq,
        round: shipped.round,
        position,
        commit,
        shared: 0,
        uploaded: shipped.uploaded_bytes,
        copied: Some(why),
    })
}
