//! Parking idle orgs (I14): an open org keeps its claim, its shipper and its lock file, but
//! an idle one gives back its SQLite connection, the descriptors captures read through and
//! its caches, so the process holds thousands of open orgs in one descriptor each.
//!
//! ```text
//! park   (shipper lock, nothing in flight, shipped == commit_seq, the file known to be
//!         the tip — else ship once first):
//!        writer job: commit still `shipped`? capture's checks, wal_checkpoint(TRUNCATE),
//!                    WAL empty -> close the connection, then its descriptors (I13)
//!        shipper: drop its descriptors and its cache of shipped pages
//! unpark (shipper lock, on the first request or ship after a park; requests wait):
//!        writer job: reopen exclusively (never creating the file; a WAL with frames is
//!                    someone else's), same pragmas, hook and page-cache share
//!        shipper: the file's page hashes (page 1 canonical) == the chain tip's?  [I8, I13]
//!          yes: requests run again; the chain goes on with a fresh WAL (no store request)
//!          no:  poisoned as any I13 violation: nothing answered, claim released, files
//!               deleted; the next acquire hydrates from the store
//! ```
//!
//! A journal org (3g) parks the same way: "the tip" is the state of its newest acknowledged
//! section (the shipper's page hashes), and it stays attached to the run while parked. A
//! release of one parked journal org (J7's lag trigger, an eviction) captures a released
//! section, so it unparks first; at shutdown the run's release seal frees it as it is.
//!
//! Both run under the org's shipper lock, and the writer's queue hands requests back while
//! the org is parked (see `Writer::park`), so a park never races a capture, a ship or a
//! request, and no request runs on a file before it is proven. Which orgs park is the
//! registry's active set (`crate::active`): beyond its limit the least recently used idle active org
//! parks.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::Error;
use crate::tenure::end::{End, Step, end};
use crate::tenure::publishing::Publishing;
use crate::tenure::state::{ActiveOrgs, Inner};

/// Parks the least recently used idle active orgs beyond the registry's limit, never `keep`
/// (the org a request is about to use). An org with work queued, running or waiting for its
/// ship is never parked. The caller must hold no org's shipper lock: a park takes its
/// victim's (waiting for a ship that is just ending), and holding one while waiting for
/// another could deadlock two orgs parking each other.
pub(crate) async fn enforce(active: &ActiveOrgs, keep: u64) {
    for inner in active.beyond_limit(keep) {
        if let Err(e) = park(&inner).await {
            tracing::debug!(org = %inner.acks.org, error = %e, "park failed");
        }
    }
}

/// Parks `inner` if it is idle. `Ok(false)` when it did not: busy, already parked,
/// stopped, or a ship it needed first failed (it serves on).
///
/// # Errors
/// [`Error::Poisoned`] when its files were found changed (I13), or the claim-lost error of
/// the ship a park needed: the org has then stopped and its files are discarded.
pub(crate) async fn park(inner: &Arc<Inner>) -> Result<bool, Error> {
    // A ship, a confirmation or an unpark may hold it: wait for it to end (the caller holds
    // no shipper lock, so two orgs never wait for each other), then look again.
    let mut shipper = inner.publishing().await;
    if !idle(inner) {
        return Ok(false);
    }
    if !shipper.parkable() {
        // A continued chain whose file differs from its tip (SQLite's switch to WAL rewrote
        // page 1, a hook wrote), a claim with nothing published, or a journal tenure whose
        // newest capture is not acknowledged (none yet: the open path's writes): one ship
        // makes the file the published state, as before a release.
        let differs = shipper.inherited_unshipped().await.unwrap_or(true);
        let untipped = shipper
            .per_org()
            .is_none_or(|s| s.claim().chain_tip().is_none());
        if (differs || untipped)
            && let Err(e) = crate::ship::ship_once(inner, &mut shipper).await
        {
            return stop_after(inner, &mut shipper, e).await.map(|()| false);
        }
        if !shipper.parkable() || !idle(inner) {
            return Ok(false);
        }
    }
    let shipped = inner.acks.lock().shipped;
    match inner.writer.park(shipped).await {
        Ok(true) => {
            // The connection is closed: the shipper's descriptors may go (I13).
            shipper.park();
            inner.active.remove(inner.serial);
            metrics::counter!(crate::metrics::PARKS).increment(1);
            inner.acks.counters.parks.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(org = %inner.acks.org, round = inner.acks.round, commit_seq = shipped, "parked");
            Ok(true)
        }
        Ok(false) => Ok(false),
        Err(reason) => Err(poison(inner, &mut shipper, &reason, Step::Park).await),
    }
}

/// Nothing in flight, nothing unshipped, not stopped, not parked.
fn idle(inner: &Inner) -> bool {
    let quiet = {
        let st = inner.acks.lock();
        st.stop.is_none() && st.shipped == inner.acks.commit_seq.get()
    };
    quiet && inner.busy() == 0 && !inner.writer.parked()
}

/// Unparks `inner` if it is parked, before a request is queued: waits for the shipper
/// lock (a park in progress finishes first), then [`unpark_locked`]. True when it
/// unparked: the caller then parks others beyond the active limit ([`enforce`],
/// once its own job is queued and the shipper lock released).
///
/// # Errors
/// As [`unpark_locked`].
pub(crate) async fn unpark(inner: &Arc<Inner>) -> Result<bool, Error> {
    let mut shipper = inner.publishing().await;
    unpark_locked(inner, &mut shipper).await
}

/// Reopens a parked org's connection and proves its file is still exactly the chain's tip
/// before any request runs (I8, I13); true when it unparked, false when it was not parked.
/// The caller holds the shipper lock.
///
/// # Errors
/// The stop error of a stopped org; [`Error::Poisoned`] when the file was changed, replaced
/// or removed while parked, or cannot be reopened: the org stops exactly as after an I13
/// violation (nothing answered, claim released, files deleted; the next acquire hydrates).
pub(crate) async fn unpark_locked(
    inner: &Arc<Inner>,
    shipper: &mut Publishing<'_>,
) -> Result<bool, Error> {
    if let Some(stop) = inner.acks.lock().stop.clone() {
        return Err(inner.acks.stop_error(stop));
    }
    if !inner.writer.parked() {
        return Ok(false);
    }
    let proven = match inner.writer.unpark().await {
        Ok(files) => shipper.unpark(files).await.map_err(|e| e.to_string()),
        Err(reason) => Err(reason),
    };
    match proven {
        Ok(()) => {
            inner.active.insert(inner);
            inner.writer.activate();
            metrics::counter!(crate::metrics::UNPARKS).increment(1);
            inner.acks.counters.unparks.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(org = %inner.acks.org, round = inner.acks.round, "unparked");
            Ok(true)
        }
        Err(reason) => Err(poison(inner, shipper, &reason, Step::Unpark).await),
    }
}

/// Stops the org because its files were found changed (I13) at `at`, and reports the end
/// ([`End::Poisoned`]: claim released, closed, files deleted).
async fn poison(inner: &Inner, shipper: &mut Publishing<'_>, reason: &str, at: Step) -> Error {
    let err = inner.acks.poison(reason);
    let _ = end(inner, shipper, End::Poisoned { at }).await;
    err
}

/// After a ship a park needed failed: a stopped org's end is reported as the shipper task
/// reports it; any other failure leaves it serving.
async fn stop_after(inner: &Inner, shipper: &mut Publishing<'_>, e: Error) -> Result<(), Error> {
    match End::after(&e, Step::ParkShip) {
        Some(how) => {
            let _ = end(inner, shipper, how).await;
            Err(e)
        }
        None => Ok(()),
    }
}
