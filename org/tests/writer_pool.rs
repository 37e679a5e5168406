//! Writers on a bounded pool (docs/design.md, section 3c): every org's jobs run in the order
//! they were queued and never two at once, a busy or blocked org does not hold up the others
//! while workers are free, a panic in `apply` leaves the worker serving, and each connection's
//! page cache is its share of the memory budget.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use common::{BoxErr, R, replica};
use idem_org::{Registry, RegistrySettings};
use idem_replica::OrgId;
use object_store::memory::InMemory;

const TABLE: &str = "CREATE TABLE IF NOT EXISTS seen (n INTEGER NOT NULL);";

async fn pool_registry(
    dir: &std::path::Path,
    settings: RegistrySettings,
) -> Result<Registry, BoxErr> {
    let replica = replica(Arc::new(InMemory::new()), None).await?;
    Ok(Registry::builder(dir, replica, "A")
        .settings(settings)
        .on_open(|c| c.execute_batch(TABLE))
        .build()?)
}

fn width(n: usize) -> RegistrySettings {
    RegistrySettings {
        writer_threads: n,
        ..RegistrySettings::default()
    }
}

/// An apply that records `n` in the org's table.
fn record(
    n: i64,
) -> impl FnOnce(&rusqlite::Transaction<'_>) -> rusqlite::Result<Vec<u8>> + Clone + Send + 'static {
    move |tx| {
        tx.execute("INSERT INTO seen (n) VALUES (?1)", [n])?;
        Ok(Vec::new())
    }
}

/// Every org's jobs run in the order they were queued, with 40 orgs sharing 3 workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_orgs_jobs_run_in_queue_order_while_many_orgs_share_the_pool() -> R {
    let dir = tempfile::tempdir()?;
    let reg = pool_registry(dir.path(), width(3)).await?;
    let mut tasks = Vec::new();
    for o in 0..40 {
        let org = reg.acquire(&OrgId::new(&format!("org-{o}"))?).await?;
        tasks.push(tokio::spawn(async move {
            // join_all polls the futures in order, and a request is queued at its first poll
            // (nothing is awaited before): so they are queued 0, 1, 2, ...
            let keys: Vec<String> = (0..30).map(|n| format!("k{n}")).collect();
            let calls = keys.iter().zip(0..).map(|(k, n)| org.once(k, record(n)));
            for out in futures::future::join_all(calls).await {
                out?;
            }
            let seen: Vec<i64> = org
                .read(|c| {
                    let mut st = c.prepare("SELECT n FROM seen ORDER BY rowid")?;
                    st.query_map([], |r| r.get(0))?.collect()
                })
                .await?;
            Ok::<_, BoxErr>(seen)
        }));
    }
    for t in tasks {
        assert_eq!(t.await??, (0..30).collect::<Vec<i64>>());
    }
    assert!(
        reg.writer_threads() <= 3,
        "{} threads",
        reg.writer_threads()
    );
    reg.shutdown().await;
    Ok(())
}

/// A job that blocks its worker stops its own org only: with a free worker, other orgs'
/// requests are answered while it blocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_job_on_one_org_leaves_other_orgs_progressing() -> R {
    let dir = tempfile::tempdir()?;
    let reg = pool_registry(dir.path(), width(2)).await?;
    let slow = reg.acquire(&OrgId::new("slow")?).await?;
    let (started_tx, started) = std::sync::mpsc::channel::<()>();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let released = Arc::new(Mutex::new(released));
    let blocked = tokio::spawn(async move {
        slow.once("long", move |tx| {
            let _ = started_tx.send(());
            // Holds the worker until the test lets it go.
            let _ = released.lock().map(|r| r.recv());
            tx.execute("INSERT INTO seen (n) VALUES (0)", [])?;
            Ok::<_, rusqlite::Error>(Vec::new())
        })
        .await
    });
    tokio::task::spawn_blocking(move || started.recv()).await??;
    for o in 0..8 {
        let org = OrgId::new(&format!("fast-{o}"))?;
        let out = reg.once(&org, "k", record(o)).await?;
        assert!(out.applied);
    }
    assert!(!blocked.is_finished(), "the long job ran to its end early");
    release.send(())?;
    assert!(blocked.await??.applied);
    reg.shutdown().await;
    Ok(())
}

