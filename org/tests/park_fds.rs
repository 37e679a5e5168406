//! What parked orgs cost the process (docs/design.md, section 3c; issue 16): an active org
//! holds `FDS_PER_ORG` descriptors, a parked one `FDS_PER_PARKED_ORG` (its lock file), and
//! every parked org still serves first runs and replays, reopening without a store request.
//! Alone in its binary: it counts the process's descriptors and threads, which other tests
//! running beside it would change; its two tests take turns.
//!
//! `IDEM_PARK_ORGS=10000 cargo test --release -p idem-org --test park_fds -- --nocapture`
//! runs the scale test at 10 000 open orgs (it prints threads, descriptors and resident
//! memory).

mod common;

use std::sync::{Arc, Mutex};

use common::{BoxErr, R, effect, proc_entries, registry, replica, status_kib};
use futures::StreamExt;
use idem_org::{FDS_PER_ORG, FDS_PER_PARKED_ORG, RegistrySettings};
use idem_replica::OrgId;
use object_store::memory::InMemory;

/// The two tests count the same process's descriptors: one at a time.
static TURN: Mutex<()> = Mutex::new(());

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(2)
        .enable_all()
        .build()
}

/// Issue 16: every open org held five descriptors, so 20 000 descriptors capped a process
/// at 3 795 open orgs. With 10 active of 200 open, the process holds 10 × 5 + 190 × 1.
#[test]
fn parked_orgs_hold_one_descriptor_and_reopen_without_a_store_request() -> R {
    parked_orgs_hold_one_descriptor(RegistrySettings::default())
}

/// The same on the journal (3g): a journal org parks as a per-org one does, and its tenure
/// stays attached to the run while parked.
#[test]
fn parked_journal_orgs_hold_one_descriptor_and_reopen_without_a_store_request() -> R {
    parked_orgs_hold_one_descriptor(common::journal::settings(16 * 1024))
}

fn parked_orgs_hold_one_descriptor(base: RegistrySettings) -> R {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    const ORGS: usize = 200;
    const ACTIVE: usize = 10;
    runtime()?.block_on(async {
        let dir = tempfile::tempdir()?;
        let replica = replica(Arc::new(InMemory::new()), None).await?;
        let settings = RegistrySettings {
            max_active_orgs: ACTIVE,
            writer_threads: 2,
            ..base
        };
        let reg = registry(dir.path(), replica.clone(), "A", settings)?;
        assert_eq!(reg.max_active_orgs(), ACTIVE);
        let fds_before = proc_entries("fd")?;
        let name = |i: usize| format!("org-{i:03}");
        for i in 0..ORGS {
            let out = reg
                .once(&OrgId::new(&name(i))?, "k", effect(&name(i), "k"))
                .await?;
            assert!(out.applied);
        }
        assert_eq!(reg.open_orgs().len(), ORGS);
        assert_eq!(reg.active_orgs(), ACTIVE);
        let parked = reg.open_orgs().iter().filter(|o| o.is_parked()).count();
        assert_eq!(parked, ORGS - ACTIVE);
        let fds = proc_entries("fd")? - fds_before;
        let expected =
            ACTIVE * FDS_PER_ORG as usize + (ORGS - ACTIVE) * FDS_PER_PARKED_ORG as usize;
        eprintln!("{ORGS} open, {ACTIVE} active: {fds} descriptors ({expected} expected)");
        assert!(
            fds <= expected + 8,
            "{fds} descriptors, {expected} expected"
        );

        // Replays on every org, oldest first, so each is parked when its request comes:
        // it reopens from its own file, with no claim and no download.
        let replay = |i: usize| {
            let reg = reg.clone();
            async move {
                let out = reg
                    .once(&OrgId::new(&name(i))?, "k", effect(&name(i), "again"))
                    .await?;
                assert!(!out.applied, "{} replays", name(i));
                assert_eq!(out.result, b"k");
                Ok::<_, BoxErr>(())
            }
        };
        // What a replay costs on an active org: its confirmation.
        let before = replica.store_requests();
        replay(ORGS - 1).await?;
        let one = replica.store_requests();
        let per_replay = (one.get - before.get, one.list - before.list);
        let before = replica.store_requests();
        for i in 0..ORGS - ACTIVE {
            replay(i).await?;
        }
        let after = replica.store_requests();
        let n = (ORGS - ACTIVE) as u64;
        assert_eq!(
            after.get - before.get,
            n * per_replay.0,
            "{before:?} -> {after:?}"
        );
        assert_eq!(
            after.list - before.list,
            n * per_replay.1,
            "{before:?} -> {after:?}"
        );
        let unparks: u64 = reg.open_orgs().iter().map(|o| o.stats().unparks).sum();
        assert_eq!(unparks, n, "each replay reopened its parked org");
        // First runs on every org, parked or not.
        for i in 0..ORGS {
            let out = reg
                .once(&OrgId::new(&name(i))?, "k2", effect(&name(i), "k2"))
                .await?;
            assert!(out.applied);
        }
        assert_eq!(reg.active_orgs(), ACTIVE);
        let fds = proc_entries("fd")? - fds_before;
        assert!(
            fds <= expected + 8,
            "{fds} descriptors, {expected} expected"
        );
        reg.shutdown().await;
        common::until(|| proc_entries("fd").is_ok_and(|n| n <= fds_before + 2)).await?;
        Ok::<_, BoxErr>(())
    })
}

