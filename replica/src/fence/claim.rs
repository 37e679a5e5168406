//! A writer's claim on an org: claiming a round (I7), releasing it, and confirming that no
//! successor appended since (I6, I11). A [`Claim`] is the only handle that publishes under
//! its round; it cannot be copied, and only this crate changes it.

use std::sync::Arc;

use futures::future::Either;
use tracing::{debug, info, warn};

use crate::chain::position::{Inherited, Tip};
use crate::fence::log::{Published, Window};
use crate::format::entry::{Claimer, EntryBody, EntryHeader, MAX_SHIP_WINDOW, Pipeline};
use crate::format::layout::new_nonce;
use crate::org_id::check_writer;
use crate::rebuild::prefetch::Prefetched;
use crate::{Error, FailPoint, LogEntry, OrgId, Replica};

mod holder;

/// A writer's claim on an org for one round: ship, confirm and release with it; any later
/// claim fences it (I7).
///
/// Not `Clone`, and its fields are private: the round it publishes under and the log
/// position it publishes at change only through [`Replica`]'s calls, and no copy can go on
/// publishing (or fence its original) after the claim was fenced, released or poisoned.
///
/// ```compile_fail
/// fn copy(claim: &idem_replica::Claim) -> idem_replica::Claim {
///     claim.clone()
/// }
/// ```
///
/// ```compile_fail
/// fn rewrite(claim: &mut idem_replica::Claim) {
///     claim.round += 1;
/// }
/// ```
#[derive(Debug)]
pub struct Claim {
    org: OrgId,
    round: u64,
    writer: String,
    nonce: String,
    seq: u64,
    /// The log position the next ship or release publishes at.
    next_seq: u64,
    /// Why the claim can no longer publish, once it cannot.
    unusable: Option<&'static str>,
    /// True after a publish the store refused: a put of it may still land, so the next
    /// landed create is checked for a successor above it.
    in_doubt: bool,
    /// The newest snapshot or delta published under this claim.
    tip: Option<Tip>,
    /// The snapshot the chain started from (compacted deltas apply to it); `None` for a
    /// chain continued from an earlier round until this claim ships a snapshot of its own.
    snapshot_tip: Option<Tip>,
    /// The chain continued from before the claim, set with `tip` by a hydrate or a reused
    /// local file, until the claim publishes.
    inherited: Option<Inherited>,
    /// The manifest of the newest snapshot in the log as this claim knows it (its own last
    /// snapshot, or the one its hydrate installed): the only segments a snapshot of this
    /// claim may name without uploading them (`docs/design.md`, "Segments and retention").
    /// Cleared whenever a snapshot's publish fails.
    reuse: Option<Arc<crate::format::segment::Manifest>>,
    /// True once a snapshot of this claim failed: its next snapshot names no segment it does
    /// not upload (a refused publish may still land, section 2a of the design).
    reuse_lost: bool,
    /// The log below the claim as the claimant listed and read it, until a hydrate or resume
    /// takes it instead of listing and reading again (`fence/log/window.rs`).
    below: Option<Window>,
    /// The slot of this claim's last entry that landed (its own seq before any).
    last_own: u64,
    /// The claim's ship window (`docs/design.md` 3e): 1 unless claimed with
    /// [`crate::Settings::ship_window`] above 1, when every entry of it is pipelined.
    window: u64,
    /// The slots of pipelined ships not yet acknowledged, in slot order (W2).
    pub(crate) slots: std::collections::BTreeMap<u64, Slot>,
    /// The chain below the claim, rebuilt in memory beside the claim's requests
    /// ([`Replica::claim_to_hydrate`]), until the hydrate takes it.
    prefetched: Option<Prefetched>,
    /// The claimant's listing of the log below the claim, kept by a resume (which downloads
    /// no manifest) for the claim's first snapshot to find the inherited chain's manifest
    /// without listing again; taken once.
    resumed_below: Option<Window>,
}

/// Where a pipelined ship's slot stands (`docs/design.md` 3e, W2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    /// Issued; its outcome is not seen yet.
    InFlight,
    /// Landed as ours, holding commits up to `commit`.
    Landed { commit: u64 },
    /// Held by a stray of the writer this claim fenced (W5).
    Stray,
}

