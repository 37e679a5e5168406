//! Walks' listings of one run, shared (`docs/design.md` 3g, "Costs"): a walk may read any
//! listing whose LIST **began after the walk did**, since that listing is as new as one the
//! walk would take itself. Listings of a run are taken one at a time; a walk that arrives
//! while one is in flight waits, and the first walk through after it lists once for every
//! walk that arrived before that LIST began. A takeover's thousand walks of a holder's run
//! (each retried while the holder drains) then cost a LIST per LIST round trip, not one per
//! walk.
//!
//! A sealed run's listing serves every later walk as well (`SealedListings`): this module
//! covers runs still being written.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::Error;
use crate::format::journal::RunName;
use crate::journal::io::RunListing;

/// Runs whose newest listing is kept at most: the oldest go first.
const MAX_RUNS: usize = 64;

/// The shared listings of runs, per handle.
#[derive(Debug, Default)]
pub(crate) struct RunListings {
    /// Ticks once per walk's start and once per LIST's start: orders the two.
    epoch: AtomicU64,
    runs: Mutex<HashMap<RunName, Arc<PerRun>>>,
}

#[derive(Debug, Default)]
struct PerRun {
    /// Held while this run is listed: one LIST of it at a time.
    listing: tokio::sync::Mutex<()>,
    /// The newest listing and the epoch its LIST began at.
    newest: Mutex<Option<(u64, Arc<RunListing>)>>,
}

impl RunListings {
    /// The epoch a walk begins at: it may use listings begun after it.
    pub(crate) fn begin(&self) -> u64 {
        self.epoch.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// A listing of `run` from `from` up whose LIST began after `since`: the newest kept
    /// one when it qualifies, else one `list` takes now from `from` (never lower: a walk
    /// reads no header below its own entry, where retention may be deleting, T1-T3).
    ///
    /// # Errors
    /// `list`'s.
    pub(crate) async fn get<F, Fut>(
        &self,
        run: &RunName,
        from: u64,
        since: u64,
        list: F,
    ) -> Result<RunListing, Error>
    where
        F: FnOnce(u64) -> Fut,
        Fut: std::future::Future<Output = Result<RunListing, Error>>,
    {
        let per_run = self.per_run(run);
        if let Some(found) = per_run.usable(from, since) {
            return Ok(found);
        }
        let _one_at_a_time = per_run.listing.lock().await;
        if let Some(found) = per_run.usable(from, since) {
            return Ok(found);
        }
        let began = self.begin();
        let listing = Arc::new(list(from).await?);
        *per_run.newest.lock().unwrap_or_else(|p| p.into_inner()) = Some((began, listing.clone()));
        Ok(listing.part(from, from..))
    }

    fn per_run(&self, run: &RunName) -> Arc<PerRun> {
        let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        if !runs.contains_key(run) && runs.len() >= MAX_RUNS {
            // Runs nobody is listing now go first; the map is small.
            let idle: Vec<RunName> = runs
                .iter()
                .filter(|(_, p)| Arc::strong_count(p) == 1)
                .map(|(r, _)| r.clone())
                .collect();
            for r in idle {
                runs.remove(&r);
            }
        }
        runs.entry(run.clone()).or_default().clone()
    }
}

impl PerRun {
    fn newest(&self) -> Option<(u64, Arc<RunListing>)> {
        self.newest
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn usable(&self, from: u64, since: u64) -> Option<RunListing> {
        let (began, listing) = self.newest()?;
        (began > since && listing.from <= from).then(|| listing.part(from, from..))
    }
}

#[cfg(test)]
mod tests;
