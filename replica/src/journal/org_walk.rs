//! K0 from an org's log (`docs/design.md` 3g, "The walk"): where the org's acknowledged state
//! is and who holds it, read from its log (format 5 where an entry names the journal) and
//! then the runs the log sends the walk to.
//!
//! The walk starts at the log's newest checkpoint (highest round, then seq), or, with none,
//! in the per-org segment of the log's newest per-org claim, or at the free point `empty`.
//! At a free point it continues at the highest claim naming it; in a run it scans
//! ([`crate::Replica::walk_runs`]) until the run's writer holds the org or a release seal
//! frees it.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use crate::chain;
use crate::format::entry::EntryBody;
use crate::format::journal::{RunName, Via};
use crate::format::mark::{FreePoint, JournalMark};
use crate::journal::SectionIndex;
use crate::journal::io::Listed;
use crate::journal::walk::{MAX_WALK_HOPS, ScanEnd, Walk, WalkTenure};
use crate::{Error, LogEntry, OrgId, Replica};

/// Reads of an org's log a walk makes at most while retention deletes entries under them.
const MAX_LOG_READS: u32 = 8;

/// The acknowledged state a walk found.
#[derive(Clone, Debug)]
pub enum WalkState {
    /// No state at all: the log holds none and no section was read.
    Empty,
    /// The state of the log entry at `seq`: a checkpoint, or a per-org chain's position.
    Entry {
        /// Its log position.
        seq: u64,
    },
    /// The newest section read, applied to the base it names.
    Section {
        /// The batch holding it.
        batch: Arc<Listed>,
        /// The section.
        section: SectionIndex,
    },
}

/// Where a walk of one org ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OrgEnd {
    /// In a run whose writer holds the org (C3 judges that process's lease).
    Held {
        /// The run.
        run: RunName,
        /// The slot after the last object listed.
        end_slot: u64,
        /// The tenure the walk ended in.
        tenure: WalkTenure,
    },
    /// In a per-org segment: the process of the claim at `claim` holds the org (3, 3e).
    HeldPerOrg {
        /// The segment's claim.
        claim: u64,
        /// Its round.
        round: u64,
    },
    /// Free at this point: a claim naming it takes the org (K1b).
    Free(FreePoint),
}

/// What K0 found for one org: its log, the runs it walked, its state and its end.
#[derive(Clone, Debug)]
pub struct OrgWalk {
    /// Every entry of the org's log as read, by seq.
    pub log: BTreeMap<u64, LogEntry>,
    /// The highest round of the log's entries and of the walk's tenures: a claim takes one
    /// above it (K1.2).
    pub highest_round: u64,
    /// The walks of runs, in order (one per stretch between free points).
    pub runs: Vec<Walk>,
    /// The acknowledged state.
    pub state: WalkState,
    /// Where the walk ended.
    pub end: OrgEnd,
}

/// Where the walk goes next.
enum Next {
    Run {
        run: RunName,
        entry: u64,
        tenure: WalkTenure,
    },
    PerOrg {
        claim: u64,
        round: u64,
    },
    Free(FreePoint),
}

impl OrgWalk {
    /// The log position a claim made from this walk goes to: head + 1 of its listing.
    pub fn next_seq(&self) -> u64 {
        self.log
            .keys()
            .next_back()
            .map_or(1, |s| s.saturating_add(1))
    }

    /// The round a claim made from this walk takes: 1 + the highest seen (K1.2).
    pub fn next_round(&self) -> u64 {
        self.highest_round.saturating_add(1)
    }
}

impl Replica {
    /// Walks `org` (K0): reads its whole log with the journal's reader, then follows the
    /// newest checkpoint, per-org segment or free point through the runs it names, listing
    /// each run from its entry slot.
    ///
    /// # Errors
    /// [`Error::Corrupt`] for a damaged entry or journal object, per-org entries with no
    /// claim, or a walk of more than [`MAX_WALK_HOPS`] hops; [`Error::ChainBroken`] for a
    /// per-org segment whose chain is broken; [`Error::UnknownFormat`];
    /// [`Error::Contended`] when retention deleted entries under each of 8 reads of the
    /// log; the store's errors.
    pub async fn walk_org(&self, org: &OrgId) -> Result<OrgWalk, Error> {
        // A listed entry gone before its read was deleted by retention (T4) meanwhile: the
        // read is no one state of the log, and could lack the newest checkpoint while
        // holding an older one, so the walk would start from a state that is not the
        // newest. Read again; retention deletes only below a newer kept entry.
        for _ in 0..MAX_LOG_READS {
            let (entries, listed) = self.inner.log.journal_history_listed(org).await?;
            if entries.len() == listed.len() {
                let log = entries.into_iter().map(|e| (e.seq(), e)).collect();
                return self.walk_org_in(org, log).await;
            }
        }
        Err(Error::Contended {
            org: org.to_string(),
            attempts: MAX_LOG_READS,
        })
    }