impl Claim {
    /// The org claimed.
    pub fn org(&self) -> &OrgId {
        &self.org
    }

    /// The round claimed: greater than the round of every claim that can still publish (I7).
    /// A claim abandoned in a slot retention freed (it never publishes) may share it.
    pub fn round(&self) -> u64 {
        self.round
    }

    /// The writer id that claimed it.
    pub fn writer(&self) -> &str {
        &self.writer
    }

    /// The nonce of the claim entry: unique per claim, so local files named by round and
    /// nonce are never shared by two claims (I8).
    pub fn nonce(&self) -> &str {
        &self.nonce
    }

    /// Log position of the claim entry.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The log position the next ship or release will publish at.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Log position of the chain's newest entry, which the next
    /// [`crate::Replica::ship_delta`] applies to: the newest snapshot or delta this claim
    /// published or, before it published anything, the position its
    /// [hydrate](crate::Replica::hydrate) installed (the previous round's tip, which the
    /// claim continues). `None` when there is none: the next ship must be a full snapshot.
    pub fn chain_tip(&self) -> Option<u64> {
        self.tip.as_ref().map(|t| t.seq)
    }

    /// The newest snapshot or delta the claim's chain reaches: its own last publish or,
    /// before that, the position a hydrate or resume handed it.
    pub(crate) fn tip(&self) -> Option<&Tip> {
        self.tip.as_ref()
    }

    /// The snapshot this claim shipped itself, which a compacted delta applies to.
    pub(crate) fn snapshot_tip(&self) -> Option<&Tip> {
        self.snapshot_tip.as_ref()
    }

    /// The chain the claim continues from before it, and its tip, until the claim publishes.
    pub(crate) fn inherited(&self) -> Option<(&Tip, &Inherited)> {
        self.tip.as_ref().zip(self.inherited.as_ref())
    }

    /// True while the claim has published nothing and holds no tip: only then may a resume
    /// hand it a position.
    pub(crate) fn is_fresh(&self) -> bool {
        self.tip.is_none() && self.next_seq == self.seq + 1
    }

    /// The manifest whose segments the next snapshot may name without uploading them.
    pub(crate) fn reuse(&self) -> Option<&Arc<crate::format::segment::Manifest>> {
        self.reuse.as_ref()
    }

    /// True when the claim knows no manifest to reuse yet and may look one up: it shipped
    /// no snapshot and no snapshot of it failed.
    pub(crate) fn may_look_up_reuse(&self) -> bool {
        self.reuse.is_none() && self.snapshot_tip.is_none() && !self.reuse_lost
    }

    /// Records the manifest of the newest snapshot this claim knows (its own, once shipped).
    pub(crate) fn set_reuse(&mut self, reuse: Option<Arc<crate::format::segment::Manifest>>) {
        self.reuse = reuse;
    }

    /// A snapshot of this claim failed: its publish may still land, so no later snapshot of
    /// the claim names a segment it does not upload.
    pub(crate) fn lose_reuse(&mut self) {
        self.reuse = None;
        self.reuse_lost = true;
    }

    /// The log below the claim as its claimant saw it, once: a hydrate or resume of a fresh
    /// claim reads its tail from it.
    pub(crate) fn take_below(&mut self) -> Option<Window> {
        self.below.take().filter(|_| self.is_fresh())
    }

    /// The image rebuilt beside the claim's requests, once, for a fresh claim's hydrate.
    pub(crate) fn take_prefetched(&mut self) -> Option<Prefetched> {
        self.prefetched.take().filter(|_| self.is_fresh())
    }

    /// After a resume: keeps the listing below the claim for [`Claim::take_resumed_below`].
    pub(crate) fn keep_below_for_reuse(&mut self) {
        self.resumed_below = self.below.take();
    }

    /// The listing a resume kept, once: what the first snapshot reads the inherited chain's
    /// manifest from.
    pub(crate) fn take_resumed_below(&mut self) -> Option<Window> {
        self.resumed_below.take()
    }

    /// [`Claim::take_below`] without taking it: a resume that refuses the local file leaves it
    /// to the hydrate that follows.
    pub(crate) fn below(&self) -> Option<&Window> {
        self.below.as_ref().filter(|_| self.is_fresh())
    }

