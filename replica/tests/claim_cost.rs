//! What an acquire costs on the store (I14, I16). Guards against a claim whose cost grows with
//! the length of the log (a GET per entry), against an acquire that writes or reads a
//! per-org lease object, lists the log twice or reads an entry twice, against a hydrate
//! whose downloads wait for the claim instead of going out beside it, and against a first
//! ship after a hydrate that restarts the chain with a full snapshot: the requests by
//! operation and the sequential round trips (depth) of claim + hydrate + first ship of a
//! small org, after a graceful release and after a crash.
//!
//! Depth is measured deterministically: every request is delayed by one constant under
//! paused tokio time ([`LatencyStore`] with a constant shape), and the depth is the longest
//! chain of requests each starting at or after the previous one ended.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use idem_replica::conformance::test_snapshot;
use idem_replica::latency::{LatencyStore, Op, Recorded, Shape, Shapes};
use idem_replica::{Delta, ManualClock, OrgId, Replica, Settings, Snapshot, StoreRequests};
use object_store::ObjectStore;
use object_store::memory::InMemory;

type R = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// The delay every traced request takes.
const DELAY: Duration = Duration::from_millis(28);

/// A store over `inner` that delays every request by [`DELAY`].
fn constant(inner: Arc<dyn ObjectStore>) -> Arc<LatencyStore> {
    Arc::new(LatencyStore::new(
        inner,
        Shapes::all(Shape::Constant(DELAY)),
        0,
    ))
}

/// The pages of `next` that differ from `prev` (both images of one page size), as a delta.
fn diff(prev: &Snapshot, next: &Snapshot) -> Result<Delta, idem_replica::Error> {
    let (prev, next_bytes) = (prev.bytes(), next.bytes());
    // SQLite's header: the page size, big-endian, at offset 16.
    let ps = usize::from(u16::from_be_bytes([next_bytes[16], next_bytes[17]]));
    let mut pages = BTreeMap::new();
    for (i, page) in next_bytes.chunks(ps).enumerate() {
        if prev.get(i * ps..(i + 1) * ps) != Some(page) {
            pages.insert(i as u32 + 1, page.to_vec());
        }
    }
    Delta::new(
        ps as u32,
        (next_bytes.len() / ps) as u32,
        pages,
        next.commit(),
    )
}

const LEASE_MS: u64 = 3_000;

fn settings() -> Settings {
    Settings {
        lease_ms: LEASE_MS,
        ..Settings::default()
    }
}

/// A small org on `store` (a claim, two snapshots), released or not by its first holder.
async fn small_org(store: Arc<dyn ObjectStore>, clock: &Arc<ManualClock>, release: bool) -> R {
    let a = Replica::open_with(store, "t", settings(), clock.clone(), None).await?;
    let org = OrgId::new("acme")?;
    let mut claim = a.claim(&org, "a", false).await?;
    a.ship(&mut claim, test_snapshot(3)?).await?;
    a.ship(&mut claim, test_snapshot(5)?).await?;
    if release {
        a.release(&mut claim).await?;
    }
    Ok(())
}

/// Claim + hydrate + first ship by a fresh process, traced; a crashed holder's process lease
/// has been seen unchanged for a whole watch first.
async fn acquire(
    store: Arc<LatencyStore>,
    clock: &Arc<ManualClock>,
    crashed: bool,
) -> Result<Recorded, Box<dyn std::error::Error + Send + Sync>> {
    acquire_with(store, clock, crashed, settings()).await
}