/// A hot org cannot starve another on a one-thread pool: after a batch of its jobs, the
/// other scheduled org runs before its next batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_org_yields_the_worker_to_another_org_after_a_batch() -> R {
    let dir = tempfile::tempdir()?;
    let reg = pool_registry(dir.path(), width(1)).await?;
    let hot = reg.acquire(&OrgId::new("hot")?).await?;
    let other = reg.acquire(&OrgId::new("other")?).await?;
    let ticket = Arc::new(AtomicU64::new(0));
    let (release, released) = std::sync::mpsc::channel::<()>();
    let released = Arc::new(Mutex::new(released));
    let take = |t: &Arc<AtomicU64>| t.fetch_add(1, Ordering::SeqCst);
    // The hot org's first job holds the only worker until the other org has queued its job,
    // so all 200 hot jobs are queued before it.
    let keys: Vec<String> = (0..200).map(|n| format!("h{n}")).collect();
    let mut hot_calls = Vec::new();
    for (n, key) in keys.iter().enumerate() {
        let (ticket, gate) = (ticket.clone(), (n == 0).then(|| released.clone()));
        hot_calls.push(hot.once(key, move |tx: &rusqlite::Transaction<'_>| {
            if let Some(gate) = gate {
                let _ = gate.lock().map(|r| r.recv());
            }
            let t = take(&ticket);
            tx.execute("INSERT INTO seen (n) VALUES (?1)", [t as i64])?;
            Ok::<_, rusqlite::Error>(t.to_be_bytes().to_vec())
        }));
    }
    let mut hot_all = futures::future::join_all(hot_calls);
    assert!(futures::poll!(&mut hot_all).is_pending());
    let t2 = ticket.clone();
    let mut other_call = Box::pin(other.once("o", move |_tx| {
        Ok::<_, rusqlite::Error>(take(&t2).to_be_bytes().to_vec())
    }));
    assert!(futures::poll!(&mut other_call).is_pending());
    release.send(())?;
    let (hot_out, other_out) = futures::join!(hot_all, other_call);
    let tick = |r: &[u8]| -> Result<u64, BoxErr> { Ok(u64::from_be_bytes(r.try_into()?)) };
    let other_ticket = tick(&other_out?.result)?;
    let mut hot_last = 0;
    for out in hot_out {
        hot_last = hot_last.max(tick(&out?.result)?);
    }
    // The hot org's first batch (16 jobs) runs, then the other org, then the rest.
    assert!(
        other_ticket <= 16 && other_ticket < hot_last,
        "the other org ran at ticket {other_ticket}, the hot org's last at {hot_last}"
    );
    reg.shutdown().await;
    Ok(())
}

/// A panic in `apply` on a one-thread pool: the worker survives, the org and the others
/// go on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_apply_leaves_the_only_worker_serving_every_org() -> R {
    let dir = tempfile::tempdir()?;
    let reg = pool_registry(dir.path(), width(1)).await?;
    let a = reg.acquire(&OrgId::new("a")?).await?;
    let b = reg.acquire(&OrgId::new("b")?).await?;
    let err = a
        .once("boom", |_tx| -> rusqlite::Result<Vec<u8>> {
            panic!("bug in apply")
        })
        .await
        .err()
        .ok_or("a panicking apply was acknowledged")?;
    assert_eq!(err.kind(), idem_org::ErrorKind::Rejected, "{err:?}");
    assert!(a.once("k", record(1)).await?.applied);
    assert!(b.once("k", record(2)).await?.applied);
    // A panicking read is caught the same way.
    let read = a
        .read(|_c| -> rusqlite::Result<()> { panic!("bug in read") })
        .await;
    assert!(read.is_err());
    assert!(a.is_serving() && b.is_serving());
    assert!(!a.once("k", record(1)).await?.applied);
    assert_eq!(reg.writer_threads(), 1);
    reg.shutdown().await;
    Ok(())
}

/// Each writer connection's page cache is its share of the memory budget, whatever the
/// application's hook set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_connection_caches_its_share_of_the_memory_budget() -> R {
    let dir = tempfile::tempdir()?;
    let settings = RegistrySettings {
        max_open_orgs: 256,
        memory_budget_bytes: 64 << 20,
        ..RegistrySettings::default()
    };
    let replica = replica(Arc::new(InMemory::new()), None).await?;
    let reg = Registry::builder(dir.path(), replica, "A")
        .settings(settings)
        // A hook that asks for a large cache: the budget wins.
        .on_open(|c| c.execute_batch("PRAGMA cache_size = -65536;"))
        .build()?;
    // 64 MiB / 256 orgs = 256 KiB per org, half of it SQLite's page cache.
    assert_eq!(reg.sqlite_cache_kib(), 128);
    for name in ["a", "b"] {
        let org = reg.acquire(&OrgId::new(name)?).await?;
        let size: i64 = org
            .read(|c| c.query_row("PRAGMA cache_size", [], |r| r.get(0)))
            .await?;
        assert_eq!(size, -128);
    }
    reg.shutdown().await;
    Ok(())
}

/// The shippers' half of the memory budget is shared by the orgs active now: one busy org
/// keeps the configured cache of shipped pages (so its deltas patch pages against their last
/// content), each of many active orgs gets an even share, and an org that parks gives its
/// share back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_page_caches_share_the_budget_among_the_orgs_active_now() -> R {
    let dir = tempfile::tempdir()?;
    let settings = RegistrySettings {
        max_open_orgs: 256,
        max_active_orgs: 64,
        memory_budget_bytes: 64 << 20,
        ..RegistrySettings::default()
    };
    let configured = settings.ship.delta_cache_pages;
    let reg = pool_registry(dir.path(), settings).await?;
    // 32 MiB of shipped pages = 8192 pages of 4 KiB; 64 active orgs at most: 128 each.
    let first = reg.acquire(&OrgId::new("solo")?).await?;
    assert_eq!(reg.active_orgs(), 1);
    assert_eq!(reg.ship_cache_pages(), configured.min(8192));
    let mut orgs = vec![first];
    for i in 0..31 {
        orgs.push(reg.acquire(&OrgId::new(&format!("o{i}"))?).await?);
    }
    assert_eq!(reg.active_orgs(), 32);
    assert_eq!(reg.ship_cache_pages(), configured.min(8192 / 32));
    for i in 0..64 {
        orgs.push(reg.acquire(&OrgId::new(&format!("p{i}"))?).await?);
    }
    // Beyond the active limit idle orgs park: the share never falls below 8192 / 64.
    assert!(reg.active_orgs() <= 64, "{}", reg.active_orgs());
    assert_eq!(reg.ship_cache_pages(), 8192 / 64);
    reg.shutdown().await;
    Ok(())
}