    /// A snapshot landed at `tip`: the chain now starts there, and nothing is inherited.
    pub(crate) fn snapshot_published(&mut self, tip: Tip) {
        self.snapshot_tip = Some(tip.clone());
        self.tip = Some(tip);
        self.inherited = None;
    }

    /// Lets go of the tip (so the caller's copy of its page hashes is the only one and can
    /// be updated in place); [`Claim::delta_published`] sets the next one.
    pub(crate) fn drop_tip(&mut self) {
        self.tip = None;
    }

    /// A delta landed at `tip`: the chain's newest entry, and nothing is inherited.
    pub(crate) fn delta_published(&mut self, tip: Tip) {
        self.tip = Some(tip);
        self.inherited = None;
    }

    /// Leaves the claim holding `tip`, the verified position it installed before publishing
    /// anything, and what the chain up to it weighs. A claim that already published, or holds
    /// a tip, keeps its own.
    pub(crate) fn inherit(
        &mut self,
        tip: Tip,
        inherited: Inherited,
        reuse: Option<Arc<crate::format::segment::Manifest>>,
    ) {
        if self.tip.is_none() && self.next_seq == self.seq + 1 && tip.seq < self.seq {
            self.tip = Some(tip);
            self.inherited = Some(inherited);
            self.reuse = reuse;
        }
    }

    /// The chain tip the next delta applies to, if the claim may append one at `next_seq`:
    /// its own last entry right before it, or, for its first entry, the position it
    /// inherited. A claim whose last publish landed but whose tip was not recorded (the
    /// successor check failed) has none: it ships a full snapshot.
    pub(crate) fn delta_tip(&self) -> Option<&Tip> {
        // Slots between the last own entry and the next are strays (W5), never ours.
        self.tip.as_ref().filter(|t| {
            (t.seq == self.last_own && t.seq > self.seq)
                || (t.seq < self.seq && self.last_own == self.seq)
        })
    }

