//! When a ship is a full snapshot, a delta or a compacted delta, and what a WAL and the page
//! cache may hold: the plain settings of a [`crate::Shipper`].

/// Tunables of shipping one live database (serde-able plain values, with defaults).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct ShipPolicy {
    /// Ship a full snapshot instead of a delta once the compressed deltas since the last full
    /// snapshot exceed this percentage of its compressed size. Default 100.
    pub delta_budget_percent: u64,
    /// The deltas since the last full snapshot may weigh up to this many compressed bytes
    /// whatever [`ShipPolicy::delta_budget_percent`] allows, while they number fewer than
    /// [`FLOOR_MAX_DELTAS`](crate::FLOOR_MAX_DELTAS): a small database then ships deltas (one create-only PUT each)
    /// instead of a full snapshot every few acknowledgements (three sequential PUTs on the
    /// acknowledgement's path). A hydrate reads at most this much more. Default 1 MiB;
    /// 0 = the percentage alone.
    pub delta_budget_floor_bytes: u64,
    /// Ship a full snapshot after this many deltas in a row, bounding the objects a hydrate
    /// reads. Default 4096.
    pub max_deltas: u64,
    /// Ship a full snapshot when the last one is older than this, in milliseconds (0 = no
    /// schedule). Default 3 600 000 (one hour).
    pub snapshot_interval_ms: u64,
    /// Checkpoint the WAL (TRUNCATE) after a delta capture once it reaches this many bytes,
    /// keeping it bounded under steady load. Default 4 MiB.
    pub wal_checkpoint_bytes: u64,
    /// Ship a compacted delta (every page changed since the last full snapshot, applied to it
    /// directly) after this many deltas, when it is small against what those deltas carried,
    /// so a hydrate reads the snapshot, it and the deltas after it (0 = never). Default 64.
    pub compact_every_deltas: u64,
    /// Pages whose last shipped content the shipper keeps, so a page changed again ships
    /// encoded against it (about its changed bytes instead of a page). Memory is up to this
    /// many pages per shipper (default 1024: 4 MiB of 4 KiB pages); 0 ships whole pages.
    pub delta_cache_pages: usize,
}

impl Default for ShipPolicy {
    fn default() -> Self {
        ShipPolicy {
            delta_budget_percent: 100,
            delta_budget_floor_bytes: 1 << 20,
            max_deltas: 4096,
            snapshot_interval_ms: 3_600_000,
            wal_checkpoint_bytes: 4 << 20,
            compact_every_deltas: 64,
            delta_cache_pages: 1024,
        }
    }
}

/// The longest chain of deltas since a full snapshot that
/// [`ShipPolicy::delta_budget_floor_bytes`] may keep going: it bounds the entries a hydrate
/// reads (a chain this shipper compacts stays shorter, at `compact_every_deltas`; a chain
/// continued from a hydrate does not compact until its own snapshot).
pub const FLOOR_MAX_DELTAS: u64 = 128;

/// A compaction this small (estimated stored bytes) is always worth the objects it saves a
/// hydrate, whatever the deltas it supersedes weighed.
pub(crate) const COMPACTION_FLOOR: u64 = 64 << 10;
