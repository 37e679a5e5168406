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
    /// Smallest gap between two retention runs of one org, in milliseconds (the first run
    /// waits this long after the org opens). With `retain_every_ships` alone, an org whose
    /// full snapshots come often ran retention often; this bounds a busy org's retention to
    /// a few store requests per interval, not per acknowledgement (I14). Default 60000.
    pub retain_interval_ms: u64,
    /// When a ship is a full snapshot, a delta or a compacted delta; the WAL bound; the
    /// page cache per open org (see [`idem_replica::ShipPolicy`]).
    pub ship: idem_replica::ShipPolicy,
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
            retain_interval_ms: 60_000,
            ship: idem_replica::ShipPolicy::default(),
            retention: idem_replica::Retention::default(),
            force_claim: false,
        }
    }
}
