//! K0's scan of runs (`docs/design.md` 3g, "The walk"): from an entry slot, the objects of a
//! run in slot order decide where one org's acknowledged state is and who holds it. The
//! scan of one listing is pure ([`scan`]); [`Replica::walk_runs`] lists each run the scan
//! hops to.

use std::sync::Arc;

use crate::format::journal::{JournalObject, RunName, SealKind, SectionIndex, Via};
use crate::journal::io::{Listed, RunListing};
use crate::{Error, OrgId, Replica};

/// Hops one walk follows at most before it calls the chain damaged: J7 re-anchors an org
/// whose walk crosses more than `max_hops` (2), so a longer walk is not one a writer made.
pub const MAX_WALK_HOPS: usize = 64;

/// The tenure a walk is in: its round and how it began.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WalkTenure {
    /// The round.
    pub round: u64,
    /// The claim or adopt seal it came through.
    pub via: Via,
}

/// Where a scan of one run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScanEnd {
    /// The end of the listing: the run's writer holds the org (C3 judges its lease); the
    /// slot after the last listed object.
    Held {
        /// The run's end slot as listed.
        end_slot: u64,
    },
    /// An exclusion of the org of a higher round: the walk continues in `run` at `from`
    /// in the tenure of the exclusion's claim.
    Excluded {
        /// The exclusion's slot.
        slot: u64,
        /// The run its claim names.
        run: RunName,
        /// The slot walks enter it at.
        from: u64,
        /// The tenure that follows.
        tenure: WalkTenure,
    },
    /// A `self` or `adopt` seal: the walk continues in `run` at `from`.
    Sealed {
        /// The seal's slot.
        slot: u64,
        /// The continued run.
        run: RunName,
        /// The slot walks enter it at.
        from: u64,
        /// The tenure that follows (an adoption's is round + 1, via the seal).
        tenure: WalkTenure,
    },
    /// A release seal: the org is free at this point (K1b claims name it).
    Released {
        /// The seal's slot.
        slot: u64,
    },
}

/// What a scan of one run found for one org.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scan {
    /// The newest section of the org's tenure read, with the batch that holds it.
    pub newest: Option<(Arc<Listed>, SectionIndex)>,
    /// Where the scan ended.
    pub end: ScanEnd,
}

/// Scans `listing` from `entry` for `org` in `tenure` (K0's "Scan"): sections of the tenure
/// become the newest read; the first exclusion of `org` of a higher round, or any seal,
/// ends the scan; other tenures' sections, exclusions of a round at or below the tenure's,
/// other orgs' exclusions are passed over.
///
/// # Errors
/// [`Error::Corrupt`] for a `self` or `adopt` seal that names no continued run.
pub fn scan(
    listing: &RunListing,
    entry: u64,
    org: &OrgId,
    tenure: &WalkTenure,
) -> Result<Scan, Error> {
    let mut newest = None;
    for (&slot, listed) in listing.objects.range(entry..) {
        match &listed.header.object {
            JournalObject::Batch(_) => {
                if let Some(s) = listed
                    .sections_of(org.as_str())
                    .find(|s| s.round == tenure.round && s.via == tenure.via)
                {
                    newest = Some((listed.clone(), s.clone()));
                }
            }
            JournalObject::Exclusion(ex) if ex.org == org.as_str() && ex.round > tenure.round => {
                let end = ScanEnd::Excluded {
                    slot,
                    run: ex.continued.clone(),
                    from: ex.from,
                    tenure: WalkTenure {
                        round: ex.round,
                        via: Via::Claim { seq: ex.claim },
                    },
                };
                return Ok(Scan { newest, end });
            }
            JournalObject::Exclusion(_) => {}
            JournalObject::Seal(seal) => {
                let continued = || {
                    seal.continued.clone().ok_or_else(|| {
                        Error::corrupt(
                            &format!("journals/{}/{slot:020}.jnl", listing.run),
                            "a seal that continues names no run",
                        )
                    })
                };
                let end = match seal.seal {
                    SealKind::Release => ScanEnd::Released { slot },
                    SealKind::SelfSeal => ScanEnd::Sealed {
                        slot,
                        run: continued()?,
                        from: 1,
                        tenure: tenure.clone(),
                    },
                    SealKind::Adopt => ScanEnd::Sealed {
                        slot,
                        run: continued()?,
                        from: seal.from,
                        tenure: WalkTenure {
                            round: tenure.round.checked_add(1).ok_or_else(|| {
                                Error::corrupt(
                                    &format!("journals/{}/{slot:020}.jnl", listing.run),
                                    "an adoption past the highest round",
                                )
                            })?,
                            via: Via::Adopt {
                                run: listing.run.clone(),
                                slot,
                            },
                        },
                    },
                };
                return Ok(Scan { newest, end });
            }
        }
    }
    Ok(Scan {
        newest,
        end: ScanEnd::Held {
            end_slot: listing.end_slot(),
        },
    })
}

