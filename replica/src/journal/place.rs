//! P, where a fence goes (`docs/design.md` 3g, "Placement"), and the two fences placed by
//! it: a claimant's exclusion of one org (K1.3) and an adopter's seal of a dead writer's
//! run (K2.2).
//!
//! A fence goes at the lowest slot at or above `f` = max(entry slot, highest listed floor)
//! that the walk's own listing shows free; the holder's create there collides. The second
//! listing re-runs the scan: every slot of `[f, fence)` must be occupied (a second fence
//! fills a hole), and nothing that voids the fence may lie below it.

use std::collections::BTreeSet;

use bytes::Bytes;
use tracing::debug;

use crate::format::journal::{
    self, Exclusion, JournalHeader, JournalObject, RunName, Seal, SealKind,
};
use crate::format::layout::new_nonce;
use crate::journal::io::{Created, RunListing};
use crate::journal::walk::{ScanEnd, WalkTenure, scan};
use crate::{Error, OrgId, Replica};

/// Second listings a placement makes (each filling the holes the previous one showed)
/// before it gives up as contended: a hole stays only while the holder's create for it is
/// in flight, at most `window` of them.
const MAX_SECOND_LISTINGS: u32 = 8;
/// Tries of one fence's create at one slot before the placement returns the error.
const FENCE_TRIES: u32 = 3;

/// A run with no free slot left (a crafted listing reaching the highest slot).
fn full(run: &RunName) -> Error {
    Error::corrupt(&format!("journals/{run}"), "no free slot left in the run")
}

/// Where a fence landed, or what stopped it.
#[derive(Clone, Debug)]
pub enum Placement {
    /// The fence landed at `slot` (and second fences at `second`), placed by `f`, and
    /// `listing` (from the entry slot, after it landed) shows every slot of `[f, slot)`
    /// occupied.
    Placed {
        /// The fence's slot.
        slot: u64,
        /// The floor it was placed by.
        f: u64,
        /// Second fences at holes below it.
        second: Vec<u64>,
        /// The second listing, from the entry slot.
        listing: RunListing,
    },
    /// A seal (or, for an exclusion, another exclusion) holds the slot tried: the placer
    /// re-walks (K1.4) or follows it (K2.2).
    Met {
        /// Its slot.
        slot: u64,
        /// Its header.
        header: Box<JournalHeader>,
    },
}

/// The outcome of [`Replica::adopt_run`] (K2.2).
#[derive(Clone, Debug)]
pub enum Adoption {
    /// Our adopt seal ended `run` at `slot`; `listing` is its second listing from slot 1.
    Sealed {
        /// The sealed run (the newest of the dead writer's chain).
        run: RunName,
        /// The seal's slot.
        slot: u64,
        /// The second listing.
        listing: RunListing,
    },
    /// A release seal ends the run: its orgs are free (K1b claims them).
    Released {
        /// The run.
        run: RunName,
        /// The release seal's slot.
        slot: u64,
    },
    /// Another process's adopt seal ends the run: that one adopted its orgs.
    AdoptedBy {
        /// The run.
        run: RunName,
        /// The seal's slot.
        slot: u64,
        /// The adopter's writer id.
        by: String,
    },
}

/// The outcome of [`Replica::exclude`] (K1.3-K1.5).
#[derive(Clone, Debug)]
pub enum Excluded {
    /// The re-walk reaches the exclusion and takes it: the claimant serves from this
    /// listing (the run the walk ended in, from its entry slot).
    Serves {
        /// The exclusion's slot.
        slot: u64,
        /// The second listing.
        listing: RunListing,
    },
    /// The exclusion fences nothing: a seal, an exclusion of a round at or above the claim's,
    /// or a released section of the tenure lies before it. Re-walk (K1.4).
    Voided {
        /// What the re-walk met.
        reason: String,
    },
}

impl Replica {
    /// P: places `object` (an exclusion or an adopt seal) in `listing`'s run, from `entry`.
    /// A collision with a batch takes the listing's next free slot; with an exclusion, the
    /// same for a seal and [`Placement::Met`] for an exclusion; with a seal, `Met`.
    ///
    /// # Errors
    /// [`Error::Contended`] when holes below the fence keep appearing; the create's and the
    /// listing's errors (an unknown outcome is retried in place by the create, I9).
    pub async fn place_fence(
        &self,
        listing: &RunListing,
        entry: u64,
        object: JournalObject,
    ) -> Result<Placement, Error> {
        let run = &listing.run;
        let f = entry.max(listing.highest_floor());
        let mut occupied: BTreeSet<u64> = listing.objects.keys().copied().collect();
        let is_exclusion = matches!(object, JournalObject::Exclusion(_));
        let lowest_free =
            |occupied: &BTreeSet<u64>, from: u64| (from..u64::MAX).find(|s| !occupied.contains(s));
        let mut slot = lowest_free(&occupied, f).ok_or_else(|| full(run))?;
        loop {
            match self.create_fence(run, slot, f, &object).await? {
                Created::Landed => break,
                Created::Taken(theirs) => {
                    if let Some(met) = voids(&theirs.object, is_exclusion) {
                        debug!(%run, slot, met, "fence met an object that stops it");
                        return Ok(Placement::Met {
                            slot,
                            header: theirs,
                        });
                    }
                    occupied.insert(slot);
                    slot = lowest_free(&occupied, slot).ok_or_else(|| full(run))?;
                }
            }
        }
        self.fill_holes(run, entry, f, slot, &object).await
    }

