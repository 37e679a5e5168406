//! T4 as built (`docs/design.md` 3g, "T4 as built"): retention of a journal org's log.
//! Everything K0 reads stays (the newest checkpoint `C`, the base of the walk's newest
//! section, the claims and Release entries from `C`'s tenure claim on, the highest entry),
//! as do the entries that fence a per-org writer, every entry younger than `keep_ms`, the
//! newest `keep_snapshots` snapshots, and every entry a kept delta is rebuilt from; the
//! rest goes, highest seq first, then the objects no kept entry names.

use std::collections::{BTreeMap, BTreeSet};

use tracing::info;

use crate::format::entry::EntryBody;
use crate::format::journal::Via;
use crate::format::mark::{FreePoint, JournalMark};
use crate::journal::org_walk::WalkState;
use crate::retention::RetentionReport;
use crate::{Error, LogEntry, OrgId, Replica, Retention};

/// What the keep rule reads of one org: its log and the base of its walk's newest section.
pub(crate) struct LogView<'a> {
    /// The org's log as listed and read, by seq.
    pub log: &'a BTreeMap<u64, LogEntry>,
    /// The base the walk's newest section names (J3-6), if the walk read one.
    pub section_base: Option<u64>,
}

/// The seqs of `view.log` that stay: the roots (module doc) closed under base links.
/// `young(entry)` says an entry is younger than `keep_ms`. A log with no checkpoint keeps
/// everything (K0 starts in a per-org segment or at `empty`, which this rule does not judge).
///
/// # Errors
/// The seq a kept delta links to when the log holds no snapshot or delta there, or when
/// the link does not go down: the kept set is unknown, so nothing may go.
pub(crate) fn keep(
    view: &LogView<'_>,
    young: impl Fn(&LogEntry) -> bool,
    keep_snapshots: usize,
) -> Result<BTreeSet<u64>, u64> {
    let log = view.log;
    let Some(c) = newest_checkpoint(log) else {
        return Ok(log.keys().copied().collect());
    };
    let floor = match &c.header.journal {
        Some(JournalMark::Checkpoint {
            tenure: Via::Claim { seq },
            ..
        }) if log.get(seq).is_some_and(LogEntry::is_claim) => *seq,
        _ => c.seq(),
    };
    // A per-org writer is fenced only by its create colliding with the entry in the slot
    // after its own last entry (2a), and it never lists: a per-org claim, its own Release
    // entry, or a journal claim taking its segment over (K1.6). Those stay, as 2a keeps
    // them: every per-org claim (so the highest per-org round is stable across runs), every
    // Release entry of a round at most that, and every journal claim naming a per-org
    // claim as the free point it passed.
    let per_org_claim = |e: &LogEntry| e.is_claim() && e.header.journal.is_none();
    let per_org_round = log
        .values()
        .filter(|e| per_org_claim(e))
        .map(LogEntry::round)
        .max();
    let per_org_fence = |e: &LogEntry| match (&e.body, &e.header.journal) {
        (EntryBody::Claim(_), None) => true,
        (EntryBody::Release, _) => per_org_round.is_some_and(|r| e.round() <= r),
        (
            EntryBody::Claim(_),
            Some(JournalMark::Claim {
                after: Some(FreePoint::Entry { seq }),
                ..
            }),
        ) => log.get(seq).is_some_and(per_org_claim),
        _ => false,
    };
    let mut roots: BTreeSet<u64> = BTreeSet::new();
    roots.insert(c.seq());
    roots.extend(view.section_base);
    roots.extend(log.keys().next_back().copied());
    for e in log.values() {
        let above = !is_checkpoint(e) && (e.seq() >= floor || e.round() >= c.round());
        if above || per_org_fence(e) || young(e) {
            roots.insert(e.seq());
        }
    }
    let snapshots = log.values().rev().filter(|e| e.is_snapshot());
    roots.extend(snapshots.take(keep_snapshots.max(1)).map(LogEntry::seq));
    let mut kept = BTreeSet::new();
    for root in roots {
        let mut at = root;
        while kept.insert(at) {
            match log.get(&at).and_then(|e| e.delta()).map(|d| d.base) {
                None => break,
                Some(base) if base < at && log.get(&base).is_some_and(|b| b.stored().is_some()) => {
                    at = base
                }
                Some(base) => return Err(base),
            }
        }
    }
    Ok(kept)
}

