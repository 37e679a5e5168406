//! Fault injection for tests of every layer (test support, behind the `test-util` feature):
//! a fault-injecting [`ObjectStore`] wrapper, [`PauseAt`], failpoints that hold an
//! operation between two protocol steps so a test orders it against another, and
//! [`SeededRng`] (`idem_base`'s, re-exported), which seeded schedules draw their steps from.
//!
//! Rules match an operation and a path substring and fire on the Nth matching call:
//! fail before the call reaches the store, apply it and then fail ("landed but error"),
//! store a truncated payload while reporting success (partial write), or silently turn a
//! create-only put into an overwrite (an unsafe store). Optional added latency; every
//! call is counted.
//!
//! ```
//! # use std::sync::Arc;
//! # use idem_replica::fault::{FaultStore, Fault, Op};
//! let store = Arc::new(FaultStore::new(Arc::new(object_store::memory::InMemory::new())));
//! store.inject(Op::Put, "/log/", 1, Fault::FailAfter); // first log-entry put lands, then errors
//! assert_eq!(store.calls(Op::Put), 0);
//! ```

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Mutex as AsyncMutex, oneshot};

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMode, PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};

use crate::{FailPoint, Failpoints, OrgId};

pub use idem_base::rng::SeededRng;

/// Which kind of call a rule matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `put_opts`.
    Put,
    /// `get_opts`.
    Get,
    /// `delete_stream` (counted per call; a rule fails one path's delete before it reaches
    /// the store).
    Delete,
    /// `list` and `list_with_delimiter`.
    List,
}

/// What a firing rule does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Return an error without calling the store.
    FailBefore,
    /// Call the store, then return an error even if it succeeded (put only; other ops fail before).
    FailAfter,
    /// Store only the first N bytes of the payload and report success (put only).
    Truncate(usize),
    /// Apply a create-only put as an overwrite, as a store that ignores `If-None-Match` would.
    IgnoreCreate,
}

#[derive(Debug)]
struct Rule {
    op: Op,
    path_contains: String,
    nth: u64,
    times: u64,
    fault: Fault,
    seen: u64,
}

/// The wrapper. Cheap to share as `Arc<FaultStore>`; rules can be changed while in use.
#[derive(Debug)]
pub struct FaultStore {
    inner: Arc<dyn ObjectStore>,
    // Shared with the streams `delete_stream` returns, which outlive the call.
    rules: Arc<Mutex<Vec<Rule>>>,
    counts: [AtomicU64; 4],
    ignore_create: AtomicBool,
    latency_ms: AtomicU64,
    pause: Mutex<Option<Pause>>,
}

/// An armed pause: the next matching call reports on `reached` and waits for `resume`.
#[derive(Debug)]
struct Pause {
    op: Op,
    path_contains: String,
    reached: tokio::sync::oneshot::Sender<()>,
    resume: tokio::sync::oneshot::Receiver<()>,
}

/// The two ends of an armed [`FaultStore::pause_next`].
#[derive(Debug)]
pub struct Paused {
    /// Fires when the matching call has arrived (and is held).
    pub reached: tokio::sync::oneshot::Receiver<()>,
    /// Send (or drop) to let the held call go on.
    pub resume: tokio::sync::oneshot::Sender<()>,
}

impl std::fmt::Display for FaultStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FaultStore({})", self.inner)
    }
}

fn injected(what: &str, path: &Path) -> object_store::Error {
    object_store::Error::Generic {
        store: "FaultStore",
        source: format!("injected {what} on {path}").into(),
    }
}

impl FaultStore {
    /// Wraps `inner` with no rules.
    pub fn new(inner: Arc<dyn ObjectStore>) -> Self {
        FaultStore {
            inner,
            rules: Arc::new(Mutex::new(Vec::new())),
            counts: Default::default(),
            ignore_create: AtomicBool::new(false),
            latency_ms: AtomicU64::new(0),
            pause: Mutex::new(None),
        }
    }