/// A walk across runs: each run visited with its entry slot and listing, the newest section
/// read along the way, and where it ended.
#[derive(Clone, Debug)]
pub struct Walk {
    /// Every run visited, in order: its entry slot and its listing (P and the hydrate use
    /// exactly these).
    pub visited: Vec<(u64, RunListing)>,
    /// The newest section read along the walk, each taken in the tenure current where it
    /// was read (J3-5).
    pub newest: Option<(Arc<Listed>, SectionIndex)>,
    /// The tenure current where the walk ended.
    pub tenure: WalkTenure,
    /// How the last run's scan ended: [`ScanEnd::Held`] or [`ScanEnd::Released`].
    pub end: ScanEnd,
}

impl Replica {
    /// Walks `org` from `entry` of `run` in `tenure` (K0), listing each run it hops to from
    /// its entry slot, until a run's listing ends (the org is held by that run's writer) or
    /// a release seal frees it. A sealed run is listed once per handle: walks entering it
    /// at or below its seal read that listing (`journal/headers.rs`, `SealedListings`).
    /// Another run's listing is shared by the walks begun before its LIST began
    /// (`journal/coalesce.rs`).
    ///
    /// # Errors
    /// [`Error::Corrupt`] after [`MAX_WALK_HOPS`] hops or for a damaged object; the
    /// listing's errors ([`Replica::list_run`]).
    pub async fn walk_runs(
        &self,
        org: &OrgId,
        run: &RunName,
        entry: u64,
        tenure: WalkTenure,
    ) -> Result<Walk, Error> {
        let (mut run, mut entry, mut tenure) = (run.clone(), entry, tenure);
        let mut visited = Vec::new();
        let mut newest = None;
        for _ in 0..=MAX_WALK_HOPS {
            // Each hop's listing must be newer than the object that sent the walk there:
            // an exclusion or seal read from the previous listing (a run listed before it
            // landed could lack the seal that preceded it).
            let since = self.inner.run_listings.begin();
            let listing = match self.inner.sealed_listings.get(&run, entry) {
                Some(listing) => listing,
                None => {
                    let listing = self
                        .inner
                        .run_listings
                        .get(&run, entry, since, |from| self.list_run(&run, from))
                        .await?;
                    self.inner.sealed_listings.insert(&listing);
                    listing
                }
            };
            let found = scan(&listing, entry, org, &tenure)?;
            if found.newest.is_some() {
                newest = found.newest;
            }
            visited.push((entry, listing));
            match found.end {
                ScanEnd::Excluded {
                    run: next,
                    from,
                    tenure: t,
                    ..
                }
                | ScanEnd::Sealed {
                    run: next,
                    from,
                    tenure: t,
                    ..
                } => (run, entry, tenure) = (next, from, t),
                end => {
                    return Ok(Walk {
                        visited,
                        newest,
                        tenure,
                        end,
                    });
                }
            }
        }
        Err(Error::corrupt(
            &format!("journals/{run}"),
            format!("a walk of {org} crosses more than {MAX_WALK_HOPS} runs"),
        ))
    }
}