    /// [`Replica::walk_org`] over `log`, the org's log as the caller read it.
    ///
    /// # Errors
    /// As [`Replica::walk_org`].
    pub(crate) async fn walk_org_in(
        &self,
        org: &OrgId,
        log: BTreeMap<u64, LogEntry>,
    ) -> Result<OrgWalk, Error> {
        let mut highest_round = log.values().map(LogEntry::round).max().unwrap_or(0);
        let mut state = WalkState::Empty;
        let mut runs = Vec::new();
        let mut next = start(org, &log, &mut state)?;
        for _ in 0..=MAX_WALK_HOPS {
            next = match next {
                Next::Free(at) => match highest_claim_after(&log, &at) {
                    Some(n) => n,
                    None => return Ok(done(log, highest_round, runs, state, OrgEnd::Free(at))),
                },
                Next::PerOrg { claim, round } => {
                    match per_org_segment(org, &log, claim, round, &mut state)? {
                        Some(n) => n,
                        None => {
                            let end = OrgEnd::HeldPerOrg { claim, round };
                            return Ok(done(log, highest_round, runs, state, end));
                        }
                    }
                }
                Next::Run { run, entry, tenure } => {
                    let walk = self.walk_runs(org, &run, entry, tenure).await?;
                    if let Some((batch, section)) = &walk.newest {
                        state = WalkState::Section {
                            batch: batch.clone(),
                            section: section.clone(),
                        };
                    }
                    highest_round = highest_round.max(walk.tenure.round);
                    let last = walk
                        .visited
                        .last()
                        .map(|(_, l)| l.run.clone())
                        .unwrap_or(run);
                    let end = match walk.end {
                        ScanEnd::Released { slot } => Ok(FreePoint::Seal { run: last, slot }),
                        ScanEnd::Held { end_slot } => Err(OrgEnd::Held {
                            run: last,
                            end_slot,
                            tenure: walk.tenure.clone(),
                        }),
                        // `walk_runs` follows every other end.
                        _ => Err(OrgEnd::Free(FreePoint::Empty)),
                    };
                    runs.push(walk);
                    match end {
                        Ok(at) => Next::Free(at),
                        Err(end) => return Ok(done(log, highest_round, runs, state, end)),
                    }
                }
            };
        }
        Err(Error::corrupt(
            &format!("orgs/{org}/log"),
            format!("a walk of {org} crosses more than {MAX_WALK_HOPS} free points"),
        ))
    }
}

fn done(
    log: BTreeMap<u64, LogEntry>,
    highest_round: u64,
    runs: Vec<Walk>,
    state: WalkState,
    end: OrgEnd,
) -> OrgWalk {
    OrgWalk {
        log,
        highest_round,
        runs,
        state,
        end,
    }
}

/// K0's "Start": the newest checkpoint, else the newest per-org claim's segment, else the
/// free point `empty`.
fn start(org: &OrgId, log: &BTreeMap<u64, LogEntry>, state: &mut WalkState) -> Result<Next, Error> {
    let newest = log
        .values()
        .filter(|e| matches!(e.header.journal, Some(JournalMark::Checkpoint { .. })))
        .max_by_key(|e| (e.round(), e.seq()));
    if let Some(c) = newest
        && let Some(JournalMark::Checkpoint {
            run,
            through,
            tenure,
            released,
        }) = &c.header.journal
    {
        *state = WalkState::Entry { seq: c.seq() };
        if *released
            && let Some(release) = above(log, c.seq())
                .find(|e| matches!(e.body, EntryBody::Release) && e.round() == c.round())
        {
            return Ok(Next::Free(FreePoint::Entry { seq: release.seq() }));
        }
        return Ok(Next::Run {
            run: run.clone(),
            entry: through.checked_add(1).ok_or_else(|| {
                Error::corrupt(
                    &format!("orgs/{org}/log"),
                    "a checkpoint through the last slot",
                )
            })?,
            tenure: WalkTenure {
                round: c.round(),
                via: tenure.clone(),
            },
        });
    }
    let claim = log
        .values()
        .rev()
        .find(|e| e.is_claim() && e.header.journal.is_none());
    match claim {
        Some(c) => Ok(Next::PerOrg {
            claim: c.seq(),
            round: c.round(),
        }),
        None if log.values().any(|e| e.stored().is_some()) => Err(Error::corrupt(
            &format!("orgs/{org}/log"),
            "snapshots or deltas with no per-org claim and no checkpoint",
        )),
        None => Ok(Next::Free(FreePoint::Empty)),
    }
}

