//! The top handle: opening it (with the create-only probe) and the layers it holds — the
//! shared store handle (`store.rs`) and the org logs (`fence/log/`); the layers never hold
//! it. The other protocol steps live in the layer folders beside it: `fence/` (claim,
//! lease), `publish/` (ship), `rebuild/` (hydrate, resume), `retention/`, and `verify.rs`.

use std::sync::Arc;

use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutPayload};

use crate::fence::lease::Leases;
use crate::fence::log::Log;
use crate::format::layout::{Layout, new_nonce};
use crate::store::Store;
use crate::store_clock::{StoreClock, StoreTime};
use crate::{
    Clock, Error, FailPoint, Failpoints, Hold, Lease, LogEntry, OrgId, ProcessLease, Settings,
    SystemClock,
};

/// Handle on a fenced snapshot store; cheap to clone.
#[derive(Clone, Debug)]
pub struct Replica {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    /// The shared store handle every layer holds a clone of.
    pub(crate) store: Store,
    /// The org logs (`fence/log/`), the only reader and writer of `orgs/<org>/log/`.
    pub(crate) log: Log,
    /// The lease objects and this process's instance and renewals (`fence/lease.rs`);
    /// shared with the renewal task, which holds it weakly.
    pub(crate) leases: Arc<Leases>,
    pub(crate) settings: Settings,
    pub(crate) clock: Arc<dyn Clock>,
    /// Segment names of manifests retention read, so it reads each one once.
    pub(crate) segment_refs: crate::retention::refs::SegmentRefs,
    /// The store's clock as this handle measures it (`store_clock.rs`).
    pub(crate) store_clock: StoreClock,
    /// Permits for chains being compacted into level files
    /// ([`Settings::compaction_concurrency`]).
    pub(crate) compactions: tokio::sync::Semaphore,
    /// Journal headers read, reused while a LIST shows the same object (`journal/headers.rs`).
    pub(crate) journal_headers: crate::journal::headers::Headers,
    pub(crate) sealed_listings: crate::journal::headers::SealedListings,
    pub(crate) run_listings: crate::journal::coalesce::RunListings,
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
        let store = Store {
            object: store,
            requests,
            layout,
            failpoints,
            read_only: false,
        };
        Replica::assemble(store, settings, clock)
    }

    /// The top handle over `store`: every layer gets its clone of the store handle.
    fn assemble(store: Store, settings: Settings, clock: Arc<dyn Clock>) -> Result<Replica, Error> {
        let leases = Arc::new(Leases::new(
            store.clone(),
            clock.clone(),
            new_nonce()?,
            &settings,
        ));
        Ok(Replica {
            inner: Arc::new(Inner {
                log: Log::new(store.clone(), &settings),
                store_clock: StoreClock::new(
                    store.clone(),
                    clock.clone(),
                    leases.clone(),
                    &settings,
                ),
                leases,
                segment_refs: Default::default(),
                compactions: tokio::sync::Semaphore::new(settings.compaction_concurrency),
                journal_headers: Default::default(),
                sealed_listings: Default::default(),
                run_listings: Default::default(),
                store,
                settings,
                clock,
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
        let store = Store {
            requests: counted.counts(),
            object: Arc::new(counted),
            layout: Layout::new(prefix),
            failpoints: None,
            read_only: true,
        };
        Replica::assemble(store, settings, Arc::new(SystemClock))
    }

    /// Refuses `op` on a read-only handle.
    ///
    /// # Errors
    /// [`Error::ReadOnly`] when opened with [`Replica::open_read_only`].
    pub(crate) fn writable(&self, op: &'static str) -> Result<(), Error> {
        self.inner.store.writable(op)
    }

    /// This handle's process instance (32 hex digits, random per opened [`Replica`]): what
    /// its leases name, so another process tells it from a live one with the same writer id.
    pub fn instance(&self) -> &str {
        self.inner.leases.instance()
    }

    /// The settings in use.
    pub fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    /// The underlying store (wrapped in a [`crate::CountedStore`]).
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.inner.store.object
    }

    /// Store requests made through this handle since it was opened, by op: what ships,
    /// confirmations, claims and idle orgs cost (I14).
    pub fn store_requests(&self) -> crate::StoreRequests {
        self.inner.store.requests.snapshot()
    }

    /// Calls the injected failpoints, if any, at `point` for `org`.
    ///
    /// # Errors
    /// [`Error::Injected`] when the failpoint says so.
    pub(crate) async fn failpoint(&self, point: FailPoint, org: &OrgId) -> Result<(), Error> {
        self.inner.store.failpoint(point, org).await
    }

    /// The bytes of the object at `path`, at most `max`; `None` when it does not exist.
    ///
    /// # Errors
    /// [`Error::Corrupt`] above `max`; [`Error::Store`].
    pub(crate) async fn get_bytes(&self, path: &Path, max: u64) -> Result<Option<Bytes>, Error> {
        self.inner.store.get_bytes(path, max).await
    }

    /// Every log entry of `org`, sorted by seq. Entries deleted between listing and reading
    /// (retention) are skipped.
    ///
    /// # Errors
    /// [`Error::Store`]; [`Error::Corrupt`]/[`Error::UnknownFormat`] for an unreadable entry.
    pub async fn history(&self, org: &OrgId) -> Result<Vec<LogEntry>, Error> {
        self.inner.log.history(org).await
    }

    /// Every log entry of `org`, sorted by seq, read with the journal's reader: format-5
    /// claims and checkpoints (`docs/design.md` 3g) included, where [`Replica::history`]
    /// refuses them with [`Error::JournalRequired`].
    ///
    /// # Errors
    /// As [`Replica::history`], without `JournalRequired`.
    pub async fn journal_history(&self, org: &OrgId) -> Result<Vec<LogEntry>, Error> {
        self.inner.log.journal_history(org).await
    }

    /// Who holds `org`, if anyone: the writer of the newest claim in its log with that
    /// claim's process, home and term, and the address and expiry (the holder's clock, for
    /// people) of its process lease; for a log whose newest claim is of an older version,
    /// the org lease that version wrote. A `Release` at the head still names the releaser:
    /// the caller sees the release in the log. Advisory: the log fences (I7). A read for
    /// people: it does not count as an observation for this handle's claims (I15, unlike
    /// [`Replica::process_lease`]).
    ///
    /// # Errors
    /// [`Error::Store`]; [`Error::Corrupt`]/[`Error::UnknownFormat`] for an unreadable lease
    /// or log entry.
    pub async fn lease(&self, org: &OrgId) -> Result<Option<Lease>, Error> {
        self.holder(org).await
    }

    /// The process lease of `instance`, if it exists and reads; an unreadable one is logged
    /// and taken as absent. One GET, which is also an observation for this handle's claims
    /// (I15, [`Replica::lease_hold`]): a watcher that reads a holder's renewals as they come
    /// has its last one's watch start at that read, so a claim after the holder's crash
    /// waits what remains of a watch since then, not a whole watch from its own first look.
    ///
    /// # Errors
    /// [`Error::Store`].
    pub async fn process_lease(&self, instance: &str) -> Result<Option<ProcessLease>, Error> {
        self.inner.leases.process_lease(instance, true).await
    }

    /// Every process lease in the store (`processes/<instance>.json`), by instance and a
    /// version that changes at each rewrite, from one LIST: a watcher GETs
    /// ([`Replica::process_lease`]) only those whose version changed since it last looked.
    ///
    /// # Errors
    /// [`Error::Store`].
    pub async fn process_leases(&self) -> Result<Vec<crate::ProcessListing>, Error> {
        self.inner.leases.process_leases().await
    }

    /// Says in this process's lease that it is draining and releasing `orgs`
    /// ([`ProcessLease::draining`], [`ProcessLease::releasing`]): one PUT now, and every
    /// later renewal says it too. Call it when the process begins to shut down, before the
    /// releases. It moves nothing by itself: a successor still claims each org by the
    /// normal rule, once its Release entry is at the head (I7, I15). Returns false, having
    /// written nothing, when this handle holds no process lease (it never claimed), or when
    /// the write failed (logged; the next renewal carries it).
    pub async fn drain(&self, orgs: &[OrgId]) -> bool {
        if self.writable("drain").is_err() {
            return false;
        }
        self.inner.leases.drain(orgs).await
    }

    /// Deletes this process's lease (`processes/<instance>.json`) and stops renewing it: call
    /// it once this handle serves no org, after [`Replica::drain`] and every release, so a
    /// drained process leaves nothing for watchers to list. A later claim through this
    /// handle writes the lease again, and is made only once that write has landed (an
    /// observer may have read the unrenewed lease long before). Returns true when the
    /// delete landed; false, deleting nothing, when this handle never wrote a lease, or
    /// when the delete failed (logged:
    /// the lease then stays unrenewed, which claimants read as an exited process). The
    /// handle must serve no org that is not released: one it still held would be claimable
    /// after a watch, as if the process had died.
    pub async fn retire(&self) -> bool {
        if self.writable("retire").is_err() {
            return false;
        }
        self.inner.leases.retire().await
    }

    /// What a claim by this handle makes of `lease` (on `org`) now, by observation (I15):
    /// reads the object that proves the holder alive — its process lease, or for a lease of
    /// an older version the org lease itself — and compares it with what this handle saw
    /// before. The holder is taken for dead once that object was seen unchanged (absent
    /// counts as a state) for the holder's term (`lease.term_ms`, at most
    /// [`crate::max_holder_term_ms`] of this handle's `lease_ms`, else this handle's
    /// `lease_ms`) plus a tenth of this handle's monotonic clock; a first sighting therefore
    /// waits a whole watch, and a process lease already watched for another org's sake, or
    /// read by [`Replica::process_lease`], counts from that earlier read. A lease naming an
    /// instance this crate could not have made names no object and proves nothing. Never
    /// reads a wall clock. One GET.
    ///
    /// # Errors
    /// [`Error::Store`].
    pub async fn lease_hold(&self, org: &OrgId, lease: &Lease) -> Result<Hold, Error> {
        self.inner.leases.lease_hold(org, lease).await
    }

    /// This host's clock beside the store's, checked: `Ok` only when they agree within
    /// [`crate::Settings::max_clock_skew_ms`]. `op` names the decision that asks (`prune`,
    /// `retention`) in the error, the log line and the metric. Use [`StoreTime::now_ms`] (or
    /// move a cutoff back by [`StoreTime::ahead_ms`]) so that nothing is deleted younger than
    /// its window by the store's clock either (I15).
    ///
    /// Costs no request while a measurement younger than [`crate::REMEASURE_AFTER`] answers,
    /// else one HEAD of this process's lease, or a probe object's PUT, HEAD and DELETE when this
    /// handle holds no lease or the lease disagrees.
    ///
    /// # Errors
    /// [`Error::ClockSkew`] when the clocks disagree by more than the bound (counted in
    /// `idem_clock_refusals_total{op}`); [`Error::Store`] when the store cannot be read or
    /// written; [`Error::ReadOnly`] when a read-only handle would have to write a probe.
    pub async fn store_time(&self, op: &'static str) -> Result<StoreTime, Error> {
        self.inner.store_clock.store_time(op).await
    }

    /// Orgs present in the store (those with any object under `orgs/<org>/`), sorted.
    ///
    /// # Errors
    /// [`Error::Store`]. Directory names that are not valid org ids are skipped.
    pub async fn orgs(&self) -> Result<Vec<OrgId>, Error> {
        let dir = self.inner.store.layout.orgs();
        let list = self
            .inner
            .store
            .object
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

    /// The newest entry of `org`'s log (its head: the last claim, ship or release), `None`
    /// for an org with no entry. One LIST and one GET (another GET for each entry retention
    /// deletes between the two).
    ///
    /// # Errors
    /// [`Error::Store`]; [`Error::Corrupt`]/[`Error::UnknownFormat`] for an unreadable entry.
    pub async fn newest_entry(&self, org: &OrgId) -> Result<Option<LogEntry>, Error> {
        for seq in self.inner.log.seqs(org).await?.into_iter().rev() {
            if let Some(entry) = self.inner.log.read_entry(org, seq).await? {
                return Ok(Some(entry));
            }
        }
        Ok(None)
    }
}