/// K0's start: the newest checkpoint by (round, seq).
fn newest_checkpoint(log: &BTreeMap<u64, LogEntry>) -> Option<&LogEntry> {
    log.values()
        .filter(|e| is_checkpoint(e))
        .max_by_key(|e| (e.round(), e.seq()))
}

fn is_checkpoint(e: &LogEntry) -> bool {
    matches!(e.header.journal, Some(JournalMark::Checkpoint { .. }))
}

impl Replica {
    /// T4 over `org`, whose log holds format-5 entries: [`Replica::retain`] calls it when
    /// the per-org read meets `JournalRequired`. One LIST and a GET per entry of the log,
    /// the walk's LISTs of runs, one store-time read when anything is old enough by this
    /// host's clock, then one DELETE per entry and object that goes.
    ///
    /// # Errors
    /// As [`Replica::walk_org`]; the store's errors while reading its clock or deleting. A
    /// partial run is safe to repeat.
    pub(crate) async fn retain_journal_org(
        &self,
        org: &OrgId,
        policy: &Retention,
    ) -> Result<RetentionReport, Error> {
        let (entries, listed) = self.inner.log.journal_history_listed(org).await?;
        let mut report = RetentionReport::default();
        // Another run deleted entries under this read: it is no one state of the log (its
        // newest checkpoint may be gone while an older one was read), so nothing is judged.
        if entries.len() < listed.len() {
            info!(%org, vanished = listed.len() - entries.len(),
                  "journal log retention skipped: the log changed under its read");
            return Ok(report);
        }
        let log: BTreeMap<u64, LogEntry> = entries.into_iter().map(|e| (e.seq(), e)).collect();
        let (Some(c), Some(head)) = (
            newest_checkpoint(&log).map(LogEntry::seq),
            log.keys().next_back().copied(),
        ) else {
            return Ok(report);
        };
        let walk = self.walk_org_in(org, log).await?;
        let section_base = match &walk.state {
            WalkState::Section { section, .. } => Some(section.base.seq),
            _ => None,
        };
        let log = walk.log;
        let view = LogView {
            log: &log,
            section_base,
        };
        // Only what the rule keeps for its age alone can go by age: the store's clock is
        // asked when this host's would delete one of those (I15).
        let broken = |base: u64| {
            Error::corrupt(
                &format!("orgs/{org}/log/{base:020}.json"),
                "a kept delta's base link names no snapshot or delta below it: retention deletes nothing",
            )
        };
        let structural = keep(&view, |_| false, policy.keep_snapshots).map_err(broken)?;
        // Ages are the store's: each entry's Last-Modified as listed (I15), never the
        // `at_ms` its writer stamped.
        let modified: BTreeMap<u64, u64> = listed.into_iter().collect();
        let modified_ms = |e: &LogEntry| modified.get(&e.seq()).copied().unwrap_or(0);
        let candidates: Vec<(u64, u64)> = log
            .values()
            .filter(|e| !structural.contains(&e.seq()))
            .map(|e| (modified_ms(e), policy.keep_ms))
            .collect();
        let now = self.age_now_or_skip(org, &candidates, &mut report).await?;
        let young = |e: &LogEntry| {
            now.is_none_or(|now| now.saturating_sub(modified_ms(e)) < policy.keep_ms)
        };
        let kept = keep(&view, young, policy.keep_snapshots).map_err(broken)?;
        let doomed: Vec<u64> = log
            .keys()
            .rev()
            .copied()
            .filter(|s| !kept.contains(s))
            .collect();
        for seq in &doomed {
            self.inner.log.delete(org, *seq).await?;
            report.deleted_entries.push(*seq);
        }
        report.deleted_entries.sort_unstable();
        report.kept_snapshots = log
            .values()
            .filter(|e| e.is_snapshot() && kept.contains(&e.seq()))
            .count();
        let kept: Vec<&LogEntry> = log.values().filter(|e| kept.contains(&e.seq())).collect();
        let occupied: BTreeSet<u64> = log.keys().copied().collect();
        self.judge_objects(org, &kept, &occupied, c, head, &mut report)
            .await?;
        info!(%org, entries = report.deleted_entries.len(), blobs = report.deleted_blobs.len(),
              age_skipped = report.age_skipped, "journal log retention ran");
        Ok(report)
    }
}

#[cfg(test)]
mod tests;
