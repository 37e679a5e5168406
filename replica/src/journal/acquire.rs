//! An org's acquire on the journal (`docs/design.md` 3g, "The org layer on the journal"):
//! K0's walk decides the rule. Free → K1b through the issuer's announcement; ends in this
//! process's own chain → K4; ends in another process's run whose lease lapsed → K2's adopt
//! seal (one PUT fences every org of that run), then K4; held per org → the per-org path
//! (3, 3e), which judges that holder as it always has.

use crate::format::journal::{RunName, Via};
use crate::format::mark::FreePoint;
use crate::journal::adopting::Turn;
use crate::journal::claim::{JournalTenure, MAX_FREE_CLAIM_ATTEMPTS};
use crate::journal::entries::{EntryCreated, JournalClaim};
use crate::journal::issuer::Issuer;
use crate::journal::org_walk::{OrgEnd, OrgWalk, WalkState};
use crate::journal::place::Adoption;
use crate::{Error, FailPoint, OrgId};

/// A tenure acquired on the journal, before its state is installed.
#[derive(Clone, Debug)]
pub struct JournalStart {
    /// The org.
    pub org: OrgId,
    /// Round, `via`, entry slot and the walk whose state to install.
    pub tenure: JournalTenure,
    /// The run of `through`.
    pub run: RunName,
    /// A slot of the run's resolved prefix where the org's state is exactly the walk's:
    /// the batch that announced the claim (K1b) or marked the attach (K4). A first
    /// checkpoint goes through it (J5's tenure checkpoint).
    pub through: u64,
    /// The log seq after the newest entry the tenure knows of: its first checkpoint's.
    pub next_seq: u64,
}

impl JournalStart {
    /// The walk's state is a log entry (a checkpoint or a per-org position): sections may
    /// name it as their base, and no first checkpoint is needed.
    pub fn base_entry(&self) -> Option<u64> {
        match self.tenure.walk.state {
            WalkState::Entry { seq } => Some(seq),
            _ => None,
        }
    }
}

/// What an acquire on the journal found.
#[derive(Clone, Debug)]
pub enum JournalAcquire {
    /// A tenure of this process's run.
    Tenure(Box<JournalStart>),
    /// The walk ends at a per-org holder (K1.6 is not built): claim per org.
    PerOrg(Box<OrgWalk>),
}

impl Issuer {
    /// Acquires `org` on the journal: walks it and applies K1b, K4 or K2 then K4 (see the
    /// module docs); the tenure is attached to the run when this returns. `force` skips
    /// the judgement of another run's holder: the adopt seal then fences **every** org of
    /// that run, live holder or not.
    ///
    /// # Errors
    /// [`Error::LeaseHeld`] while another process's run holds the org and its process lease
    /// is live; [`Error::Contended`] after [`MAX_FREE_CLAIM_ATTEMPTS`] lost races;
    /// [`Error::Fenced`] when J2 fences the tenure at birth; [`Error::RunFenced`]; the
    /// walk's and the creates' errors.
    pub async fn acquire(&self, org: &OrgId, force: bool) -> Result<JournalAcquire, Error> {
        let (acquired, _) = self.acquire_walked(org, force, None).await?;
        Ok(acquired)
    }

    /// The round of the tenure an acquire from `walk` makes when it goes straight to a
    /// claim (K1b: the walk ends free) or to an attach in this process's own chain (K4), so
    /// that the walk's state is what the tenure installs unless a race makes the acquire
    /// walk again; `None` when the acquire would first judge another holder, or claim per
    /// org. The caller may then install that state beside the claim
    /// ([`crate::journal::JournalShipper::install`], [`Issuer::acquire_walked`]).
    pub fn tenure_round(&self, walk: &OrgWalk) -> Option<u64> {
        match &walk.end {
            OrgEnd::Free(_) => Some(walk.next_round()),
            OrgEnd::Held { run, tenure, .. } => {
                let ours = self.run_name();
                (run.instance() == ours.instance() && run.number() <= ours.number())
                    .then_some(tenure.round)
            }
            OrgEnd::HeldPerOrg { .. } => None,
        }
    }