    /// Holds the next call of `op` whose path contains `path_contains` until resumed, so a
    /// test orders it against other work without sleeping.
    pub fn pause_next(&self, op: Op, path_contains: &str) -> Paused {
        let (reached_tx, reached) = tokio::sync::oneshot::channel();
        let (resume, resume_rx) = tokio::sync::oneshot::channel();
        *idem_base::lock(&self.pause) = Some(Pause {
            op,
            path_contains: path_contains.to_owned(),
            reached: reached_tx,
            resume: resume_rx,
        });
        Paused { reached, resume }
    }

    /// Fires `fault` on the `nth` (1-based) call of `op` whose path contains `path_contains`
    /// (counted from when the rule was added), once.
    pub fn inject(&self, op: Op, path_contains: &str, nth: u64, fault: Fault) {
        self.inject_times(op, path_contains, nth, 1, fault);
    }

    /// As [`FaultStore::inject`], firing on `times` consecutive matching calls from the `nth`.
    pub fn inject_times(&self, op: Op, path_contains: &str, nth: u64, times: u64, fault: Fault) {
        let rule = Rule {
            op,
            path_contains: path_contains.to_owned(),
            nth: nth.max(1),
            times,
            fault,
            seen: 0,
        };
        self.lock().push(rule);
    }

    /// Removes every rule.
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// Makes every create-only put an overwrite (an unsafe store), or restores the condition.
    pub fn ignore_create_condition(&self, on: bool) {
        self.ignore_create.store(on, Ordering::SeqCst);
    }

    /// Adds `latency` before every call.
    pub fn set_latency(&self, latency: Duration) {
        self.latency_ms.store(
            u64::try_from(latency.as_millis()).unwrap_or(u64::MAX),
            Ordering::SeqCst,
        );
    }

