//! The issuer (`docs/design.md` 3g, "The org layer on the journal"): one task per writer
//! process owns its [`Run`] and turns what every org hands it into batches. Each org's
//! section, confirmation or claim announcement waits in a queue; a batch takes the whole
//! queue (group commit across orgs), and J7 issues one while nothing is in flight, or
//! another once the newest in flight is late (half a mean landing), up to the window. Answers go out as the resolved prefix passes each slot
//! (J1): a section is acknowledged only when the prefix passes our landed batch holding
//! it, and a confirmation only by a batch of ours issued after it arrived (J6).
//!
//! ```text
//! submit(section) ─┐                               ┌─ Ok(SectionAcked { run, slot })
//! confirm(org) ────┼─ queue ─ issue_batch ─ land ──┼─ Ok(())        (prefix passed it)
//! announce(org) ───┘    (J7: one in flight,        └─ NotAcknowledged / Fenced / RunFenced
//!                         another when it is late)
//! a failed put  → drain → seal_self (J3) → the continued run; sections again, same tenures
//! close(release) → drain → seal_release (J4)
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_base::Stopwatch;

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use tokio::sync::{mpsc, oneshot};

use crate::format::journal::{Announced, RunName};
use crate::journal::run::{BatchLanding, BatchMeta, IssuedBatch, Run, SectionInput};
use crate::{Error, OrgId, Replica};

/// Batches between two rosters of a run (3g, "Objects": every `M`-th batch).
pub(crate) const ROSTER_EVERY: u64 = 256;

/// Another process's run that a claim of this issuer found released (K2.6): an org was
/// free at its release seal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReleasedRun {
    /// The run.
    pub run: RunName,
    /// The slot of its release seal.
    pub seal: u64,
    /// The seal's Last-Modified as the walk's LIST reported it (ms since the Unix epoch, on
    /// the store's clock): compared only with another reading of the store's clock (I15).
    pub sealed_at_ms: u64,
}

/// The first guess of a batch's landing time before one was measured, ms.
const FIRST_LANDING_MS: f64 = 30.0;

/// J7's default `late_ms` as a fraction of the mean landing time: a batch in flight for half
/// a landing lets the next one go, so a commit that just missed a batch waits at most about
/// half a round trip for its own, and at most about two batches fly per round trip.
const LATE_FRACTION: f64 = 0.5;

/// The longest wait between two attempts at a self-seal the store refused (J3.2). The
/// first retry waits one [`Task::late`] (a landing's share), and each refusal doubles it up
/// to this: a store that is down gets one attempt a second, and a store that comes back
/// sees the seal within about a second, with or without traffic.
const SEAL_RETRY_MAX: Duration = Duration::from_secs(1);

/// How an [`Issuer`] issues.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IssuerSettings {
    /// Slots in flight at most, from the lowest unresolved one (1..=[`crate::MAX_SHIP_WINDOW`]).
    pub window: u64,
    /// Ms after which the newest batch in flight is late and another may be issued (J7);
    /// 0 = half the measured mean landing time.
    pub late_ms: u64,
    /// Batches between two retention runs of the current run ([`Replica::retain_run`],
    /// T1-T3, in the background, one at a time); 0 = never.
    pub retain_every: u64,
    /// Age by the store's clock, ms, a batch below every walk entry must reach before
    /// retention deletes it.
    pub keep_ms: u64,
    /// J7's lag: an attached org whose walk entry is this many slots behind the batch being
    /// issued is *lagging* ([`Issuer::is_lagging`], [`Issuer::subscribe_lag`]): its next
    /// ship checkpoints, and an idle one should be released. 0 = never.
    pub max_lag: u64,
}

impl Default for IssuerSettings {
    fn default() -> Self {
        IssuerSettings {
            window: 4,
            late_ms: 0,
            retain_every: 1024,
            keep_ms: crate::Retention::default().keep_ms,
            max_lag: 3_900,
        }
    }
}

/// Where an acknowledged section is: the run and slot of the batch holding it. A
/// checkpoint of the org is through exactly this slot (J5).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SectionAcked {
    /// The run.
    pub run: RunName,
    /// The batch's slot.
    pub slot: u64,
}

type Reply<T> = oneshot::Sender<Result<T, Error>>;

enum Msg {
    Section(Box<SectionInput>, Reply<SectionAcked>),
    Confirm(OrgId, Reply<()>),
    Announce(OrgId, bool, Reply<(Announced, u64)>),
    Attach(OrgId, u64, u64, Reply<()>),
    Entry(OrgId, u64),
    Hold(u64),
    Detach(OrgId),
    Close(bool, Reply<()>),
}

/// A handle on the process's issuer task. Cloning shares the task; it ends once every
/// handle is dropped and nothing is in flight, or at [`Issuer::close`].
#[derive(Clone)]
pub struct Issuer {
    shared: Arc<Shared>,
}

