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
//! Both run under the org's shipper lock, and the writer's queue hands requests back while
//! the org is parked (see `Writer::park`), so a park never races a capture, a ship or a
//! request, and no request runs on a file before it is proven. Which orgs park is the
//! registry's [`Active`] set: beyond its limit the least recently used idle active org
//! parks.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use idem_replica::Shipper;

use crate::Error;
use crate::org::Inner;
use crate::sync::lock;

/// Serial numbers of open org handles: the key of [`Active`] (one org id may have a
/// closing handle and a new one at once).
pub(crate) static SERIAL: AtomicU64 = AtomicU64::new(0);

/// The orgs of a registry that hold a connection, and how many may: beyond `limit` the
/// least recently used idle ones park.
pub(crate) struct Active {
    limit: usize,
    orgs: Mutex<HashMap<u64, Weak<Inner>>>,
    /// The shipped-page caches' half of the memory budget, in pages, shared by the orgs
    /// active now, never below `cache_floor` (an org's share at the active limit).
    cache_pages: usize,
    cache_floor: usize,
    /// `cache_pages / active orgs`: each active org's shipper bounds its cache by it at every
    /// ship (`Shipper::share_cache_limit`).
    cache_limit: Arc<AtomicUsize>,
}

impl Active {
    /// A set that keeps at most `limit` orgs active (at least one), whose shipped-page
    /// caches share `cache_pages` pages, at least `cache_floor` each.
    pub(crate) fn new(limit: usize, cache_pages: usize, cache_floor: usize) -> Arc<Active> {
        Arc::new(Active {
            limit: limit.max(1),
            orgs: Mutex::new(HashMap::new()),
            cache_pages,
            cache_floor,
            cache_limit: Arc::new(AtomicUsize::new(cache_pages.max(cache_floor))),
        })
    }

    /// Orgs holding a connection now.
    pub(crate) fn len(&self) -> usize {
        lock(&self.orgs).len()
    }

    /// The per-org bound on shipped-page caches, updated as orgs activate and park.
    pub(crate) fn cache_limit(&self) -> Arc<AtomicUsize> {
        self.cache_limit.clone()
    }

    fn share(&self, active: usize) {
        let each = (self.cache_pages / active.max(1)).max(self.cache_floor);
        self.cache_limit.store(each, Ordering::Relaxed);
    }

    pub(crate) fn insert(&self, inner: &Arc<Inner>) {
        let mut orgs = lock(&self.orgs);
        orgs.insert(inner.serial, Arc::downgrade(inner));
        self.share(orgs.len());
    }

    pub(crate) fn remove(&self, serial: u64) {
        let mut orgs = lock(&self.orgs);
        orgs.remove(&serial);
        self.share(orgs.len());
    }

    /// Parks the least recently used idle active orgs beyond the limit, never `keep` (the
    /// org a request is about to use). An org with work queued, running or waiting for its
    /// ship is never parked. The caller must hold no org's shipper lock: a park takes its
    /// victim's (waiting for a ship that is just ending), and holding one while waiting for
    /// another could deadlock two orgs parking each other.
    pub(crate) async fn enforce(&self, keep: u64) {
        let victims: Vec<Arc<Inner>> = {
            let orgs = lock(&self.orgs);
            let excess = orgs.len().saturating_sub(self.limit);
            if excess == 0 {
                return;
            }
            let mut idle: Vec<Arc<Inner>> = orgs
                .iter()
                .filter(|(serial, _)| **serial != keep)
                .filter_map(|(_, w)| w.upgrade())
                .filter(|i| i.busy() == 0)
                .collect();
            idle.sort_by_key(|i| i.last_used.load(Ordering::Relaxed));
            idle.truncate(excess);
            idle
        };
        for inner in victims {
            if let Err(e) = park(&inner).await {
                tracing::debug!(org = %inner.acks.org, error = %e, "park failed");
            }
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
    let mut shipper = inner.shipper.lock().await;
    if !idle(inner) {
        return Ok(false);
    }
    if !shipper.parkable() {
        // A continued chain whose file differs from its tip (SQLite's switch to WAL rewrote
        // page 1, a hook wrote), or a claim with nothing published: one ship makes the file
        // the tip, as before a release.
        let differs = shipper.inherited_unshipped().await.unwrap_or(true);
        if (differs || shipper.claim().chain_tip().is_none())
            && let Err(e) = crate::shipper::ship_once(inner, &mut shipper).await
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
        Err(reason) => Err(poison(inner, &mut shipper, &reason).await),
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
/// unparked: the caller then parks others beyond the active limit ([`Active::enforce`],
/// once its own job is queued and the shipper lock released).
///
/// # Errors
/// As [`unpark_locked`].
pub(crate) async fn unpark(inner: &Arc<Inner>) -> Result<bool, Error> {
    let mut shipper = inner.shipper.lock().await;
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
    shipper: &mut Shipper,
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
        Err(reason) => Err(poison(inner, shipper, &reason).await),
    }
}

/// Stops the org because its files were found changed (I13) and ends it as the shipper
/// task does: release the claim (a successor claims at once), close, delete the files.
async fn poison(inner: &Inner, shipper: &mut Shipper, reason: &str) -> Error {
    let err = inner.acks.poison(reason);
    if let Err(e) = shipper.release().await {
        tracing::warn!(org = %inner.acks.org, round = inner.acks.round, error = %e, "release after poisoning failed");
    }
    inner.close().await;
    err
}

/// After a ship a park needed failed: a stopped org is ended as the shipper task ends it
/// (poisoned: claim released; claim lost: nothing more published), then closed; any other
/// failure leaves it serving.
async fn stop_after(inner: &Inner, shipper: &mut Shipper, e: Error) -> Result<(), Error> {
    match e {
        Error::Poisoned { .. } => {
            if let Err(e) = shipper.release().await {
                tracing::warn!(org = %inner.acks.org, round = inner.acks.round, error = %e, "release after poisoning failed");
            }
        }
        Error::Fenced { .. } | Error::ClaimLost { .. } => {}
        _ => return Ok(()),
    }
    inner.close().await;
    Err(e)
}