    /// The second listing of P: lists `run` from `entry` again and places a second fence
    /// (the same object) at every slot of `[f, slot)` still free, until none is.
    async fn fill_holes(
        &self,
        run: &RunName,
        entry: u64,
        f: u64,
        slot: u64,
        object: &JournalObject,
    ) -> Result<Placement, Error> {
        let is_exclusion = matches!(object, JournalObject::Exclusion(_));
        let mut second = Vec::new();
        for _ in 0..MAX_SECOND_LISTINGS {
            let again = self.list_run(run, entry).await?;
            let holes: Vec<u64> = (f..slot)
                .filter(|s| !again.objects.contains_key(s))
                .collect();
            if holes.is_empty() {
                return Ok(Placement::Placed {
                    slot,
                    f,
                    second,
                    listing: again,
                });
            }
            for hole in holes {
                match self.create_fence(run, hole, f, object).await? {
                    Created::Landed => second.push(hole),
                    Created::Taken(theirs) => {
                        if voids(&theirs.object, is_exclusion).is_some() {
                            return Ok(Placement::Met {
                                slot: hole,
                                header: theirs,
                            });
                        }
                    }
                }
            }
        }
        Err(Error::Contended {
            org: format!("journal {run}"),
            attempts: MAX_SECOND_LISTINGS,
        })
    }

    /// Creates `object` at `slot` with one header, retried in place while its outcome is
    /// not decided (K2.2: "retried in place until decided"), so a fence that landed unseen
    /// is found as ours (its nonce) and never taken for another's.
    async fn create_fence(
        &self,
        run: &RunName,
        slot: u64,
        f: u64,
        object: &JournalObject,
    ) -> Result<Created, Error> {
        let header = JournalHeader {
            run: run.clone(),
            slot,
            nonce: new_nonce()?,
            floor: f,
            object: object.clone(),
        };
        let bytes = Bytes::from(journal::encode(header.clone(), Vec::new())?);
        let mut tries = 0;
        loop {
            tries += 1;
            match self.journal_create(&header, bytes.clone()).await {
                Err(e) if tries < FENCE_TRIES && !matches!(e, Error::Corrupt { .. }) => {
                    debug!(%run, slot, error = %e, "fence not settled; retrying in place");
                }
                other => return other,
            }
        }
    }

    /// K2.2: seals the dead writer's run `run` (following its `self` seals to the newest
    /// run of its chain) with an adopt seal by P, `continued` = the adopter's run entered at
    /// `from` (its floor). The writer's next create at or above the seal collides with it,
    /// and every org of the run is fenced by this one PUT.
    ///
    /// # Errors
    /// [`Error::Corrupt`] for a chain of more than [`crate::journal::MAX_WALK_HOPS`] self
    /// seals or a damaged object; [`Replica::place_fence`]'s errors.
    pub async fn adopt_run(
        &self,
        run: &RunName,
        by: &str,
        continued: &RunName,
        from: u64,
    ) -> Result<Adoption, Error> {
        crate::org_id::check_writer(by)?;
        // The seal hands the run's orgs to `continued`, judged by this process's lease.
        self.inner.leases.ready_to_claim().await?;
        let seal = JournalObject::Seal(Seal {
            by: by.to_owned(),
            instance: continued.instance().to_owned(),
            seal: SealKind::Adopt,
            continued: Some(continued.clone()),
            from,
            retain_below: 0,
        });
        let mut run = run.clone();
        for _ in 0..=crate::journal::MAX_WALK_HOPS {
            let listing = self.list_run(&run, 1).await?;
            // A seal already in the listing ends the run before any slot we could take.
            let met = listing
                .objects
                .iter()
                .find_map(|(&s, l)| match &l.header.object {
                    JournalObject::Seal(_) => Some((s, l.header.clone())),
                    _ => None,
                });
            let placed = match met {
                // Our own adopt seal, from an earlier call whose outcome was not seen: the
                // placement goes on from its second listing.
                Some((slot, h)) if is_ours(&h.object, continued) => {
                    self.fill_holes(&run, 1, h.floor, slot, &seal).await?
                }
                Some((slot, h)) => Placement::Met {
                    slot,
                    header: Box::new(h),
                },
                None => self.place_fence(&listing, 1, seal.clone()).await?,
            };
            // A create that met our own adopt seal (an earlier call's, landed after this
            // call's listing) goes on from that seal's second listing, as when the
            // listing shows it: never read as another's adoption, which would leave the
            // run's orgs with no writer. Each such seal met lies at a hole below the last,
            // so this ends.
            let mut placed = placed;
            while let Placement::Met { slot, header } = &placed {
                if !is_ours(&header.object, continued) {
                    break;
                }
                placed = self.fill_holes(&run, 1, header.floor, *slot, &seal).await?;
            }
            let (slot, header) = match placed {
                Placement::Placed {
                    slot,
                    listing: again,
                    ..
                } => {
                    let mut ours = again
                        .objects
                        .range(..=slot)
                        .filter(|(_, l)| is_ours(&l.header.object, continued));
                    // Walks meet the lowest of our seals first: the adopted tenures come
                    // through it (a second seal at a hole lies below the first).
                    let first = ours.next().map_or(slot, |(&s, _)| s);
                    let below = again.objects.range(..slot).find_map(|(&s, l)| {
                        let foreign = matches!(l.header.object, JournalObject::Seal(_))
                            && !is_ours(&l.header.object, continued);
                        foreign.then(|| (s, l.header.clone()))
                    });
                    match below {
                        Some(m) => m,
                        None => {
                            return Ok(Adoption::Sealed {
                                run,
                                slot: first,
                                listing: again,
                            });
                        }
                    }
                }
                Placement::Met { slot, header } => (slot, *header),
            };
            let JournalObject::Seal(s) = &header.object else {
                return Err(Error::corrupt(
                    &format!("journals/{run}/{slot:020}.jnl"),
                    "an adoption stopped by an object that is not a seal",
                ));
            };
            match (s.seal, &s.continued) {
                (SealKind::SelfSeal, Some(next)) => run = next.clone(),
                (SealKind::Release, _) => return Ok(Adoption::Released { run, slot }),
                (SealKind::Adopt, _) => {
                    return Ok(Adoption::AdoptedBy {
                        run,
                        slot,
                        by: s.by.clone(),
                    });
                }
                (SealKind::SelfSeal, None) => {
                    return Err(Error::corrupt(
                        &format!("journals/{run}/{slot:020}.jnl"),
                        "a self seal that names no continued run",
                    ));
                }
            }
        }
        Err(Error::corrupt(
            &format!("journals/{run}"),
            "a chain of more self seals than a walk follows",
        ))
    }

