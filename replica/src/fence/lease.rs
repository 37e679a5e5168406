//! Advisory leases: liveness only, never fencing (the log fences, I7).
//!
//! Liveness belongs to the process, not to each org (I14): a writer process keeps one
//! object, `processes/<instance>.json`, renewed on a timer every `lease_ms / 3`; each claim
//! entry names it ([`crate::format::entry::Claimer`]). An idle org therefore issues no store
//! request at all, whatever the number of orgs. `orgs/<org>/lease.json` is legacy: older
//! versions wrote it once per claim; it is read only for a log whose newest claim names no
//! instance, and no longer written.
//!
//! A lease is judged by observation, never by its timestamps (I15): a claimant takes an org
//! from another live-looking writer only once it has itself seen the holder's process lease
//! unchanged for a whole watch (the holder's `lease_ms` plus a tenth) on its own monotonic clock
//! ([`watch`]). The expiries leases carry are the holder's wall clock, for people.

mod watch;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use object_store::{ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};
use tracing::warn;

use crate::format::entry::ENTRY_VERSION;
use crate::store::Store;
use crate::{Clock, Error, OrgId, Settings};

pub(crate) use watch::Watch;

/// Who holds an org (liveness only; fencing is the log's job): the newest claim entry's
/// [`crate::format::entry::Claimer`] with its process lease's address and expiry
/// ([`crate::Replica::lease`]), or the legacy org lease `orgs/<org>/lease.json` an older
/// version wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// Holder's writer id.
    pub writer: String,
    /// Holder's round.
    pub round: u64,
    /// When the holder's clock said the claim's own term ends, ms since the Unix epoch: for
    /// people; no decision reads it (I15).
    pub expires_at_ms: u64,
    /// The holder's process instance (random per [`crate::Replica`] opened): two processes
    /// configured with one writer id are told apart by it. Empty in leases of older versions.
    #[serde(default)]
    pub instance: String,
    /// The holder's home: the id of the data directory it works in, if it gave one
    /// ([`crate::Replica::claim_from`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub home: Option<String>,
    /// Where the holder's clients reach it ([`crate::Settings::advertise`]), if it said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<String>,
    /// True when the holder's liveness is its process lease
    /// (`processes/<instance>.json`, see [`ProcessLease`]): the org is held while that object
    /// keeps changing. False in leases of older versions, which their holders renewed per org:
    /// then the org lease itself is the object watched.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub process: bool,
    /// The holder's lease term in ms ([`crate::Settings::lease_ms`]): a claimant watches for
    /// this term plus a tenth, whatever its own setting, since the holder renews every third
    /// of it. A duration, not a clock reading. 0 in leases of older versions: the claimant's
    /// own term then.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub term_ms: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A writer process's lease, `processes/<instance>.json`: renewed every `lease_ms / 3` by a
/// task of the [`crate::Replica`] that claimed through it, for as long as that handle lives.
/// Every org lease with `process: true` and this instance is held while it keeps changing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessLease {
    /// The process instance (random per [`crate::Replica`] opened, 32 hex digits).
    pub instance: String,
    /// When the holder's clock said this renewal's term ends, ms since the Unix epoch: for
    /// people; no decision reads it (I15).
    pub expires_at_ms: u64,
    /// How many times the process wrote its lease before this write: every renewal writes
    /// new bytes, however its wall clock moves, so an observer can tell a renewal from none.
    /// 0 in leases of older versions.
    #[serde(default)]
    pub renewals: u64,
    /// The process's lease term in ms: it renews every third of it. 0 in leases of older
    /// versions.
    #[serde(default)]
    pub term_ms: u64,
    /// Where the process's clients reach it, if it said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<String>,
    /// True once the process is shutting down: it is releasing the orgs in `releasing`
    /// (final ship, Release entry) and opens none. A successor may claim them as their
    /// Release entries land, by the normal claim rule (it never forces). False in leases of
    /// older versions, and absent from the wire when false (older readers skip the key).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub draining: bool,
    /// While `draining`, the ids of the orgs the process held when it began to drain;
    /// empty otherwise. Ids as the holder wrote them: a reader validates each with
    /// [`crate::OrgId::new`] before it names an object (I12).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub releasing: Vec<String>,
}