    /// [`Issuer::acquire`] whose first attempt uses `first`, a walk of `org` the caller
    /// took (so it can install the walk's state beside the claim's requests). Also returns
    /// true when the tenure came from `first` itself: its state is exactly that walk's, and
    /// a file installed from it is the tenure's (the claim's C2, or the attach's mark, is
    /// what makes the walk's state the newest, as on the sequential path). False when a
    /// race made the acquire walk again: such a file must be discarded.
    ///
    /// # Errors
    /// As [`Issuer::acquire`].
    pub async fn acquire_walked(
        &self,
        org: &OrgId,
        force: bool,
        first: Option<OrgWalk>,
    ) -> Result<(JournalAcquire, bool), Error> {
        let replica = self.replica();
        let mut first = first;
        for _ in 0..MAX_FREE_CLAIM_ATTEMPTS {
            let (walk, given) = match first.take() {
                Some(w) => (w, true),
                None => (replica.walk_org(org).await?, false),
            };
            match walk.end.clone() {
                OrgEnd::Free(after) => {
                    let (announced, through) = self.announce(org, true).await?;
                    let (seq, round) = (walk.next_seq(), walk.next_round());
                    let claim = JournalClaim {
                        seq,
                        round,
                        writer: self.writer().to_owned(),
                        run: announced.run.clone(),
                        from: announced.from,
                        after: Some(after.clone()),
                    };
                    if let EntryCreated::Taken(_) = replica.create_journal_claim(org, claim).await?
                    {
                        continue;
                    }
                    // C2: an entry above the claim abandons it.
                    if !replica
                        .inner
                        .log
                        .seqs_after(org, Some(seq))
                        .await?
                        .is_empty()
                    {
                        continue;
                    }
                    self.attach(org, round, announced.from).await?;
                    if let FreePoint::Seal { run, slot } = &after {
                        // The walk ended at the seal: its last listing holds it.
                        let sealed_at = walk
                            .runs
                            .last()
                            .and_then(|w| w.visited.last())
                            .and_then(|(_, listing)| listing.objects.get(slot))
                            .map(|l| l.last_modified_ms);
                        if let Some(at) = sealed_at {
                            self.note_released(run, *slot, at);
                        }
                    }
                    let start = JournalStart {
                        org: org.clone(),
                        tenure: JournalTenure {
                            round,
                            via: Via::Claim { seq },
                            from: announced.from,
                            walk,
                        },
                        run: announced.run,
                        through,
                        next_seq: seq + 1,
                    };
                    return Ok((JournalAcquire::Tenure(Box::new(start)), given));
                }
                OrgEnd::Held {
                    run: holder,
                    tenure,
                    ..
                } => {
                    let ours = self.run_name();
                    if holder.instance() == ours.instance() && holder.number() <= ours.number() {
                        // K4: no claim, no exclusion; a marked slot after the walk is
                        // where the tenure's state is exactly the walk's.
                        let (announced, through) = self.announce(org, false).await?;
                        let from = walk
                            .runs
                            .last()
                            .and_then(|w| w.visited.last())
                            .map_or(1, |(entry, _)| *entry);
                        self.attach(org, tenure.round, from).await?;
                        let next_seq = walk.next_seq();
                        let start = JournalStart {
                            org: org.clone(),
                            tenure: JournalTenure {
                                round: tenure.round,
                                via: tenure.via,
                                from,
                                walk,
                            },
                            run: announced.run,
                            through,
                            next_seq,
                        };
                        return Ok((JournalAcquire::Tenure(Box::new(start)), given));
                    }
                    // Our adopt seal ended that run after this walk listed it (another
                    // org's acquire placed it): the next walk meets the seal.
                    if self.adopted_run(&holder) {
                        continue;
                    }
                    if !force {
                        replica
                            .judge_run_holder(org, &walk, &holder, tenure.round)
                            .await?;
                    }
                    // One adopt seal fences every org of the run: one acquire places it,
                    // the others meeting the run meanwhile walk again once it settled, or
                    // adopt on their own if it did not (`adopting.rs`). The judgement above
                    // stays each acquire's own, so a live holder's refusals never queue.
                    let mut lead = match self.adoption_turn(&holder) {
                        Turn::Lead(lead) => Some(lead),
                        Turn::Wait(waiting) => {
                            replica.failpoint(FailPoint::AdoptionAwaited, org).await?;
                            if waiting.ended().await {
                                continue;
                            }
                            None
                        }
                    };
                    if self.adopted_run(&holder) {
                        continue;
                    }
                    let from = self.floor();
                    let adoption = replica
                        .adopt_run(&holder, self.writer(), &ours, from)
                        .await?;
                    match adoption {
                        Adoption::Sealed { run, slot, listing } => {
                            tracing::info!(%org, %run, slot, "adopted a dead writer's journal run (K2)");
                            self.hold(from);
                            self.note_adopted_runs([holder.clone(), run.clone()]);
                            // K2.3: the run's other orgs, for the caller to take in the
                            // background (K2.5) before their requests arrive.
                            match replica.run_orgs(&listing, slot).await {
                                Ok(learned) => {
                                    self.note_adopted(learned.orgs.into_iter().filter(|o| o != org))
                                }
                                Err(e) => {
                                    tracing::warn!(%run, error = %e, "the adopted run's orgs not learned")
                                }
                            }
                        }
                        Adoption::Released { .. } | Adoption::AdoptedBy { .. } => {}
                    }
                    if let Some(lead) = lead.as_mut() {
                        lead.settle();
                    }
                }
                OrgEnd::HeldPerOrg { .. } => {
                    return Ok((JournalAcquire::PerOrg(Box::new(walk)), given));
                }
            }
        }
        Err(Error::Contended {
            org: org.to_string(),
            attempts: MAX_FREE_CLAIM_ATTEMPTS,
        })
    }
}