    /// Why this claim can no longer publish (fenced, released, unknown outcome), if so.
    pub fn unusable(&self) -> Option<&'static str> {
        self.unusable
    }

    /// `Ok` while the claim may publish.
    ///
    /// # Errors
    /// [`Error::ClaimUnusable`] once it was fenced, released or left unknown.
    pub(crate) fn usable(&self) -> Result<(), Error> {
        match self.unusable {
            Some(reason) => Err(Error::ClaimUnusable {
                org: self.org.to_string(),
                round: self.round,
                reason,
            }),
            None => Ok(()),
        }
    }

    /// True when `e` is a stray for this claim (R1, W5): a pipelined delta of a lower round,
    /// below this claim's slot plus its window, which the writer this claim fenced had in
    /// flight when the claim landed.
    pub(crate) fn stray(&self, e: &LogEntry) -> bool {
        e.is_stray_of(self.round, self.seq)
    }

    /// The claim's ship window: how many pipelined ships may be unresolved at once.
    pub fn ship_window(&self) -> u64 {
        self.window
    }

    /// The lowest slot of this claim whose ship is unresolved, or the next slot when none is.
    pub(crate) fn floor(&self) -> u64 {
        self.slots
            .iter()
            .find(|(_, s)| **s == Slot::InFlight)
            .map_or(self.next_seq, |(seq, _)| *seq)
    }

    /// Takes the next slot for a pipelined ship.
    pub(crate) fn issue(&mut self) -> u64 {
        let slot = self.next_seq;
        self.next_seq += 1;
        self.slots.insert(slot, Slot::InFlight);
        slot
    }

    /// A pipelined ship landed at `tip`, holding commits up to `commit`; it is the base of
    /// the next ship when it is the newest landed (W1).
    pub(crate) fn landed(&mut self, tip: Tip, commit: u64) {
        self.slots.insert(tip.seq, Slot::Landed { commit });
        self.last_own = self.last_own.max(tip.seq);
        self.below = None;
        if self.tip.as_ref().is_none_or(|t| t.seq < tip.seq) {
            self.tip = Some(tip);
            self.inherited = None;
        }
    }

    /// A pipelined ship's slot holds a stray (W5).
    pub(crate) fn stray_at(&mut self, seq: u64) {
        self.slots.insert(seq, Slot::Stray);
    }

    /// The claim can publish no more (W3).
    pub(crate) fn end(&mut self, reason: &'static str) {
        self.unusable = Some(reason);
    }

    /// Removes the longest prefix of resolved slots and returns its newest landed entry:
    /// what is acknowledged now (W2). Slots are issued in capture order, so it holds the
    /// highest commit of the prefix.
    pub(crate) fn acknowledge(&mut self) -> Option<crate::Acked> {
        let mut acked = None;
        while let Some((&seq, &slot)) = self.slots.first_key_value() {
            match slot {
                Slot::InFlight => break,
                Slot::Landed { commit } => acked = Some(crate::Acked { seq, commit }),
                Slot::Stray => {}
            }
            self.slots.remove(&seq);
        }
        acked
    }

    /// How many more pipelined ships may be issued now (W1): slots below the lowest
    /// unresolved one plus the window (1 while in doubt, W3), less the next slot.
    pub(crate) fn room(&self) -> usize {
        let window = if self.in_doubt { 1 } else { self.window };
        (self.floor() + window).saturating_sub(self.next_seq) as usize
    }

    /// How many pipelined ships are unresolved.
    pub(crate) fn in_flight(&self) -> usize {
        self.slots
            .values()
            .filter(|s| **s == Slot::InFlight)
            .count()
    }

    /// `Ok` when no pipelined ship is unresolved: a full snapshot, a release and a ship of
    /// one at a time are issued only then (W4).
    ///
    /// # Errors
    /// [`Error::InvalidSettings`] naming `what` while ships are in flight.
    pub(crate) fn nothing_in_flight(&self, what: &str) -> Result<(), Error> {
        match self.in_flight() {
            0 => Ok(()),
            n => Err(Error::InvalidSettings {
                reason: format!("{what} while {n} pipelined ships of the claim are in flight"),
            }),
        }
    }

    /// The header of the entry this claim publishes next: pipelined (window and floor, W1)
    /// when the claim's window is above 1.
    pub(crate) fn next_header(&self, at_ms: u64) -> Result<EntryHeader, Error> {
        Ok(EntryHeader {
            seq: self.next_seq,
            round: self.round,
            writer: self.writer.clone(),
            nonce: new_nonce()?,
            at_ms,
            pipeline: (self.window > 1).then(|| Pipeline {
                window: self.window,
                floor: self.floor(),
            }),
            journal: None,
        })
    }
}

impl Replica {
    /// Claims the next round for `org` (highest round seen + 1) with a create-only log entry,
    /// fencing every older writer (I7). The entry names this process's lease ([`Claimer`]),
    /// which is written with it the first time; no org lease is written.
    ///
    /// Another writer's lease blocks the claim unless `force` until this handle has seen the
    /// holder's process lease unchanged for `lease_ms` plus a tenth of its own monotonic clock
    /// ([`Replica::lease_hold`], I15): a first attempt starts that watch and answers
    /// [`Error::LeaseHeld`] with the wait; a `Release` entry at the head lets it through at
    /// once. The holder is the newest claim's: the process that claim entry names is watched
    /// (for a claim of an older version, the org lease it wrote). A holder of the same
    /// `writer` id blocks too unless it
    /// is this instance's own (this [`Replica`]): two live processes configured with one
    /// writer id never take orgs from each other. See [`Replica::claim_from`] for a restart.
    ///
    /// # Errors
    /// [`Error::LeaseHeld`]; [`Error::Contended`] after `claim_retries` lost races;
    /// [`Error::StoreRefused`] when the store refuses the claim's write;
    /// [`Error::InvalidWriter`]; [`Error::Store`]; [`Error::Corrupt`]/[`Error::UnknownFormat`]
    /// for an unreadable log.
    pub async fn claim(&self, org: &OrgId, writer: &str, force: bool) -> Result<Claim, Error> {
        self.claim_from(org, writer, None, force).await
    }