/// A process lease as a LIST of `processes/` shows it, without its body
/// ([`crate::Replica::process_leases`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProcessListing {
    /// The process instance (32 hex digits; other names under `processes/` are skipped).
    pub instance: String,
    /// What changes whenever the object is rewritten: its ETag, else its size and
    /// Last-Modified. Compared only with an earlier listing of the same object, never read
    /// as a time (I15).
    pub version: String,
}

/// `processes/<instance>.json` on the wire:
/// `{"v":1,"instance":…,"expires_at_ms":…,"renewals":…,"term_ms":…}` (`addr` only when set;
/// `draining` and `releasing` only while the process drains).
#[derive(Serialize, Deserialize)]
struct ProcessWire {
    v: u64,
    #[serde(flatten)]
    lease: ProcessLease,
}

/// True for an instance id this crate could have made: 32 lower-case hex digits. An
/// instance read from a lease is a path segment only after this check (I12).
pub(crate) fn valid_instance(instance: &str) -> bool {
    instance.len() == 32
        && instance
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// `lease.json` on the wire: `{"v":1,"writer":…,"round":…,"expires_at_ms":…,"instance":…}`
/// (`home`, `addr`, `process` and `term_ms` only when set), in this order.
#[derive(Serialize, Deserialize)]
struct LeaseWire {
    v: u64,
    #[serde(flatten)]
    lease: Lease,
}

/// Largest lease object read, org or process lease (16 MiB). A lease is a few hundred bytes;
/// a draining process lease lists the orgs it releases, about 70 bytes each, so this admits
/// a process releasing 200 000 orgs. A larger object is refused as [`Error::Corrupt`].
pub const MAX_LEASE_BYTES: u64 = 16 << 20;

/// How long a liveness object must be seen unchanged before its holder is taken for dead:
/// the term plus a tenth, in ms of the observer's monotonic clock. The holder renews three
/// times a term, so a live one that misses two renewals still keeps its orgs; the tenth is
/// slack for a renewal held up by a slow PUT and for the two hosts' clock rates.
pub(crate) fn watch_ms(lease_ms: u64) -> u64 {
    lease_ms.saturating_add(lease_ms / 10)
}

/// What a claim by one [`crate::Replica`] would make of a lease now ([`crate::Replica::lease_hold`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Hold {
    /// Ms of the asking handle's monotonic clock before its claim could go through, if the
    /// holder's liveness object stays as it is now: 0 when it has already been seen
    /// unchanged for a whole watch (the holder stopped), a whole watch after a first
    /// sighting or a renewal.
    pub wait_ms: u64,
    /// The holder's process lease as read, if it exists and reads (its `expires_at_ms` is
    /// the holder's clock: for people).
    pub process: Option<ProcessLease>,
}

impl Hold {
    /// True when the holder's process lease, as read, says it is draining and lists `org`
    /// among the orgs it releases: a graceful shutdown whose release of `org` is on the way.
    pub fn drains(&self, org: &OrgId) -> bool {
        self.process
            .as_ref()
            .is_some_and(|p| p.draining && p.releasing.iter().any(|o| o == org.as_ref()))
    }
}

/// `bytes` of the process lease at `path` as a [`ProcessLease`] of `instance`; `None`
/// (logged) for one of another version or instance, or unreadable.
fn parse_process_lease(path: &str, instance: &str, bytes: &Bytes) -> Option<ProcessLease> {
    match serde_json::from_slice::<ProcessWire>(bytes) {
        Ok(w) if w.v == ENTRY_VERSION && w.lease.instance == instance => Some(w.lease),
        Ok(w) => {
            warn!(%path, v = w.v, "process lease of another version or instance: ignored");
            None
        }
        Err(e) => {
            warn!(%path, error = %e, "unreadable process lease: ignored");
            None
        }
    }
}

