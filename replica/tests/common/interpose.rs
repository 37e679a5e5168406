//! [`Interpose`]: a store over another that forces a schedule at exact store requests, never
//! by sleeping (another process's step run just before one GET, or around the first PUT of a
//! path; a LIST held at a [`gate`]), and records the LISTs and GETs that reach it.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result as OsResult,
};
use tokio::sync::oneshot;

/// A step the store runs at one request, once.
pub type Hook = BoxFuture<'static, ()>;

/// Where a PUT hook runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Around {
    Before,
    After,
}

/// Passes every request to `inner`, running the hooks armed on it at their request.
pub struct Interpose {
    inner: Arc<dyn ObjectStore>,
    get_hooks: Mutex<Vec<(Path, Hook)>>,
    put_hooks: Mutex<Vec<(String, Around, Hook)>>,
    list_gates: Mutex<Vec<(String, Hook)>>,
    lists: Mutex<Vec<(String, Option<String>)>>,
    gets: Mutex<Vec<String>>,
}

impl Interpose {
    /// A store over `inner` with nothing armed.
    pub fn new(inner: Arc<dyn ObjectStore>) -> Arc<Interpose> {
        Arc::new(Interpose {
            inner,
            get_hooks: Mutex::new(Vec::new()),
            put_hooks: Mutex::new(Vec::new()),
            list_gates: Mutex::new(Vec::new()),
            lists: Mutex::new(Vec::new()),
            gets: Mutex::new(Vec::new()),
        })
    }

    /// Runs `hook` once, just before the first GET of exactly `at` reaches the store.
    pub fn before_get(&self, at: Path, hook: Hook) {
        self.get_hooks.lock().unwrap().push((at, hook));
    }

    /// Runs `hook` once, just before the first PUT whose path contains `part` reaches the
    /// store.
    pub fn before_put(&self, part: &str, hook: Hook) {
        let hook = (part.to_owned(), Around::Before, hook);
        self.put_hooks.lock().unwrap().push(hook);
    }

    /// Runs `hook` once, just after the first PUT whose path contains `part` returned from
    /// the store (and before its caller sees the result).
    pub fn after_put(&self, part: &str, hook: Hook) {
        let hook = (part.to_owned(), Around::After, hook);
        self.put_hooks.lock().unwrap().push(hook);
    }

    /// Holds the next LIST under `prefix` until `gate` completes (the LIST itself runs after).
    pub fn gate_list(&self, prefix: String, gate: Hook) {
        self.list_gates.lock().unwrap().push((prefix, gate));
    }

    /// Whether every GET and PUT hook armed has run.
    pub fn fired(&self) -> bool {
        self.get_hooks.lock().unwrap().is_empty() && self.put_hooks.lock().unwrap().is_empty()
    }

    /// The paths GET since the last call.
    pub fn take_gets(&self) -> Vec<String> {
        std::mem::take(&mut *self.gets.lock().unwrap())
    }

    /// The LISTs since the last call: their prefix and offset.
    pub fn take_lists(&self) -> Vec<(String, Option<String>)> {
        std::mem::take(&mut *self.lists.lock().unwrap())
    }

    fn gated(
        &self,
        prefix: Option<&Path>,
        offset: Option<&Path>,
    ) -> BoxStream<'static, OsResult<ObjectMeta>> {
        let p = prefix.map(ToString::to_string).unwrap_or_default();
        self.lists
            .lock()
            .unwrap()
            .push((p.clone(), offset.map(ToString::to_string)));
        let gate = {
            let mut gates = self.list_gates.lock().unwrap();
            gates
                .iter()
                .position(|(g, _)| *g == p)
                .map(|i| gates.remove(i).1)
        };
        let inner = self.inner.clone();
        let (prefix, offset) = (prefix.cloned(), offset.cloned());
        let list = move || match &offset {
            Some(off) => inner.list_with_offset(prefix.as_ref(), off),
            None => inner.list(prefix.as_ref()),
        };
        match gate {
            None => list(),
            Some(gate) => futures::stream::once(async move {
                gate.await;
                list()
            })
            .flatten()
            .boxed(),
        }
    }
}

impl std::fmt::Debug for Interpose {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Interpose")
    }
}

impl std::fmt::Display for Interpose {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Interpose({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for Interpose {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> OsResult<PutResult> {
        let hook = {
            let mut hooks = self.put_hooks.lock().unwrap();
            hooks
                .iter()
                .position(|(part, _, _)| location.as_ref().contains(part.as_str()))
                .map(|i| hooks.remove(i))
        };
        match hook {
            Some((_, Around::Before, h)) => {
                h.await;
                self.inner.put_opts(location, payload, opts).await
            }
            Some((_, Around::After, h)) => {
                let put = self.inner.put_opts(location, payload, opts).await;
                h.await;
                put
            }
            None => self.inner.put_opts(location, payload, opts).await,
        }
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> OsResult<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> OsResult<GetResult> {
        self.gets.lock().unwrap().push(location.to_string());
        let hook = {
            let mut hooks = self.get_hooks.lock().unwrap();
            hooks
                .iter()
                .position(|(p, _)| p == location)
                .map(|i| hooks.remove(i).1)
        };
        if let Some(h) = hook {
            h.await;
        }
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, OsResult<Path>>,
    ) -> BoxStream<'static, OsResult<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, OsResult<ObjectMeta>> {
        self.gated(prefix, None)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, OsResult<ObjectMeta>> {
        self.gated(prefix, Some(offset))
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> OsResult<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> OsResult<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

/// A gate: the future the store awaits (it says when the LIST or GET reached it, then waits
/// for `go`), the receiver that hears it arrived, and the sender that lets it through.
pub fn gate() -> (Hook, oneshot::Receiver<()>, oneshot::Sender<()>) {
    let (arrived_tx, arrived_rx) = oneshot::channel::<()>();
    let (go_tx, go_rx) = oneshot::channel::<()>();
    let fut = Box::pin(async move {
        let _ = arrived_tx.send(());
        let _ = go_rx.await;
    });
    (fut, arrived_rx, go_tx)
}
