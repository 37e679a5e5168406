//! The per-process registry of orgs: one writer per org, opened on demand, bounded.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::{BoxError, Options, Outcome};
use idem_replica::journal::{Issuer, IssuerSettings};
use idem_replica::{OrgId, Replica};
use rusqlite::Transaction;
use tokio::sync::OnceCell;

use crate::budget::Budget;
use crate::pool::Pool;
use crate::sync::lock;
use crate::writer::InitFn;
use crate::{Error, ErrorKind, Org, RegistrySettings};

type Slot = Arc<OnceCell<Org>>;

/// Releases [`Registry::shutdown`] runs at once by default ([`RegistrySettings::shutdown_concurrency`]). Each is mostly waiting (a drain on the
/// writer pool, a final ship, a Release entry, a checkpoint on close), so a rolling upgrade
/// of a thousand orgs is bounded by the store and the disk, not by this: 16 took 6.1 s for
/// 1000 orgs in `idem-bench` P7, 128 took 3.7 s on the same 2-core machine.
pub const SHUTDOWN_CONCURRENCY: usize = 128;

/// Builds a [`Registry`]: required parts positional, components injected.
pub struct RegistryBuilder {
    data_dir: PathBuf,
    replica: Replica,
    writer_id: String,
    settings: RegistrySettings,
    clock: Arc<dyn idem::Clock>,
    init: Option<InitFn>,
}

impl RegistryBuilder {
    /// Plain settings (limits, timeouts, retention).
    pub fn settings(mut self, settings: RegistrySettings) -> Self {
        self.settings = settings;
        self
    }