impl Lease {
    /// The lease in its wire form: only older versions wrote org leases, so only the tests
    /// that read them back encode one.
    #[cfg(test)]
    fn encode(&self) -> Result<Vec<u8>, Error> {
        serde_json::to_vec(&LeaseWire {
            v: ENTRY_VERSION,
            lease: self.clone(),
        })
        .map_err(|source| Error::Encode {
            what: "lease",
            source,
        })
    }

    fn decode(object: &str, bytes: &[u8]) -> Result<Lease, Error> {
        let wire: LeaseWire =
            serde_json::from_slice(bytes).map_err(|e| Error::corrupt(object, e))?;
        if wire.v != ENTRY_VERSION {
            return Err(Error::UnknownFormat {
                object: object.into(),
                detail: format!("lease version {}", wire.v),
            });
        }
        Ok(wire.lease)
    }
}

/// The lease objects under the prefix — `orgs/<org>/lease.json` and
/// `processes/<instance>.json` — and this process's side of them: its instance, the renewal
/// task of its process lease, and what it saw of other writers' (I15). The only code that
/// writes lease objects or reads their bodies (the store clock HEADs this process's lease
/// for its Last-Modified).
#[derive(Debug)]
pub(crate) struct Leases {
    store: Store,
    clock: Arc<dyn Clock>,
    /// This process's instance: written into every lease it holds, so a claim tells another
    /// live process with the same writer id from itself.
    instance: String,
    /// This handle's lease term, ms ([`crate::Settings::lease_ms`]).
    lease_ms: u64,
    /// Where this process's clients reach it ([`crate::Settings::advertise`]).
    advertise: Option<String>,
    /// Set once this process's lease was first written and its renewal task started.
    started: tokio::sync::OnceCell<()>,
    /// Writes of this process's lease so far: each renewal carries the next count.
    renewals: AtomicU64,
    /// Other writers' liveness objects as this handle saw them (I15, bounded).
    watch: Watch,
    /// Set when this process begins to drain: the orgs it is releasing, written into every
    /// later write of its process lease.
    draining: std::sync::Mutex<Option<Vec<String>>>,
    /// Held across each write of this process's lease, so a renewal built before the
    /// process began to drain never lands after the write that said so, nor after the
    /// delete that retired it.
    writing: tokio::sync::Mutex<()>,
    /// Set by [`Leases::retire`]: the lease was deleted and renewals write nothing, until
    /// a claim through this handle writes it again ([`Leases::ensure_process_lease`]).
    retired: std::sync::atomic::AtomicBool,
}

/// One read of a liveness object ([`Leases::read_liveness`]).
struct Liveness {
    /// What the watch records: the object's bytes, `None` when absent, or for an object
    /// over [`MAX_LEASE_BYTES`] the refusal's text.
    bytes: Option<Bytes>,
    /// True when `bytes` is that refusal's text, not the object's.
    over_cap: bool,
    /// Monotonic ms when the GET was sent, and when it returned.
    asked_ms: u64,
    read_ms: u64,
}