    /// [`Replica::claim`] by a writer working in a data directory with id `home.0`. The
    /// claim entry records the home when `home.1` is true — the caller holds that directory's
    /// exclusive lock, which every earlier process working in it held until it died — a live
    /// lease of the same writer id and the same home belongs to a dead process and does not
    /// block the claim (a restart after `kill -9` claims at once).
    ///
    /// # Errors
    /// As [`Replica::claim`].
    pub async fn claim_from(
        &self,
        org: &OrgId,
        writer: &str,
        home: Option<(&str, bool)>,
        force: bool,
    ) -> Result<Claim, Error> {
        self.claim_with(org, writer, home, force, false).await
    }

    /// [`Replica::claim_from`] for a claimant that [hydrates](Replica::hydrate) next: when
    /// the claim's first listing and read of the log's top entries hold the whole chain below
    /// the claim, and its image is at most `read_concurrency × segment_bytes` bytes, the
    /// chain is downloaded and verified into memory while the claim's PUT and successor
    /// check are in flight, and the hydrate installs it instead of downloading it after the
    /// claim (`docs/design.md`, section 3d): a small org's acquire takes two round trips
    /// fewer. A claim that does not land, or lands below a newer entry, drops the image
    /// unused and retries as [`Replica::claim_from`] does (I7); the hydrate installs it only
    /// when the chain it finds below the claim is that very chain (I8, I10), and downloads
    /// the chain itself otherwise or after any failure of the prefetch.
    ///
    /// Costs the same requests as the claim and its hydrate; a caller that may
    /// [resume](Replica::resume) a local file instead of hydrating should use
    /// [`Replica::claim_from`], so no download is wasted.
    ///
    /// # Errors
    /// As [`Replica::claim`].
    pub async fn claim_to_hydrate(
        &self,
        org: &OrgId,
        writer: &str,
        home: Option<(&str, bool)>,
        force: bool,
    ) -> Result<Claim, Error> {
        self.claim_with(org, writer, home, force, true).await
    }

