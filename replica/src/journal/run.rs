//! A writer process's run (`docs/design.md` 3g, "Writer rules"): batches issued in slot
//! order below `floor + window`, landed concurrently, acknowledged as the **resolved prefix**
//! grows (J1); a slot holding another writer's object resolved by J2; a failed put ending the
//! run with a self-seal at the lowest unresolved slot once everything in flight has settled
//! (J3); a drained run ended by a release seal (J4).
//!
//! ```text
//! issue_batch(&mut run, sections)   takes the next slot (below floor + window), encodes
//! land_batch(&batch)                create-only put, settled by re-reading (I9); no run
//!                                   borrowed, so several land at once
//! run.settle(batch, landing)        resolves the slot; returns the commits acknowledged now:
//!                                   those of our batches the prefix passed, except orgs an
//!                                   exclusion fenced at or below their slot (J1, J2)
//! seal_self(&mut run)               J3: the continued run, after the seal landed
//! seal_release(&mut run)            J4: the drained run's end
//! ```

use std::collections::BTreeMap;

use bytes::Bytes;
use tracing::{debug, warn};

use crate::format::journal::{
    self, Announced, Batch, Exclusion, JournalHeader, JournalObject, RunName, Seal, SealKind,
    SectionFrame, SectionIndex,
};
use crate::format::layout::new_nonce;
use crate::journal::io::Created;
use crate::journal::{Base, Via};
use crate::{Delta, Error, OrgId, Replica};

/// Tries of a seal's create at one slot, within one call, before the call returns the
/// error; the next call retries the same body at the same slot (J3.2).
const SEAL_TRIES: u32 = 3;

/// Page bytes of a batch up to which its sections are compressed on the issuer's own task
/// rather than on a blocking thread: 256 KiB, a fraction of a millisecond of zstd.
const INLINE_COMPRESS_BYTES: usize = 256 << 10;

/// What a slot of the run holds, as far as its writer knows.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Slot {
    /// Issued, not settled.
    InFlight { nonce: String, sections: Sections },
    /// Our batch landed there.
    Ours { sections: Sections },
    /// Another writer's exclusion is there, resolved by J2: of this org, of this round.
    Foreign { excludes: Option<(OrgId, u64)> },
    /// Our put failed or its outcome is unknown: unresolved until a seal's collision shows
    /// whose it is.
    Failed { nonce: String, sections: Sections },
}

/// The `(org, commit counter)` of each section of a batch.
pub type Commits = Vec<(OrgId, u64)>;

/// The `(org, tenure round, commit counter)` of each section of a batch.
type Sections = Vec<(OrgId, u64, u64)>;

/// Where the run is.
#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    Open,
    /// A put failed: nothing more is issued; J3 seals once everything settled.
    Failing,
    /// Ended by our own seal at `slot` (self or release).
    Sealed {
        slot: u64,
    },
    /// Another process's seal (or an object we never made) at `slot`: nothing more is
    /// acknowledged.
    Fenced {
        slot: u64,
        reason: String,
    },
}

/// One org held in the run: its tenure's round, and where an exclusion ended it.
#[derive(Clone, Debug)]
struct Tenure {
    round: u64,
    /// The slot and round of the lowest exclusion that fenced it (J2).
    fenced: Option<(u64, u64)>,
}

/// One org's section of a batch to issue: the tenure it is written under and its pages,
/// cumulative from `base` (`docs/design.md` 3g, "Objects").
#[derive(Debug)]
pub struct SectionInput {
    /// The org.
    pub org: OrgId,
    /// How its tenure began.
    pub via: Via,
    /// The checkpoint the pages are counted from.
    pub base: Base,
    /// The database checksum after the pages are applied to the base.
    pub checksum: String,
    /// Every page changed since `base`, and the commit counter they hold.
    pub pages: Delta,
    /// The org is released by this section (J4).
    pub released: bool,
}