struct Shared {
    replica: Replica,
    writer: String,
    tx: mpsc::UnboundedSender<Msg>,
    /// The current run and its floor, as of the last batch issued or settled.
    now: Mutex<(RunName, u64)>,
    /// Set when the run is fenced.
    fenced: std::sync::atomic::AtomicBool,
    /// Orgs whose walk entry lags (J7), until a checkpoint moves it or they detach.
    lagging: Mutex<BTreeSet<OrgId>>,
    /// Where each org that starts lagging is reported.
    lag_tx: Mutex<Option<mpsc::UnboundedSender<OrgId>>>,
    /// Orgs of runs this issuer adopted (K2.3), not yet taken by the caller.
    adopted: Mutex<BTreeSet<OrgId>>,
    /// Runs this issuer's adopt seal ended: a walk that listed one before the seal landed
    /// walks again rather than judging its writer and adopting it once more.
    adopted_runs: Mutex<BTreeSet<RunName>>,
    /// Runs an acquire of this issuer is adopting now: one attempt per run at a time.
    adopting: crate::journal::adopting::Adopting,
    /// Release seals of other processes' runs that a claim of this issuer took an org at
    /// (K1b), each run once: the first is kept in `released` for the caller (K2.6).
    released_runs: Mutex<BTreeSet<RunName>>,
    /// Release seals met and not yet taken by the caller.
    released: Mutex<Vec<ReleasedRun>>,
    /// The process is shutting down: releases wait for the run's release seal.
    closing: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Issuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issuer")
            .field("writer", &self.shared.writer)
            .field("run", &self.run_name())
            .finish_non_exhaustive()
    }
}

impl Issuer {
    /// Starts a new run of this process ([`Replica::start_run`]) written by `writer`, and
    /// its task. Needs a tokio runtime.
    ///
    /// # Errors
    /// As [`Replica::start_run`].
    pub async fn start(
        replica: &Replica,
        writer: &str,
        settings: IssuerSettings,
    ) -> Result<Issuer, Error> {
        let run = replica.start_run(writer, settings.window).await?;
        Ok(Issuer::spawn(replica, writer, settings, run))
    }

    /// After `fenced` ([`Issuer::is_fenced`]), a new issuer in this process's next run: the
    /// fenced run is the newest of its chain (another process sealed it), so its next
    /// number is unused (a self-seal would have moved the chain there first).
    ///
    /// # Errors
    /// As [`Issuer::start`].
    pub async fn restart(fenced: &Issuer, settings: IssuerSettings) -> Result<Issuer, Error> {
        let replica = fenced.replica();
        let mut run = replica.start_run(fenced.writer(), settings.window).await?;
        let next = fenced.run_name().next();
        if next.instance() == run.name().instance() {
            run = Run::new(next, fenced.writer(), settings.window)?;
        }
        Ok(Issuer::spawn(replica, fenced.writer(), settings, run))
    }

