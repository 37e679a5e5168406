//! What open orgs may cost, fixed once per registry from its settings and the process's
//! descriptor limit (I14: memory and open files bounded by settings, not by the number of
//! orgs).
//!
//! - **Descriptors.** An *active* org (one with a connection) holds [`FDS_PER_ORG`]
//!   descriptors: SQLite's database and WAL, the two the capture reads through, the claim's
//!   lock file. None of them may be closed while its connection is open (I13: closing a
//!   descriptor of a file SQLite has open drops its locks). A *parked* org (idle, connection
//!   closed, claim kept: `crate::park`) holds [`FDS_PER_PARKED_ORG`]: its lock file, whose
//!   `flock` keeps other processes' cleanup off its files (I8). The registry raises the soft
//!   `RLIMIT_NOFILE` to the hard one when it starts, keeps [`RESERVED_FDS`] for everything
//!   else, and with `usable = limit - RESERVED_FDS` allows
//!   - open orgs: `usable - 4 × floor`, where `floor` is the active orgs wanted (the
//!     setting and the memory budget), at most `usable / 4 / 4`: a quarter of the
//!     descriptors stays with activation, since an active limit below the request
//!     concurrency parks an org at every acquire and the registry thrashes; and
//!   - active orgs: `(usable - open × 1) / 4` (the 4 descriptors an active org holds
//!     beyond its lock file), at least that floor.
//!
//!   With the common hard limit of 20 000 and 10 000 open orgs: `(18 976 - 10 000) / 4 =
//!   2 244` active orgs, 18 976 descriptors in all; asked for 30 000 open orgs, the same
//!   limit allows `18 976 - 4 × 1 186 = 14 232` of them with 1 186 active.
//! - **Memory.** [`crate::RegistrySettings::memory_budget_bytes`] is split evenly across the
//!   active-org limit (a parked org has no caches): half of an org's share is its SQLite
//!   page cache (`PRAGMA cache_size`). The other half of the budget is the shippers' caches
//!   of shipped pages, shared by the orgs active *now* (`crate::active::Active`): each gets
//!   `ship_pages_total / active` pages, at least its share at the active limit and at most
//!   `ShipPolicy::delta_cache_pages`, read at every ship; so a lone busy org keeps the
//!   configured cache (pages patched against their last content, about half the bytes of
//!   whole pages: BENCHMARKS.md, P3) and a thousand active orgs split it. A cache shrinks to
//!   a new bound at its next ship or park: until then the total can pass the budget by what
//!   the orgs active before held. A share below [`MIN_ORG_BYTES`] lowers the active-org
//!   limit instead, so the caches of all active orgs together stay within the budget.

use crate::RegistrySettings;

/// Descriptors an active org keeps: the SQLite connection's database and WAL files, the
/// capture's read-only descriptors of the same two files (`idem_replica::sqlite::OwnedFiles`),
/// and the claim's lock file. No `-shm` (exclusive locking keeps the WAL index in memory).
/// Measured by `org/tests/pool_threads.rs`.
pub const FDS_PER_ORG: u64 = 5;

/// Descriptors a parked org keeps: the claim's lock file. Measured by `org/tests/park.rs`.
pub const FDS_PER_PARKED_ORG: u64 = 1;

/// Descriptors a registry leaves to the rest of the process (sockets, store connections,
/// hydrate's temporary files, logs) when it sizes its open-org and active-org limits.
pub const RESERVED_FDS: u64 = 1024;

/// Activation keeps at least `1 / ACTIVATION_SHARE` of the usable descriptors.
const ACTIVATION_SHARE: u64 = 4;

/// The smallest cache share of one active org, in bytes: 16 KiB of SQLite page cache and
/// four 4 KiB pages of the shipper's cache. SQLite works with less than that but reads every
/// page again from the operating system's cache.
pub const MIN_ORG_BYTES: u64 = 32 << 10;