/// What a batch's header carries besides its sections (`docs/design.md` 3g, "Objects").
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BatchMeta {
    /// The lowest walk entry into the run its writer knows of (T3).
    pub retain_below: u64,
    /// The orgs attached to the run, when this batch carries the roster (every run's first
    /// batch, every 256th, and any after an attach).
    pub roster: Option<Vec<OrgId>>,
    /// Claims announced before their create and not yet superseded (K1.2, J6-1).
    pub claims: Vec<Announced>,
    /// Raised `retain_below` values for earlier runs of the chain or adopted runs (T3).
    pub retain: BTreeMap<RunName, u64>,
}

impl BatchMeta {
    /// A header with `retain_below` and nothing else: no roster, no announcements.
    pub fn new(retain_below: u64) -> BatchMeta {
        BatchMeta {
            retain_below,
            ..BatchMeta::default()
        }
    }
}

/// A batch issued in a run and not yet settled. Not `Clone`: it is settled once.
#[derive(Debug)]
pub struct IssuedBatch {
    header: JournalHeader,
    bytes: Bytes,
    commits: Commits,
    sections: Sections,
}

impl IssuedBatch {
    /// The batch's slot.
    pub fn slot(&self) -> u64 {
        self.header.slot
    }

    /// The `(org, commit counter)` of every section it holds.
    pub fn commits(&self) -> &[(OrgId, u64)] {
        &self.commits
    }

    /// The encoded object's size, bytes.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// True for a batch of no bytes (never: a batch has at least its header).
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

/// The outcome of [`Replica::land_batch`].
#[derive(Debug)]
pub enum BatchLanding {
    /// The batch is in its slot (now, or by an earlier try).
    Landed,
    /// Another object holds the slot.
    Taken(Box<JournalHeader>),
    /// The put failed, or its outcome is unknown (I9): the slot stays unresolved (J3).
    Failed(Error),
}

/// A writer process's run: the slots it issued, the orgs it holds and what fenced them.
#[derive(Debug)]
pub struct Run {
    name: RunName,
    writer: String,
    window: u64,
    next: u64,
    /// The lowest unresolved slot: every slot below it is resolved (the resolved prefix).
    prefix: u64,
    slots: BTreeMap<u64, Slot>,
    tenures: BTreeMap<OrgId, Tenure>,
    /// Per org, the highest round of an exclusion resolved foreign in this run or an earlier
    /// one of its chain (J2, "Before a tenure starts").
    remembered: BTreeMap<OrgId, u64>,
    /// Per org, the highest round of an exclusion in a slot the prefix passed (or in an
    /// earlier run of the chain): a section of a lower round above it is never acknowledged
    /// (J1), whatever tenure the org holds now.
    passed: BTreeMap<OrgId, u64>,
    state: State,
    /// J3.2 / J4: the seal being placed, retried at its slot with the same body.
    pending_seal: Option<JournalHeader>,
    /// The zstd level of section frames.
    level: i32,
}

impl Run {
    /// A new run named `name`, written by `writer`, with at most `window` slots in flight
    /// (1..=[`crate::MAX_SHIP_WINDOW`]). Nothing is written until a batch lands.
    ///
    /// # Errors
    /// [`Error::InvalidSettings`] for a window out of range; [`Error::InvalidWriter`].
    pub fn new(name: RunName, writer: &str, window: u64) -> Result<Run, Error> {
        crate::org_id::check_writer(writer)?;
        if !(1..=crate::MAX_SHIP_WINDOW).contains(&window) {
            return Err(Error::InvalidSettings {
                reason: format!(
                    "a journal window of {window}, outside 1..={}",
                    crate::MAX_SHIP_WINDOW
                ),
            });
        }
        Ok(Run {
            name,
            writer: writer.to_owned(),
            window,
            next: 1,
            prefix: 1,
            slots: BTreeMap::new(),
            tenures: BTreeMap::new(),
            remembered: BTreeMap::new(),
            passed: BTreeMap::new(),
            state: State::Open,
            pending_seal: None,
            level: 3,
        })
    }

    /// The run's name.
    pub fn name(&self) -> &RunName {
        &self.name
    }

    /// The writer id its objects and claims carry.
    pub fn writer(&self) -> &str {
        &self.writer
    }

    /// The lowest slot not resolved: every slot below it is (J1's prefix ends here). A
    /// claim, exclusion or adopt seal this writer makes names it as `from` (J4-1).
    pub fn floor(&self) -> u64 {
        self.prefix
    }

