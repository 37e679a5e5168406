//! K1b (`docs/design.md` 3g, "Claim rules"): a claim of an org whose walk ends free. The
//! claim names the free point its walk passed, the claimant's run and its floor; it is
//! created only after a batch announcing it has landed (so an adopter of the run learns it,
//! K2.3), at head + 1 of the walk's log listing, and checked by a listing above it (C2). No
//! exclusion is placed: nobody holds the org after the free point, and the claim is the
//! fence (a second claimant's walk continues at it and meets this writer as the holder).
//!
//! K4: a walk that ends in the asker's own run, or an earlier run of its chain (an abandoned
//! claim walks still follow, an adoption whose roster missed the org), attaches the org with
//! the walk's tenure: no claim and no exclusion, since no other writer holds that tenure.
//! A walk that ends at another holder (K1, K2) is returned to the caller as it is.

use crate::format::journal::{Announced, RunName, Via};
use crate::format::mark::FreePoint;
use crate::journal::entries::{EntryCreated, JournalClaim};
use crate::journal::org_walk::{OrgEnd, OrgWalk};
use crate::journal::run::Run;
use crate::{Error, OrgId, Replica};

/// Claims a K1b claim makes at most before [`Error::Contended`]: each lost race is another
/// claimant's landed claim, so this many in a row means the org is hot.
pub const MAX_FREE_CLAIM_ATTEMPTS: u32 = 8;

/// A K1b claim planned from a walk that ended free: announce [`PlannedClaim::announced`] in a
/// batch of the claimant's run, then [`Replica::make_free_claim`].
#[derive(Clone, Debug)]
pub struct PlannedClaim {
    /// The org.
    pub org: OrgId,
    /// The walk it was planned from; its state is what the tenure hydrates.
    pub walk: OrgWalk,
    /// The free point the walk ended at.
    pub after: FreePoint,
    /// What the announcing batch carries in its `claims`: this run and the floor `from`.
    pub announced: Announced,
}

/// What a planned claim became.
#[derive(Clone, Debug)]
pub enum FreeClaim {
    /// The claim landed, nothing is above it, and the tenure is attached to the run.
    Claimed(Box<JournalTenure>),
    /// Another entry took the slot, or landed above the claim (C2): the claim is abandoned;
    /// walk again.
    Lost,
}

/// A tenure begun by a claim: its round, the claim it came through, where its sections
/// start, and the walk whose state it hydrates.
#[derive(Clone, Debug)]
pub struct JournalTenure {
    /// The round.
    pub round: u64,
    /// The claim's log position (the tenure's `via`).
    pub via: Via,
    /// The slot walks enter the run at for this tenure.
    pub from: u64,
    /// The walk the claim was planned from: [`Replica::restore_walk`] installs its state.
    pub walk: OrgWalk,
}

/// What a plan found.
#[derive(Clone, Debug)]
pub enum ClaimPlan {
    /// The walk ended free: announce the claim, then make it.
    Free(Box<PlannedClaim>),
    /// The walk ended at a holder (in a run or per org): K1, K2 or K4 applies, not K1b.
    Held(Box<OrgWalk>),
}

impl Replica {
    /// K1b.1's first half: walks `org` (K0); if the walk ends free, plans a claim naming
    /// `run` and its floor.
    ///
    /// # Errors
    /// As [`Replica::walk_org`].
    pub async fn plan_free_claim(&self, org: &OrgId, run: &Run) -> Result<ClaimPlan, Error> {
        let walk = self.walk_org(org).await?;
        let OrgEnd::Free(after) = walk.end.clone() else {
            return Ok(ClaimPlan::Held(Box::new(walk)));
        };
        Ok(ClaimPlan::Free(Box::new(PlannedClaim {
            org: org.clone(),
            after,
            announced: Announced {
                org: org.to_string(),
                run: run.name().clone(),
                from: run.floor(),
            },
            walk,
        })))
    }

