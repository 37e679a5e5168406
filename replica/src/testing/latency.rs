//! A latency-shaped store for tests and benchmarks (test support, behind the `test-util`
//! feature): [`LatencyStore`] wraps any [`ObjectStore`] and delays each request by a seeded
//! draw from a [`Shape`], so what a protocol step costs on S3 (its sequential round trips,
//! I16) shows on a local directory or in memory. It is never a product store: no store URL
//! names it.
//!
//! The delay is a `tokio::time::sleep` before the inner call, so under tokio's paused time
//! (`#[tokio::test(start_paused = true)]`) a test's clock advances by exactly the drawn
//! delays. A [`Trace`] records every request's operation, path and start and end instants
//! (tokio's clock), and [`Recorded::depth`] counts the round trips on the critical path.
//!
//! ```
//! # use std::sync::Arc;
//! # use std::time::Duration;
//! # use idem_replica::latency::{LatencyStore, Op, Shape, Shapes};
//! # use object_store::{ObjectStoreExt, PutPayload, path::Path};
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), object_store::Error> {
//! let inner = Arc::new(object_store::memory::InMemory::new());
//! let store = LatencyStore::new(inner, Shapes::all(Shape::Constant(Duration::from_millis(28))), 7);
//! let trace = store.trace();
//! store.put(&Path::from("a"), PutPayload::from_static(b"1")).await?;
//! store.get(&Path::from("a")).await?;
//! let recorded = trace.finish();
//! assert_eq!((recorded.count(Op::Put), recorded.depth()), (1, 2));
//! # Ok(())
//! # }
//! ```

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};
use tokio::time::Instant;

use idem_base::rng::SeededRng;

#[cfg(test)]
mod tests;

/// A distribution of one request's latency.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Shape {
    /// Every request takes this long.
    Constant(Duration),
    /// Lognormal: the median `p50` and the standard deviation `sigma` of the log (natural
    /// log of seconds); p99 is `p50 × e^(2.326 σ)`.
    LogNormal {
        /// The median.
        p50: Duration,
        /// Standard deviation of ln(latency).
        sigma: f64,
    },
}

/// z of the standard normal's 99th percentile.
const Z99: f64 = 2.326_348;

impl Shape {
    /// S3 from a host in the same region: a small request takes 28 ms at the median and about
    /// 75 ms at p99 (lognormal).
    pub fn s3() -> Shape {
        Shape::lognormal(Duration::from_millis(28), Duration::from_millis(75))
    }

    /// The lognormal with median `p50` and 99th percentile `p99` (`p99` at least `p50`).
    pub fn lognormal(p50: Duration, p99: Duration) -> Shape {
        let ratio = p99.as_secs_f64() / p50.as_secs_f64().max(f64::MIN_POSITIVE);
        Shape::LogNormal {
            p50,
            sigma: ratio.max(1.0).ln() / Z99,
        }
    }

    /// One draw from `rng`.
    pub fn draw(&self, rng: &mut SeededRng) -> Duration {
        match *self {
            Shape::Constant(d) => d,
            Shape::LogNormal { p50, sigma } => {
                let z = standard_normal(rng);
                Duration::from_secs_f64(p50.as_secs_f64() * (sigma * z).exp())
            }
        }
    }
}