/// [`acquire`] by a process with `b_settings`.
async fn acquire_with(
    store: Arc<LatencyStore>,
    clock: &Arc<ManualClock>,
    crashed: bool,
    b_settings: Settings,
) -> Result<Recorded, Box<dyn std::error::Error + Send + Sync>> {
    let b = Replica::open_with(store.clone(), "t", b_settings, clock.clone(), None).await?;
    let org = OrgId::new("acme")?;
    if crashed {
        assert!(
            b.claim(&org, "b", false).await.is_err(),
            "a crashed holder's claim was taken at once"
        );
        clock.advance(LEASE_MS + LEASE_MS / 10);
    }
    let trace = store.trace();
    let mut claim = b.claim_to_hydrate(&org, "b", None, false).await?;
    let tmp = tempfile::tempdir()?;
    let hydrated = b.hydrate(&mut claim, &tmp.path().join("db")).await?;
    assert_eq!(hydrated.commit, 5);
    // The first ship continues the hydrated chain: a delta, inline in its entry.
    assert_eq!(claim.chain_tip(), hydrated.position);
    let delta = diff(&test_snapshot(5)?, &test_snapshot(6)?)?;
    b.ship_delta(&mut claim, delta).await?;
    let spans = trace.finish();
    assert!(
        spans
            .requests
            .iter()
            .all(|s| !s.path.ends_with("lease.json")),
        "an org lease was read or written: {spans:#?}"
    );
    let log_reads: Vec<&str> = spans
        .requests
        .iter()
        .filter(|s| s.op == Op::Get && s.path.contains("/log/"))
        .map(|s| s.path.as_str())
        .collect();
    let mut unique = log_reads.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(
        log_reads.len(),
        unique.len(),
        "an entry was read twice: {spans:#?}"
    );
    Ok(spans)
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_acquire_after_a_release_takes_few_round_trips_and_no_org_lease() -> R {
    let raw: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let clock = Arc::new(ManualClock::new(1_000_000));
    small_org(raw.clone(), &clock, true).await?;
    let spans = acquire(constant(raw), &clock, false).await?;
    // LIST; the log's entries at once; the claim's PUT beside the process lease's and the
    // snapshot's manifest GET; the successor check's LIST beside the segment's GET; the
    // delta's PUT.
    assert_eq!(spans.count(Op::List), 2, "{spans:#?}");
    assert_eq!(spans.depth(), 5, "{spans:#?}");
    Ok(())
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_acquire_after_a_crash_reads_the_process_lease_not_an_org_lease() -> R {
    let raw: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let clock = Arc::new(ManualClock::new(1_000_000));
    small_org(raw.clone(), &clock, false).await?;
    let spans = acquire(constant(raw), &clock, true).await?;
    assert_eq!(spans.count(Op::List), 2, "{spans:#?}");
    // As after a release, with the claimer's process lease read before the claim.
    assert_eq!(spans.depth(), 6, "{spans:#?}");
    Ok(())
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_image_above_the_prefetch_bound_is_downloaded_after_the_claim() -> R {
    let raw: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let clock = Arc::new(ManualClock::new(1_000_000));
    small_org(raw.clone(), &clock, true).await?;
    // The bound is `read_concurrency × segment_bytes`: 16 × 256 bytes, below the org's
    // two-page image, so nothing is held in memory and the hydrate downloads after the claim.
    let tight = Settings {
        segment_bytes: 256,
        ..settings()
    };
    let spans = acquire_with(constant(raw), &clock, false, tight).await?;
    assert_eq!(spans.count(Op::List), 2, "{spans:#?}");
    assert_eq!(spans.depth(), 7, "{spans:#?}");
    Ok(())
}

/// What a fresh process's claim of an org whose log holds `entries` snapshots costs.
async fn claim_cost(
    store: Arc<dyn ObjectStore>,
    org: &str,
    entries: u64,
) -> Result<StoreRequests, Box<dyn std::error::Error + Send + Sync>> {
    let writer = Replica::open(store.clone(), "", Settings::default()).await?;
    let org = OrgId::new(org)?;
    let mut claim = writer.claim(&org, "a", false).await?;
    for n in 0..entries {
        writer.ship(&mut claim, test_snapshot(n)?).await?;
    }
    writer.release(&mut claim).await?;
    let successor = Replica::open(store, "", Settings::default()).await?;
    let before = successor.store_requests();
    let next = successor.claim(&org, "b", false).await?;
    assert_eq!(next.round(), 2);
    Ok(successor.store_requests().since(&before))
}

#[tokio::test]
async fn a_claim_reads_the_head_of_the_log_not_every_entry() -> R {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    // Both logs are longer than the window of entries a claim reads at once.
    let long = claim_cost(store.clone(), "long", 60).await?;
    let longer = claim_cost(store, "longer", 120).await?;
    assert_eq!(long, longer, "a longer log made the claim dearer");
    let window = Settings::default().read_concurrency as u64;
    // LIST + the top `read_concurrency` entries at once, PUT process lease, PUT claim, LIST.
    assert_eq!((long.list, long.get, long.put), (2, window, 2), "{long:?}");
    Ok(())
}

/// A full snapshot of a small database is three PUTs in two round trips: the manifest goes
/// out beside the segment, the entry after both (it names them, I10).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_small_full_snapshot_puts_its_manifest_beside_its_segment() -> R {
    let traced = constant(Arc::new(InMemory::new()));
    let clock = Arc::new(ManualClock::new(1_000_000));
    let replica = Replica::open_with(traced.clone(), "t", settings(), clock, None).await?;
    let org = OrgId::new("acme")?;
    let mut claim = replica.claim(&org, "a", false).await?;
    let trace = traced.trace();
    replica.ship(&mut claim, test_snapshot(3)?).await?;
    let recorded = trace.finish();
    let puts: Vec<&str> = recorded
        .requests
        .iter()
        .filter(|r| r.op == Op::Put)
        .map(|r| r.path.as_str())
        .collect();
    assert_eq!(puts.len(), 3, "segment, manifest, entry: {puts:?}");
    assert!(puts[2].contains("/log/"), "the entry lands last: {puts:?}");
    assert_eq!(recorded.depth(), 2, "{:?}", recorded.requests);
    Ok(())
}