    /// Calls of `op` seen so far (including failed ones).
    pub fn calls(&self, op: Op) -> u64 {
        self.counts[op as usize].load(Ordering::SeqCst)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Rule>> {
        lock_rules(&self.rules)
    }

    async fn enter(&self, op: Op, path: &Path) -> Option<Fault> {
        self.counts[op as usize].fetch_add(1, Ordering::SeqCst);
        let held = {
            let mut pause = idem_base::lock(&self.pause);
            match pause.as_ref() {
                Some(p) if p.op == op && path.as_ref().contains(&p.path_contains) => pause.take(),
                _ => None,
            }
        };
        if let Some(p) = held {
            let _ = p.reached.send(());
            let _ = p.resume.await;
        }
        let ms = self.latency_ms.load(Ordering::SeqCst);
        if ms > 0 {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        fire(&self.rules, op, path)
    }
}

fn lock_rules(rules: &Mutex<Vec<Rule>>) -> std::sync::MutexGuard<'_, Vec<Rule>> {
    idem_base::lock(rules)
}

/// Counts a call of `op` on `path` against every matching rule; the first rule due fires.
fn fire(rules: &Mutex<Vec<Rule>>, op: Op, path: &Path) -> Option<Fault> {
    let mut rules = lock_rules(rules);
    let mut fired = None;
    for r in rules
        .iter_mut()
        .filter(|r| r.op == op && path.as_ref().contains(&r.path_contains))
    {
        r.seen += 1;
        if fired.is_none() && r.seen >= r.nth && r.seen - r.nth < r.times {
            fired = Some(r.fault);
        }
    }
    fired
}

#[async_trait]
impl ObjectStore for FaultStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        mut opts: PutOptions,
    ) -> Result<PutResult> {
        let fault = self.enter(Op::Put, location).await;
        if self.ignore_create.load(Ordering::SeqCst) && opts.mode == PutMode::Create {
            opts.mode = PutMode::Overwrite;
        }
        match fault {
            None => self.inner.put_opts(location, payload, opts).await,
            Some(Fault::FailBefore) => Err(injected("put failure", location)),
            Some(Fault::FailAfter) => {
                self.inner.put_opts(location, payload, opts).await?;
                Err(injected("put error after landing", location))
            }
            Some(Fault::Truncate(n)) => {
                let bytes: bytes::Bytes = payload.into();
                let cut = bytes.slice(..n.min(bytes.len()));
                self.inner
                    .put_opts(location, PutPayload::from(cut), opts)
                    .await
            }
            Some(Fault::IgnoreCreate) => {
                if opts.mode == PutMode::Create {
                    opts.mode = PutMode::Overwrite;
                }
                self.inner.put_opts(location, payload, opts).await
            }
        }
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        match self.enter(Op::Put, location).await {
            Some(Fault::FailBefore | Fault::FailAfter) => {
                Err(injected("multipart failure", location))
            }
            _ => self.inner.put_multipart_opts(location, opts).await,
        }
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        match self.enter(Op::Get, location).await {
            Some(_) => Err(injected("get failure", location)),
            None => self.inner.get_opts(location, options).await,
        }
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.counts[Op::Delete as usize].fetch_add(1, Ordering::SeqCst);
        // Each path is matched on its own: a firing rule fails that path's delete without
        // reaching the store (the object stays), every other path is deleted as asked.
        let (rules, inner) = (self.rules.clone(), self.inner.clone());
        locations
            .then(move |location| {
                let (rules, inner) = (rules.clone(), inner.clone());
                async move {
                    let path = location?;
                    if fire(&rules, Op::Delete, &path).is_some() {
                        return Err(injected("delete failure", &path));
                    }
                    let one = futures::stream::once(std::future::ready(Ok(path.clone())));
                    match inner.delete_stream(one.boxed()).next().await {
                        Some(result) => result,
                        None => Ok(path),
                    }
                }
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.counts[Op::List as usize].fetch_add(1, Ordering::SeqCst);
        let p = prefix.cloned().unwrap_or_default();
        let fire = {
            let mut rules = self.lock();
            let mut fired = false;
            for r in rules
                .iter_mut()
                .filter(|r| r.op == Op::List && p.as_ref().contains(&r.path_contains))
            {
                r.seen += 1;
                fired |= r.seen >= r.nth && r.seen - r.nth < r.times;
            }
            fired
        };
        if fire {
            return futures::stream::once(async move { Err(injected("list failure", &p)) }).boxed();
        }
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        let p = prefix.cloned().unwrap_or_default();
        match self.enter(Op::List, &p).await {
            Some(_) => Err(injected("list failure", &p)),
            None => self.inner.list_with_delimiter(prefix).await,
        }
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

/// A [`Failpoints`] that pauses the first hit of one point after [`PauseAt::arm`]: it
/// reports the hit on a channel and waits until [`PauseHandle::resume`] is sent. Orders
/// interleavings without sleeps.
#[derive(Debug)]
pub struct PauseAt {
    point: FailPoint,
    armed: AtomicBool,
    reached: AsyncMutex<Option<oneshot::Sender<()>>>,
    resume: AsyncMutex<Option<oneshot::Receiver<()>>>,
}

/// Handles to drive a [`PauseAt`]: wait for the pause, then release it.
#[derive(Debug)]
pub struct PauseHandle {
    /// Fires when the operation reaches the point.
    pub reached: oneshot::Receiver<()>,
    /// Send to let the operation continue.
    pub resume: oneshot::Sender<()>,
}

impl PauseAt {
    /// A disarmed pause at `point`.
    pub fn new(point: FailPoint) -> Arc<PauseAt> {
        Arc::new(PauseAt {
            point,
            armed: AtomicBool::new(false),
            reached: AsyncMutex::new(None),
            resume: AsyncMutex::new(None),
        })
    }
    /// Arms it for the next hit and returns the handles.
    pub async fn arm(&self) -> PauseHandle {
        let (reached_tx, reached) = oneshot::channel();
        let (resume, resume_rx) = oneshot::channel();
        *self.reached.lock().await = Some(reached_tx);
        *self.resume.lock().await = Some(resume_rx);
        self.armed.store(true, Ordering::SeqCst);
        PauseHandle { reached, resume }
    }
}

#[async_trait::async_trait]
impl Failpoints for PauseAt {
    async fn hit(&self, point: FailPoint, _org: &OrgId) -> Result<(), String> {
        if point != self.point || !self.armed.swap(false, Ordering::SeqCst) {
            return Ok(());
        }
        if let Some(tx) = self.reached.lock().await.take() {
            let _ = tx.send(());
        }
        let rx = self.resume.lock().await.take();
        if let Some(rx) = rx {
            let _ = rx.await;
        }
        Ok(())
    }
}