/// A standard normal draw (Box–Muller over two uniform draws in (0, 1]).
fn standard_normal(rng: &mut SeededRng) -> f64 {
    let uniform = |rng: &mut SeededRng| ((rng.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64;
    let (u1, u2) = (uniform(rng), uniform(rng));
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// A [`Shape`] per kind of request (a copy takes `put`'s, a multipart upload `put`'s once).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shapes {
    /// `put_opts`, `copy_opts`, the start of a multipart upload.
    pub put: Shape,
    /// `get_opts` (not `head`): the delay is to the response, the body then streams at once.
    pub get: Shape,
    /// `get_opts` with `head`.
    pub head: Shape,
    /// Every listing call (one delay per call, whatever its length).
    pub list: Shape,
    /// Each path of a `delete_stream`.
    pub delete: Shape,
}

impl Shapes {
    /// The same shape for every kind.
    pub fn all(shape: Shape) -> Shapes {
        Shapes {
            put: shape,
            get: shape,
            head: shape,
            list: shape,
            delete: shape,
        }
    }

    /// [`Shape::s3`] for every kind.
    pub fn s3() -> Shapes {
        Shapes::all(Shape::s3())
    }

    fn of(&self, op: Op) -> Shape {
        match op {
            Op::Put | Op::Copy => self.put,
            Op::Get => self.get,
            Op::Head => self.head,
            Op::List => self.list,
            Op::Delete => self.delete,
        }
    }
}

/// The kind of one recorded request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// A put (or the start of a multipart upload).
    Put,
    /// A get.
    Get,
    /// A get with `head`.
    Head,
    /// A listing.
    List,
    /// One path of a delete.
    Delete,
    /// A copy.
    Copy,
}

/// One request as a [`Trace`] saw it: start is when its delay began, end when the inner
/// store answered (for a listing: when its stream ended).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// What kind.
    pub op: Op,
    /// The object or prefix it named.
    pub path: String,
    /// When it was sent (tokio's clock).
    pub start: Instant,
    /// When it was answered (tokio's clock).
    pub end: Instant,
}

type Log = Mutex<Vec<Request>>;

/// The shared state of a store and its traces.
#[derive(Debug)]
struct Shared {
    rng: Mutex<SeededRng>,
    /// The open traces' logs: a finished or dropped trace leaves only a dead `Weak`.
    traces: Mutex<Vec<Weak<Log>>>,
}

impl Shared {
    fn delay(&self, shapes: &Shapes, op: Op) -> Duration {
        let mut rng = idem_base::lock(&self.rng);
        shapes.of(op).draw(&mut rng)
    }

    fn record(&self, op: Op, path: &str, start: Instant) {
        let end = now();
        let mut traces = idem_base::lock(&self.traces);
        traces.retain(|t| t.strong_count() > 0);
        for log in traces.iter().filter_map(Weak::upgrade) {
            idem_base::lock(&log).push(Request {
                op,
                path: path.to_owned(),
                start,
                end,
            });
        }
    }
}

/// tokio's clock, which paused-time tests advance: the trace's instants must be on the clock
/// the delays run on.
#[allow(clippy::disallowed_methods)]
fn now() -> Instant {
    Instant::now()
}

/// Waits `d`; no timer at all for zero, so a zero shape adds nothing but the record.
async fn sleep(d: Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}

/// The wrapper: every request waits a seeded draw from its kind's shape, then goes to the
/// inner store. Same seed, same sequence of draws (in the order requests arrive).
#[derive(Debug)]
pub struct LatencyStore {
    inner: Arc<dyn ObjectStore>,
    shapes: Shapes,
    shared: Arc<Shared>,
}

impl std::fmt::Display for LatencyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LatencyStore({})", self.inner)
    }
}

