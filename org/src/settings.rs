//! Plain settings of a [`crate::Registry`] (serde-able, with defaults).

/// Tunables of a registry. Components (store, clock, schema hook) are given to the builder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Most orgs held open at once; idle orgs beyond it are released and closed (LRU), so open
    /// files, threads and memory stay bounded with thousands of orgs. Default 256.
    pub max_open_orgs: usize,
    /// How long a request waits for SQLite's write lock, in milliseconds. Default 5000.
    pub busy_timeout_ms: u64,
    /// Smallest gap between two ships of one org, in milliseconds (0 = ship as soon as the
    /// previous ship ends). A gap batches more requests per ship at the cost of latency.
    pub min_ship_interval_ms: u64,
    /// Run snapshot retention after a full snapshot, at most once per this many ships of an
    /// org (0 = never). Only a new full snapshot makes older entries deletable.
    pub retain_every_ships: u64,
    /// Ship a full snapshot instead of a delta once the compressed deltas since the last full
    /// snapshot exceed this percentage of its compressed size. Default 100.
    pub delta_budget_percent: u64,
    /// Ship a full snapshot after this many deltas in a row, bounding the objects a hydrate
    /// reads. Default 4096.
    pub max_deltas: u64,
    /// Ship a full snapshot when the last one is older than this, in milliseconds (0 = no
    /// schedule). Default 3 600 000 (one hour).
    pub snapshot_interval_ms: u64,
    /// Checkpoint the org's WAL (TRUNCATE) after a delta capture once it reaches this many
    /// bytes, keeping it bounded under steady load. Default 4 MiB.
    pub wal_checkpoint_bytes: u64,
    /// Ship a compacted delta (every page changed since the last full snapshot, applied to it
    /// directly) after this many deltas, when it is no larger than what those deltas carried,
    /// so a hydrate reads the snapshot, it and the deltas after it (0 = never). Default 64.
    pub compact_every_deltas: u64,
    /// Pages per open org whose last shipped content the shipper keeps, so a page changed
    /// again ships encoded against it (about its changed bytes instead of a page). Memory
    /// per open org is up to this many pages (default 1024: 4 MiB of 4 KiB pages); 0 ships
    /// whole pages.
    pub delta_cache_pages: usize,
    /// The retention policy applied then.
    pub retention: idem_replica::Retention,
    /// Claim even when another writer's advisory lease is live (operator override).
    pub force_claim: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_open_orgs: 256,
            busy_timeout_ms: 5_000,
            min_ship_interval_ms: 0,
            retain_every_ships: 64,
            delta_budget_percent: 100,
            max_deltas: 4096,
            snapshot_interval_ms: 3_600_000,
            wal_checkpoint_bytes: 4 << 20,
            delta_cache_pages: 1024,
            compact_every_deltas: 64,
            retention: idem_replica::Retention::default(),
            force_claim: false,
        }
    }
}