    /// K1.3-K1.5: places an exclusion of `org` for the claim at log position `claim` of
    /// round `round` (naming the claim's run `continued` and its `from`) in the run the
    /// walk ended in (`listing`, entered at `entry`, in `tenure`), then re-runs the scan
    /// over the second listing: the claimant serves only when it reaches the exclusion and
    /// takes it, past no seal, no higher exclusion and no released section of the tenure.
    ///
    /// # Errors
    /// [`Error::InvalidSettings`] when `round` is not above the walk's; as
    /// [`Replica::place_fence`].
    #[allow(clippy::too_many_arguments)]
    pub async fn exclude(
        &self,
        org: &OrgId,
        claim: u64,
        round: u64,
        continued: &RunName,
        from: u64,
        by: &str,
        listing: &RunListing,
        entry: u64,
        tenure: &WalkTenure,
    ) -> Result<Excluded, Error> {
        crate::org_id::check_writer(by)?;
        if round <= tenure.round {
            return Err(Error::InvalidSettings {
                reason: format!(
                    "an exclusion of round {round} over a walk of round {}",
                    tenure.round
                ),
            });
        }
        let object = JournalObject::Exclusion(Exclusion {
            org: org.to_string(),
            claim,
            round,
            continued: continued.clone(),
            from,
            by: by.to_owned(),
        });
        let placed = self.place_fence(listing, entry, object).await?;
        let (slot, second, again) = match placed {
            Placement::Placed {
                slot,
                second,
                listing,
                ..
            } => (slot, second, listing),
            Placement::Met { slot, .. } => {
                return Ok(Excluded::Voided {
                    reason: format!("slot {slot} holds a seal or an exclusion"),
                });
            }
        };
        let rewalk = scan(&again, entry, org, tenure)?;
        if let Some((_, s)) = &rewalk.newest
            && s.released
        {
            return Ok(Excluded::Voided {
                reason: "a released section of the tenure".into(),
            });
        }
        match rewalk.end {
            ScanEnd::Excluded {
                slot: at,
                tenure: t,
                ..
            } if (at == slot || second.contains(&at)) && t.round == round => Ok(Excluded::Serves {
                slot: at,
                listing: again,
            }),
            other => Ok(Excluded::Voided {
                reason: format!("the re-walk ended at {other:?}"),
            }),
        }
    }
}

/// True for an adopt seal continuing in `continued`: this adopter's own.
fn is_ours(object: &JournalObject, continued: &RunName) -> bool {
    matches!(object, JournalObject::Seal(Seal { seal: SealKind::Adopt, continued: Some(c), .. }) if c == continued)
}

/// What stops a fence that collided with `theirs`: a seal always; another exclusion only
/// for an exclusion (K1.4 re-walks; an adopter resolves it and moves up, K2.2).
fn voids(theirs: &JournalObject, is_exclusion: bool) -> Option<&'static str> {
    match theirs {
        JournalObject::Seal(_) => Some("a seal"),
        JournalObject::Exclusion(_) if is_exclusion => Some("an exclusion"),
        _ => None,
    }
}