/// Pages of the shipper's cache are counted at SQLite's default page size; an org with
/// larger pages holds proportionally more.
const SHIP_PAGE_BYTES: u64 = 4096;

/// Descriptors an active org holds beyond a parked one's.
const FDS_TO_ACTIVATE: u64 = FDS_PER_ORG - FDS_PER_PARKED_ORG;

/// An org's limits, derived once per registry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Budget {
    /// Orgs open (claimed) at once: `RegistrySettings::max_open_orgs`, lowered by the descriptor
    /// limit.
    pub open_orgs: usize,
    /// Orgs with a connection at once: `RegistrySettings::max_active_orgs`, lowered to the open-org
    /// limit, the descriptors left by the open orgs and the memory budget.
    pub active_orgs: usize,
    /// SQLite page cache of each writer connection, in KiB.
    pub sqlite_cache_kib: u64,
    /// Shipped pages each shipper keeps.
    pub ship_cache_pages: usize,
    /// Pages all shipped-page caches may hold together (the budget's other half): the orgs
    /// active at a time share it, each getting at least `ship_cache_pages` and at most
    /// `ShipPolicy::delta_cache_pages`.
    pub ship_pages_total: usize,
}

fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

impl Budget {
    /// The limits for `settings` when the process may hold `fd_limit` descriptors (`None`:
    /// unknown, no descriptor cap).
    pub(crate) fn plan(settings: &RegistrySettings, fd_limit: Option<u64>) -> Budget {
        let usable = fd_limit.map(|limit| limit.saturating_sub(RESERVED_FDS));
        let by_memory = to_usize(settings.memory_budget_bytes / MIN_ORG_BYTES).max(1);
        let wanted_active = settings.max_active_orgs.min(by_memory).max(1);
        // Activation keeps its share of the descriptors before open orgs take the rest: an
        // active limit below the request concurrency parks an org at every acquire (a
        // checkpoint, often a ship first, one after another) and the registry thrashes.
        let activation_floor = usable.map_or(0, |u| {
            let share = (u / ACTIVATION_SHARE / FDS_TO_ACTIVATE).max(1);
            (wanted_active as u64).min(share)
        });
        let by_fds_open = usable.map_or(usize::MAX, |u| {
            let reserved = activation_floor.saturating_mul(FDS_TO_ACTIVATE);
            to_usize(u.saturating_sub(reserved) / FDS_PER_PARKED_ORG).max(1)
        });
        let open_orgs = settings.max_open_orgs.min(by_fds_open).max(1);
        let by_fds_active = usable.map_or(usize::MAX, |u| {
            let parked = (open_orgs as u64).saturating_mul(FDS_PER_PARKED_ORG);
            to_usize(u.saturating_sub(parked) / FDS_TO_ACTIVATE).max(1)
        });
        let active_orgs = wanted_active.min(open_orgs).min(by_fds_active).max(1);
        let share = settings.memory_budget_bytes / active_orgs as u64;
        let sqlite_cache_kib = (share / 2 / 1024).max(MIN_ORG_BYTES / 2 / 1024);
        let ship_pages = to_usize(share / 2 / SHIP_PAGE_BYTES);
        let ship_cache_pages = settings
            .ship
            .delta_cache_pages
            .min(ship_pages.max((MIN_ORG_BYTES / 2 / SHIP_PAGE_BYTES) as usize));
        Budget {
            open_orgs,
            active_orgs,
            sqlite_cache_kib,
            ship_cache_pages,
            ship_pages_total: to_usize(settings.memory_budget_bytes / 2 / SHIP_PAGE_BYTES),
        }
    }
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit and returns the soft limit in force
/// (`None` when it cannot be read: the registry then applies no descriptor cap).
pub(crate) fn raise_fd_limit() -> Option<u64> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    // An unlimited hard limit is still capped by the kernel's `nr_open` (1 Mi by default).
    let target = hard.min(1 << 20);
    if soft < target {
        match setrlimit(Resource::RLIMIT_NOFILE, target, hard) {
            Ok(()) => return Some(target),
            Err(e) => {
                tracing::warn!(soft, hard, error = %e, "could not raise the open-files limit")
            }
        }
    }
    Some(soft)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_split_across_the_active_org_limit() {
        let s = RegistrySettings {
            max_open_orgs: 1000,
            memory_budget_bytes: 256 << 20,
            ..RegistrySettings::default()
        };
        let b = Budget::plan(&s, None);
        assert_eq!((b.open_orgs, b.active_orgs), (1000, 1000));
        // 268 435 456 / 1000 = 268 435 bytes: 131 KiB of page cache, 32 shipped pages.
        assert_eq!(b.sqlite_cache_kib, 131);
        assert_eq!(b.ship_cache_pages, 32);
        let s = RegistrySettings {
            max_active_orgs: 100,
            ..s
        };
        // Parked orgs have no caches: 100 active orgs share the budget.
        assert_eq!(Budget::plan(&s, None).sqlite_cache_kib, 1310);
    }