    async fn claim_with(
        &self,
        org: &OrgId,
        writer: &str,
        home: Option<(&str, bool)>,
        force: bool,
        prefetch: bool,
    ) -> Result<Claim, Error> {
        self.writable("claim")?;
        check_writer(writer)?;
        let attempts = self.inner.settings.claim_retries.saturating_add(1);
        for attempt in 0..attempts {
            // One LIST and one round of concurrent GETs, whatever the length of the log: the
            // head entry carries the highest round of any claim that can still publish
            // (claims that passed the check below took rounds in seq order, each read the one
            // before, and a claim that landed below a newer entry, in a freed slot, is
            // abandoned and never publishes); the entries below it are the claim's holder
            // (when the head is a snapshot or delta) and the hydrate's tail (`Window`).
            // At least one more than a pipelined writer's strays can fill (C3), so the newest
            // claim's round is among the entries read.
            let reads = self
                .inner
                .settings
                .read_concurrency
                .max(MAX_SHIP_WINDOW as usize + 1);
            let window = self.inner.log.window(org, reads).await?;
            let top = window.top();
            if top.is_none() && !window.seqs.is_empty() {
                // The listed head vanished before it was read (retention never deletes the
                // head, so the log moved): list again.
                continue;
            }
            // The highest round read, never the head's alone: a stray may be the head (C1).
            // An abandoned claim counts too, so rounds only grow.
            let max_round = window
                .entries
                .values()
                .map(LogEntry::round)
                .max()
                .unwrap_or(0);
            let slot = window.claim_slot();
            let window_size = self.inner.settings.ship_window.clamp(1, MAX_SHIP_WINDOW);
            let now = self.inner.clock.now_ms();
            // Judged by what this handle has seen change, never by the timestamps the holder
            // wrote (I15): fencing keeps a wrong guess safe (I7), this keeps a live holder's
            // orgs where they are. The holder is the newest claim's (`claim/holder.rs`).
            if !force && let Some(lease) = self.blocking_lease(org, &window, writer, home).await? {
                let hold = self.inner.leases.lease_hold(org, &lease).await?;
                if hold.wait_ms > 0 {
                    return Err(Error::LeaseHeld {
                        org: org.to_string(),
                        holder: lease.writer,
                        retry_after_ms: hold.wait_ms,
                        draining: hold.drains(org),
                        holder_addr: lease.addr.or(hold.process.and_then(|p| p.addr)),
                    });
                }
            }
            self.failpoint(FailPoint::ClaimBeforePublish, org).await?;
            // Only a holder of the home's lock names it: a process waiting for the lock (the
            // old one still runs) must not write claims the old one would take as its own.
            let home = home
                .filter(|(_, locked)| *locked)
                .map(|(id, _)| id.to_owned());
            let entry = LogEntry {
                header: EntryHeader {
                    seq: slot,
                    round: max_round + 1,
                    writer: writer.to_owned(),
                    nonce: new_nonce()?,
                    at_ms: now,
                    pipeline: (window_size > 1).then_some(Pipeline {
                        window: window_size,
                        floor: slot,
                    }),
                    journal: None,
                },
                body: EntryBody::Claim(Claimer {
                    instance: self.inner.leases.instance().to_owned(),
                    term_ms: self.inner.settings.lease_ms,
                    home,
                }),
            };
            let plan = match prefetch {
                true => self.prefetch_plan(org, &window, slot).await,
                false => None,
            };
            let landing = self.land_claim(org, &entry, attempt);
            let (landed, prefetched) = match plan {
                None => (landing.await, None),
                // The chain downloads beside the claim's PUT and successor check; a claim
                // that does not land drops the download where it is.
                Some(chain) => {
                    let fetching = std::pin::pin!(self.prefetch(org, chain));
                    let landing = std::pin::pin!(landing);
                    match futures::future::select(landing, fetching).await {
                        Either::Left((Ok(true), fetching)) => (Ok(true), fetching.await),
                        Either::Left((other, _)) => (other, None),
                        Either::Right((fetched, landing)) => (landing.await, fetched),
                    }
                }
            };
            if !landed? {
                continue;
            }
            let EntryHeader {
                seq, round, nonce, ..
            } = entry.header;
            self.failpoint(FailPoint::ClaimAfterPublish, org).await?;
            info!(%org, round, seq, writer, "claimed");
            return Ok(Claim {
                org: org.clone(),
                round,
                writer: writer.to_owned(),
                nonce,
                seq,
                next_seq: seq + 1,
                unusable: None,
                in_doubt: false,
                tip: None,
                snapshot_tip: None,
                inherited: None,
                reuse: None,
                reuse_lost: false,
                below: Some(window.below(seq)),
                last_own: seq,
                window: window_size,
                slots: Default::default(),
                prefetched,
                resumed_below: None,
            });
        }
        Err(Error::Contended {
            org: org.to_string(),
            attempts,
        })
    }

    /// Creates the claim `entry` (at the slot C1 chose) beside the first write of the process lease,
    /// then lists above it: `Ok(true)` when it landed with nothing above, `Ok(false)` when
    /// the claim must be retried higher (the slot was taken, the outcome is unknown, or it
    /// landed below a newer entry).
    async fn land_claim(&self, org: &OrgId, entry: &LogEntry, attempt: u32) -> Result<bool, Error> {
        let seq = entry.seq();
        // The claim entry names the process lease, which a claimant watches from the
        // moment the entry lands; an absent one counts as unchanged only for a whole
        // watch, which the renewal task's next write ends, so both PUTs go out together.
        // After a retire the lease's write lands first (`Leases::ready_to_claim`).
        self.inner.leases.ready_to_claim().await?;
        let (published, ()) = futures::future::join(
            self.inner.log.publish(org, entry),
            self.inner.leases.ensure_process_lease(),
        )
        .await;
        match published {
            Ok(Published::Landed) => {}
            Ok(Published::Taken(theirs)) => {
                debug!(%org, seq, theirs = theirs.round(), attempt, "claim lost the race");
                return Ok(false);
            }
            // A claim of unknown outcome fences nobody we care about: retry higher.
            Err(Error::PublishUnknown { .. }) => return Ok(false),
            Err(e) => return Err(e),
        }
        // A claimer that read a stale head may land in a slot retention freed. Listed
        // from our own entry on: the cost follows the entries above it. Strays of the
        // writer this claim fenced may sit above it (C2): anything else is a newer entry.
        let above: Vec<u64> = (self.inner.log.seqs_after(org, Some(seq)).await?)
            .into_iter()
            .filter(|s| *s > seq)
            .collect();
        if self
            .successor_above(org, &above, entry.round(), seq)
            .await?
            .is_some()
        {
            debug!(%org, seq, attempt, "claim landed below a newer entry");
            return Ok(false);
        }
        Ok(true)
    }