/// The entries of `log` above `seq` (none above the last seq a log name holds).
fn above(log: &BTreeMap<u64, LogEntry>, seq: u64) -> impl Iterator<Item = &LogEntry> {
    log.range((Bound::Excluded(seq), Bound::Unbounded))
        .map(|(_, e)| e)
}

/// The claim with the highest seq naming `at` as the free point it passed, as the next step
/// of the walk: its run from its `from` slot, in its round's tenure.
fn highest_claim_after(log: &BTreeMap<u64, LogEntry>, at: &FreePoint) -> Option<Next> {
    claims_after(log, at).next().map(|(_, next)| next)
}

/// The claims naming `at` as the free point they passed, highest seq first, each with the
/// step of the walk it starts.
fn claims_after<'a>(
    log: &'a BTreeMap<u64, LogEntry>,
    at: &'a FreePoint,
) -> impl Iterator<Item = (&'a LogEntry, Next)> + 'a {
    log.values()
        .rev()
        .filter_map(move |e| match &e.header.journal {
            Some(JournalMark::Claim {
                run,
                from,
                after: Some(after),
            }) if after == at => Some((
                e,
                Next::Run {
                    run: run.clone(),
                    entry: *from,
                    tenure: WalkTenure {
                        round: e.round(),
                        via: Via::Claim { seq: e.seq() },
                    },
                },
            )),
            _ => None,
        })
}

/// True when an entry of the per-org path of a lower round than `claim`, other than a stray
/// it fenced (R1), lies above it: `claim` landed in a slot retention freed, under the
/// holder's newer entries, and C2 abandoned it. 3e reads such a claim as shadowed
/// (`Window::newest`): it fenced nothing, so it never ends a per-org segment.
fn shadowed(log: &BTreeMap<u64, LogEntry>, claim: &LogEntry) -> bool {
    above(log, claim.seq()).any(|e| {
        e.header.journal.is_none()
            && e.round() < claim.round()
            && !e.is_stray_of(claim.round(), claim.seq())
    })
}

/// A per-org segment from its claim at `claim` (K0): it ends at the first of the Release
/// entry of its tenure and a journal claim that takes it over (`after` naming the claim, not
/// shadowed), and the walk continues at the free point or the highest such claim. Its state
/// is its chain's below that end. `None` when it reaches the log's end: the claim's process
/// holds the org.
fn per_org_segment(
    org: &OrgId,
    log: &BTreeMap<u64, LogEntry>,
    claim: u64,
    round: u64,
    state: &mut WalkState,
) -> Result<Option<Next>, Error> {
    let at = FreePoint::Entry { seq: claim };
    let takers: Vec<(&LogEntry, Next)> = claims_after(log, &at)
        .filter(|(e, _)| !shadowed(log, e))
        .collect();
    let lowest_taker = takers.last().map(|(e, _)| e.seq());
    let release = above(log, claim)
        .find(|e| matches!(e.body, EntryBody::Release) && e.round() == round)
        .map(LogEntry::seq)
        .filter(|r| lowest_taker.is_none_or(|t| *r < t));
    let (limit, next) = match (release, takers.into_iter().next()) {
        (Some(r), _) => (r, Some(Next::Free(FreePoint::Entry { seq: r }))),
        (None, Some((e, next))) => (e.seq(), Some(next)),
        (None, None) => (u64::MAX, None),
    };
    let below: Vec<LogEntry> = log.range(..limit).map(|(_, e)| e.clone()).collect();
    if let Some(c) = chain::newest(org, &below, limit)? {
        *state = WalkState::Entry { seq: c.position() };
    }
    Ok(next)
}