    /// Batches that may be issued now: the window is a span of slots from the lowest
    /// unresolved one, not a count of batches in flight (3e's W1), so landed slots above an
    /// unresolved one still take room. 0 once the run stopped issuing.
    pub fn room(&self) -> u64 {
        if self.state != State::Open {
            return 0;
        }
        (self.prefix + self.window).saturating_sub(self.next)
    }

    /// Slots issued and not settled.
    pub fn in_flight(&self) -> usize {
        self.slots
            .values()
            .filter(|s| matches!(s, Slot::InFlight { .. }))
            .count()
    }

    /// True when a put failed and J3's self-seal is due ([`Replica::seal_self`]) once
    /// nothing is in flight.
    pub fn needs_seal(&self) -> bool {
        self.state == State::Failing
    }

    /// True while batches may be issued.
    pub fn is_open(&self) -> bool {
        self.state == State::Open
    }

    /// Starts `org`'s tenure of `round` in this run (K1.5, K1b.3, K2.4, K4).
    ///
    /// # Errors
    /// [`Error::Fenced`] when the writer resolved an exclusion of `org` of a higher round
    /// (J2 at birth: the tenure never serves); [`Error::RunFenced`] on a fenced run.
    pub fn attach(&mut self, org: &OrgId, round: u64) -> Result<(), Error> {
        self.usable()?;
        if let Some(&theirs) = self.remembered.get(org)
            && theirs > round
        {
            return Err(Error::Fenced {
                org: org.to_string(),
                ours: round,
                theirs,
            });
        }
        self.tenures.insert(
            org.clone(),
            Tenure {
                round,
                fenced: None,
            },
        );
        Ok(())
    }

    /// Ends `org`'s tenure here (its release landed, or it moved).
    pub fn detach(&mut self, org: &OrgId) {
        self.tenures.remove(org);
    }

    /// Forgets the exclusions of `org` this writer resolved: call only when no claim,
    /// adoption or K4 attach of `org` is in progress (J2, J6-3).
    pub fn forget_exclusions(&mut self, org: &OrgId) {
        self.remembered.remove(org);
    }

    /// The end of the resolved prefix: every slot below it is resolved (J1).
    pub fn resolved_below(&self) -> u64 {
        self.prefix
    }

    /// Whether `org` may still be served from this run.
    ///
    /// # Errors
    /// [`Error::Fenced`] when an exclusion fenced `org`'s tenure (J2);
    /// [`Error::RunFenced`] when another process's seal ended the run;
    /// [`Error::ClaimUnusable`] when `org` holds no tenure here.
    pub fn holds(&self, org: &OrgId) -> Result<(), Error> {
        self.usable()?;
        let tenure = self.tenures.get(org).ok_or_else(|| Error::ClaimUnusable {
            org: org.to_string(),
            round: 0,
            reason: "no tenure in this journal run",
        })?;
        match tenure.fenced {
            Some((_, theirs)) => Err(Error::Fenced {
                org: org.to_string(),
                ours: tenure.round,
                theirs,
            }),
            None => Ok(()),
        }
    }

    /// Records `landing`, the outcome of `batch`, and returns the commits acknowledged now
    /// (J1): the sections of our batches in the slots the resolved prefix just passed, in
    /// slot order, except those of an org an exclusion fenced at or below their slot. A
    /// slot an exclusion holds is resolved but acknowledges nothing: its batch never
    /// landed, and its pages go with the next batch (cumulative sections). A failed put
    /// leaves its slot unresolved and makes [`Run::needs_seal`] true (J3).
    ///
    /// # Errors
    /// [`Error::RunFenced`] when the slot holds another process's seal or an object this
    /// writer never made, or the run was fenced before: nothing is acknowledged from it
    /// again (J2).
    pub fn settle(&mut self, batch: IssuedBatch, landing: BatchLanding) -> Result<Commits, Error> {
        self.usable()?;
        let slot = batch.slot();
        match landing {
            BatchLanding::Landed => {
                self.slots.insert(
                    slot,
                    Slot::Ours {
                        sections: batch.sections,
                    },
                );
            }
            BatchLanding::Taken(theirs) => self.resolve_foreign(slot, &theirs)?,
            // A damaged object in our slot is one this writer never made: nothing above it
            // can be placed or read (I10), so the run stops rather than seal over it.
            BatchLanding::Failed(e @ Error::Corrupt { .. }) => {
                return Err(self.fence_run(slot, format!("a damaged object in its slot: {e}")));
            }
            BatchLanding::Failed(e) => {
                warn!(run = %self.name, slot, error = %e, "journal batch not landed; the run ends (J3)");
                self.slots.insert(
                    slot,
                    Slot::Failed {
                        nonce: batch.header.nonce,
                        sections: batch.sections,
                    },
                );
                if self.state == State::Open {
                    self.state = State::Failing;
                }
            }
        }
        Ok(self.advance())
    }