    /// The one clock of the stack (default: the system clock): it stamps `applied_at` of keys
    /// and effect rows and judges effect leases. Open the replica
    /// ([`idem_replica::Replica::open_with`]) with the same clock, so its leases and retention
    /// read the same time (tests inject an `idem::ManualClock`, which is `idem_base`'s).
    pub fn clock(mut self, clock: Arc<dyn idem::Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// A hook run on each org's writer connection when it opens, after hydrate: create the
    /// application's tables here (`CREATE TABLE IF NOT EXISTS ...`).
    pub fn on_open(
        mut self,
        init: impl Fn(&rusqlite::Connection) -> rusqlite::Result<()> + Send + Sync + 'static,
    ) -> Self {
        self.init = Some(Arc::new(init));
        self
    }

    /// Creates the data directory and the registry.
    ///
    /// The registry raises the process's soft open-files limit to its hard limit and sizes
    /// its open-org and active-org limits, page caches and writer pool from the settings
    /// (see [`RegistrySettings::max_open_orgs`], [`RegistrySettings::max_active_orgs`],
    /// [`RegistrySettings::memory_budget_bytes`], [`RegistrySettings::writer_threads`]).
    ///
    /// # Errors
    /// With [`RegistrySettings::warm`] enabled, the warm takeover's watcher starts on the current
    /// tokio runtime.
    ///
    /// # Errors
    /// [`Error::InvalidSettings`] (empty writer id, zero open orgs or writer threads; the
    /// warm takeover together with `force_claim`, or without a tokio runtime);
    /// [`Error::DataDir`] when the data directory cannot be created or locked.
    pub fn build(self) -> Result<Registry, Error> {
        if self.writer_id.is_empty()
            || self.settings.max_open_orgs == 0
            || self.settings.writer_threads == 0
        {
            return Err(Error::InvalidSettings {
                reason: "writer id must be non-empty, max_open_orgs and writer_threads at least 1"
                    .into(),
            });
        }
        let warm = self.settings.warm.enabled;
        if warm && self.settings.force_claim {
            // A forced claim takes an org from a live holder; the watcher never may.
            return Err(Error::InvalidSettings {
                reason: "the warm takeover cannot run with force_claim".into(),
            });
        }
        if warm && tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::InvalidSettings {
                reason: "the warm takeover needs a tokio runtime to build the registry in".into(),
            });
        }
        let journal = &self.settings.journal;
        if journal.enabled && self.settings.force_claim {
            // A forced claim over another process's run would adopt the whole run (K2),
            // fencing every org of a holder that may be live; K1's one-org exclusion is not
            // used by the registry.
            return Err(Error::InvalidSettings {
                reason: "the journal cannot run with force_claim".into(),
            });
        }
        if journal.enabled && !(1..=idem_replica::MAX_SHIP_WINDOW).contains(&journal.window) {
            return Err(Error::InvalidSettings {
                reason: format!(
                    "journal.window must be 1..={}",
                    idem_replica::MAX_SHIP_WINDOW
                ),
            });
        }
        std::fs::create_dir_all(&self.data_dir).map_err(|source| Error::DataDir {
            path: self.data_dir.clone(),
            source,
        })?;
        let home = crate::local::Home::open(&self.data_dir).map_err(|source| Error::DataDir {
            path: self.data_dir.clone(),
            source,
        })?;
        if home.locked() {
            // This process owns the data directory: temp folders of reads a killed process
            // left behind go (`Registry::read`).
            let _ = std::fs::remove_dir_all(self.data_dir.join(crate::published::READS_DIR));
        }
        let budget = Budget::plan(&self.settings, crate::budget::raise_fd_limit());
        if budget.open_orgs < self.settings.max_open_orgs {
            tracing::info!(
                configured = self.settings.max_open_orgs,
                open_orgs = budget.open_orgs,
                "open-org limit lowered to what open files allow"
            );
        }
        tracing::debug!(
            open_orgs = budget.open_orgs,
            active_orgs = budget.active_orgs,
            cache_kib = budget.sqlite_cache_kib,
            "org limits"
        );
        // Every org opens with the limits in force: the open-org limit the LRU keeps, and the
        // shipper's share of the memory budget.
        let mut settings = self.settings;
        settings.max_open_orgs = budget.open_orgs;
        settings.max_active_orgs = budget.active_orgs;
        // The shipped-page caches share their half of the budget among the orgs active now
        // (`ship.delta_cache_pages` stays each one's ceiling; `budget.ship_cache_pages`,
        // the share at the active limit, is the floor).
        let active = crate::tenure::state::ActiveOrgs::new(
            budget.active_orgs,
            budget.ship_pages_total,
            budget.ship_cache_pages,
        );
        let pool = Pool::new(settings.writer_threads);
        let poll_ms = match settings.warm.poll_ms {
            0 => (self.replica.settings().lease_ms / 3).max(1),
            ms => ms,
        };
        let warm = warm.then(|| {
            Arc::new(crate::warm::Warm::new(
                settings.warm.clone(),
                poll_ms,
                self.clock.clone(),
            ))
        });
        let registry = Registry {
            inner: Arc::new(RegistryInner {
                data_dir: self.data_dir,
                replica: self.replica,
                writer_id: self.writer_id,
                settings,
                budget,
                active,
                pool,
                clock: self.clock,
                init: self.init,
                home: Arc::new(home),
                orgs: Mutex::new(HashMap::new()),
                shutting_down: std::sync::atomic::AtomicBool::new(false),
                shut_down: tokio::sync::Mutex::new(false),
                warm: warm.clone(),
                journal: tokio::sync::Mutex::new(None),
            }),
        };
        if let Some(warm) = warm {
            crate::warm::spawn(&registry, warm, poll_ms);
        }
        Ok(registry)
    }
}

/// Every org this process writes, keyed by org id. Cheap to clone.
///
/// End it with [`Registry::shutdown`], which releases every org to its successors at once.
/// Dropping the last handle without it stops every open org as a crash would: [`Org`]
/// handles still held answer [`crate::ErrorKind::Reacquire`], nothing more is acknowledged
/// or published, and successors take the orgs once this process's lease lapses, which is
/// one watch after the last clone of the [`Replica`] handle is gone.
#[derive(Clone)]
pub struct Registry {
    inner: Arc<RegistryInner>,
}

pub(crate) struct RegistryInner {
    data_dir: PathBuf,
    replica: Replica,
    writer_id: String,
    /// The settings in force: `max_open_orgs`, `max_active_orgs` and
    /// `ship.delta_cache_pages` as `budget` set.
    settings: RegistrySettings,
    budget: Budget,
    /// The orgs holding a connection; beyond `budget.active_orgs` idle ones park.
    active: Arc<crate::tenure::state::ActiveOrgs>,
    /// The writer threads every org of this registry runs on.
    pool: Pool,
    clock: Arc<dyn idem::Clock>,
    init: Option<InitFn>,
    home: Arc<crate::local::Home>,
    orgs: Mutex<HashMap<OrgId, Slot>>,
    /// Set by [`Registry::shutdown`]: no org opens any more.
    shutting_down: std::sync::atomic::AtomicBool,
    /// Held by the one [`Registry::shutdown`] running; true once one ran to its end. A
    /// second call that ran beside the first would find no org left, skip the drain's
    /// linger, seal the journal run and delete the process lease while the first was still
    /// shipping its orgs' final sections.
    shut_down: tokio::sync::Mutex<bool>,
    /// The warm takeover, when [`RegistrySettings::warm`] enables it.
    warm: Option<Arc<crate::warm::Warm>>,
    /// The journal's issuer, started at the first acquire when
    /// [`RegistrySettings::journal`] enables it.
    journal: tokio::sync::Mutex<Option<Issuer>>,
}

