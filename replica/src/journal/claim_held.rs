//! K1 (`docs/design.md` 3g, "Claim rules"): a claim of an org whose walk ends in another
//! writer's run. The holder's process lease is judged as C3 judges any holder (I15), the
//! claim is announced in a landed batch of the claimant's run and created at head + 1 of the
//! walk's log listing naming that run and the claimant's floor (no `after`: an exclusion, not
//! a free point, makes it part of walks), and then an exclusion of its round is placed by P
//! in the holder's run. The claimant serves only when the exclusion's second listing takes
//! it (K1.5), and hydrates from a walk taken after that.
//!
//! Not here: K1.6 (a per-org holder, whose strays C2 must tell from claims) and the J3-9
//! watch of a holder whose run shows no section of the tenure: a walk that ends held per org
//! is returned to the caller.

use crate::fence::lease::Lease;
use crate::format::entry::EntryBody;
use crate::format::journal::{Announced, RunName, Via};
use crate::journal::claim::JournalTenure;
use crate::journal::entries::{EntryCreated, JournalClaim};
use crate::journal::org_walk::{OrgEnd, OrgWalk};
use crate::journal::place::Excluded;
use crate::journal::run::{BatchLanding, BatchMeta, Run};
use crate::{Error, OrgId, Replica};

/// Claims a K1 claim makes at most before [`Error::Contended`].
pub const MAX_HELD_CLAIM_ATTEMPTS: u32 = 8;

/// What [`Replica::claim_held`] found.
#[derive(Clone, Debug)]
pub enum HeldClaim {
    /// The exclusion took: the tenure is attached; hydrate its walk's state.
    Claimed(Box<JournalTenure>),
    /// The walk does not end in another writer's run (free, per org, or our own run): K1b,
    /// K1.6 or K4 applies.
    NotHeld(Box<OrgWalk>),
}

impl Replica {
    /// K1 whole: walks `org`; when the walk ends in another writer's run, judges that
    /// writer's process lease (unless `force`), announces the claim in an empty batch of
    /// `run`, creates it, and places the exclusion. A lost race, an abandoned claim or a
    /// voided exclusion walks again with a higher round.
    ///
    /// # Errors
    /// [`Error::LeaseHeld`] while the holder's process lease keeps changing (I15);
    /// [`Error::Contended`] after [`MAX_HELD_CLAIM_ATTEMPTS`];
    /// [`Error::ClaimUnusable`] when the announcing batch failed (the run needs its
    /// self-seal, J3); [`Error::Fenced`] when J2 fences the tenure at birth; the walk's,
    /// the create's and P's errors.
    pub async fn claim_held(
        &self,
        org: &OrgId,
        run: &mut Run,
        force: bool,
    ) -> Result<HeldClaim, Error> {
        for _ in 0..MAX_HELD_CLAIM_ATTEMPTS {
            let walk = self.walk_org(org).await?;
            let OrgEnd::Held {
                run: holder,
                tenure,
                ..
            } = walk.end.clone()
            else {
                return Ok(HeldClaim::NotHeld(Box::new(walk)));
            };
            if holder.instance() == run.name().instance() {
                return Ok(HeldClaim::NotHeld(Box::new(walk)));
            }
            if !force {
                self.judge_run_holder(org, &walk, &holder, tenure.round)
                    .await?;
            }
            let from = run.floor();
            self.announce(org, run, from).await?;
            let (seq, round) = (walk.next_seq(), walk.next_round());
            let claim = JournalClaim {
                seq,
                round,
                writer: run.writer().to_owned(),
                run: run.name().clone(),
                from,
                after: None,
            };
            if let EntryCreated::Taken(_) = self.create_journal_claim(org, claim).await? {
                continue;
            }
            if !self.inner.log.seqs_after(org, Some(seq)).await?.is_empty() {
                continue;
            }
            let Some((entry, listing)) = walk.runs.last().and_then(|w| w.visited.last()) else {
                continue;
            };
            let excluded = self
                .exclude(
                    org,
                    seq,
                    round,
                    run.name(),
                    from,
                    run.writer(),
                    listing,
                    *entry,
                    &tenure,
                )
                .await?;
            if let Excluded::Voided { reason } = excluded {
                tracing::debug!(%org, seq, round, reason, "exclusion voided; walking again");
                continue;
            }
            // K1.5: hydrate from a walk taken after the exclusion, which must pass it into
            // this run in this claim's tenure.
            let walk = self.walk_org(org).await?;
            let via = Via::Claim { seq };
            match &walk.end {
                OrgEnd::Held { run: r, tenure, .. }
                    if r == run.name() && tenure.round == round && tenure.via == via => {}
                _ => continue,
            }
            run.attach(org, round)?;
            return Ok(HeldClaim::Claimed(Box::new(JournalTenure {
                round,
                via,
                from,
                walk,
            })));
        }
        Err(Error::Contended {
            org: org.to_string(),
            attempts: MAX_HELD_CLAIM_ATTEMPTS,
        })
    }

