//! What a shipper remembers of its chain between ships.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::policy::{COMPACTION_FLOOR, FLOOR_MAX_DELTAS, ShipPolicy};
use crate::Claim;
use crate::chain::position::Inherited;
use crate::live::wal::{Frames, WalPos};

/// Where the next delta capture starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WalState {
    /// Unknown: the next ship must be a full snapshot.
    Lost,
    /// A new WAL generation begins after a checkpoint emptied the file: read from offset 0.
    Fresh,
    /// After the last captured commit frame.
    At(WalPos),
}

/// What the shipper keeps of the chain it extends: its WAL position, pending pages, page
/// cache and policy counters.
pub(super) struct ShipState {
    pub(super) wal: WalState,
    pub(super) page_size: u32,
    pub(super) db_pages: u32,
    /// Pages captured but not yet published: a delta whose ship failed is merged into the
    /// next one.
    pub(super) pending: BTreeMap<u32, Vec<u8>>,
    full_bytes: u64,
    since_full_bytes: u64,
    since_full_deltas: u64,
    /// When the chain's snapshot was shipped or taken over, on the replica's injected
    /// clock's monotonic time ([`crate::Clock::monotonic_ms`]), so a manual clock drives
    /// [`ShipPolicy::snapshot_interval_ms`].
    full_at_monotonic_ms: u64,
    /// Age of the chain's snapshot when this shipper took the chain over, in ms (0 for a
    /// snapshot it shipped): [`ShipPolicy::snapshot_interval_ms`] counts from the snapshot.
    full_age_ms: u64,
    /// When the chain's snapshot was published, ms since the Unix epoch.
    pub(super) full_at_ms: u64,
    /// The chain's snapshot was shipped by this shipper: only then may it compact (a
    /// compaction must be of its snapshot's round, and `changed` covers only what this
    /// shipper saw).
    own_snapshot: bool,
    /// The chain was taken over from a hydrate or a reused file and nothing shipped yet: the
    /// first delta must first take every page of the database file that differs from the
    /// tip (the open path may have written it outside the WAL, see [`ShipState::inherit`]).
    pub(super) diff_file: bool,
    /// Pages changed since the chain's snapshot (shipped or pending): a compacted delta
    /// carries them all.
    changed: BTreeSet<u32>,
    /// Deltas, and their compressed bytes, since the last compaction (or snapshot).
    window_deltas: u64,
    window_bytes: u64,
    /// Database pages in the last full snapshot (with `full_bytes`: bytes per stored page).
    full_pages: u64,
    /// Published content of pages shipped in this chain's deltas: the base a later delta
    /// encodes a page against (spans or a zstd patch). Exactly the chain tip's content for
    /// each page it holds; at most `ShipPolicy::delta_cache_pages` pages.
    pub(super) published: HashMap<u32, Vec<u8>>,
    /// The commit sequence the last capture proved from its pages: a capture whose new
    /// frames do not touch the counter page must hold exactly this one.
    pub(super) proven: Option<u64>,
}

impl ShipState {
    /// An empty ship state, `monotonic_ms` being the injected clock's monotonic time now.
    pub(super) fn new(monotonic_ms: u64) -> ShipState {
        ShipState {
            wal: WalState::Lost,
            page_size: 0,
            db_pages: 0,
            pending: BTreeMap::new(),
            full_bytes: 0,
            since_full_bytes: 0,
            since_full_deltas: 0,
            full_at_monotonic_ms: monotonic_ms,
            full_age_ms: 0,
            full_at_ms: 0,
            own_snapshot: false,
            diff_file: false,
            changed: BTreeSet::new(),
            window_deltas: 0,
            window_bytes: 0,
            full_pages: 0,
            published: HashMap::new(),
            proven: None,
        }
    }

    /// Whether the next ship must be a full snapshot, `monotonic_ms` being the injected
    /// clock's monotonic time now.
    pub(super) fn wants_full(&self, claim: &Claim, p: &ShipPolicy, monotonic_ms: u64) -> bool {
        claim.chain_tip().is_none()
            || self.wal == WalState::Lost
            || self.over_budget(p)
            || self.since_full_deltas >= p.max_deltas
            || (p.snapshot_interval_ms > 0
                && monotonic_ms
                    .saturating_sub(self.full_at_monotonic_ms)
                    .saturating_add(self.full_age_ms)
                    >= p.snapshot_interval_ms)
    }

    /// The deltas since the snapshot outweigh `delta_budget_percent` of it and, while the
    /// chain is shorter than [`FLOOR_MAX_DELTAS`], `delta_budget_floor_bytes` as well.
    fn over_budget(&self, p: &ShipPolicy) -> bool {
        let percent = self.since_full_bytes.saturating_mul(100)
            > self.full_bytes.saturating_mul(p.delta_budget_percent);
        let floored = self.since_full_deltas < FLOOR_MAX_DELTAS
            && self.since_full_bytes <= p.delta_budget_floor_bytes;
        percent && !floored
    }