    /// Moves the prefix past every resolved slot, in slot order, and returns the commits
    /// it acknowledged: a section is acknowledged unless an exclusion of its org of a round
    /// above the section's lies in a slot below it (J1). Judged by the section's own round,
    /// so a later tenure of the org never revives an earlier one's sections.
    fn advance(&mut self) -> Commits {
        let mut acked = Vec::new();
        loop {
            match self.slots.get(&self.prefix) {
                Some(Slot::Ours { .. } | Slot::Foreign { .. }) => {}
                _ => return acked,
            }
            match self.slots.remove(&self.prefix) {
                Some(Slot::Ours { sections }) => {
                    for (org, round, commit) in sections {
                        if self.passed.get(&org).is_none_or(|&r| r <= round) {
                            acked.push((org, commit));
                        }
                    }
                }
                Some(Slot::Foreign {
                    excludes: Some((org, round)),
                }) => {
                    let r = self.passed.entry(org).or_insert(0);
                    *r = (*r).max(round);
                }
                _ => {}
            }
            self.prefix += 1;
        }
    }

    fn usable(&self) -> Result<(), Error> {
        match &self.state {
            State::Fenced { slot, reason } => Err(self.run_fenced(*slot, reason)),
            _ => Ok(()),
        }
    }

    fn run_fenced(&self, slot: u64, reason: &str) -> Error {
        Error::RunFenced {
            run: self.name.to_string(),
            slot,
            reason: reason.to_owned(),
        }
    }

    /// J2: what another writer's object at `slot` means to this run.
    fn resolve_foreign(&mut self, slot: u64, theirs: &JournalHeader) -> Result<(), Error> {
        match &theirs.object {
            JournalObject::Exclusion(ex) => {
                let excludes = self.exclude(slot, ex);
                self.slots.insert(slot, Slot::Foreign { excludes });
                Ok(())
            }
            JournalObject::Seal(Seal {
                seal: SealKind::Adopt,
                by,
                ..
            }) => Err(self.fence_run(slot, format!("adopted by {by}"))),
            other => Err(self.fence_run(
                slot,
                format!(
                    "an object this writer never made: {}",
                    match other {
                        JournalObject::Batch(_) => "a batch",
                        JournalObject::Seal(_) => "a seal",
                        JournalObject::Exclusion(_) => "an exclusion",
                    }
                ),
            )),
        }
    }

    /// J2 for an exclusion at `slot`: remembers its round, fences the org's tenure of a
    /// lower round from the lowest such slot, and returns the org and round it excludes.
    fn exclude(&mut self, slot: u64, ex: &Exclusion) -> Option<(OrgId, u64)> {
        // An org id that does not validate names no section of ours.
        let org = OrgId::new(&ex.org).ok()?;
        let remembered = self.remembered.entry(org.clone()).or_insert(0);
        *remembered = (*remembered).max(ex.round);
        if let Some(t) = self.tenures.get_mut(&org)
            && ex.round > t.round
            && t.fenced.is_none_or(|(at, _)| slot < at)
        {
            debug!(run = %self.name, slot, %org, ours = t.round, theirs = ex.round, "exclusion fences the tenure (J2)");
            t.fenced = Some((slot, ex.round));
        }
        Some((org, ex.round))
    }

    fn fence_run(&mut self, slot: u64, reason: String) -> Error {
        warn!(run = %self.name, slot, %reason, "journal run fenced; every org of it is lost");
        self.state = State::Fenced {
            slot,
            reason: reason.clone(),
        };
        self.run_fenced(slot, &reason)
    }

