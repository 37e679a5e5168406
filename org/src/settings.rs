//! Plain settings of a [`crate::Registry`] (serde-able, with defaults).

/// Tunables of a registry. Components (store, clock, schema hook) are given to the builder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistrySettings {
    /// Most orgs held open (claimed) at once; idle orgs beyond it are released (final ship,
    /// Release entry) and closed, least recently used first, so claims, open files and memory
    /// stay bounded. Default 10 000. The registry lowers it to what the process's open-files
    /// limit allows: a parked org keeps [`crate::FDS_PER_PARKED_ORG`] descriptor, after
    /// [`crate::RESERVED_FDS`] for the rest and room for one active org;
    /// [`crate::Registry::max_open_orgs`] tells the limit in force.
    pub max_open_orgs: usize,
    /// Most open orgs with a SQLite connection at once. Beyond it the least recently used
    /// idle active org is *parked*: it stays open and claimed, but its connection and the
    /// descriptors captures read through are closed and its caches dropped, until its next
    /// request reopens it and proves its file is still the chain's tip (no store request).
    /// Default `usize::MAX`: as many as the open-files limit and the memory budget allow.
    /// The registry lowers it to `max_open_orgs`, to the descriptors the open orgs leave
    /// (an active org keeps [`crate::FDS_PER_ORG`], a parked one
    /// [`crate::FDS_PER_PARKED_ORG`]: `(limit - reserved - open) / 4`) and to
    /// `memory_budget_bytes / `[`crate::MIN_ORG_BYTES`]; [`crate::Registry::max_active_orgs`]
    /// tells the limit in force.
    pub max_active_orgs: usize,
    /// Worker threads that run the writer jobs (transactions, reads, captures) of every open
    /// org of the registry, one job per org at a time. Threads start on demand up to this
    /// many, however many orgs are open. A job holds its worker until it ends: while this
    /// many long jobs run, other orgs wait. Default `min(16, 2 × available cores)`; 0 is
    /// refused.
    pub writer_threads: usize,
    /// Memory for the caches of all active orgs together, in bytes: split evenly across
    /// `max_active_orgs` (a parked org has none), half to each writer connection's SQLite
    /// page cache (`PRAGMA cache_size`), half to its shipper's cache of shipped pages (at
    /// most `ship.delta_cache_pages`). Default 320 MiB: 10 240 orgs at the smallest share.
    /// Connections, statements and the WAL index cost about the same per active org on
    /// top (see docs/design.md, section 3c).
    pub memory_budget_bytes: u64,
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
    /// Keep a released org's database file on this host, and reuse it at the next acquire
    /// here when the store proves it still holds the newest published state (its checksum
    /// equals the newest entry's), downloading nothing. Default true; false deletes the
    /// file at release and every acquire downloads.
    pub reuse_released_files: bool,
    /// Releases [`crate::Registry::shutdown`] runs at once. Default
    /// [`crate::SHUTDOWN_CONCURRENCY`]; 0 is taken as 1.
    pub shutdown_concurrency: usize,
    /// The warm takeover: claiming, in the background, the orgs a draining process is
    /// releasing and those a crashed one held (see [`WarmSettings`]). Off by default.
    pub warm: WarmSettings,
    /// The journal (docs/design.md section 3g): one store object per group-commit tick
    /// acknowledges every org of the process that committed during it. Off by default.
    pub journal: JournalSettings,
}

/// Settings of a registry's journal (docs/design.md, section 3g, "The org layer on the
/// journal"). With `enabled`, every acquire walks the org (K0) and takes it into this
/// process's run: a never-written or released org by a claim naming the run (K1b), an org
/// whose walk ends in this process's own run by an attach (K4), an org of a dead process's
/// run by one adopt seal for that whole run (K2). An org held per org by a live or dead
/// per-org holder stays on the per-org path. Commits ship as cumulative sections in the
/// run's batches; a request is acknowledged once the batch holding its commit is inside
/// the run's resolved prefix (J1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalSettings {
    /// Use the journal. Default false: every org ships per org (3, 3e).
    pub enabled: bool,
    /// Batches in flight at most, as a span of slots (1..=`MAX_SHIP_WINDOW`). Default 4.
    pub window: u64,
    /// Ms after which the newest batch in flight is late and another is issued (J7); 0 =
    /// half the measured mean landing time. Default 0.
    pub late_ms: u64,
    /// Bytes of pages (uncompressed) an org's cumulative section may reach before the
    /// org is checkpointed into its own log (J5), at its next ship. Default 64 KiB.
    pub section_bytes: u64,
    /// J5's chain bound: once this many delta checkpoints lead down to an org's newest
    /// snapshot checkpoint, its next checkpoint is a snapshot, so a hydrate or a restore
    /// reads at most this many deltas (plus the snapshot and one section). Default 16.
    pub max_chain_deltas: u64,
    /// WAL bytes past which a journal org's capture checkpoints the WAL into the database
    /// file. Smaller than [`idem_replica::ShipPolicy::wal_checkpoint_bytes`] (4 MiB): a
    /// journal process holds thousands of small orgs, and each WAL is local disk that a
    /// close writes back. Default 256 KiB.
    pub wal_checkpoint_bytes: u64,
    /// Batches between two retention runs of the process's run (T1-T3: batches below
    /// every org's walk entry, once `retention.keep_ms` old by the store's clock); 0 =
    /// never. Default 1024.
    pub retain_every_batches: u64,
    /// J7's lag, in batches: an org whose newest checkpoint is this many batches behind
    /// the run's newest is checkpointed at its next ship, or released if it is idle, so
    /// a walk reads at most about this many batch headers and retention is never held
    /// back for ever by a quiet org; 0 = never. Default 3 900.
    pub max_lag_batches: u64,
}