    /// C3 for a run's writer: the process lease of the run's instance, watched as any
    /// holder's (I15), with the term its tenure's claim names.
    pub(crate) async fn judge_run_holder(
        &self,
        org: &OrgId,
        walk: &OrgWalk,
        holder: &RunName,
        round: u64,
    ) -> Result<(), Error> {
        let claim = walk
            .log
            .values()
            .rev()
            .find(|e| e.round() == round && e.is_claim());
        let (writer, term_ms) = match claim.map(|e| (&e.header.writer, &e.body)) {
            Some((w, EntryBody::Claim(c))) => (w.clone(), c.term_ms),
            _ => (String::new(), 0),
        };
        let lease = Lease {
            writer,
            round,
            expires_at_ms: 0,
            instance: holder.instance().to_owned(),
            home: None,
            addr: None,
            process: true,
            term_ms,
        };
        let hold = self.inner.leases.lease_hold(org, &lease).await?;
        if hold.wait_ms > 0 {
            return Err(Error::LeaseHeld {
                org: org.to_string(),
                holder: lease.writer,
                retry_after_ms: hold.wait_ms,
                draining: hold.drains(org),
                holder_addr: hold.process.and_then(|p| p.addr),
            });
        }
        Ok(())
    }

    /// Announces a claim of `org` naming `run` and `from` in an empty batch (K1.2), again
    /// above each slot another writer's exclusion takes.
    ///
    /// # Errors
    /// [`Error::ClaimUnusable`] when the batch failed (the run needs its self-seal, J3);
    /// [`Error::Contended`] after [`MAX_HELD_CLAIM_ATTEMPTS`] taken slots;
    /// [`Error::RunFenced`].
    pub(crate) async fn announce(
        &self,
        org: &OrgId,
        run: &mut Run,
        from: u64,
    ) -> Result<(), Error> {
        for _ in 0..MAX_HELD_CLAIM_ATTEMPTS {
            let meta = BatchMeta {
                claims: vec![Announced {
                    org: org.to_string(),
                    run: run.name().clone(),
                    from,
                }],
                ..BatchMeta::new(from)
            };
            let batch = self.issue_batch(run, Vec::new(), meta).await?;
            let landing = self.land_batch(&batch).await;
            let landed = matches!(landing, BatchLanding::Landed);
            run.settle(batch, landing)?;
            if run.needs_seal() {
                return Err(Error::ClaimUnusable {
                    org: org.to_string(),
                    round: 0,
                    reason: "the batch announcing the claim failed: the run needs its self-seal (J3)",
                });
            }
            if landed {
                return Ok(());
            }
            // Another writer's exclusion took the slot: announce again above it.
        }
        Err(Error::Contended {
            org: org.to_string(),
            attempts: MAX_HELD_CLAIM_ATTEMPTS,
        })
    }
}