    /// The continued run after a self-seal: the same tenures (those an exclusion fenced
    /// end), the remembered exclusions, a fresh slot space.
    fn continued(&self) -> Run {
        Run {
            name: self.name.next(),
            writer: self.writer.clone(),
            window: self.window,
            next: 1,
            prefix: 1,
            slots: BTreeMap::new(),
            tenures: self
                .tenures
                .iter()
                .filter(|(_, t)| t.fenced.is_none())
                .map(|(o, t)| (o.clone(), t.clone()))
                .collect(),
            remembered: self.remembered.clone(),
            // Every exclusion this run resolved lies below its seal, or above it where no
            // walk reads: either way none of its orgs' lower rounds is acknowledged again.
            passed: {
                let mut passed = self.remembered.clone();
                for (o, &r) in &self.passed {
                    let p = passed.entry(o.clone()).or_insert(0);
                    *p = (*p).max(r);
                }
                passed
            },
            state: State::Open,
            pending_seal: None,
            level: self.level,
        }
    }
}

impl Replica {
    /// Issues a batch of `sections` in `run`'s next slot (below `floor + window`, W1), its
    /// header carrying `meta` (retention, roster, announced claims). Publishes nothing:
    /// [`Replica::land_batch`] does. An empty `sections` is an empty batch (a header), which
    /// confirms and announces (J6, K1.2).
    ///
    /// # Errors
    /// [`Error::InvalidSettings`] when the run is not open or its window is full, or a
    /// section's org holds no tenure here or holds two sections; [`Error::Fenced`] for a
    /// section of a fenced tenure; [`Error::RunFenced`]; [`Error::Compress`].
    pub async fn issue_batch(
        &self,
        run: &mut Run,
        sections: Vec<SectionInput>,
        meta: BatchMeta,
    ) -> Result<IssuedBatch, Error> {
        run.usable()?;
        if run.state != State::Open || run.next >= run.prefix + run.window {
            return Err(Error::InvalidSettings {
                reason: format!(
                    "a journal batch at slot {} with slot {} unresolved, window {}, run {}",
                    run.next,
                    run.prefix,
                    run.window,
                    if run.state == State::Open {
                        "open"
                    } else {
                        "ending"
                    }
                ),
            });
        }
        let mut inputs = Vec::with_capacity(sections.len());
        let mut commits = Vec::with_capacity(sections.len());
        let mut sections_of = Vec::with_capacity(sections.len());
        for s in sections {
            let tenure = run
                .tenures
                .get(&s.org)
                .ok_or_else(|| Error::InvalidSettings {
                    reason: format!("a section of {} with no tenure in the run", s.org),
                })?;
            if let Some((_, theirs)) = tenure.fenced {
                return Err(Error::Fenced {
                    org: s.org.to_string(),
                    ours: tenure.round,
                    theirs,
                });
            }
            if commits.iter().any(|(o, _)| *o == s.org) {
                return Err(Error::InvalidSettings {
                    reason: format!("two sections of {} in one batch", s.org),
                });
            }
            commits.push((s.org.clone(), s.pages.commit()));
            sections_of.push((s.org.clone(), tenure.round, s.pages.commit()));
            inputs.push((s, tenure.round));
        }
        let level = run.level;
        let bytes: usize = inputs
            .iter()
            .flat_map(|(s, _)| s.pages.pages().values())
            .map(Vec::len)
            .sum();
        let frames = compress_sections(inputs, level, bytes).await?;
        let header = JournalHeader {
            run: run.name.clone(),
            slot: run.next,
            nonce: new_nonce()?,
            floor: run.prefix,
            object: JournalObject::Batch(Batch {
                window: run.window,
                retain_below: meta.retain_below,
                claims: meta.claims,
                retain: meta.retain,
                roster: meta
                    .roster
                    .map(|orgs| orgs.iter().map(ToString::to_string).collect()),
                sections: Vec::new(),
            }),
        };
        let bytes = Bytes::from(journal::encode(header.clone(), frames)?);
        run.slots.insert(
            run.next,
            Slot::InFlight {
                nonce: header.nonce.clone(),
                sections: sections_of.clone(),
            },
        );
        run.next += 1;
        Ok(IssuedBatch {
            header,
            bytes,
            commits,
            sections: sections_of,
        })
    }

