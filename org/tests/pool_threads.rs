//! Hundreds of open orgs cost the pool's threads, not a thread each, and a fixed number of
//! descriptors each (docs/design.md, section 3c). Alone in its binary: it counts the
//! process's threads and descriptors, which other tests running beside it would change.
//!
//! `IDEM_POOL_ORGS=3700 cargo test --release -p idem-org --test pool_threads -- --nocapture`
//! measures at another size (it prints threads, descriptors and resident memory).

mod common;

use std::sync::Arc;

use common::{BoxErr, R, effect, proc_entries, registry, replica, status_kib};
use futures::StreamExt;
use idem_org::RegistrySettings;
use idem_replica::OrgId;
use object_store::memory::InMemory;

/// Regression for issue 16: 100 open orgs were 103 threads (one writer thread each).
#[test]
fn five_hundred_open_orgs_run_on_the_pools_threads_with_five_descriptors_each() -> R {
    let orgs: usize = std::env::var("IDEM_POOL_ORGS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(500);
    let pool = 4;
    // Two async workers and at most two blocking threads (hydrate, compression, opening a
    // connection): the runtime's own threads are bounded too.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
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
        assert!(reg.max_open_orgs() >= orgs, "limit {}", reg.max_open_orgs());
        let (threads_before, fds_before) = (proc_entries("task")?, proc_entries("fd")?);
        let rss_before = status_kib("VmRSS:").unwrap_or(0);
        let opened: Vec<Result<(), BoxErr>> = futures::stream::iter(0..orgs)
            .map(|i| {
                let reg = reg.clone();
                async move {
                    let name = format!("org-{i:05}");
                    let org = reg.acquire(&OrgId::new(&name)?).await?;
                    assert!(org.once("k", effect(&name, "k")).await?.applied);
                    Ok(())
                }
            })
            .buffer_unordered(8)
            .collect()
            .await;
        for o in opened {
            o?;
        }
        assert_eq!(reg.open_orgs().len(), orgs);
        let threads = proc_entries("task")?;
        let fds = proc_entries("fd")?;
        let per_org = (fds - fds_before) as f64 / orgs as f64;
        eprintln!(
            "{orgs} open orgs: {threads} threads ({threads_before} before), {} descriptors \
             ({per_org:.2} per org), RSS {} KiB ({rss_before} KiB before), {} writer threads \
             started",
            fds - fds_before,
            status_kib("VmRSS:").unwrap_or(0),
            reg.writer_threads(),
        );
        // The test harness's threads, the runtime's 2 + 2, and the pool's 4.
        assert!(reg.writer_threads() <= pool);
        assert!(
            threads <= threads_before.max(4) + pool + 2,
            "{threads} threads with {orgs} open orgs ({threads_before} before)"
        );
        assert_eq!(per_org.round() as u64, idem_org::FDS_PER_ORG, "{per_org}");
        // Every one of them still serves: a replay on each.
        for i in (0..orgs).step_by(50) {
            let name = format!("org-{i:05}");
            let out = reg
                .once(&OrgId::new(&name)?, "k", effect(&name, "k"))
                .await?;
            assert!(!out.applied);
        }
        reg.shutdown().await;
        // Closing every org closes its descriptors once its shipper task has ended (the
        // capture's descriptors go with the last handle on the org).
        common::until(|| proc_entries("fd").is_ok_and(|n| n <= fds_before + 2)).await?;
        Ok::<_, BoxErr>(())
    })
}
