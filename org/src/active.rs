//! The orgs of a registry that hold a connection, and how many may (I14): beyond the limit
//! the least recently used idle ones park (`crate::park::enforce`). Generic over the member
//! type so this set knows nothing of an org's tenure; it only counts, shares the page-cache
//! budget and picks victims.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::sync::lock;

/// What the set reads of a member to pick the orgs that park.
pub(crate) trait Member {
    /// Unique per open handle: its key in the set (one org id may have a closing handle and
    /// a new one at once).
    fn serial(&self) -> u64;
    /// Requests queued, running or waiting for a ship: a busy member never parks.
    fn busy(&self) -> usize;
    /// When it was last used, in ticks of a process-wide counter (larger is later).
    fn last_used(&self) -> u64;
}

/// The members holding a connection, and how many may: beyond `limit` the least recently
/// used idle ones park.
pub(crate) struct Active<T> {
    limit: usize,
    orgs: Mutex<HashMap<u64, Weak<T>>>,
    /// The shipped-page caches' half of the memory budget, in pages, shared by the orgs
    /// active now, never below `cache_floor` (an org's share at the active limit).
    cache_pages: usize,
    cache_floor: usize,
    /// `cache_pages / active orgs`: each active org's shipper bounds its cache by it at every
    /// ship (`Shipper::share_cache_limit`).
    cache_limit: Arc<AtomicUsize>,
}

impl<T: Member> Active<T> {
    /// A set that keeps at most `limit` orgs active (at least one), whose shipped-page
    /// caches share `cache_pages` pages, at least `cache_floor` each.
    pub(crate) fn new(limit: usize, cache_pages: usize, cache_floor: usize) -> Arc<Active<T>> {
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

    pub(crate) fn insert(&self, member: &Arc<T>) {
        let mut orgs = lock(&self.orgs);
        orgs.insert(member.serial(), Arc::downgrade(member));
        self.share(orgs.len());
    }

    pub(crate) fn remove(&self, serial: u64) {
        let mut orgs = lock(&self.orgs);
        orgs.remove(&serial);
        self.share(orgs.len());
    }

    /// The least recently used idle members beyond the limit, never `keep` (the org a
    /// request is about to use): the ones to park.
    pub(crate) fn beyond_limit(&self, keep: u64) -> Vec<Arc<T>> {
        let orgs = lock(&self.orgs);
        let excess = orgs.len().saturating_sub(self.limit);
        if excess == 0 {
            return Vec::new();
        }
        let mut idle: Vec<Arc<T>> = orgs
            .iter()
            .filter(|(serial, _)| **serial != keep)
            .filter_map(|(_, w)| w.upgrade())
            .filter(|m| m.busy() == 0)
            .collect();
        idle.sort_by_key(|m| m.last_used());
        idle.truncate(excess);
        idle
    }
}