    /// Creates `batch` in its slot (create-only, settled by re-reading, I9). Borrows no run,
    /// so several batches of one run land at once.
    pub async fn land_batch(&self, batch: &IssuedBatch) -> BatchLanding {
        self.landing(batch).await
    }

    /// [`Replica::land_batch`] as a future that owns what it creates (the header and the
    /// body, shared), so it can run on a task of its own while the batch stays with its
    /// issuer for [`Run::settle`].
    pub(crate) fn landing(
        &self,
        batch: &IssuedBatch,
    ) -> impl std::future::Future<Output = BatchLanding> + Send + 'static {
        let (replica, header, bytes) = (self.clone(), batch.header.clone(), batch.bytes.clone());
        async move {
            match replica.journal_create(&header, bytes).await {
                Ok(Created::Landed) => BatchLanding::Landed,
                Ok(Created::Taken(theirs)) => BatchLanding::Taken(theirs),
                Err(e) => BatchLanding::Failed(e),
            }
        }
    }

    /// J3: ends `run` after a failed put with a self-seal at its lowest unresolved slot and
    /// returns the continued run, which holds the same tenures. Call once nothing is in
    /// flight. A collision with our own late batch or an exclusion resolves that slot and
    /// the seal moves up; the seal's own failure is retried at the same slot with the same
    /// body, here and by the next call (J3.2). Once it landed every slot below it is
    /// resolved, and nothing at or above it is ever acknowledged. Returns the continued run
    /// and the commits acknowledged by the seal (our own late batches it found below it).
    ///
    /// # Errors
    /// [`Error::InvalidSettings`] while a batch is in flight or after the run ended;
    /// [`Error::RunFenced`] when another process's seal is met; the create's error after
    /// three tries (call again: nothing is acknowledged meanwhile).
    pub async fn seal_self(
        &self,
        run: &mut Run,
        retain_below: u64,
    ) -> Result<(Run, Commits), Error> {
        let continued = run.name.next();
        let (slot, acked) = self
            .place_own_seal(run, SealKind::SelfSeal, Some(continued), retain_below)
            .await?;
        debug!(run = %run.name, slot, "journal run self-sealed (J3)");
        Ok((run.continued(), acked))
    }

    /// J4: ends a drained `run` (nothing in flight, every issued slot resolved) with a
    /// release seal at the slot after its prefix, and returns the seal's slot: every org
    /// whose walk reaches it is free there.
    ///
    /// # Errors
    /// As [`Replica::seal_self`]; [`Error::InvalidSettings`] when a slot is unresolved or
    /// a put failed (J3 seals that run), or a self seal is undecided. After an error of the
    /// create, call this again: a release seal of unknown outcome is placed again with the
    /// same body, and `seal_self` refuses the run until it is decided.
    pub async fn seal_release(&self, run: &mut Run, retain_below: u64) -> Result<u64, Error> {
        if run.state != State::Open || run.prefix != run.next {
            return Err(Error::InvalidSettings {
                reason: format!("a release seal with slot {} unresolved", run.prefix),
            });
        }
        let (slot, _) = self
            .place_own_seal(run, SealKind::Release, None, retain_below)
            .await?;
        Ok(slot)
    }