    /// Publishes a Release entry (same create/compare/fence rules as ship, and like a ship no
    /// LIST after it: the create in the slot after the claim's own last entry proves no
    /// successor claimed), so the next claim goes through at once: a Release at the head of
    /// the log passes any lease of its round or older, so the org lease is left in place
    /// (deleting it would cost a GET and a DELETE per org at every handoff). The claim is
    /// unusable afterwards.
    ///
    /// # Errors
    /// As [`Replica::ship`]'s publish step.
    pub async fn release(&self, claim: &mut Claim) -> Result<(), Error> {
        claim.usable()?;
        claim.nothing_in_flight("a release")?;
        let org = claim.org.clone();
        self.failpoint(FailPoint::ReleaseBeforePublish, &org)
            .await?;
        // A slot held by a stray is skipped (W5); there are fewer than the window of them.
        let mut strays = 0;
        let seq = loop {
            let entry = LogEntry {
                header: claim.next_header(self.inner.clock.now_ms())?,
                body: EntryBody::Release,
            };
            match self.publish_for_claim(claim, &entry).await {
                Ok(()) => break entry.seq(),
                Err(Error::SlotTaken { .. }) if strays < MAX_SHIP_WINDOW => strays += 1,
                Err(e) => return Err(e),
            }
        };
        claim.unusable = Some("released");
        info!(%org, round = claim.round, seq, "released");
        Ok(())
    }

    /// Publishes `entry` at `claim.next_seq` and moves the claim past it; maps a taken slot
    /// to [`Error::Fenced`], and makes the claim unusable on that and on
    /// [`Error::PublishUnknown`].
    pub(crate) async fn publish_for_claim(
        &self,
        claim: &mut Claim,
        entry: &LogEntry,
    ) -> Result<(), Error> {
        // After a refused publish, a put of ours may land late, and retention may free its
        // slot under a successor's claim. Look above our last entry before creating: a
        // create that landed in such a slot would stay in the log below the successor,
        // naming objects retention may already have deleted as orphans (their seq is below
        // the head). The LIST after the create (below) still catches a successor that
        // claimed in between.
        if claim.in_doubt {
            self.check_no_successor(claim, entry.seq().saturating_sub(1))
                .await?;
        }
        match self.inner.log.publish(&claim.org, entry).await {
            Ok(Published::Landed) => {
                claim.next_seq = entry.seq() + 1;
                claim.last_own = entry.seq();
                // Only a fresh claim's hydrate or resume reads it.
                claim.below = None;
                claim.prefetched = None;
                // After a refused publish, a put of ours may have landed late in that slot,
                // and retention may since have freed it under a successor's claim: this
                // create landing no longer proves we are the newest writer, so look above it
                // once (the one LIST a landed create otherwise never needs, I7, I11).
                if claim.in_doubt {
                    self.check_no_successor(claim, entry.seq()).await?;
                    claim.in_doubt = false;
                }
                Ok(())
            }
            // W5: a fenced writer's pipelined ship landed in our slot after our claim. The
            // slot is resolved as a stray; the next publish goes above it.
            Ok(Published::Taken(theirs)) if claim.stray(&theirs) => {
                debug!(org = %claim.org, round = claim.round, seq = entry.seq(), theirs = theirs.round(), "slot held by a stray");
                claim.next_seq = entry.seq() + 1;
                Err(Error::SlotTaken {
                    org: claim.org.to_string(),
                    seq: entry.seq(),
                })
            }
            Ok(Published::Taken(theirs)) => {
                claim.unusable = Some("fenced");
                warn!(org = %claim.org, round = claim.round, seq = entry.seq(), theirs = theirs.round(), "fenced");
                Err(Error::Fenced {
                    org: claim.org.to_string(),
                    ours: claim.round,
                    theirs: theirs.round(),
                })
            }
            Err(e) => {
                match e {
                    Error::PublishUnknown { .. } => {
                        claim.unusable = Some("outcome of a publish is unknown");
                    }
                    Error::StoreRefused { .. } => claim.in_doubt = true,
                    _ => {}
                }
                Err(e)
            }
        }
    }