/// The last handle dropped without [`Registry::shutdown`]: every open org stops as in a
/// crash (I7, I14). Requests are refused, waiters fail unacknowledged and each shipper task
/// returns, so nothing more is published for them; their tasks, connections and the replica
/// handle they hold go with them, and with the last clone of that handle the process lease
/// renewals stop, so successors take the orgs after one watch (I15). Nothing is released:
/// that needs the store, which a drop cannot wait for.
impl Drop for RegistryInner {
    fn drop(&mut self) {
        let slots: Vec<Slot> = lock(&self.orgs).drain().map(|(_, slot)| slot).collect();
        let mut stopped = 0usize;
        for org in slots.iter().filter_map(|slot| slot.get()) {
            org.inner().writer.refuse();
            org.inner().acks.stop(crate::ack::Stop::Closed);
            stopped += 1;
        }
        if stopped > 0 {
            tracing::warn!(
                orgs = stopped,
                "registry dropped without shutdown: its orgs stopped unreleased; successors take them once this process's lease lapses"
            );
        }
    }
}

/// Progress of [`Registry::prune_all`], reported after each org.
#[derive(Debug)]
pub struct PruneProgress<'a> {
    /// Orgs done so far, this one included.
    pub done: usize,
    /// Orgs in the run.
    pub total: usize,
    /// The org just pruned.
    pub org: &'a OrgId,
    /// Its result: keys deleted, or the error.
    pub result: &'a Result<u64, Error>,
}

impl Registry {
    /// Starts a builder: local data directory, snapshot store, this process's writer id.
    pub fn builder(
        data_dir: impl AsRef<Path>,
        replica: Replica,
        writer_id: impl Into<String>,
    ) -> RegistryBuilder {
        RegistryBuilder {
            data_dir: data_dir.as_ref().to_owned(),
            replica,
            writer_id: writer_id.into(),
            settings: RegistrySettings::default(),
            clock: Arc::new(idem::SystemClock),
            init: None,
        }
    }

    /// The data directory.
    pub(crate) fn data_dir(&self) -> &Path {
        &self.inner.data_dir
    }

    /// The `on_open` hook, if one was given.
    pub(crate) fn init_fn(&self) -> Option<InitFn> {
        self.inner.init.clone()
    }

    pub(crate) fn from_inner(inner: Arc<RegistryInner>) -> Registry {
        Registry { inner }
    }

    pub(crate) fn downgrade(&self) -> std::sync::Weak<RegistryInner> {
        Arc::downgrade(&self.inner)
    }

    /// Orgs the warm takeover ([`RegistrySettings::warm`]) opened in the background so far: those a
    /// draining process listed and those a held lease refused before its holder lapsed.
    pub fn warm_claims(&self) -> u64 {
        self.inner.warm.as_ref().map_or(0, |w| w.claimed())
    }

    /// Released journal runs of other processes that the warm takeover took up (K2.6):
    /// followed ([`Registry::warm_runs_followed`]), too old, not learned, or passed over
    /// while shutting down or without room. 0 without the watcher.
    pub fn warm_runs_met(&self) -> u64 {
        self.inner.warm.as_ref().map_or(0, |w| w.runs_met())
    }

    /// Background claims of the warm takeover under way: orgs waiting for a permit or
    /// being claimed ([`crate::WarmSettings::concurrency`] at a time). 0 without the watcher.
    pub fn warm_claims_in_flight(&self) -> usize {
        self.inner.warm.as_ref().map_or(0, |w| w.claiming())
    }