    fn spawn(replica: &Replica, writer: &str, settings: IssuerSettings, run: Run) -> Issuer {
        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            replica: replica.clone(),
            writer: writer.to_owned(),
            tx,
            now: Mutex::new((run.name().clone(), run.floor())),
            fenced: std::sync::atomic::AtomicBool::new(false),
            lagging: Mutex::new(BTreeSet::new()),
            lag_tx: Mutex::new(None),
            adopted: Mutex::new(BTreeSet::new()),
            adopted_runs: Mutex::new(BTreeSet::new()),
            adopting: Default::default(),
            released_runs: Mutex::new(BTreeSet::new()),
            released: Mutex::new(Vec::new()),
            closing: std::sync::atomic::AtomicBool::new(false),
        });
        let task = Task {
            replica: replica.clone(),
            shared: Arc::downgrade(&shared),
            late_ms: settings.late_ms,
            max_lag: settings.max_lag,
            retain: (settings.retain_every, settings.keep_ms),
            since_retain: 0,
            retaining: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            run,
            queued: BTreeMap::new(),
            confirms: Vec::new(),
            announces: Vec::new(),
            issued: BTreeMap::new(),
            claims: BTreeMap::new(),
            entries: BTreeMap::new(),
            holds: BTreeSet::new(),
            roster_due: true,
            since_roster: 0,
            flying: FuturesUnordered::new(),
            newest_at: None,
            landing_ms: FIRST_LANDING_MS,
            dead: None,
            closing: None,
            seal_retry: None,
            seal_refusals: 0,
        };
        tokio::spawn(task.run(rx));
        Issuer { shared }
    }

    /// True once another process fenced the run (an adoption, K2): nothing of it is
    /// acknowledged again, and every org it held has stopped. [`Issuer::restart`] starts
    /// the next one.
    pub fn is_fenced(&self) -> bool {
        self.shared
            .fenced
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// True while `org`'s walk entry lags the run by [`IssuerSettings::max_lag`] slots or
    /// more (J7): its next ship writes a checkpoint whatever its section's size.
    pub fn is_lagging(&self, org: &OrgId) -> bool {
        lock(&self.shared.lagging).contains(org)
    }

    /// Reports every org that starts lagging (J7) on the returned channel, once per
    /// episode: the caller releases the idle ones (J4), whose entries otherwise hold the
    /// run's retention back for ever. A second call replaces the first's channel.
    pub fn subscribe_lag(&self) -> mpsc::UnboundedReceiver<OrgId> {
        let (tx, rx) = mpsc::unbounded_channel();
        *lock(&self.shared.lag_tx) = Some(tx);
        rx
    }

    /// The orgs of the runs [`Issuer::acquire`] adopted since the last call (K2.3): walks of
    /// each may now end in this run, and the caller takes them in the background (K2.5).
    pub fn take_adopted(&self) -> Vec<OrgId> {
        std::mem::take(&mut *lock(&self.shared.adopted))
            .into_iter()
            .collect()
    }

    pub(crate) fn note_adopted(&self, orgs: impl IntoIterator<Item = OrgId>) {
        lock(&self.shared.adopted).extend(orgs);
    }

    /// The release seals of other processes' runs that this issuer's claims took orgs at
    /// since the last call (K2.6), each run once in the issuer's life. The caller may learn
    /// the run's other orgs ([`crate::Replica::released_run_orgs`]) and open them before
    /// their requests arrive.
    pub fn take_released(&self) -> Vec<ReleasedRun> {
        std::mem::take(&mut *lock(&self.shared.released))
    }

    /// Notes that a claim took an org free at `run`'s release seal in `slot`, which the
    /// store stamped `sealed_at_ms`: kept for [`Issuer::take_released`] the first time `run`
    /// is met, unless it is this process's.
    pub(crate) fn note_released(&self, run: &RunName, slot: u64, sealed_at_ms: u64) {
        if run.instance() == self.run_name().instance() {
            return;
        }
        if lock(&self.shared.released_runs).insert(run.clone()) {
            lock(&self.shared.released).push(ReleasedRun {
                run: run.clone(),
                seal: slot,
                sealed_at_ms,
            });
        }
    }

    /// Remembers that this issuer's adopt seal ended `runs`.
    pub(crate) fn note_adopted_runs(&self, runs: impl IntoIterator<Item = RunName>) {
        lock(&self.shared.adopted_runs).extend(runs);
    }

    /// True when this issuer's adopt seal ended `run`.
    pub(crate) fn adopted_run(&self, run: &RunName) -> bool {
        lock(&self.shared.adopted_runs).contains(run)
    }

    /// An acquire's turn at adopting `run`: lead the one attempt, or wait for it.
    pub(crate) fn adoption_turn(&self, run: &RunName) -> crate::journal::adopting::Turn<'_> {
        self.shared.adopting.turn(run)
    }

    /// J4 for every org: from now on a tenure's release only drains it (its last section
    /// acknowledged, nothing more written), and stays counted in the run; the release seal
    /// [`Issuer::close`] places afterwards frees every such org at once, one PUT for all.
    pub fn begin_close(&self) {
        self.shared
            .closing
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// True after [`Issuer::begin_close`].
    pub fn is_closing(&self) -> bool {
        self.shared
            .closing
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// The replica the issuer writes through.
    pub fn replica(&self) -> &Replica {
        &self.shared.replica
    }

    /// The writer id its entries carry.
    pub fn writer(&self) -> &str {
        &self.shared.writer
    }

    /// The run batches go to now (a self-seal moves it to the continued run, J3).
    pub fn run_name(&self) -> RunName {
        self.now().0
    }

    /// The run's floor, as of the last batch issued or settled.
    pub fn floor(&self) -> u64 {
        self.now().1
    }

    fn now(&self) -> (RunName, u64) {
        self.shared
            .now
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    async fn ask<T>(&self, make: impl FnOnce(Reply<T>) -> Msg) -> Result<T, Error> {
        let (tx, rx) = oneshot::channel();
        let gone = || Error::ClaimUnusable {
            org: String::new(),
            round: 0,
            reason: "the journal's issuer has stopped",
        };
        self.shared.tx.send(make(tx)).map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?
    }

    /// Hands `section` to the next batch and returns where it was acknowledged: the batch
    /// holding it landed and the resolved prefix passed it (J1). The org must be attached.
    ///
    /// # Errors
    /// [`Error::NotAcknowledged`] when the batch did not land as ours or the run sealed
    /// below it (ship again: sections are cumulative); [`Error::Fenced`] when an exclusion
    /// ended the org's tenure (J2); [`Error::RunFenced`]; [`Error::ClaimUnusable`] for an
    /// org with no tenure in the run, or once the issuer stopped.
    pub async fn submit(&self, section: SectionInput) -> Result<SectionAcked, Error> {
        self.ask(|r| Msg::Section(Box::new(section), r)).await
    }

    /// J6: returns once a batch of ours issued after this call is inside the resolved
    /// prefix and `org`'s tenure is still unfenced: an answer from local state given after
    /// this returns is one no successor had fenced when the request arrived. An empty
    /// batch is issued when no section is due, so one request confirms every waiting org.
    ///
    /// # Errors
    /// As [`Issuer::submit`], but never `NotAcknowledged` (the confirmation waits for the
    /// next batch instead).
    pub async fn confirm(&self, org: &OrgId) -> Result<(), Error> {
        self.ask(|r| Msg::Confirm(org.clone(), r)).await
    }

    /// K1.2 / K1b.1's announcement: returns once a batch carrying `(org, run, from)` in its
    /// `claims` has landed, with that announcement and the batch's slot. The claim then
    /// names exactly that run and `from`. With `claim` false the batch only marks a slot
    /// (K4's tenure start), and announces nothing.
    ///
    /// # Errors
    /// [`Error::RunFenced`]; [`Error::ClaimUnusable`] once the issuer stopped.
    pub async fn announce(&self, org: &OrgId, claim: bool) -> Result<(Announced, u64), Error> {
        self.ask(|r| Msg::Announce(org.clone(), claim, r)).await
    }

    /// Starts `org`'s tenure of `round` in the run, walks entering at `entry` (T3).
    ///
    /// # Errors
    /// [`Error::Fenced`] when the run resolved an exclusion of `org` of a higher round (J2
    /// at birth); [`Error::RunFenced`].
    pub async fn attach(&self, org: &OrgId, round: u64, entry: u64) -> Result<(), Error> {
        self.ask(|r| Msg::Attach(org.clone(), round, entry, r))
            .await
    }

    /// `org`'s walk entry moved to `entry` (a checkpoint through `entry - 1` landed): its
    /// claim is superseded and retention may pass its older entry (T3).
    pub fn entry(&self, org: &OrgId, entry: u64) {
        let _ = self.shared.tx.send(Msg::Entry(org.clone(), entry));
    }

    /// Keeps slots from `entry` on for as long as the run lives: an adopt seal's `from`
    /// (T3: until every org it adopted is checkpointed, which this issuer does not track).
    pub fn hold(&self, entry: u64) {
        let _ = self.shared.tx.send(Msg::Hold(entry));
    }

    /// Ends `org`'s tenure in the run (its Release entry landed, or it stopped).
    pub fn detach(&self, org: &OrgId) {
        let _ = self.shared.tx.send(Msg::Detach(org.clone()));
    }

    /// Waits until nothing is queued or in flight, then, with `release`, ends the run with
    /// a release seal (J4: every org whose walk reaches it is free there); the task then
    /// stops. Call after every org was released or stopped.
    ///
    /// # Errors
    /// [`Error::RunFenced`]; the seal's errors.
    pub async fn close(&self, release: bool) -> Result<(), Error> {
        self.ask(|r| Msg::Close(release, r)).await
    }
}

/// A batch's waiters, by what they wait for.
#[derive(Default)]
struct Waiters {
    sections: Vec<(OrgId, u64, Reply<SectionAcked>)>,
    confirms: Vec<(OrgId, Reply<()>)>,
    announces: Vec<(Announced, Reply<(Announced, u64)>)>,
    /// The batch landed in its slot as ours.
    landed: bool,
}

type Landing = BoxFuture<'static, (IssuedBatch, BatchLanding, Stopwatch)>;

/// Per org, its newest queued section and who waits for it (with the commit each needs).
type Queued = BTreeMap<OrgId, (Box<SectionInput>, Vec<(u64, Reply<SectionAcked>)>)>;

/// Announcements to carry in the next batch: org, whether it is a claim, who waits.
type Announces = Vec<(OrgId, bool, Reply<(Announced, u64)>)>;

struct Task {
    replica: Replica,
    shared: std::sync::Weak<Shared>,
    late_ms: u64,
    max_lag: u64,
    /// `retain_every` and `keep_ms`.
    retain: (u64, u64),
    since_retain: u64,
    /// A retention run is in progress.
    retaining: Arc<std::sync::atomic::AtomicBool>,
    run: Run,
    /// Per org, its newest section and everyone waiting for it (an older queued section is
    /// replaced: the newer one is cumulative).
    queued: Queued,
    confirms: Vec<(OrgId, Reply<()>)>,
    announces: Announces,
    /// Issued slots of the current run and their waiters.
    issued: BTreeMap<u64, Waiters>,
    /// Claims announced and not superseded (T3, J6-1): every batch lists them.
    claims: BTreeMap<OrgId, Announced>,
    /// Walk entries of attached orgs (T3).
    entries: BTreeMap<OrgId, u64>,
    /// Entries kept for the run's life (adopt seals' `from`).
    holds: BTreeSet<u64>,
    roster_due: bool,
    since_roster: u64,
    flying: FuturesUnordered<Landing>,
    newest_at: Option<Stopwatch>,
    /// Mean landing time, ms (J7's `late_ms` when not set).
    landing_ms: f64,
    /// The run was fenced: every request gets this.
    dead: Option<Error>,
    closing: Option<(bool, Reply<()>)>,
    /// After the store refused a self-seal: the wait before the next attempt, and how many
    /// attempts in a row it refused (J3.2, [`SEAL_RETRY_MAX`]).
    seal_retry: Option<Pin<Box<tokio::time::Sleep>>>,
    seal_refusals: u32,
}

impl Task {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Msg>) {
        let mut open = true;
        loop {
            if self.dead.is_none() {
                self.issue().await;
                if self.run.needs_seal() && self.flying.is_empty() && self.seal_retry.is_none() {
                    self.seal().await;
                    // What was queued while the seal was placed goes now, in the continued
                    // run: no message may ever come to wake the select below.
                    if self.dead.is_none() {
                        self.issue().await;
                    }
                }
            }
            if self.flying.is_empty() && (self.closing.is_some() || !open) && self.idle() {
                self.finish().await;
                return;
            }
            let late = self.late_at();
            tokio::select! {
                msg = rx.recv(), if open => match msg {
                    Some(m) => {
                        self.take(m);
                        // Waiting to retry a refused seal: answer at once, as the refusal
                        // answered those before (J3), not after the wait.
                        if self.seal_retry.is_some() {
                            self.not_acknowledged();
                        }
                    }
                    None => open = false,
                },
                Some((batch, landing, at)) = self.flying.next(), if !self.flying.is_empty() => {
                    self.settle(batch, landing, at);
                }
                () = sleep_for(late), if late.is_some() => {}
                () = wait_retry(&mut self.seal_retry), if self.seal_retry.is_some() => {
                    self.seal_retry = None;
                }
            }
        }
    }

    fn idle(&self) -> bool {
        self.dead.is_some()
            || (self.queued.is_empty() && self.confirms.is_empty() && self.announces.is_empty())
    }

    fn due(&self) -> bool {
        !self.queued.is_empty() || !self.confirms.is_empty() || !self.announces.is_empty()
    }

    /// The wait before retrying a self-seal the store refused `seal_refusals` times in a
    /// row: one [`Task::late`], doubled per earlier refusal, at most [`SEAL_RETRY_MAX`].
    fn seal_wait(&self) -> Duration {
        let doubled = 2u32.saturating_pow(self.seal_refusals.min(16));
        self.late().saturating_mul(doubled).min(SEAL_RETRY_MAX)
    }

    fn late(&self) -> Duration {
        let ms = if self.late_ms > 0 {
            self.late_ms as f64
        } else {
            LATE_FRACTION * self.landing_ms
        };
        Duration::from_micros((ms * 1000.0) as u64)
    }

    /// How long until a second batch may go: the newest in flight turns late.
    fn late_at(&self) -> Option<Duration> {
        if self.dead.is_some() || !self.due() || self.flying.is_empty() || self.run.room() == 0 {
            return None;
        }
        self.newest_at
            .map(|at| self.late().saturating_sub(at.elapsed()))
    }

    fn take(&mut self, msg: Msg) {
        if let Some(e) = &self.dead {
            reply_dead(msg, e);
            return;
        }
        match msg {
            Msg::Section(section, reply) => {
                let org = section.org.clone();
                let commit = section.pages.commit();
                match self.queued.remove(&org) {
                    Some((old, mut waiting)) => {
                        let newest = if old.pages.commit() > commit {
                            old
                        } else {
                            section
                        };
                        waiting.push((commit, reply));
                        self.queued.insert(org, (newest, waiting));
                    }
                    None => {
                        self.queued.insert(org, (section, vec![(commit, reply)]));
                    }
                }
            }
            Msg::Confirm(org, reply) => self.confirms.push((org, reply)),
            Msg::Announce(org, claim, reply) => self.announces.push((org, claim, reply)),
            Msg::Attach(org, round, entry, reply) => {
                let attached = self.run.attach(&org, round);
                if attached.is_ok() {
                    self.entries.insert(org, entry);
                    self.roster_due = true;
                }
                let _ = reply.send(attached);
            }
            Msg::Entry(org, entry) => {
                self.unlag(&org);
                self.claims.remove(&org);
                if let Some(e) = self.entries.get_mut(&org) {
                    *e = entry;
                }
            }
            Msg::Hold(entry) => {
                self.holds.insert(entry);
            }
            Msg::Detach(org) => {
                self.unlag(&org);
                self.run.detach(&org);
                self.run.forget_exclusions(&org);
                self.entries.remove(&org);
                self.claims.remove(&org);
            }
            Msg::Close(release, reply) => self.closing = Some((release, reply)),
        }
    }

    /// T3: the lowest walk entry into the run this writer knows of.
    fn retain_below(&self) -> u64 {
        let floor = self.run.floor();
        self.entries
            .values()
            .chain(self.holds.iter())
            .copied()
            .chain(
                self.claims
                    .values()
                    .filter(|a| &a.run == self.run.name())
                    .map(|a| a.from),
            )
            .fold(floor, u64::min)
    }

    /// J7: issues one batch of everything queued when something is due and nothing is in
    /// flight, or the newest in flight is late, and the window has room.
    async fn issue(&mut self) {
        let may = self.due()
            && self.run.is_open()
            && self.run.room() > 0
            && (self.flying.is_empty()
                || self.newest_at.is_some_and(|at| at.elapsed() >= self.late()));
        if !may {
            return;
        }
        let mut waiters = Waiters::default();
        let mut sections = Vec::new();
        for (org, (section, waiting)) in std::mem::take(&mut self.queued) {
            if let Err(e) = self.run.holds(&org) {
                for (_, reply) in waiting {
                    let _ = reply.send(Err(dup(&e)));
                }
                continue;
            }
            for (commit, reply) in waiting {
                waiters.sections.push((org.clone(), commit, reply));
            }
            sections.push(*section);
        }
        waiters.confirms = std::mem::take(&mut self.confirms);
        let (name, floor) = (self.run.name().clone(), self.run.floor());
        for (org, claim, reply) in std::mem::take(&mut self.announces) {
            let announced = Announced {
                org: org.to_string(),
                run: name.clone(),
                from: floor,
            };
            if claim {
                self.claims.insert(org, announced.clone());
            }
            waiters.announces.push((announced, reply));
        }
        if sections.is_empty() && waiters.confirms.is_empty() && waiters.announces.is_empty() {
            return;
        }
        let roster = (self.roster_due || self.since_roster >= ROSTER_EVERY)
            .then(|| self.entries.keys().cloned().collect::<Vec<_>>());
        let meta = BatchMeta {
            retain_below: self.retain_below(),
            claims: self.claims.values().cloned().collect(),
            roster: roster.clone(),
            ..BatchMeta::default()
        };
        match self
            .replica
            .issue_batch(&mut self.run, sections, meta)
            .await
        {
            Ok(batch) => {
                if roster.is_some() {
                    self.roster_due = false;
                    self.since_roster = 0;
                } else {
                    self.since_roster += 1;
                }
                self.publish_now();
                self.retain_now();
                self.check_lag(batch.slot());
                self.issued.insert(batch.slot(), waiters);
                let at = Stopwatch::start();
                self.newest_at = Some(at);
                // The create runs on a task of its own: it makes progress while this task
                // issues the next batch or waits for the runtime, and the landing's time
                // is the store's, not the issuer's. A create this task no longer awaits
                // (the issuer ended) may still land: an unsettled slot acknowledges
                // nothing, and a seal meets it as any late batch (J3). A create whose task
                // failed (a panic) has an unknown outcome, as a failed put (I9): J3 seals
                // the run at its slot.
                let create = tokio::spawn(self.replica.landing(&batch));
                self.flying.push(Box::pin(async move {
                    let landing = create.await.unwrap_or_else(|source| {
                        BatchLanding::Failed(Error::Task {
                            op: "landing a journal batch",
                            source,
                        })
                    });
                    (batch, landing, at)
                }));
            }
            Err(e) => {
                let fenced = matches!(e, Error::RunFenced { .. });
                fail(waiters, &e);
                if fenced {
                    self.die(e);
                }
            }
        }
    }

    fn settle(&mut self, batch: IssuedBatch, landing: BatchLanding, at: Stopwatch) {
        let ms = at.elapsed().as_secs_f64() * 1000.0;
        self.landing_ms = 0.8 * self.landing_ms + 0.2 * ms;
        let slot = batch.slot();
        let landed = matches!(landing, BatchLanding::Landed);
        if let Some(w) = self.issued.get_mut(&slot) {
            w.landed = landed;
        }
        match self.run.settle(batch, landing) {
            Ok(acked) => self.answer(&acked),
            Err(e) => self.die(e),
        }
        self.publish_now();
    }

    /// Answers the waiters of every slot the prefix passed.
    fn answer(&mut self, acked: &[(OrgId, u64)]) {
        let below = self.run.resolved_below();
        let passed: Vec<u64> = self.issued.range(..below).map(|(s, _)| *s).collect();
        let name = self.run.name().clone();
        for slot in passed {
            let Some(w) = self.issued.remove(&slot) else {
                continue;
            };
            for (org, commit, reply) in w.sections {
                let ok = acked.iter().any(|(o, c)| *o == org && *c >= commit) && w.landed;
                let answer = if ok {
                    Ok(SectionAcked {
                        run: name.clone(),
                        slot,
                    })
                } else {
                    Err(self
                        .run
                        .holds(&org)
                        .err()
                        .unwrap_or(Error::NotAcknowledged {
                            org: org.to_string(),
                            run: name.to_string(),
                            slot,
                            reason: "another writer's object holds the batch's slot",
                        }))
                };
                let _ = reply.send(answer);
            }
            if w.landed {
                for (org, reply) in w.confirms {
                    let _ = reply.send(self.run.holds(&org));
                }
                for (announced, reply) in w.announces {
                    let _ = reply.send(Ok((announced, slot)));
                }
            } else {
                // Not ours: confirm and announce in the next batch.
                self.confirms.extend(w.confirms);
                for (a, reply) in w.announces {
                    if let Ok(org) = OrgId::new(&a.org) {
                        let claim = self.claims.remove(&org).is_some();
                        self.announces.push((org, claim, reply));
                    }
                }
            }
        }
    }

    /// J3: once nothing is in flight after a failed put, seals the run at its lowest
    /// unresolved slot and goes on in the continued run with the same tenures.
    async fn seal(&mut self) {
        let retain_below = self.retain_below();
        match self.replica.seal_self(&mut self.run, retain_below).await {
            Ok((continued, acked)) => {
                // Our late batches below the seal are acknowledged by it; nothing at or
                // above it is: sections again, confirms and announcements in the
                // continued run.
                let name = self.run.name().clone();
                for (slot, w) in std::mem::take(&mut self.issued) {
                    for (org, commit, reply) in w.sections {
                        let ok = w.landed && acked.iter().any(|(o, c)| *o == org && *c >= commit);
                        let _ = reply.send(if ok {
                            Ok(SectionAcked {
                                run: name.clone(),
                                slot,
                            })
                        } else {
                            Err(Error::NotAcknowledged {
                                org: org.to_string(),
                                run: name.to_string(),
                                slot,
                                reason: "the run self-sealed below the batch (J3)",
                            })
                        });
                    }
                    self.confirms.extend(w.confirms);
                    for (a, reply) in w.announces {
                        if let Ok(org) = OrgId::new(&a.org) {
                            let claim = self.claims.contains_key(&org);
                            self.announces.push((org, claim, reply));
                        }
                    }
                }
                self.run = continued;
                self.seal_refusals = 0;
                // J3.5: every entry into the sealed run continues at slot 1 of this one.
                for e in self.entries.values_mut() {
                    *e = 1;
                }
                self.holds = [1].into();
                self.roster_due = true;
                self.newest_at = None;
                self.publish_now();
            }
            // The seal's own failure is retried at the same slot (J3.2), after a wait that
            // doubles with each refusal in a row, so a store that is down is not hammered.
            Err(e @ Error::RunFenced { .. }) => self.die(e),
            Err(e) => {
                let wait = self.seal_wait();
                self.seal_refusals = self.seal_refusals.saturating_add(1);
                tracing::warn!(run = %self.run.name(), error = %e, refusals = self.seal_refusals,
                    retry_in_ms = wait.as_millis() as u64, "journal self-seal failed; retrying");
                // Nobody waits for the store to come back: a retryable answer now, as a
                // failed per-org ship gives one (sections are cumulative and go again).
                self.not_acknowledged();
                self.seal_retry = Some(Box::pin(tokio::time::sleep(wait)));
            }
        }
    }

    /// While the self-seal is not placed (J3), every waiter gets `NotAcknowledged` (never
    /// an acknowledgement: a slot the seal later finds ours answers nobody). An announced
    /// claim stays listed (T3) until its org's entry moves or it detaches, as before.
    fn not_acknowledged(&mut self) {
        let (run, slot) = (self.run.name().to_string(), self.run.floor());
        let e = |org: &str| Error::NotAcknowledged {
            org: org.to_owned(),
            run: run.clone(),
            slot,
            reason: "the store refused the run's self-seal (J3)",
        };
        let mut announces = Vec::new();
        for w in self.issued.values_mut() {
            for (org, _, reply) in w.sections.drain(..) {
                let _ = reply.send(Err(e(org.as_str())));
            }
            for (org, reply) in w.confirms.drain(..) {
                let _ = reply.send(Err(e(org.as_str())));
            }
            announces.extend(w.announces.drain(..).map(|(a, r)| (a.org, r)));
        }
        for (org, (_, waiting)) in std::mem::take(&mut self.queued) {
            for (_, reply) in waiting {
                let _ = reply.send(Err(e(org.as_str())));
            }
        }
        for (org, reply) in std::mem::take(&mut self.confirms) {
            let _ = reply.send(Err(e(org.as_str())));
        }
        announces.extend(
            std::mem::take(&mut self.announces)
                .into_iter()
                .map(|(o, _, r)| (o.to_string(), r)),
        );
        for (org, reply) in announces {
            let _ = reply.send(Err(e(&org)));
        }
    }

    /// Every `retain_every` batches, T1-T3 over the current run in the background: batches
    /// below every walk entry the newest header names, once `keep_ms` old by the store.
    fn retain_now(&mut self) {
        use std::sync::atomic::Ordering;
        let (every, keep_ms) = self.retain;
        self.since_retain += 1;
        if every == 0 || self.since_retain < every || self.retaining.swap(true, Ordering::AcqRel) {
            return;
        }
        self.since_retain = 0;
        let (replica, run, running) = (
            self.replica.clone(),
            self.run.name().clone(),
            self.retaining.clone(),
        );
        tokio::spawn(async move {
            match replica.retain_run(&run, keep_ms).await {
                Ok(r) => {
                    tracing::debug!(%run, deleted = r.deleted.len(), below = r.retain_below, "journal retention")
                }
                Err(e) => tracing::warn!(%run, error = %e, "journal retention failed"),
            }
            running.store(false, Ordering::Release);
        });
    }

    /// J7's lag trigger at the batch in `slot`: marks and reports every attached org whose
    /// entry is `max_lag` or more slots behind it.
    fn check_lag(&self, slot: u64) {
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        if self.max_lag == 0 {
            return;
        }
        let mut lagging = lock(&shared.lagging);
        let tx = lock(&shared.lag_tx).clone();
        for (org, &entry) in &self.entries {
            if slot.saturating_sub(entry) >= self.max_lag && lagging.insert(org.clone()) {
                tracing::debug!(%org, entry, slot, "journal entry lags (J7)");
                if let Some(tx) = &tx {
                    let _ = tx.send(org.clone());
                }
            }
        }
    }

    fn unlag(&self, org: &OrgId) {
        if let Some(shared) = self.shared.upgrade() {
            lock(&shared.lagging).remove(org);
        }
    }

    fn publish_now(&self) {
        if let Some(shared) = self.shared.upgrade() {
            *lock(&shared.now) = (self.run.name().clone(), self.run.floor());
        }
    }

    fn die(&mut self, e: Error) {
        tracing::warn!(run = %self.run.name(), error = %e, "journal run fenced: every org of it stops");
        for (_, w) in std::mem::take(&mut self.issued) {
            fail(w, &e);
        }
        for (_, (_, waiting)) in std::mem::take(&mut self.queued) {
            for (_, reply) in waiting {
                let _ = reply.send(Err(dup(&e)));
            }
        }
        for (_, reply) in std::mem::take(&mut self.confirms) {
            let _ = reply.send(Err(dup(&e)));
        }
        for (_, _, reply) in std::mem::take(&mut self.announces) {
            let _ = reply.send(Err(dup(&e)));
        }
        if let Some(shared) = self.shared.upgrade() {
            shared
                .fenced
                .store(true, std::sync::atomic::Ordering::Release);
        }
        self.dead = Some(e);
    }

    async fn finish(&mut self) {
        let Some((release, reply)) = self.closing.take() else {
            return;
        };
        let result = match &self.dead {
            Some(e) => Err(dup(e)),
            None if release && self.run.is_open() => {
                // J4 for every org: the tenures the seal frees stay attached, and their
                // walks read their newest sections before they meet it, so the seal keeps
                // the lowest entry left (T3), never just its own slot.
                let below = self.retain_below();
                self.replica
                    .seal_release(&mut self.run, below)
                    .await
                    .map(|_| ())
            }
            None => Ok(()),
        };
        let _ = reply.send(result);
    }
}

/// Waits out a pending seal retry (none: never ready; the caller guards the branch).
async fn wait_retry(retry: &mut Option<Pin<Box<tokio::time::Sleep>>>) {
    match retry {
        Some(sleep) => sleep.as_mut().await,
        None => std::future::pending().await,
    }
}

async fn sleep_for(d: Option<Duration>) {
    if let Some(d) = d {
        tokio::time::sleep(d).await;
    }
}

fn fail(w: Waiters, e: &Error) {
    for (_, _, reply) in w.sections {
        let _ = reply.send(Err(dup(e)));
    }
    for (_, reply) in w.confirms {
        let _ = reply.send(Err(dup(e)));
    }
    for (_, reply) in w.announces {
        let _ = reply.send(Err(dup(e)));
    }
}

fn reply_dead(msg: Msg, e: &Error) {
    match msg {
        Msg::Section(_, r) => drop(r.send(Err(dup(e)))),
        Msg::Confirm(_, r) => drop(r.send(Err(dup(e)))),
        Msg::Announce(_, _, r) => drop(r.send(Err(dup(e)))),
        Msg::Attach(_, _, _, r) => drop(r.send(Err(dup(e)))),
        Msg::Close(_, r) => drop(r.send(Err(dup(e)))),
        Msg::Entry(..) | Msg::Hold(_) | Msg::Detach(_) => {}
    }
}

/// The same answer for each of several waiters (errors are not `Clone`: the store's are
/// not). What a waiter acts on is the kind: a fence, a lost tenure, or "ship again".
fn dup(e: &Error) -> Error {
    match e {
        Error::RunFenced { run, slot, reason } => Error::RunFenced {
            run: run.clone(),
            slot: *slot,
            reason: reason.clone(),
        },
        Error::Fenced { org, ours, theirs } => Error::Fenced {
            org: org.clone(),
            ours: *ours,
            theirs: *theirs,
        },
        Error::ClaimUnusable { org, round, reason } => Error::ClaimUnusable {
            org: org.clone(),
            round: *round,
            reason,
        },
        Error::NotAcknowledged {
            org,
            run,
            slot,
            reason,
        } => Error::NotAcknowledged {
            org: org.clone(),
            run: run.clone(),
            slot: *slot,
            reason,
        },
        other => {
            tracing::warn!(error = %other, "journal batch not issued");
            Error::NotAcknowledged {
                org: String::new(),
                run: String::new(),
                slot: 0,
                reason: "the batch could not be issued",
            }
        }
    }
}

/// A poisoned lock is still the state: every writer of these leaves them whole.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