/// Issue 16: 10 000 open orgs in one process, at most 64 threads and 1 GiB resident. Opens
/// `IDEM_PARK_ORGS` orgs (default 1 000: 10 000 takes minutes in a debug build) with one
/// first run each, under the registry's default limits (the active-org limit derived from
/// the open-files limit), and checks threads and descriptors.
#[test]
fn thousands_of_open_orgs_fit_in_the_descriptor_limit_by_parking_idle_ones() -> R {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let orgs: usize = std::env::var("IDEM_PARK_ORGS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1000);
    let pool = 4;
    runtime()?.block_on(async {
        let dir = tempfile::tempdir()?;
        let settings = RegistrySettings {
            writer_threads: pool,
            ..RegistrySettings::default()
        };
        let reg = registry(
            dir.path(),
            replica(Arc::new(InMemory::new()), None).await?,
            "A",
            settings,
        )?;
        assert!(
            reg.max_open_orgs() >= orgs,
            "open limit {}",
            reg.max_open_orgs()
        );
        let (threads_before, fds_before) = (proc_entries("task")?, proc_entries("fd")?);
        let rss_before = status_kib("VmRSS:").unwrap_or(0);
        let began = idem_base::Stopwatch::start();
        let opened: Vec<Result<(), BoxErr>> = futures::stream::iter(0..orgs)
            .map(|i| {
                let reg = reg.clone();
                async move {
                    let name = format!("org-{i:05}");
                    let out = reg
                        .once(&OrgId::new(&name)?, "k", effect(&name, "k"))
                        .await?;
                    assert!(out.applied);
                    Ok(())
                }
            })
            .buffer_unordered(8)
            .collect()
            .await;
        for o in opened {
            o?;
        }
        let elapsed = began.elapsed();
        assert_eq!(reg.open_orgs().len(), orgs);
        let active = reg.active_orgs();
        let threads = proc_entries("task")?;
        let fds = proc_entries("fd")? - fds_before;
        let rss = status_kib("VmRSS:").unwrap_or(0);
        let hwm = status_kib("VmHWM:").unwrap_or(0);
        eprintln!(
            "{orgs} open orgs in {elapsed:.1?}: {active} active (limit {}), {threads} threads \
             ({threads_before} before), {fds} descriptors, RSS {} MiB (peak {} MiB, {} MiB \
             before), {} writer threads",
            reg.max_active_orgs(),
            rss / 1024,
            hwm / 1024,
            rss_before / 1024,
            reg.writer_threads(),
        );
        assert!(active <= reg.max_active_orgs() + 8, "{active} active");
        let bound = active * FDS_PER_ORG as usize + (orgs - active) * FDS_PER_PARKED_ORG as usize;
        assert!(fds <= bound + 16, "{fds} descriptors, bound {bound}");
        assert!(threads <= 64, "{threads} threads");
        assert!(reg.writer_threads() <= pool);
        // A sample still serves: replays, parked or not.
        for i in (0..orgs).step_by((orgs / 20).max(1)) {
            let name = format!("org-{i:05}");
            let out = reg
                .once(&OrgId::new(&name)?, "k", effect(&name, "k"))
                .await?;
            assert!(!out.applied);
        }
        reg.shutdown().await;
        common::until(|| proc_entries("fd").is_ok_and(|n| n <= fds_before + 2)).await?;
        Ok::<_, BoxErr>(())
    })
}