    /// Takes over a chain the claim continues: a database of `db_pages` pages of `page_size`
    /// bytes at the chain's tip, installed with an empty WAL, holding commit `commit`; the
    /// budget counters start from what the chain already weighs (`inherited`), and its
    /// snapshot is `age_ms` old at `monotonic_ms` (the injected clock's monotonic time), so
    /// the bounds on what a hydrate reads hold across rounds.
    ///
    /// The next delta reads the WAL from its start, after taking every page of the file
    /// that differs from the tip: SQLite's switch of the installed file to WAL mode rewrites
    /// page 1 (its change counter) in the file itself, and an open hook may checkpoint.
    pub(super) fn inherit(
        &mut self,
        page_size: u32,
        db_pages: u32,
        inherited: &Inherited,
        age_ms: u64,
        monotonic_ms: u64,
    ) {
        self.restart();
        self.wal = WalState::Fresh;
        self.page_size = page_size;
        self.db_pages = db_pages;
        self.full_bytes = inherited.snapshot_bytes;
        self.full_pages = inherited.snapshot_pages;
        self.since_full_bytes = inherited.delta_bytes;
        self.since_full_deltas = inherited.deltas;
        self.full_at_monotonic_ms = monotonic_ms;
        self.full_age_ms = age_ms;
        self.full_at_ms = inherited.snapshot_at_ms;
        self.own_snapshot = false;
        self.diff_file = true;
        self.changed.clear();
        (self.window_deltas, self.window_bytes) = (0, 0);
        self.proven = Some(inherited.commit);
    }

    /// What the chain weighs now, for a writer that continues it from this position.
    pub(super) fn weight(&self, commit: u64) -> Inherited {
        Inherited {
            commit,
            snapshot_bytes: self.full_bytes,
            snapshot_pages: self.full_pages,
            snapshot_at_ms: self.full_at_ms,
            delta_bytes: self.since_full_bytes,
            deltas: self.since_full_deltas,
        }
    }

    /// A compaction is due after `compact_every_deltas` deltas, and worth it only while its
    /// estimated size — the pages changed since the snapshot, at the last snapshot's stored
    /// bytes per page (whole pages: a compaction cannot XOR-encode) — is at most a quarter of
    /// what the deltas since the last compaction shipped, or at most [`COMPACTION_FLOOR`]:
    /// bytes per acknowledgement then grow by at most a quarter (or about 1 KiB per delta
    /// when deltas are tiny), and a hydrate reads the snapshot, it and the deltas after it
    /// instead of the whole chain. A database that grows or changes everywhere fails the test
    /// and keeps its chain until the budget ships a full snapshot.
    pub(super) fn wants_compaction(&self, p: &ShipPolicy) -> bool {
        let per_page = self.full_bytes / self.full_pages.max(1);
        let estimate = (self.changed.len() as u64).saturating_mul(per_page);
        self.own_snapshot
            && p.compact_every_deltas > 0
            && self.window_deltas >= p.compact_every_deltas
            && estimate <= (self.window_bytes / 4).max(COMPACTION_FLOOR)
    }

    /// Forgets the chain before a full snapshot: its position, pending pages and cache.
    pub(super) fn restart(&mut self) {
        self.wal = WalState::Lost;
        self.pending.clear();
        self.published.clear();
        self.diff_file = false;
    }

    pub(super) fn full_shipped(
        &mut self,
        wal: WalState,
        page_size: u32,
        db_pages: u32,
        bytes: u64,
        at_ms: u64,
        monotonic_ms: u64,
    ) {
        self.wal = wal;
        self.own_snapshot = true;
        self.full_age_ms = 0;
        self.full_at_ms = at_ms;
        self.page_size = page_size;
        self.db_pages = db_pages;
        self.full_bytes = bytes;
        self.since_full_bytes = 0;
        self.since_full_deltas = 0;
        self.changed.clear();
        self.window_deltas = 0;
        self.window_bytes = 0;
        self.full_pages = u64::from(db_pages);
        self.full_at_monotonic_ms = monotonic_ms;
    }

    /// Takes a delta capture's committed frames into the pending pages and moves the WAL
    /// position past them (or to a fresh generation when the capture's checkpoint emptied
    /// the WAL); returns the database size in pages.
    pub(super) fn take_frames(&mut self, frames: Frames, reset: bool) -> u32 {
        self.wal = if reset {
            WalState::Fresh
        } else {
            frames.end.map_or(self.wal, WalState::At)
        };
        if let Some(n) = frames.db_pages {
            self.db_pages = n;
        }
        let db_pages = self.db_pages;
        self.pending.extend(frames.pages);
        self.pending.retain(|p, _| *p <= db_pages);
        self.changed.retain(|p| *p <= db_pages);
        db_pages
    }

    /// Every page a compacted delta must carry: changed since the snapshot, or pending.
    pub(super) fn compaction_pages(&self) -> Vec<u32> {
        let mut wanted: Vec<u32> = self.changed.iter().copied().collect();
        wanted.extend(self.pending.keys().copied());
        wanted.sort_unstable();
        wanted.dedup();
        wanted
    }

    /// Records a published delta: its pages are the tip's now, and enter the page cache of
    /// at most `cap` pages.
    pub(super) fn delta_shipped(&mut self, compacted: bool, bytes: u64, cap: usize) {
        if compacted {
            (self.window_deltas, self.window_bytes) = (0, 0);
        } else {
            self.window_deltas += 1;
            self.window_bytes += bytes;
        }
        let done = std::mem::take(&mut self.pending);
        self.changed.extend(done.keys().copied());
        // The tip now holds these pages; pages past the end are gone from it.
        let db_pages = self.db_pages;
        self.published.retain(|p, _| *p <= db_pages);
        // Beyond the bound the cache restarts with the newest pages: the pages changed most
        // recently are the ones most likely to change again.
        if self.published.len() + done.len() > cap {
            self.published.clear();
        }
        if done.len() <= cap {
            self.published.extend(done);
        }
        // The budget and the count bound what a hydrate reads: after a compaction that is
        // the compacted delta and what follows it.
        if compacted {
            (self.since_full_bytes, self.since_full_deltas) = (bytes, 1);
        } else {
            self.since_full_bytes += bytes;
            self.since_full_deltas += 1;
        }
    }
}
