//! The store handle: opening it (with the create-only probe), the injected clock and
//! failpoints, and plain object reads. The protocol lives in the layer folders beside it:
//! `fence/` (claim, log, lease), `publish/` (ship), `rebuild/` (hydrate, resume),
//! `retention/`, and `verify.rs`.

use std::sync::Arc;

use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutPayload};

use crate::format::layout::{Layout, new_nonce};
use crate::{Clock, Error, FailPoint, Failpoints, OrgId, Settings, SystemClock};

/// Handle on a fenced snapshot store; cheap to clone.
#[derive(Clone, Debug)]
pub struct Replica {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) store: Arc<dyn ObjectStore>,
    /// What `store` (a [`crate::CountedStore`]) has counted.
    pub(crate) requests: Arc<crate::counted::Counts>,
    pub(crate) layout: Layout,
    pub(crate) settings: Settings,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) failpoints: Option<Arc<dyn Failpoints>>,
    /// This process's instance: written into every lease it holds, so a claim tells another
    /// live process with the same writer id from itself.
    pub(crate) instance: String,
    /// Opened with [`Replica::open_read_only`]: claims and retention are refused.
    pub(crate) read_only: bool,
    /// Set once this process's lease was first written and its renewal task started.
    pub(crate) process_lease: tokio::sync::OnceCell<()>,
    /// Writes of this process's lease so far: each renewal carries the next count.
    pub(crate) renewals: std::sync::atomic::AtomicU64,
    /// Other writers' liveness objects as this handle saw them (I15, bounded).
    pub(crate) watch: crate::fence::lease::Watch,
    /// Entries published or read by retention, so retention reads only new ones.
    pub(crate) known: crate::fence::log::known::Known,
    /// Segment names of manifests retention read, so it reads each one once.
    pub(crate) segment_refs: crate::retention::refs::SegmentRefs,
    /// The last measurement of the store's clock (`store_clock.rs`).
    pub(crate) store_clock: crate::store_clock::StoreClock,
}

/// Runs CPU-bound work (hashing, compression) on the blocking pool; `op` names it in a
/// [`Error::Task`] when the task panics or is cancelled.
pub(crate) async fn blocking<T: Send + 'static>(
    op: &'static str,
    f: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|source| Error::Task { op, source })?
}

