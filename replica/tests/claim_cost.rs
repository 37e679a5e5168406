//! What an acquire costs on the store (I14, I16). Guards against a claim whose cost grows with
//! the length of the log (a GET per entry), and against an acquire that writes or reads a
//! per-org lease object, lists the log twice or reads an entry twice: the requests by
//! operation and the sequential round trips (depth) of claim + hydrate + first ship of a
//! small org, after a graceful release and after a crash.
//!
//! Depth is measured deterministically: every request is delayed by one constant under
//! paused tokio time, and the depth is the longest chain of requests each starting at or
//! after the previous one ended.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use idem_replica::conformance::test_snapshot;
use idem_replica::{ManualClock, OrgId, Replica, Settings, StoreRequests};
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result as OsResult,
};
use tokio::time::Instant;

type R = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// The delay every traced request takes.
const DELAY: Duration = Duration::from_millis(28);

/// One request as the tracer saw it: what, and when it started and ended (tokio's clock).
#[derive(Debug, Clone)]
struct Span {
    op: &'static str,
    path: String,
    start: Instant,
    end: Instant,
}

/// A store wrapper that delays every request by [`DELAY`] and records its span.
#[derive(Debug)]
struct Tracer {
    inner: Arc<dyn ObjectStore>,
    spans: Arc<Mutex<Vec<Span>>>,
}

impl std::fmt::Display for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tracer({})", self.inner)
    }
}

impl Tracer {
    fn new(inner: Arc<dyn ObjectStore>) -> Tracer {
        Tracer {
            inner,
            spans: Arc::default(),
        }
    }

    fn take(&self) -> Vec<Span> {
        std::mem::take(&mut *self.spans.lock().unwrap_or_else(|e| e.into_inner()))
    }

    async fn traced<T>(&self, op: &'static str, path: &Path, f: impl Future<Output = T>) -> T {
        record(&self.spans, op, path.to_string(), f).await
    }

    fn traced_list(
        &self,
        prefix: Option<&Path>,
        listing: BoxStream<'static, OsResult<ObjectMeta>>,
    ) -> BoxStream<'static, OsResult<ObjectMeta>> {
        let spans = self.spans.clone();
        let path = prefix.map(ToString::to_string).unwrap_or_default();
        futures::stream::once(async move {
            record(&spans, "list", path, listing.collect::<Vec<_>>()).await
        })
        .flat_map(futures::stream::iter)
        .boxed()
    }
}

// The tracer reads tokio's clock, paused and virtual here: it is the measurement itself.
#[allow(clippy::disallowed_methods)]
async fn record<T>(
    spans: &Mutex<Vec<Span>>,
    op: &'static str,
    path: String,
    f: impl Future<Output = T>,
) -> T {
    let start = Instant::now();
    tokio::time::sleep(DELAY).await;
    let out = f.await;
    let end = Instant::now();
    let span = Span {
        op,
        path,
        start,
        end,
    };
    spans.lock().unwrap_or_else(|e| e.into_inner()).push(span);
    out
}

#[async_trait]
impl ObjectStore for Tracer {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> OsResult<PutResult> {
        self.traced(
            "put",
            location,
            self.inner.put_opts(location, payload, opts),
        )
        .await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> OsResult<Box<dyn MultipartUpload>> {
        self.traced(
            "multipart",
            location,
            self.inner.put_multipart_opts(location, opts),
        )
        .await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> OsResult<GetResult> {
        let op = if options.head { "head" } else { "get" };
        self.traced(op, location, self.inner.get_opts(location, options))
            .await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, OsResult<Path>>,
    ) -> BoxStream<'static, OsResult<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, OsResult<ObjectMeta>> {
        self.traced_list(prefix, self.inner.list(prefix))
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, OsResult<ObjectMeta>> {
        self.traced_list(prefix, self.inner.list_with_offset(prefix, offset))
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> OsResult<ListResult> {
        let path = prefix.cloned().unwrap_or_default();
        self.traced("list", &path, self.inner.list_with_delimiter(prefix))
            .await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> OsResult<()> {
        self.traced("copy", from, self.inner.copy_opts(from, to, options))
            .await
    }
}

/// The longest chain of spans each starting at or after the previous one ended.
fn depth(spans: &[Span]) -> usize {
    let mut sorted = spans.to_vec();
    sorted.sort_by_key(|s| s.start);
    let mut chain = vec![0usize; sorted.len()];
    for i in 0..sorted.len() {
        let before = (0..i)
            .filter(|&j| sorted[j].end <= sorted[i].start)
            .map(|j| chain[j])
            .max()
            .unwrap_or(0);
        chain[i] = before + 1;
    }
    chain.into_iter().max().unwrap_or(0)
}

/// Requests by operation, and the log and lease objects among them.
fn count(spans: &[Span], op: &str) -> usize {
    spans.iter().filter(|s| s.op == op).count()
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
    tracer: Arc<Tracer>,
    clock: &Arc<ManualClock>,
    crashed: bool,
) -> Result<Vec<Span>, Box<dyn std::error::Error + Send + Sync>> {
    let b = Replica::open_with(tracer.clone(), "t", settings(), clock.clone(), None).await?;
    let org = OrgId::new("acme")?;
    if crashed {
        assert!(
            b.claim(&org, "b", false).await.is_err(),
            "a crashed holder's claim was taken at once"
        );
        clock.advance(LEASE_MS + LEASE_MS / 10);
    }
    tracer.take();
    let mut claim = b.claim(&org, "b", false).await?;
    let tmp = tempfile::tempdir()?;
    let hydrated = b.hydrate(&mut claim, &tmp.path().join("db")).await?;
    assert_eq!(hydrated.commit, 5);
    b.ship(&mut claim, test_snapshot(6)?).await?;
    let spans = tracer.take();
    assert!(
        spans.iter().all(|s| !s.path.ends_with("lease.json")),
        "an org lease was read or written: {spans:#?}"
    );
    let log_reads: Vec<&str> = spans
        .iter()
        .filter(|s| s.op == "get" && s.path.contains("/log/"))
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
    let spans = acquire(Arc::new(Tracer::new(raw)), &clock, false).await?;
    // LIST; the log's entries at once; the claim's PUT beside the process lease's; the
    // successor check's LIST; the snapshot's manifest; its segment; the ship's uploads.
    assert_eq!(count(&spans, "list"), 2, "{spans:#?}");
    assert_eq!(depth(&spans), 9, "{spans:#?}");
    Ok(())
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_acquire_after_a_crash_reads_the_process_lease_not_an_org_lease() -> R {
    let raw: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let clock = Arc::new(ManualClock::new(1_000_000));
    small_org(raw.clone(), &clock, false).await?;
    let spans = acquire(Arc::new(Tracer::new(raw)), &clock, true).await?;
    assert_eq!(count(&spans, "list"), 2, "{spans:#?}");
    assert_eq!(depth(&spans), 10, "{spans:#?}");
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
