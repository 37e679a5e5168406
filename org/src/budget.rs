//! What an open org may cost, fixed once per registry from its settings and the process's
//! descriptor limit (I14: memory and open files bounded by settings, not by the number of
//! orgs).
//!
//! - **Descriptors.** An open org holds [`FDS_PER_ORG`] descriptors for as long as it is open
//!   (SQLite's database and WAL, the two the capture reads through, the claim's lock file).
//!   None of them may be closed early (I13: closing a descriptor of a file SQLite has open
//!   drops its locks), so the only way to stay within `RLIMIT_NOFILE` is to open fewer orgs:
//!   the registry raises the soft limit to the hard one when it starts, keeps
//!   [`RESERVED_FDS`] for everything else, and opens at most `(limit - reserved) /
//!   FDS_PER_ORG` orgs at once.
//! - **Memory.** [`crate::Settings::memory_budget_bytes`] is split evenly across the open-org
//!   limit: half of an org's share is its SQLite page cache (`PRAGMA cache_size`), half its
//!   shipper's cache of shipped pages (`ShipPolicy::delta_cache_pages`, never above the
//!   configured value). A share below [`MIN_ORG_BYTES`] lowers the open-org limit instead,
//!   so the caches of all open orgs together never exceed the budget.

use crate::Settings;

/// Descriptors an open org keeps: the SQLite connection's database and WAL files, the
/// capture's read-only descriptors of the same two files (`idem_replica::sqlite::OwnedFiles`),
/// and the claim's lock file. No `-shm` (exclusive locking keeps the WAL index in memory).
/// Measured by `org/tests/writer_pool.rs`.
pub const FDS_PER_ORG: u64 = 5;

/// Descriptors a registry leaves to the rest of the process (sockets, store connections,
/// hydrate's temporary files, logs) when it sizes its open-org limit.
pub const RESERVED_FDS: u64 = 1024;

/// The smallest cache share of one open org, in bytes: 16 KiB of SQLite page cache and four
/// 4 KiB pages of the shipper's cache. SQLite works with less than that but reads every page
/// again from the operating system's cache.
pub const MIN_ORG_BYTES: u64 = 32 << 10;

/// Pages of the shipper's cache are counted at SQLite's default page size; an org with
/// larger pages holds proportionally more.
const SHIP_PAGE_BYTES: u64 = 4096;

/// An org's limits, derived once per registry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Budget {
    /// Orgs open at once: `Settings::max_open_orgs`, lowered by the descriptor limit and the
    /// memory budget.
    pub open_orgs: usize,
    /// SQLite page cache of each writer connection, in KiB.
    pub sqlite_cache_kib: u64,
    /// Shipped pages each shipper keeps.
    pub ship_cache_pages: usize,
}

impl Budget {
    /// The limits for `settings` when the process may hold `fd_limit` descriptors (`None`:
    /// unknown, no descriptor cap).
    pub(crate) fn plan(settings: &Settings, fd_limit: Option<u64>) -> Budget {
        let by_fds = fd_limit.map_or(usize::MAX, |limit| {
            usize::try_from(limit.saturating_sub(RESERVED_FDS) / FDS_PER_ORG)
                .unwrap_or(usize::MAX)
                .max(1)
        });
        let by_memory = usize::try_from(settings.memory_budget_bytes / MIN_ORG_BYTES)
            .unwrap_or(usize::MAX)
            .max(1);
        let open_orgs = settings.max_open_orgs.min(by_fds).min(by_memory).max(1);
        let share = settings.memory_budget_bytes / open_orgs as u64;
        let sqlite_cache_kib = (share / 2 / 1024).max(MIN_ORG_BYTES / 2 / 1024);
        let ship_pages = usize::try_from(share / 2 / SHIP_PAGE_BYTES).unwrap_or(usize::MAX);
        let ship_cache_pages = settings
            .ship
            .delta_cache_pages
            .min(ship_pages.max((MIN_ORG_BYTES / 2 / SHIP_PAGE_BYTES) as usize));
        Budget {
            open_orgs,
            sqlite_cache_kib,
            ship_cache_pages,
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
    fn the_budget_is_split_across_the_open_org_limit() {
        let s = Settings {
            max_open_orgs: 1000,
            memory_budget_bytes: 256 << 20,
            ..Settings::default()
        };
        let b = Budget::plan(&s, None);
        assert_eq!(b.open_orgs, 1000);
        // 268 435 456 / 1000 = 268 435 bytes: 131 KiB of page cache, 32 shipped pages.
        assert_eq!(b.sqlite_cache_kib, 131);
        assert_eq!(b.ship_cache_pages, 32);
    }

    #[test]
    fn descriptors_and_memory_lower_the_open_org_limit() {
        let s = Settings {
            max_open_orgs: 10_000,
            memory_budget_bytes: 64 << 20,
            ..Settings::default()
        };
        // 64 MiB / 32 KiB = 2048 orgs by memory; (20 000 - 1024) / 5 = 3795 by descriptors.
        assert_eq!(Budget::plan(&s, Some(20_000)).open_orgs, 2048);
        let s = Settings {
            memory_budget_bytes: 1 << 30,
            ..s
        };
        let b = Budget::plan(&s, Some(20_000));
        assert_eq!(b.open_orgs, 3795);
        assert!(b.sqlite_cache_kib * 1024 * b.open_orgs as u64 <= 1 << 29);
    }

    #[test]
    fn the_ship_cache_never_exceeds_the_configured_pages() {
        let mut s = Settings {
            max_open_orgs: 1,
            ..Settings::default()
        };
        s.ship.delta_cache_pages = 100;
        assert_eq!(Budget::plan(&s, None).ship_cache_pages, 100);
    }
}