impl Leases {
    /// The leases over `store` of the process `instance`, with `settings`' term and address.
    pub(crate) fn new(
        store: Store,
        clock: Arc<dyn Clock>,
        instance: String,
        settings: &Settings,
    ) -> Leases {
        Leases {
            store,
            clock,
            instance,
            lease_ms: settings.lease_ms,
            advertise: settings.advertise.clone(),
            started: tokio::sync::OnceCell::new(),
            renewals: AtomicU64::new(0),
            watch: Watch::default(),
            draining: std::sync::Mutex::new(None),
            writing: tokio::sync::Mutex::new(()),
            retired: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// This process's instance (32 hex digits).
    pub(crate) fn instance(&self) -> &str {
        &self.instance
    }

    /// True once this process's lease was first written and its renewal task runs.
    pub(crate) fn started(&self) -> bool {
        self.started.initialized()
    }

    /// The advisory lease of `org`, if any.
    ///
    /// # Errors
    /// [`Error::Store`]; [`Error::Corrupt`]/[`Error::UnknownFormat`] for an unreadable lease.
    pub(crate) async fn lease(&self, org: &OrgId) -> Result<Option<Lease>, Error> {
        let path = self.store.layout.lease(org);
        match self.store.get_bytes(&path, MAX_LEASE_BYTES).await? {
            Some(b) => Lease::decode(path.as_ref(), &b).map(Some),
            None => Ok(None),
        }
    }

    /// The process lease of `instance`, if it exists and reads; an unreadable one is logged
    /// and taken as absent. With `watching`, the read is an observation like a claim's
    /// (I15) and goes into this handle's watch, so a watcher that reads a holder's renewals
    /// as they come ([`crate::Replica::process_lease`]) starts the watch of its last one at
    /// its first read, not at the first claim that finds it silent. Reads for people
    /// ([`crate::Replica::lease`]) do not watch: what they report of a claim's wait stays
    /// what a claim from a process that never looked would wait.
    ///
    /// # Errors
    /// [`Error::Store`].
    pub(crate) async fn process_lease(
        &self,
        instance: &str,
        watching: bool,
    ) -> Result<Option<ProcessLease>, Error> {
        if !valid_instance(instance) {
            return Ok(None);
        }
        let path = self.store.layout.process(instance);
        let read = self.read_liveness(&path).await?;
        let lease = match (&read.bytes, read.over_cap) {
            (Some(b), false) => parse_process_lease(path.as_ref(), instance, b),
            _ => None,
        };
        if watching {
            let term_ms = self.holders_term(lease.as_ref().map_or(0, |l| l.term_ms));
            self.watch.saw(
                path.as_ref(),
                read.bytes,
                read.asked_ms,
                read.read_ms,
                watch_ms(term_ms),
            );
        }
        Ok(lease)
    }

    /// One GET of the liveness object at `path`, timed on this handle's monotonic clock,
    /// with what the watch records of it. An object over its cap is still a state to
    /// watch: what the refusal says (its size included) stands for its bytes, so a dead
    /// holder's oversized lease lapses after a watch like any other, and one whose size
    /// keeps changing keeps its holder alive (one rewritten at the same size over its cap
    /// reads as unchanged: such a holder is taken for dead after a watch, which fencing
    /// keeps safe, I7).
    async fn read_liveness(&self, path: &object_store::path::Path) -> Result<Liveness, Error> {
        let asked_ms = self.clock.monotonic_ms();
        let (bytes, over_cap) = match self.store.get_bytes(path, MAX_LEASE_BYTES).await {
            Ok(bytes) => (bytes, false),
            Err(Error::Corrupt { reason, .. }) => {
                tracing::warn!(%path, reason, "lease over its cap: watched by its size, taken as absent");
                (Some(Bytes::from(format!("oversized: {reason}"))), true)
            }
            Err(e) => return Err(e),
        };
        Ok(Liveness {
            bytes,
            over_cap,
            asked_ms,
            read_ms: self.clock.monotonic_ms(),
        })
    }

    /// The term a holder that states `holders` ms is judged by: at most
    /// [`crate::max_holder_term_ms`] of this handle's `lease_ms`, and this handle's own
    /// term when it states none (0, leases of older versions).
    fn holders_term(&self, holders: u64) -> u64 {
        match holders {
            0 => self.lease_ms,
            holders => holders.min(crate::settings::max_holder_term_ms(self.lease_ms)),
        }
    }

    /// What a claim by this handle makes of `lease` (on `org`) now, by observation (I15):
    /// reads the object that proves the holder alive — its process lease, or for a lease of
    /// an older version the org lease itself — and compares it with what this handle saw
    /// before. The holder is taken for dead once that object was seen unchanged (absent
    /// counts as a state) for the holder's term (`lease.term_ms`, at most
    /// [`crate::max_holder_term_ms`] of this handle's `lease_ms`, else this handle's
    /// `lease_ms`) plus a tenth of this handle's monotonic clock; a first sighting therefore
    /// waits a whole watch, and a process lease already watched for another org's sake, or
    /// read by [`crate::Replica::process_lease`], counts from that earlier read. A lease
    /// naming an instance this crate could not have made names no object and proves
    /// nothing. Never reads a wall clock. One GET.
    ///
    /// # Errors
    /// [`Error::Store`].
    pub(crate) async fn lease_hold(&self, org: &OrgId, lease: &Lease) -> Result<Hold, Error> {
        let path = if !lease.process {
            self.store.layout.lease(org)
        } else if valid_instance(&lease.instance) {
            self.store.layout.process(&lease.instance)
        } else {
            return Ok(Hold {
                wait_ms: 0,
                process: None,
            });
        };
        let read = self.read_liveness(&path).await?;
        let watch_ms = watch_ms(self.holders_term(lease.term_ms));
        let process = match (&read.bytes, read.over_cap, lease.process) {
            (Some(b), false, true) => parse_process_lease(path.as_ref(), &lease.instance, b),
            _ => None,
        };
        let unchanged_ms = self.watch.saw(
            path.as_ref(),
            read.bytes,
            read.asked_ms,
            read.read_ms,
            watch_ms,
        );
        Ok(Hold {
            wait_ms: watch_ms.saturating_sub(unchanged_ms),
            process,
        })
    }

    /// Makes sure this process's lease exists before a claim points to it: written at the
    /// first claim, then renewed by a task every `lease_ms / 3` while this handle (any clone)
    /// lives: the task holds the leases weakly and ends once the handle is dropped. The task
    /// starts even when that first write fails, and its next tick retries; meanwhile a
    /// claimant sees the process lease absent, which must last a whole watch before it counts
    /// as silence.
    pub(crate) async fn ensure_process_lease(self: &Arc<Self>) {
        self.started
            .get_or_init(|| async {
                self.put_process_lease().await;
                let weak = Arc::downgrade(self);
                let every = Duration::from_millis((self.lease_ms / 3).max(1));
                tokio::spawn(async move {
                    // A fixed schedule (not a sleep after each write) so a slow write does
                    // not stretch the period; missed ticks are not made up in a burst.
                    let mut ticks = tokio::time::interval(every);
                    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                    // The first tick is one period from now, not at once: the lease was just
                    // written.
                    ticks.reset();
                    loop {
                        ticks.tick().await;
                        let Some(leases) = weak.upgrade() else {
                            return;
                        };
                        // Each renewal gets one period: a PUT that hangs must not hold up the
                        // next (a live holder would lose every org after a watch). The one
                        // abandoned may still land after a later one; that is harmless, as
                        // every write carries new bytes (`renewals`) and an observer counts
                        // any change as life, whatever order the writes land in, and it only
                        // lands while the process lived to send it.
                        let renewal = leases.put_process_lease();
                        if tokio::time::timeout(every, renewal).await.is_err() {
                            warn!("a process lease renewal took a whole period: abandoned");
                        }
                    }
                });
            })
            .await;
        // A claim after a retire: the lease is written again now, and the renewals resume
        // (a failed write is logged; the claim paths check it first, `ready_to_claim`).
        let _ = self.ready_to_claim().await;
    }

    /// Makes sure a claim about to name this process may do so: after a [`Leases::retire`],
    /// the lease is written again and that write has **landed** before this returns, where
    /// otherwise it goes out beside the claim's create. A watcher's read of the process
    /// lease is an observation (I15), and a retired lease is not renewed while its process
    /// lives: an observer that read it (or its absence) long ago would otherwise judge the
    /// new claim's holder dead at once, before the write beside the claim lands. With the
    /// write first, every read a claimant makes after reading the claim returns the new
    /// bytes, a change.
    ///
    /// # Errors
    /// [`Error::Store`] when the write failed: the handle stays retired and the claim must
    /// not be made. [`Error::Encode`] if the lease could not be encoded.
    pub(crate) async fn ready_to_claim(&self) -> Result<(), Error> {
        if !self.retired.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.unretire().await
    }

    /// Writes the lease of a retired handle again and resumes its renewals; the handle
    /// stays retired when the write fails. The handle reads as retired until the write has
    /// landed, and the write holds `writing`: a second claim meanwhile queues here and
    /// finds the lease written, or writes it itself, never publishing beside a write in
    /// flight (nor beside one an abandoned claim left half done).
    async fn unretire(&self) -> Result<(), Error> {
        let _writing = self.writing.lock().await;
        if !self.retired.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.put_locked().await?;
        self.retired.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Deletes this process's lease and stops its renewals (the task keeps its timer and
    /// writes nothing), once the process holds no org: a drained process leaves nothing in
    /// `processes/` for every watcher to list ever after. True when the delete landed;
    /// false, deleting nothing, when this process never wrote a lease. A failed delete is
    /// logged and the lease is left unrenewed, which a claimant reads as silence after a
    /// watch, as for a process that exited.
    ///
    /// Safe for every org (I7, I15): an org this process released has its Release entry at
    /// the head and moves without any liveness check; an org it still held looks absent or
    /// unchanged, which a claimant takes for dead only after a whole watch of its own
    /// monotonic clock. A later claim through this handle (or adopt seal) is made only once
    /// the lease's new write has landed ([`Leases::ready_to_claim`]): an observer may have
    /// read the unrenewed lease, or its absence, long before, and must see a change.
    pub(crate) async fn retire(&self) -> bool {
        if !self.started() {
            return false;
        }
        let _writing = self.writing.lock().await;
        self.retired.store(true, Ordering::SeqCst);
        let path = self.store.layout.process(&self.instance);
        match self.store.object.delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => true,
            Err(e) => {
                warn!(%path, error = %e, "could not delete the process lease");
                false
            }
        }
    }

    /// Says in this process's lease that it is draining and which orgs it is releasing
    /// (one PUT now; every later renewal says it too), so a successor watching
    /// `processes/` claims them as they are released. False, writing nothing, when this
    /// process holds no lease (it never claimed through this handle, so holds no org), or
    /// when the write fails (logged): the renewal task retries it within a period.
    pub(crate) async fn drain(&self, orgs: &[OrgId]) -> bool {
        if !self.started() {
            return false;
        }
        *idem_base::lock(&self.draining) = Some(orgs.iter().map(|o| o.to_string()).collect());
        self.put_process_lease().await
    }

    /// Every process lease under `processes/`, by instance and version, from one LIST.
    ///
    /// # Errors
    /// [`Error::Store`].
    pub(crate) async fn process_leases(&self) -> Result<Vec<ProcessListing>, Error> {
        let dir = self.store.layout.processes();
        let metas = self.store.list_all(&dir).await?;
        let mut out: Vec<ProcessListing> = metas
            .into_iter()
            .filter_map(|m| {
                let instance = m.location.filename()?.strip_suffix(".json")?.to_owned();
                valid_instance(&instance).then(|| ProcessListing {
                    version: m.e_tag.unwrap_or_else(|| {
                        format!("{}:{}", m.size, m.last_modified.timestamp_micros())
                    }),
                    instance,
                })
            })
            .collect();
        out.sort_by(|a, b| a.instance.cmp(&b.instance));
        Ok(out)
    }

    /// Writes this process's lease for another `lease_ms`; false (logged) when the write
    /// fails or the handle is retired.
    async fn put_process_lease(&self) -> bool {
        let _writing = self.writing.lock().await;
        if self.retired.load(Ordering::SeqCst) {
            return false;
        }
        self.put_locked().await.is_ok()
    }

    /// [`Leases::put_process_lease`]'s write, with `writing` held by the caller; the error
    /// is logged too.
    async fn put_locked(&self) -> Result<(), Error> {
        let releasing = idem_base::lock(&self.draining).clone();
        let lease = ProcessLease {
            instance: self.instance.clone(),
            expires_at_ms: self.clock.now_ms().saturating_add(self.lease_ms),
            renewals: self.renewals.fetch_add(1, Ordering::Relaxed),
            term_ms: self.lease_ms,
            addr: self.advertise.clone(),
            draining: releasing.is_some(),
            releasing: releasing.unwrap_or_default(),
        };
        let path = self.store.layout.process(&lease.instance);
        let body = serde_json::to_vec(&ProcessWire {
            v: ENTRY_VERSION,
            lease,
        })
        .map_err(|source| Error::Encode {
            what: "process lease",
            source,
        })?;
        match self.store.object.put(&path, PutPayload::from(body)).await {
            Ok(_) => {
                metrics::counter!(crate::metrics::LEASE_RENEWALS).increment(1);
                Ok(())
            }
            Err(e) => {
                warn!(%path, error = %e, "could not write the process lease");
                Err(Error::store("put", &path, e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_written_before_and_after_homes_read_and_write_back_byte_for_byte() -> Result<(), Error>
    {
        for text in [
            r#"{"v":1,"writer":"writer-b","round":2,"expires_at_ms":1796090785875,"instance":"0269a007f46e0ec5d8bce6b2d6d01284"}"#,
            r#"{"v":1,"writer":"w","round":3,"expires_at_ms":5,"instance":"ab","home":"h1"}"#,
        ] {
            let lease = Lease::decode("lease.json", text.as_bytes())?;
            assert_eq!(String::from_utf8_lossy(&lease.encode()?), text);
        }
        let old = Lease::decode(
            "lease.json",
            br#"{"v":1,"writer":"w","round":1,"expires_at_ms":5}"#,
        )?;
        assert_eq!((old.instance.as_str(), old.home), ("", None));
        assert!(matches!(
            Lease::decode(
                "lease.json",
                br#"{"v":2,"writer":"w","round":1,"expires_at_ms":5}"#
            ),
            Err(Error::UnknownFormat { .. })
        ));
        Ok(())
    }

    #[test]
    fn a_draining_process_lease_names_its_orgs_and_older_leases_read_as_not_draining() {
        let id = "0269a007f46e0ec5d8bce6b2d6d01284";
        let old =
            format!(r#"{{"v":1,"instance":"{id}","expires_at_ms":5,"renewals":2,"term_ms":30}}"#);
        let read = parse_process_lease("p", id, &Bytes::from(old.clone()));
        assert_eq!(
            read.as_ref().map(|l| (l.draining, l.releasing.len())),
            Some((false, 0))
        );
        // Not draining: the wire is what older versions wrote, byte for byte.
        let again = read.map(|lease| serde_json::to_string(&ProcessWire { v: 1, lease }).ok());
        assert_eq!(again, Some(Some(old)));
        let draining = format!(
            r#"{{"v":1,"instance":"{id}","expires_at_ms":5,"renewals":3,"term_ms":30,"draining":true,"releasing":["acme","beta"]}}"#
        );
        let read = parse_process_lease("p", id, &Bytes::from(draining));
        assert_eq!(
            read.map(|l| (l.draining, l.releasing)),
            Some((true, vec!["acme".to_owned(), "beta".to_owned()]))
        );
    }
}