    /// Confirms that this claim still owns the org: no entry was appended to the log after
    /// the claim's last entry (one LIST). A writer answers a replay or a read only after a
    /// ship or a confirmation that started after the request arrived, so a fenced writer never
    /// acknowledges from its local file (I6, I7). Costs one LIST and writes nothing: liveness
    /// is the process lease's job.
    ///
    /// # Errors
    /// [`Error::Fenced`] when a successor appended (the claim becomes unusable);
    /// [`Error::ClaimUnusable`]; [`Error::Store`] when the log cannot be listed.
    pub async fn confirm(&self, claim: &mut Claim) -> Result<(), Error> {
        claim.usable()?;
        let last = claim.next_seq.saturating_sub(1);
        self.check_no_successor(claim, last).await
    }

    /// After our create at `seq`, anything above it means a successor owns the org (I11):
    /// the claim becomes unusable and the error is [`Error::Fenced`].
    /// One LIST; only the highest entry above is read (for the error's `theirs`), so the cost
    /// does not grow with the length of the log.
    pub(crate) async fn check_no_successor(
        &self,
        claim: &mut Claim,
        seq: u64,
    ) -> Result<(), Error> {
        let above: Vec<u64> = self
            .inner
            .log
            .seqs_after(&claim.org, Some(seq))
            .await?
            .into_iter()
            .filter(|s| *s > seq)
            .collect();
        let Some(theirs) = self
            .successor_above(&claim.org, &above, claim.round, claim.seq)
            .await?
        else {
            return Ok(());
        };
        claim.unusable = Some("fenced");
        warn!(org = %claim.org, round = claim.round, seq, theirs, "successor above our entry");
        Err(Error::Fenced {
            org: claim.org.to_string(),
            ours: claim.round,
            theirs,
        })
    }

    /// Whether the entries at `above` (listed above an entry of the claim of `round` at
    /// `claim_seq`) hold a successor: `None` when there are none, or when every one is a
    /// stray (R1: a pipelined delta of a lower round, below `claim_seq` plus its window,
    /// which a writer our claim fenced had in flight; C2, `docs/design.md` 3e); otherwise the
    /// round of the highest, or `round + 1` when it cannot be read. Reads the entries only
    /// when there could be strays among them (fewer than [`MAX_SHIP_WINDOW`], all inside the
    /// window), so a plain successor costs the one GET it always did.
    pub(crate) async fn successor_above(
        &self,
        org: &OrgId,
        above: &[u64],
        round: u64,
        claim_seq: u64,
    ) -> Result<Option<u64>, Error> {
        let Some(&top) = above.iter().max() else {
            return Ok(None);
        };
        let could_be_strays = (above.len() as u64) < MAX_SHIP_WINDOW
            && top < claim_seq.saturating_add(MAX_SHIP_WINDOW);
        if could_be_strays {
            let reads = above.iter().map(|s| self.inner.log.read_entry(org, *s));
            let read: Vec<Result<Option<LogEntry>, Error>> = futures::future::join_all(reads).await;
            let stray = |e: &LogEntry| e.is_stray_of(round, claim_seq);
            // A vanished entry is no stray (retention deletes nothing above the newest
            // snapshot; a stray above our entry would still be there).
            if read.iter().all(|r| matches!(r, Ok(Some(e)) if stray(e))) {
                return Ok(None);
            }
            if let Some(Ok(Some(e))) = read
                .iter()
                .rev()
                .find(|r| matches!(r, Ok(Some(e)) if !stray(e)))
            {
                return Ok(Some(e.round()));
            }
        }
        Ok(Some(match self.inner.log.read_entry(org, top).await {
            Ok(Some(entry)) => entry.round(),
            // Unreadable or gone (retention): still a successor; report the next round.
            _ => round + 1,
        }))
    }
}