    /// Released journal runs of other processes whose orgs the warm takeover opened in the
    /// background (K2.6, `docs/design.md` 3g): a claim took an org free at the run's
    /// release seal, younger than [`crate::WarmSettings::follow_ms`].
    pub fn warm_runs_followed(&self) -> u64 {
        self.inner.warm.as_ref().map_or(0, |w| w.runs_followed())
    }

    /// True while one more org may open without passing the open-org or active-org limit
    /// in force: a background claim never makes room by releasing or parking others.
    pub(crate) fn has_room(&self) -> bool {
        lock(&self.inner.orgs).len() < self.inner.budget.open_orgs
            && self.inner.active.len() < self.inner.budget.active_orgs
    }

    /// The snapshot store.
    pub fn replica(&self) -> &Replica {
        &self.inner.replica
    }

    /// The open-org limit in force: [`RegistrySettings::max_open_orgs`], lowered to what the open-files
    /// limit allows (a parked org holds one descriptor).
    pub fn max_open_orgs(&self) -> usize {
        self.inner.budget.open_orgs
    }

    /// The active-org limit in force: [`RegistrySettings::max_active_orgs`], lowered to what the
    /// open-files limit left by the open orgs and the memory budget allow. Beyond it, idle
    /// orgs park (connection closed, claim kept).
    pub fn max_active_orgs(&self) -> usize {
        self.inner.budget.active_orgs
    }

    /// Open orgs holding a connection now (the rest of [`Registry::open_orgs`] are parked).
    pub fn active_orgs(&self) -> usize {
        self.inner.active.len()
    }

    /// Each writer connection's SQLite page cache, in KiB (`PRAGMA cache_size = -KiB`): the
    /// connection's half of one active org's share of [`RegistrySettings::memory_budget_bytes`].
    pub fn sqlite_cache_kib(&self) -> u64 {
        self.inner.budget.sqlite_cache_kib
    }

    /// Pages each active org's shipper may keep of what it shipped, now: the shippers' half
    /// of [`RegistrySettings::memory_budget_bytes`] shared by the orgs active at this moment, at
    /// least their share at [`Registry::max_active_orgs`], and at most
    /// `ship.delta_cache_pages` (which bounds it again at every ship).
    pub fn ship_cache_pages(&self) -> usize {
        self.inner
            .active
            .cache_limit()
            .load(std::sync::atomic::Ordering::Relaxed)
            .min(self.inner.settings.ship.delta_cache_pages)
    }

    /// Writer threads started so far (at most [`RegistrySettings::writer_threads`]).
    pub fn writer_threads(&self) -> usize {
        self.inner.pool.threads()
    }

    /// Returns this process's writer for `org`, acquiring it first if needed: claim the next
    /// round, hydrate the latest snapshot, open the database, and only then serve (I8).
    /// Concurrent acquires of one org share a single writer. When more than
    /// `max_open_orgs` are open, the least recently used idle ones are released; when more
    /// than `max_active_orgs` hold a connection, the least recently used idle ones park.
    ///
    /// The org id is validated once, at the edge, by [`OrgId::new`] (I12).
    ///
    /// # Errors
    /// Claim errors (lease held by a live writer, contention: retry); hydrate errors (corrupt
    /// snapshot: stop); local file errors.
    pub async fn acquire(&self, id: &OrgId) -> Result<Org, Error> {
        if let Some(warm) = &self.inner.warm
            && self.serving(id).is_none()
            && let Some(refused) = warm.recent_refusal(id)
        {
            return Err(refused);
        }
        let result = self.acquire_unnoted(id).await;
        if let Some(warm) = &self.inner.warm {
            // A held lease is remembered, to claim in the background once it lapses.
            warm.after_request(id, &result);
        }
        result
    }