    #[test]
    fn ten_thousand_open_orgs_fit_in_twenty_thousand_descriptors() {
        let s = RegistrySettings {
            max_open_orgs: 10_000,
            memory_budget_bytes: 1 << 30,
            ..RegistrySettings::default()
        };
        let b = Budget::plan(&s, Some(20_000));
        // (20 000 - 1024 - 10 000 × 1) / 4 = 2244 active orgs.
        assert_eq!((b.open_orgs, b.active_orgs), (10_000, 2244));
        let fds = b.open_orgs as u64 * FDS_PER_PARKED_ORG
            + b.active_orgs as u64 * (FDS_PER_ORG - FDS_PER_PARKED_ORG);
        assert!(fds <= 20_000 - RESERVED_FDS, "{fds}");
        assert!(b.sqlite_cache_kib * 1024 * b.active_orgs as u64 <= 1 << 29);
    }

    #[test]
    fn descriptors_and_memory_lower_the_limits() {
        let s = RegistrySettings {
            max_open_orgs: 10_000,
            memory_budget_bytes: 64 << 20,
            ..RegistrySettings::default()
        };
        // 64 MiB / 32 KiB = 2048 active orgs by memory; 2244 by descriptors.
        assert_eq!(Budget::plan(&s, Some(20_000)).active_orgs, 2048);
        // A tiny descriptor limit: a quarter of it (104 / 4 / 4 = 6 active orgs) stays with
        // activation, open orgs take one each of the rest.
        let b = Budget::plan(&s, Some(RESERVED_FDS + 104));
        assert_eq!((b.open_orgs, b.active_orgs), (80, 6));
        // More open orgs asked for than descriptors allow: they never squeeze activation
        // below its share (an active limit of 1 parked an org at every acquire).
        let s = RegistrySettings {
            max_open_orgs: 30_000,
            ..s
        };
        let b = Budget::plan(&s, Some(20_000));
        assert_eq!((b.open_orgs, b.active_orgs), (14_232, 1186));
        let fds = b.open_orgs as u64 + b.active_orgs as u64 * FDS_TO_ACTIVATE;
        assert!(fds <= 20_000 - RESERVED_FDS, "{fds}");
        // Fewer active orgs wanted than the share: open orgs get the rest.
        let s = RegistrySettings {
            max_active_orgs: 10,
            ..s
        };
        let b = Budget::plan(&s, Some(20_000));
        assert_eq!((b.open_orgs, b.active_orgs), (18_936, 10));
    }

    #[test]
    fn the_ship_cache_never_exceeds_the_configured_pages() {
        let mut s = RegistrySettings {
            max_open_orgs: 1,
            ..RegistrySettings::default()
        };
        s.ship.delta_cache_pages = 100;
        assert_eq!(Budget::plan(&s, None).ship_cache_pages, 100);
    }
}