impl LatencyStore {
    /// Wraps `inner`; delays are drawn from `shapes` with a generator seeded by `seed`.
    pub fn new(inner: Arc<dyn ObjectStore>, shapes: Shapes, seed: u64) -> LatencyStore {
        LatencyStore {
            inner,
            shapes,
            shared: Arc::new(Shared {
                rng: Mutex::new(SeededRng::new(seed)),
                traces: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Starts recording: every request that starts from now on and is answered before
    /// [`Trace::finish`] is in its [`Recorded`]. Several traces may be open at once.
    pub fn trace(&self) -> Trace {
        let log = Arc::new(Mutex::new(Vec::new()));
        idem_base::lock(&self.shared.traces).push(Arc::downgrade(&log));
        Trace { log, began: now() }
    }

    /// Waits out a draw for `op`; returns when the request is sent.
    async fn wait(&self, op: Op) -> Instant {
        let start = now();
        sleep(self.shared.delay(&self.shapes, op)).await;
        start
    }
}

/// An open recording (see [`LatencyStore::trace`]); dropping it stops it.
#[derive(Debug)]
pub struct Trace {
    log: Arc<Log>,
    began: Instant,
}

impl Trace {
    /// Stops recording and returns the requests answered meanwhile, in the order they were
    /// answered.
    pub fn finish(self) -> Recorded {
        let began = self.began;
        let mut requests = std::mem::take(&mut *idem_base::lock(&self.log));
        requests.retain(|r| r.start >= began);
        Recorded { requests }
    }
}

/// What a [`Trace`] recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recorded {
    /// Every request, in the order they were answered.
    pub requests: Vec<Request>,
}

impl Recorded {
    /// How many requests of kind `op`.
    pub fn count(&self, op: Op) -> usize {
        self.requests.iter().filter(|r| r.op == op).count()
    }

    /// The sequential depth: the longest chain of requests each of which started at or after
    /// the previous one ended — the round trips on the critical path. Requests in flight
    /// together count once; 0 for no request.
    pub fn depth(&self) -> usize {
        let mut by_start: Vec<&Request> = self.requests.iter().collect();
        by_start.sort_by_key(|r| (r.start, r.end));
        // chain[i]: the longest chain ending with by_start[i]. Any request that ends by
        // by_start[i]'s start sorts before it, so its chain is known.
        let mut chain = vec![0usize; by_start.len()];
        for i in 0..by_start.len() {
            let before = (0..i)
                .filter(|&j| by_start[j].end <= by_start[i].start)
                .map(|j| chain[j])
                .max()
                .unwrap_or(0);
            chain[i] = before + 1;
        }
        chain.into_iter().max().unwrap_or(0)
    }
}

#[async_trait]
impl ObjectStore for LatencyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        let start = self.wait(Op::Put).await;
        let result = self.inner.put_opts(location, payload, opts).await;
        self.shared.record(Op::Put, location.as_ref(), start);
        result
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        let start = self.wait(Op::Put).await;
        let result = self.inner.put_multipart_opts(location, opts).await;
        self.shared.record(Op::Put, location.as_ref(), start);
        result
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        let op = if options.head { Op::Head } else { Op::Get };
        let start = self.wait(op).await;
        let result = self.inner.get_opts(location, options).await;
        self.shared.record(op, location.as_ref(), start);
        result
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        // One DELETE per path, each delayed in turn and forwarded on its own.
        let (inner, shared, shapes) = (self.inner.clone(), self.shared.clone(), self.shapes);
        locations
            .then(move |location| {
                let (inner, shared) = (inner.clone(), shared.clone());
                async move {
                    let path = location?;
                    let start = now();
                    sleep(shared.delay(&shapes, Op::Delete)).await;
                    let one = futures::stream::once(std::future::ready(Ok(path.clone())));
                    let result = match inner.delete_stream(one.boxed()).next().await {
                        Some(result) => result,
                        None => Ok(path.clone()),
                    };
                    shared.record(Op::Delete, path.as_ref(), start);
                    result
                }
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        let inner = self.inner.clone();
        self.listing(prefix, move |p| inner.list(p.as_ref()))
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        let (inner, offset) = (self.inner.clone(), offset.clone());
        self.listing(prefix, move |p| inner.list_with_offset(p.as_ref(), &offset))
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        let start = self.wait(Op::List).await;
        let result = self.inner.list_with_delimiter(prefix).await;
        let path = prefix.map(|p| p.to_string()).unwrap_or_default();
        self.shared.record(Op::List, &path, start);
        result
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        let start = self.wait(Op::Copy).await;
        let result = self.inner.copy_opts(from, to, options).await;
        self.shared.record(Op::Copy, to.as_ref(), start);
        result
    }
}

impl LatencyStore {
    /// A listing stream: the delay runs when the stream is first polled, the request is
    /// recorded when the stream ends.
    fn listing(
        &self,
        prefix: Option<&Path>,
        open: impl FnOnce(Option<Path>) -> BoxStream<'static, Result<ObjectMeta>> + Send + 'static,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        let (shared, shapes, prefix) = (self.shared.clone(), self.shapes, prefix.cloned());
        let path = prefix.as_ref().map(|p| p.to_string()).unwrap_or_default();
        let begin = {
            let shared = shared.clone();
            async move {
                let start = now();
                sleep(shared.delay(&shapes, Op::List)).await;
                (start, open(prefix))
            }
        };
        futures::stream::once(begin)
            .flat_map(move |(start, stream)| {
                let (shared, path) = (shared.clone(), path.clone());
                let end = futures::stream::once(async move {
                    shared.record(Op::List, &path, start);
                    None
                });
                stream.map(Some).chain(end).filter_map(std::future::ready)
            })
            .boxed()
    }
}
