//! K2.3: what an adopter learns of a sealed run's orgs (`docs/design.md` 3g). A roster says
//! which orgs there are, never where their state is (J3-19): the newest roster that exists,
//! reading back along the chain's `self` seals, plus every org with a section or an announced
//! claim in a batch after it (T2 keeps them). Each org's state comes from its own walk.

use std::collections::BTreeSet;

use crate::format::journal::{Announced, JournalObject, RunName, SealKind};
use crate::journal::io::RunListing;
use crate::journal::issuer::ROSTER_EVERY;
use crate::journal::walk::MAX_WALK_HOPS;
use crate::{Error, OrgId, Replica};

/// The orgs a run's adopter learns (K2.3).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunOrgs {
    /// Every org whose walk may pass the seal: the newest roster's, and those of every
    /// section and announced claim after it along the chain.
    pub orgs: BTreeSet<OrgId>,
    /// The claims announced after the roster: their `from` counts in the adopter's
    /// `retain_below` until superseded (T3).
    pub claims: Vec<Announced>,
    /// The run and slot of the roster found; `None` when the chain holds none.
    pub roster: Option<(RunName, u64)>,
}

impl Replica {
    /// K2.6: the orgs a release seal in `seal` of `run` freed, for a successor to open
    /// before their requests arrive: [`Replica::run_orgs`] below the seal. Lists the run
    /// from `2 × ROSTER_EVERY` slots below the seal (a roster is written at least every
    /// 256 batches, so it is there unless the run is young or its chain is continued),
    /// and from slot 1 when that part holds no roster. What it returns is a hint: each org
    /// is then acquired by the ordinary rules, which never take one from a live holder.
    ///
    /// # Errors
    /// As [`Replica::run_orgs`] and [`Replica::list_run`].
    pub async fn released_run_orgs(&self, run: &RunName, seal: u64) -> Result<RunOrgs, Error> {
        let from = seal.saturating_sub(2 * ROSTER_EVERY).max(1);
        let mut listing = self.list_run(run, from).await?;
        let has_roster = listing.objects.range(..seal).any(
            |(_, l)| matches!(&l.header.object, JournalObject::Batch(b) if b.roster.is_some()),
        );
        if !has_roster && from > 1 {
            listing = self.list_run(run, 1).await?;
        }
        self.run_orgs(&listing, seal).await
    }

    /// K2.3 over `listing`, the sealed run's listing from slot 1, reading objects below
    /// `below` (the adopter's seal: nothing at or above it is read by a walk). When the run
    /// holds no roster, its chain's earlier runs are read back along their `self` seals (a
    /// continued run is always its writer's next number).
    ///
    /// # Errors
    /// [`Error::Corrupt`] for an org id in a roster, section or claim that does not validate,
    /// or a chain longer than [`MAX_WALK_HOPS`]; [`Replica::list_run`]'s errors.
    pub async fn run_orgs(&self, listing: &RunListing, below: u64) -> Result<RunOrgs, Error> {
        let mut out = RunOrgs::default();
        let mut cur = listing.clone();
        let mut below = below;
        for _ in 0..=MAX_WALK_HOPS {
            let batches: Vec<_> = cur
                .objects
                .range(..below)
                .filter_map(|(&slot, l)| match &l.header.object {
                    JournalObject::Batch(b) => Some((slot, b)),
                    _ => None,
                })
                .collect();
            let newest_roster = batches.iter().rposition(|(_, b)| b.roster.is_some());
            let after = newest_roster.map_or(0, |i| i + 1);
            let org = |name: &str| {
                OrgId::new(name).map_err(|_| {
                    Error::corrupt(
                        &format!("journals/{}", cur.run),
                        format!("an org id that does not validate: {name:?}"),
                    )
                })
            };
            for (_, b) in &batches[after..] {
                for s in &b.sections {
                    out.orgs.insert(org(&s.org)?);
                }
                for c in &b.claims {
                    out.orgs.insert(org(&c.org)?);
                    out.claims.push(c.clone());
                }
            }
            if let Some(i) = newest_roster {
                let (slot, b) = batches[i];
                for name in b.roster.iter().flatten() {
                    out.orgs.insert(org(name)?);
                }
                out.roster = Some((cur.run.clone(), slot));
                return Ok(out);
            }
            // No roster here: the run before it in the chain, if a self seal ends it here.
            let n = cur.run.number();
            if n <= 1 {
                return Ok(out);
            }
            let prev = RunName::new(cur.run.instance(), n - 1)?;
            let prev_listing = self.list_run(&prev, 1).await?;
            let seal = prev_listing
                .objects
                .iter()
                .find_map(|(&s, l)| match &l.header.object {
                    JournalObject::Seal(seal)
                        if seal.seal == SealKind::SelfSeal
                            && seal.continued.as_ref() == Some(&cur.run) =>
                    {
                        Some(s)
                    }
                    _ => None,
                });
            let Some(seal) = seal else {
                return Ok(out);
            };
            below = seal;
            cur = prev_listing;
        }
        Err(Error::corrupt(
            &format!("journals/{}", listing.run),
            "a chain of more self seals than a walk follows",
        ))
    }
}