    /// [`Registry::acquire`] without telling the warm takeover: its own claims use it.
    pub(crate) async fn acquire_unnoted(&self, id: &OrgId) -> Result<Org, Error> {
        loop {
            if self.shutting_down() {
                return Err(Error::ShuttingDown { org: id.clone() });
            }
            let slot = {
                let mut orgs = lock(&self.inner.orgs);
                orgs.entry(id.clone()).or_default().clone()
            };
            let inner = &self.inner;
            let handle = slot
                .get_or_try_init(|| async {
                    // Checked again inside the cell, which runs one initializer at a time:
                    // once `shutdown` has set the flag, an org it may already have passed
                    // over never opens.
                    if self.shutting_down() {
                        return Err(Error::ShuttingDown { org: id.clone() });
                    }
                    let journal = self.issuer(id).await?;
                    let opened = Org::open(
                        crate::tenure::open::Opening {
                            replica: inner.replica.clone(),
                            data_dir: &inner.data_dir,
                            writer_id: &inner.writer_id,
                            home: &inner.home,
                            settings: inner.settings.clone(),
                            clock: inner.clock.clone(),
                            init: inner.init.clone(),
                            pool: &inner.pool,
                            cache_kib: inner.budget.sqlite_cache_kib,
                            active: &inner.active,
                            journal: journal.as_ref(),
                        },
                        id.clone(),
                    )
                    .await;
                    if let Some(journal) = &journal {
                        self.take_adopted(journal);
                        match &inner.warm {
                            Some(warm) => warm.follow_released(self, journal),
                            None => drop(journal.take_released()),
                        }
                    }
                    opened
                })
                .await
                .cloned();
            let handle = match handle {
                Ok(h) => h,
                Err(e) => {
                    self.forget(id, &slot);
                    return Err(e);
                }
            };
            if self.shutting_down() {
                // A slot `shutdown` drained is released by it; one inserted after the drain
                // is nobody's but ours.
                let ours = {
                    let mut orgs = lock(&self.inner.orgs);
                    let still = orgs.get(id).is_some_and(|s| Arc::ptr_eq(s, &slot));
                    if still {
                        orgs.remove(id);
                    }
                    still
                };
                if ours && let Err(e) = handle.release().await {
                    tracing::warn!(org = %id, error = %e, "release of an org opened during shutdown failed");
                }
                return Err(Error::ShuttingDown { org: id.clone() });
            }
            if handle.is_serving() {
                self.evict_beyond_limit(id).await;
                // The org is (or is about to be, at its request) active: park others.
                crate::park::enforce(&self.inner.active, handle.inner().serial).await;
                return Ok(handle);
            }
            // A release of this org (an eviction) may still be shipping: claiming now would
            // fence it and fail what it was about to acknowledge. Its Release entry then lets
            // this claim proceed at once.
            let _ = tokio::time::timeout(std::time::Duration::from_secs(60), handle.wait_closed())
                .await;
            self.forget(id, &slot);
        }
    }