    /// K1b.1's second half, K1b.2 and K1b.3: after a batch of `run` carrying
    /// `planned.announced` has landed, creates the claim at head + 1 of the walk's log
    /// listing with round 1 + the highest round seen, lists the log above it (C2) and, when
    /// nothing is there, attaches the tenure to `run` (J2 at birth).
    ///
    /// # Errors
    /// [`Error::InvalidSettings`] when `planned` was announced for another run;
    /// [`Error::Fenced`] when `run` resolved an exclusion of the org of a higher round (the
    /// tenure never serves); as [`Replica::create_journal_claim`].
    pub async fn make_free_claim(
        &self,
        planned: Box<PlannedClaim>,
        run: &mut Run,
    ) -> Result<FreeClaim, Error> {
        let PlannedClaim {
            org,
            walk,
            after,
            announced,
        } = *planned;
        if &announced.run != run.name() {
            return Err(Error::InvalidSettings {
                reason: format!(
                    "a claim announced for run {} made in run {}",
                    announced.run,
                    run.name()
                ),
            });
        }
        let (seq, round) = (walk.next_seq(), walk.next_round());
        let claim = JournalClaim {
            seq,
            round,
            writer: run.writer().to_owned(),
            run: announced.run,
            from: announced.from,
            after: Some(after),
        };
        match self.create_journal_claim(&org, claim).await? {
            EntryCreated::Taken(_) => return Ok(FreeClaim::Lost),
            EntryCreated::Landed(_) => {}
        }
        if !self.inner.log.seqs_after(&org, Some(seq)).await?.is_empty() {
            return Ok(FreeClaim::Lost);
        }
        run.attach(&org, round)?;
        Ok(FreeClaim::Claimed(Box::new(JournalTenure {
            round,
            via: Via::Claim { seq },
            from: announced.from,
            walk,
        })))
    }

    /// A new run of this process, `<instance>-1` by this handle's instance (so a claimant
    /// judges its writer by this process's lease, C3), written by `writer` with at most
    /// `window` slots in flight. Writes the process lease first if this handle has not.
    ///
    /// # Errors
    /// As [`Run::new`].
    pub async fn start_run(&self, writer: &str, window: u64) -> Result<Run, Error> {
        self.inner.leases.ensure_process_lease().await;
        Run::new(
            RunName::new(self.inner.leases.instance(), 1)?,
            writer,
            window,
        )
    }

    /// K4: when `walk` ends in `run` or an earlier run of its chain (the same instance, a
    /// number at or below `run`'s), attaches the org with the walk's tenure and returns it;
    /// `None` when another process holds the org. The tenure serves once a batch holding its
    /// attach section is inside the prefix (J1).
    ///
    /// # Errors
    /// [`Error::Fenced`] when `run` resolved an exclusion of the org of a higher round than
    /// the walk's (J2 at birth); [`Error::RunFenced`] on a fenced run.
    pub fn attach_own(
        &self,
        org: &OrgId,
        walk: OrgWalk,
        run: &mut Run,
    ) -> Result<Option<JournalTenure>, Error> {
        let OrgEnd::Held {
            run: holder,
            tenure,
            ..
        } = &walk.end
        else {
            return Ok(None);
        };
        let ours =
            holder.instance() == run.name().instance() && holder.number() <= run.name().number();
        if !ours {
            return Ok(None);
        }
        let from = walk
            .runs
            .last()
            .and_then(|w| w.visited.last())
            .map_or(1, |(entry, _)| *entry);
        run.attach(org, tenure.round)?;
        Ok(Some(JournalTenure {
            round: tenure.round,
            via: tenure.via.clone(),
            from,
            walk,
        }))
    }

    /// K1b whole, for a caller with no batch of its own due: plans, announces the claim in
    /// an empty batch of `run` (one PUT), makes it, and walks again after each lost race.
    /// `Ok(ClaimPlan::Held)` comes back when a walk ends at a holder.
    ///
    /// # Errors
    /// [`Error::Contended`] after [`MAX_FREE_CLAIM_ATTEMPTS`] lost races;
    /// [`Error::ClaimUnusable`] when the announcing batch failed (the run then needs its
    /// self-seal, J3); [`Error::RunFenced`]; as
    /// [`Replica::make_free_claim`].
    pub async fn claim_free(
        &self,
        org: &OrgId,
        run: &mut Run,
    ) -> Result<Result<Box<JournalTenure>, Box<OrgWalk>>, Error> {
        for _ in 0..MAX_FREE_CLAIM_ATTEMPTS {
            let planned = match self.plan_free_claim(org, run).await? {
                ClaimPlan::Free(p) => p,
                ClaimPlan::Held(walk) => return Ok(Err(walk)),
            };
            self.announce(org, run, planned.announced.from).await?;
            if let FreeClaim::Claimed(tenure) = self.make_free_claim(planned, run).await? {
                return Ok(Ok(tenure));
            }
        }
        Err(Error::Contended {
            org: org.to_string(),
            attempts: MAX_FREE_CLAIM_ATTEMPTS,
        })
    }
}