    async fn place_own_seal(
        &self,
        run: &mut Run,
        kind: SealKind,
        continued: Option<RunName>,
        retain_below: u64,
    ) -> Result<(u64, Commits), Error> {
        run.usable()?;
        if run.in_flight() > 0 || matches!(run.state, State::Sealed { .. }) {
            return Err(Error::InvalidSettings {
                reason: format!(
                    "a seal of run {} with {} batches in flight or after its end",
                    run.name,
                    run.in_flight()
                ),
            });
        }
        let mut acked = Vec::new();
        loop {
            // The lowest unresolved slot: a failed one, or the next unissued.
            let slot = run.prefix;
            let header = match run.pending_seal.take() {
                // J3.2: an undecided seal is placed again with the same body, and only it:
                // a release seal that may have landed must never be followed by a
                // continued run, nor a self seal by a release (walks follow what landed).
                Some(h) if h.slot == slot => {
                    let same = matches!(&h.object, JournalObject::Seal(s) if s.seal == kind && s.continued == continued);
                    if !same {
                        run.pending_seal = Some(h);
                        return Err(Error::InvalidSettings {
                            reason: format!(
                                "another seal of run {} at slot {slot} is undecided: place it again",
                                run.name
                            ),
                        });
                    }
                    h
                }
                _ => JournalHeader {
                    run: run.name.clone(),
                    slot,
                    nonce: new_nonce()?,
                    floor: slot,
                    object: JournalObject::Seal(Seal {
                        by: run.writer.clone(),
                        instance: run.name.instance().to_owned(),
                        seal: kind,
                        continued: continued.clone(),
                        from: 1,
                        retain_below,
                    }),
                },
            };
            let bytes = Bytes::from(journal::encode(header.clone(), Vec::new())?);
            let mut tries = 0;
            let created = loop {
                tries += 1;
                match self.journal_create(&header, bytes.clone()).await {
                    Ok(c) => break c,
                    Err(e) if tries < SEAL_TRIES && !matches!(e, Error::Corrupt { .. }) => {
                        debug!(run = %run.name, slot, error = %e, "seal not settled; retrying in place");
                    }
                    Err(e) => {
                        run.pending_seal = Some(header);
                        return Err(e);
                    }
                }
            };
            match created {
                Created::Landed => {
                    run.state = State::Sealed { slot };
                    run.slots.retain(|s, _| *s < slot);
                    run.next = run.next.max(slot + 1);
                    return Ok((slot, acked));
                }
                Created::Taken(theirs) => {
                    match run.slots.remove(&slot) {
                        Some(Slot::Failed { nonce, sections }) if nonce == theirs.nonce => {
                            run.slots.insert(slot, Slot::Ours { sections });
                        }
                        _ => run.resolve_foreign(slot, &theirs)?,
                    }
                    run.next = run.next.max(slot + 1);
                    acked.extend(run.advance());
                }
            }
        }
    }
}

/// The compressed frame of each section of a batch, in order, without a trip through the
/// blocking pool where the runtime allows: the issuer's task would wait for a worker after
/// that trip (woken from outside the runtime, behind every ready task of a busy one, tens of
/// ms when a thousand orgs are opening at once), and every batch after it waits on the
/// issuer. A small batch (the usual one: a few pages per org, well under a millisecond of
/// zstd) compresses on the task itself; a larger one hands the worker's other tasks off for
/// the while (`block_in_place`), or goes to the blocking pool on a current-thread runtime.
async fn compress_sections(
    inputs: Vec<(SectionInput, u64)>,
    level: i32,
    page_bytes: usize,
) -> Result<Vec<SectionFrame>, Error> {
    use tokio::runtime::{Handle, RuntimeFlavor};
    if page_bytes <= INLINE_COMPRESS_BYTES {
        return section_frames(inputs, level);
    }
    if Handle::current().runtime_flavor() == RuntimeFlavor::MultiThread {
        return tokio::task::block_in_place(|| section_frames(inputs, level));
    }
    crate::replica::blocking("journal batch", move || section_frames(inputs, level)).await
}

/// The compressed frame of each section of a batch, in order.
fn section_frames(
    inputs: Vec<(SectionInput, u64)>,
    level: i32,
) -> Result<Vec<SectionFrame>, Error> {
    inputs
        .into_iter()
        .map(|(s, round)| {
            let body = s.pages.body();
            let frame =
                crate::format::blob::compress(&body, level).map_err(|source| Error::Compress {
                    org: s.org.to_string(),
                    what: "journal section",
                    source,
                })?;
            Ok(SectionFrame {
                index: SectionIndex {
                    org: s.org.to_string(),
                    round,
                    via: s.via,
                    base: s.base,
                    checksum: s.checksum,
                    commit: s.pages.commit(),
                    released: s.released,
                    offset: 0,
                    len: 0,
                    bytes: 0,
                    sha256: String::new(),
                },
                frame,
                bytes: body.len() as u64,
            })
        })
        .collect()
}