    pub(crate) fn shutting_down(&self) -> bool {
        self.inner
            .shutting_down
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// [`Registry::once_with`] with default options.
    ///
    /// # Errors
    /// As [`Registry::once_with`].
    pub async fn once<F, E>(&self, org: &OrgId, key: &str, apply: F) -> Result<Outcome, Error>
    where
        F: FnOnce(&Transaction<'_>) -> Result<Vec<u8>, E> + Clone + Send + 'static,
        E: Into<BoxError>,
    {
        self.once_with(org, key, Options::new(), apply).await
    }

    /// Acquires `org` and runs [`Org::once_with`]; when the handle turns out closed (evicted or
    /// released meanwhile) it acquires again and retries once. `apply` is `Clone` for that.
    ///
    /// # Errors
    /// As [`Registry::acquire`] and [`Org::once_with`].
    pub async fn once_with<F, E>(
        &self,
        org: &OrgId,
        key: &str,
        opts: Options,
        apply: F,
    ) -> Result<Outcome, Error>
    where
        F: FnOnce(&Transaction<'_>) -> Result<Vec<u8>, E> + Clone + Send + 'static,
        E: Into<BoxError>,
    {
        let mut tries = 0;
        loop {
            let handle = self.acquire(org).await?;
            match handle.once_with(key, opts.clone(), apply.clone()).await {
                Err(Error::Closed { .. }) if tries == 0 => tries += 1,
                other => return other,
            }
        }
    }

    /// Acquires `org` and runs [`Org::effect`]; when the handle turns out closed (evicted or
    /// released meanwhile) it acquires again and retries once. `executor` is `Clone` for
    /// that, and the retry never executes twice: closed before the reservation, nothing ran;
    /// closed after it but before the executor started, the retry finds the key reserved by
    /// the first attempt (in progress, then AMBIGUOUS); closed after the executor's `Ok`, the
    /// answer is [`Error::EffectUnacknowledged`] carrying the result, which is not retried.
    ///
    /// # Errors
    /// As [`Registry::acquire`] and [`Org::effect`].
    pub async fn effect<F, Fut>(
        &self,
        org: &OrgId,
        key: &str,
        opts: idem::effect::Options,
        executor: F,
    ) -> Result<idem::effect::Outcome, Error>
    where
        F: FnOnce() -> Fut + Clone + Send + 'static,
        Fut: Future<Output = Result<Vec<u8>, idem::effect::Error>> + Send + 'static,
    {
        let mut tries = 0;
        loop {
            let handle = self.acquire(org).await?;
            match handle.effect(key, opts.clone(), executor.clone()).await {
                Err(Error::Closed { .. }) if tries == 0 => tries += 1,
                other => return other,
            }
        }
    }

    /// This process's serving writer for `org`, if it has one open; never acquires (a read
    /// must not claim an org, which would fence the writer holding it elsewhere).
    pub fn serving(&self, org: &OrgId) -> Option<Org> {
        let slot = lock(&self.inner.orgs).get(org).cloned()?;
        slot.get().filter(|o| o.is_serving()).cloned()
    }

    /// Orgs currently open in this process.
    pub fn open_orgs(&self) -> Vec<Org> {
        let slots: Vec<Slot> = lock(&self.inner.orgs).values().cloned().collect();
        slots.iter().filter_map(|s| s.get().cloned()).collect()
    }

    /// Prunes keys applied more than `window` ago in every open org (each then ships),
    /// calling `progress` after each org. Returns each org's result; one org's failure does
    /// not stop the others. Each org checks this host's clock against the store's first
    /// ([`Org::prune`]) and computes its own cutoff from that reading, so a host clock that
    /// steps during the run never prunes an org by a cutoff read before the step; the
    /// measurement is the process's, so a run costs one HEAD at most, and on a host whose
    /// clock the store contradicts every org is refused with `idem_replica::Error::ClockSkew`
    /// and none is touched (I15).
    pub async fn prune_all(
        &self,
        window: Duration,
        mut progress: impl FnMut(PruneProgress<'_>),
    ) -> Vec<(OrgId, Result<u64, Error>)> {
        let orgs = self.open_orgs();
        let total = orgs.len();
        let mut results = Vec::with_capacity(total);
        for (i, org) in orgs.into_iter().enumerate() {
            let result = org.prune(window).await;
            progress(PruneProgress {
                done: i + 1,
                total,
                org: org.id(),
                result: &result,
            });
            results.push((org.id().clone(), result));
        }
        results
    }

    /// Releases every open org (final ship, Release entry, close): what a replica does on
    /// SIGTERM during a rolling upgrade, so successors claim at once. On the journal each
    /// org's release is its final ship only, and one release seal of the process's run
    /// then frees every org at once (J4).
    ///
    /// First the process lease says the process is draining and lists the orgs it releases
    /// (one PUT, [`idem_replica::Replica::drain`]), so a successor running the warm
    /// takeover claims each as its Release entry lands. Releases then run
    /// [`RegistrySettings::shutdown_concurrency`] at a time: each is a final ship and a Release
    /// entry (a few store round trips), so hundreds of orgs move to their successors in
    /// seconds instead of one after another. Once every release landed, the process lease
    /// is deleted ([`idem_replica::Replica::retire`]): the registry must be the replica
    /// handle's only user. With the warm takeover on, the delete waits until the drain was
    /// said two of its watcher's polls ago ([`crate::WarmSettings::poll_ms`]; 2 s by default,
    /// 5 s at most): a successor polling as often then reads the drain at least once,
    /// however short it was. A caller that drops this future during that wait (a timeout
    /// of 2 s or less) leaves the lease saying draining, renewed while the replica handle
    /// lives and listed after the process exits, as after an exit without `shutdown`.
    ///
    /// One call does the work. A call made while another runs waits for it to end, and a
    /// call after one that ended returns at once; both return an empty list, since the
    /// orgs were released (and reported) by that one. After a dropped call the next one
    /// releases whatever is left.
    pub async fn shutdown(&self) -> Vec<(OrgId, Result<(), Error>)> {
        self.inner
            .shutting_down
            .store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(warm) = &self.inner.warm {
            warm.wake.notify_one();
        }
        let mut ran = self.inner.shut_down.lock().await;
        if *ran {
            return Vec::new();
        }
        let released = self.release_all().await;
        *ran = true;
        released
    }

    /// The work of [`Registry::shutdown`], run once.
    async fn release_all(&self) -> Vec<(OrgId, Result<(), Error>)> {
        use futures::StreamExt;
        // J4 for every journal org: each release only drains it, and one release seal
        // frees them all once every final ship is acknowledged.
        let journal = self.inner.journal.lock().await.clone();
        if let Some(issuer) = &journal {
            issuer.begin_close();
        }
        let slots: Vec<(OrgId, Slot)> = lock(&self.inner.orgs).drain().collect();
        // When the drain was said: its lease stays listed a while from then (below).
        let mut announced = None;
        if !slots.is_empty() {
            let ids: Vec<OrgId> = slots.iter().map(|(id, _)| id.clone()).collect();
            if self.inner.replica.drain(&ids).await {
                announced = Some(idem_base::Stopwatch::start());
            } else {
                tracing::info!(
                    orgs = ids.len(),
                    "draining not said in the process lease: successors claim at their next requests"
                );
            }
        }
        let released: Vec<Option<(OrgId, Result<(), Error>)>> = futures::stream::iter(slots)
            .map(|(id, slot)| async move {
                // An org still opening is waited for (the cell runs one initializer at a
                // time), then released like the others; a slot nobody opens yields nothing.
                let org = slot
                    .get_or_try_init(|| async { Err(Error::ShuttingDown { org: id.clone() }) })
                    .await
                    .ok()?
                    .clone();
                Some((id, org.release().await))
            })
            .buffer_unordered(self.inner.settings.shutdown_concurrency.max(1))
            .collect()
            .await;
        let released: Vec<(OrgId, Result<(), Error>)> = released.into_iter().flatten().collect();
        // Every journal org released: the run ends with a release seal (J4), so nothing
        // of it is adopted and a successor's walk of any org it held ends free.
        // An org whose final ship failed had those commits unacknowledged: the seal frees
        // it at its acknowledged state like the others. Without the seal (a fenced run, a
        // store that is down) the orgs stay held by the run until a successor adopts it.
        if let Some(issuer) = journal
            && let Err(e) = issuer.close(true).await
        {
            tracing::warn!(error = %e, "journal run not sealed at shutdown");
        }
        // Every org released: the process holds nothing, and its lease would only be listed
        // by every watcher ever after. An org whose release failed keeps it (renewed while
        // this handle lives), so its successor judges it as it judges any holder (I15).
        if !released.iter().all(|(_, r)| r.is_ok()) {
            return released;
        }
        // A drain shorter than a watcher's poll would otherwise come and go between two
        // LISTs, and no successor would claim in the background (docs/design.md 3f).
        if let (Some(since), Some(warm)) = (announced, &self.inner.warm) {
            tokio::time::sleep(warm.drain_linger().saturating_sub(since.elapsed())).await;
        }
        if self.inner.replica.retire().await {
            tracing::info!(orgs = released.len(), "drained: process lease deleted");
        }
        released
    }

    /// The journal's issuer, started at its first use; `None` when the registry ships per
    /// org.
    async fn issuer(&self, id: &OrgId) -> Result<Option<Issuer>, Error> {
        let j = &self.inner.settings.journal;
        if !j.enabled {
            return Ok(None);
        }
        let settings = IssuerSettings {
            window: j.window,
            late_ms: j.late_ms,
            retain_every: j.retain_every_batches,
            keep_ms: self.inner.settings.retention.keep_ms,
            max_lag: j.max_lag_batches,
        };
        let inner = &self.inner;
        let mut journal = inner.journal.lock().await;
        // A fenced run acknowledges nothing again: the next acquire starts the next run.
        let started = match journal.as_ref() {
            Some(i) if !i.is_fenced() => return Ok(Some(i.clone())),
            Some(fenced) => Issuer::restart(fenced, settings).await,
            None => Issuer::start(&inner.replica, &inner.writer_id, settings).await,
        };
        let issuer = started.map_err(|e| Error::replica(id, e))?;
        tokio::spawn(release_lagging(
            Arc::downgrade(&self.inner),
            issuer.subscribe_lag(),
        ));
        *journal = Some(issuer.clone());
        Ok(Some(issuer))
    }

    /// Removes `slot` from the map if it is still the org's slot and holds no serving writer.
    /// A slot whose init failed may meanwhile be initialized by another waiter on the same
    /// cell; removing it then would orphan that writer, and the next acquire would claim a new
    /// round and fence it. So an uninitialized slot is removed only when nobody else holds it.
    fn forget(&self, id: &OrgId, slot: &Slot) {
        let mut orgs = lock(&self.inner.orgs);
        let Some(current) = orgs.get(id) else {
            return;
        };
        if !Arc::ptr_eq(current, slot) {
            return;
        }
        let dead = match slot.get() {
            Some(org) => !org.is_serving(),
            // Held by the map and by us only: no other task can be initializing it.
            None => Arc::strong_count(slot) == 2,
        };
        if dead {
            orgs.remove(id);
        }
    }

    /// Releases the least recently used idle orgs beyond `max_open_orgs`.
    async fn evict_beyond_limit(&self, keep: &OrgId) {
        let victims: Vec<(OrgId, Slot, Org)> = {
            let orgs = lock(&self.inner.orgs);
            let excess = orgs.len().saturating_sub(self.inner.settings.max_open_orgs);
            if excess == 0 {
                return;
            }
            let mut idle: Vec<(OrgId, Slot, Org)> = orgs
                .iter()
                .filter(|(id, _)| *id != keep)
                .filter_map(|(id, s)| s.get().map(|o| (id.clone(), s.clone(), o.clone())))
                .filter(|(_, _, o)| o.is_serving() && o.inflight() == 0)
                .collect();
            idle.sort_by_key(|(_, _, o)| o.last_used());
            idle.truncate(excess);
            idle
        };
        // Victims stay in the map until released: an acquire of one meanwhile finds it
        // closing and waits for its Release instead of claiming over its final ship.
        for (id, slot, org) in victims {
            if let Err(e) = org.release().await
                && e.kind() != ErrorKind::Reacquire
            {
                tracing::warn!(org = %id, error = %e, "release on eviction failed");
            }
            self.forget(&id, &slot);
        }
    }
}

impl Registry {
    /// K2.5: opens in the background, `warm.concurrency` at a time, the orgs of a run
    /// this process adopted, so their first requests find them served. Each is an ordinary
    /// acquire (its walk now ends in this process's run: K4); one already open or refused is
    /// left alone.
    fn take_adopted(&self, issuer: &Issuer) {
        use futures::StreamExt;
        let adopted = issuer.take_adopted();
        if adopted.is_empty() {
            return;
        }
        let registry = Arc::downgrade(&self.inner);
        let concurrency = self.inner.settings.warm.concurrency.max(1);
        tokio::spawn(async move {
            futures::stream::iter(adopted)
                .for_each_concurrent(concurrency, |id| {
                    let registry = registry.clone();
                    async move {
                        let Some(inner) = registry.upgrade() else {
                            return;
                        };
                        let registry = Registry { inner };
                        if registry.shutting_down()
                            || registry.serving(&id).is_some()
                            || !registry.has_room()
                        {
                            return;
                        }
                        match registry.acquire_unnoted(&id).await {
                            Ok(_) => tracing::debug!(org = %id, "adopted org opened (K2.5)"),
                            Err(e) => {
                                tracing::debug!(org = %id, error = %e, "adopted org not opened")
                            }
                        }
                    }
                })
                .await;
        });
    }
}

/// J7 for idle orgs: each org the issuer reports lagging is released (J4) if it is idle,
/// as an eviction releases it, so its old walk entry stops holding the run's retention
/// back; a busy one checkpoints at its next ship instead. Ends with the registry.
async fn release_lagging(
    registry: std::sync::Weak<RegistryInner>,
    mut lagging: tokio::sync::mpsc::UnboundedReceiver<OrgId>,
) {
    while let Some(id) = lagging.recv().await {
        let Some(inner) = registry.upgrade() else {
            return;
        };
        let registry = Registry { inner };
        if registry.shutting_down() {
            return;
        }
        let found = lock(&registry.inner.orgs)
            .get(&id)
            .and_then(|s| s.get().map(|o| (s.clone(), o.clone())));
        let Some((slot, org)) = found else {
            continue;
        };
        if !org.is_serving() || org.inflight() > 0 {
            continue;
        }
        tracing::debug!(org = %id, "releasing an idle org whose journal entry lags (J7)");
        if let Err(e) = org.release().await
            && e.kind() != ErrorKind::Reacquire
        {
            tracing::warn!(org = %id, error = %e, "release of a lagging org failed");
        }
        registry.forget(&id, &slot);
    }
}