impl Default for JournalSettings {
    fn default() -> Self {
        JournalSettings {
            enabled: false,
            window: 4,
            late_ms: 0,
            section_bytes: 64 << 10,
            max_chain_deltas: 16,
            wal_checkpoint_bytes: 256 << 10,
            retain_every_batches: 1024,
            max_lag_batches: 3_900,
        }
    }
}

/// The warm takeover's default poll period, ms ([`WarmSettings::poll_ms`]): a drain is
/// seen within a second, at one LIST a second (on S3 about $0.018 an hour, docs/design.md
/// section 3f), whatever the lease term.
pub const WARM_POLL_MS: u64 = 1_000;

/// Settings of a registry's warm takeover (docs/design.md, section 3f). A watcher task lists
/// `processes/` every `poll_ms`, GETs the process leases whose version changed, and claims
/// the orgs a draining process lists once each one's Release entry is at the head; and it
/// claims again the orgs this registry was refused with a held lease, once the wait the
/// refusal named has passed. Every claim is the normal one, never forced (I7, I15).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmSettings {
    /// Run the watcher (needs a tokio runtime when the registry is built). Refused together
    /// with [`RegistrySettings::force_claim`], which would take orgs from live holders. Default false.
    pub enabled: bool,
    /// Background claims (claim and hydrate or resume) in flight at once. Default
    /// [`crate::SHUTDOWN_CONCURRENCY`], the releases a draining predecessor runs at once, so
    /// a successor takes orgs as fast as they are released; 0 is taken as 1.
    pub concurrency: usize,
    /// Ms between two LISTs of `processes/`: how late a drain is seen at most when no
    /// request for one of its orgs reached this registry first (a refusal lists at once).
    /// Its own period, not the lease's: default [`WARM_POLL_MS`] (1 s, 3 600 LISTs an hour);
    /// 0 = the replica's renewal period, `lease_ms / 3`. Each poll is one LIST, plus one GET
    /// per other process whose lease changed since the last (each renews once per its own
    /// renewal period, however often this lists). A draining process keeps its lease listed
    /// for two of its own polls, 5 s at most ([`crate::Registry::shutdown`]): a fleet runs one
    /// setting.
    pub poll_ms: u64,
    /// Ms before a background claim of an org a draining process lists, refused because
    /// its Release entry is not at the head yet, is tried again. Default 200.
    pub retry_ms: u64,
    /// Most orgs remembered after a refusal with a held lease, to claim once the holder's
    /// lease lapses; beyond it, new refusals are not remembered. Default 10 000.
    pub remember: usize,
    /// Ms, on the store's clock, within which another process's journal release seal is a
    /// drain to follow (K2.6): a claim that takes an org free at a younger seal opens that
    /// run's other orgs in the background. An older seal (an idle org's last holder, gone
    /// long ago) is not followed. Default 300 000 (5 minutes); 0 follows none.
    pub follow_ms: u64,
}

impl Default for WarmSettings {
    fn default() -> Self {
        WarmSettings {
            enabled: false,
            concurrency: crate::SHUTDOWN_CONCURRENCY,
            poll_ms: WARM_POLL_MS,
            retry_ms: 200,
            remember: 10_000,
            follow_ms: 300_000,
        }
    }
}

impl Default for RegistrySettings {
    fn default() -> Self {
        RegistrySettings {
            max_open_orgs: 10_000,
            max_active_orgs: usize::MAX,
            writer_threads: default_writer_threads(),
            memory_budget_bytes: 320 << 20,
            busy_timeout_ms: 5_000,
            min_ship_interval_ms: 0,
            retain_every_ships: 64,
            retain_interval_ms: 60_000,
            ship: idem_replica::ShipPolicy::default(),
            retention: idem_replica::Retention::default(),
            force_claim: false,
            reuse_released_files: true,
            shutdown_concurrency: crate::SHUTDOWN_CONCURRENCY,
            warm: WarmSettings::default(),
            journal: JournalSettings::default(),
        }
    }
}

/// `min(16, 2 × available cores)`: enough to keep the cores busy while some jobs wait on the
/// disk, few enough that thousands of orgs cost a handful of threads.
fn default_writer_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(4, |n| n.get().saturating_mul(2))
        .min(16)
}