impl Replica {
    /// A local-directory store rooted at `dir` (created if missing), built
    /// `with_fsync(true)` so an acknowledged object is on disk.
    ///
    /// # Errors
    /// [`Error::Io`] if the directory cannot be created; [`Error::Store`] if the store
    /// cannot be built on it.
    pub fn local_store(dir: &std::path::Path) -> Result<Arc<dyn ObjectStore>, Error> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let store = object_store::local::LocalFileSystem::new_with_prefix(dir)
            .map_err(|source| Error::Store {
                op: "open",
                path: dir.display().to_string(),
                source,
            })?
            .with_fsync(true);
        Ok(Arc::new(store))
    }

    /// Opens over `store` under `prefix` ("" allowed) with the system clock and no failpoints.
    ///
    /// # Errors
    /// As [`Replica::open_with`].
    pub async fn open(
        store: Arc<dyn ObjectStore>,
        prefix: &str,
        settings: Settings,
    ) -> Result<Replica, Error> {
        Self::open_with(store, prefix, settings, Arc::new(SystemClock), None).await
    }

    /// Opens with an injected clock and optional failpoints.
    ///
    /// Probes the store once: two create-only puts on one fresh path under the prefix; the
    /// second must fail with `AlreadyExists`, else fencing would be unsound.
    ///
    /// # Errors
    /// [`Error::UnsafeStore`] when the store ignores the create condition or does not
    /// support it; [`Error::InvalidSettings`]; [`Error::Store`] when the probe cannot run.
    pub async fn open_with(
        store: Arc<dyn ObjectStore>,
        prefix: &str,
        settings: Settings,
        clock: Arc<dyn Clock>,
        failpoints: Option<Arc<dyn Failpoints>>,
    ) -> Result<Replica, Error> {
        settings.check()?;
        let counted = crate::CountedStore::new(store);
        let requests = counted.counts();
        let store: Arc<dyn ObjectStore> = Arc::new(counted);
        let layout = Layout::new(prefix);
        let probe = layout.probe(&new_nonce()?);
        let body = || PutPayload::from(Bytes::from_static(b"idem create-only probe"));
        let first = store.put_opts(&probe, body(), PutMode::Create.into()).await;
        match first {
            Ok(_) => {}
            Err(
                object_store::Error::NotImplemented { .. }
                | object_store::Error::NotSupported { .. },
            ) => {
                return Err(Error::UnsafeStore {
                    reason: format!("{store} does not support create-only puts"),
                });
            }
            Err(source) => return Err(Error::store("put", &probe, source)),
        }
        let second = store.put_opts(&probe, body(), PutMode::Create.into()).await;
        let _ = store.delete(&probe).await;
        match second {
            Err(
                object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. },
            ) => {}
            Ok(_) => {
                return Err(Error::UnsafeStore {
                    reason: format!(
                        "{store} accepted a create-only put on an existing object: it ignores the condition"
                    ),
                });
            }
            Err(source) => return Err(Error::store("put", &probe, source)),
        }
        Ok(Replica {
            inner: Arc::new(Inner {
                known: crate::fence::log::known::Known::new(settings.known_entries),
                segment_refs: Default::default(),
                store_clock: Default::default(),
                store,
                requests,
                layout,
                settings,
                clock,
                failpoints,
                instance: new_nonce()?,
                read_only: false,
                process_lease: tokio::sync::OnceCell::new(),
                renewals: Default::default(),
                watch: Default::default(),
            }),
        })
    }

    /// Opens for reading only (inspect, verify, restore, listing effects): no probe, and
    /// nothing through this handle ever writes to the store — claims and retention are
    /// refused with [`Error::ReadOnly`] — so read-only credentials (an auditor's) suffice.
    ///
    /// # Errors
    /// [`Error::InvalidSettings`].
    pub fn open_read_only(
        store: Arc<dyn ObjectStore>,
        prefix: &str,
        settings: Settings,
    ) -> Result<Replica, Error> {
        settings.check()?;
        let counted = crate::CountedStore::new(store);
        Ok(Replica {
            inner: Arc::new(Inner {
                known: crate::fence::log::known::Known::new(settings.known_entries),
                segment_refs: Default::default(),
                store_clock: Default::default(),
                requests: counted.counts(),
                store: Arc::new(counted),
                layout: Layout::new(prefix),
                settings,
                clock: Arc::new(SystemClock),
                failpoints: None,
                instance: new_nonce()?,
                read_only: true,
                process_lease: tokio::sync::OnceCell::new(),
                renewals: Default::default(),
                watch: Default::default(),
            }),
        })
    }

    pub(crate) fn writable(&self, op: &'static str) -> Result<(), Error> {
        if self.inner.read_only {
            return Err(Error::ReadOnly { op });
        }
        Ok(())
    }

    /// This handle's process instance (32 hex digits, random per opened [`Replica`]): what
    /// its leases name, so another process tells it from a live one with the same writer id.
    pub fn instance(&self) -> &str {
        &self.inner.instance
    }

    /// The settings in use.
    pub fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    /// The underlying store (wrapped in a [`crate::CountedStore`]).
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.inner.store
    }

    /// Store requests made through this handle since it was opened, by op: what ships,
    /// confirmations, claims and idle orgs cost (I14).
    pub fn store_requests(&self) -> crate::StoreRequests {
        self.inner.requests.snapshot()
    }

    /// Calls the injected failpoints, if any, at `point` for `org`.
    ///
    /// # Errors
    /// [`Error::Injected`] when the failpoint says so.
    pub(crate) async fn failpoint(&self, point: FailPoint, org: &OrgId) -> Result<(), Error> {
        match &self.inner.failpoints {
            Some(fp) => fp.hit(point, org).await.map_err(|message| Error::Injected {
                point,
                org: org.to_string(),
                message,
            }),
            None => Ok(()),
        }
    }

    /// The bytes of the object at `path`; `None` when it does not exist.
    ///
    /// # Errors
    /// [`Error::Store`].
    pub(crate) async fn get_bytes(&self, path: &Path) -> Result<Option<Bytes>, Error> {
        let got = match self.inner.store.get(path).await {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(Error::store("get", path, e)),
        };
        match got.bytes().await {
            Ok(b) => Ok(Some(b)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(Error::store("get", path, e)),
        }
    }

    /// Orgs present in the store (those with any object under `orgs/<org>/`), sorted.
    ///
    /// # Errors
    /// [`Error::Store`]. Directory names that are not valid org ids are skipped.
    pub async fn orgs(&self) -> Result<Vec<OrgId>, Error> {
        let dir = self.inner.layout.orgs();
        let list = self
            .inner
            .store
            .list_with_delimiter(Some(&dir))
            .await
            .map_err(|e| Error::store("list", &dir, e))?;
        let mut orgs: Vec<OrgId> = list
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename().and_then(|n| OrgId::new(n).ok()))
            .collect();
        orgs.sort();
        orgs.dedup();
        Ok(orgs)
    }
}
