//! The keep rule of T4, clause by clause: each case deletes exactly what the rule lets go,
//! and keeps what K0, `restore --at` and later claims read.

use std::collections::{BTreeMap, BTreeSet};

use super::{LogView, keep};
use crate::LogEntry;
use crate::format::entry::{BlobRef, Claimer, DeltaLink, EntryBody, EntryHeader, Stored};
use crate::format::journal::{RunName, Via};
use crate::format::mark::{FreePoint, JournalMark};

const INSTANCE: &str = "0123456789abcdef0123456789abcdef";

fn run() -> RunName {
    RunName::new(INSTANCE, 1).expect("a valid run name")
}

fn entry(seq: u64, round: u64, journal: Option<JournalMark>, body: EntryBody) -> LogEntry {
    LogEntry {
        header: EntryHeader {
            seq,
            round,
            writer: "w".into(),
            nonce: format!("{seq:032x}"),
            at_ms: seq,
            pipeline: None,
            journal,
        },
        body,
    }
}

fn stored() -> Stored {
    Stored {
        blob: BlobRef::Inline(String::new()),
        sha256: String::new(),
        bytes: 0,
        compressed_bytes: 0,
        commit: 0,
    }
}

fn mark(through: u64, claim: u64) -> Option<JournalMark> {
    Some(JournalMark::Checkpoint {
        run: run(),
        through,
        tenure: Via::Claim { seq: claim },
        released: false,
    })
}

fn claim(seq: u64, round: u64) -> LogEntry {
    claim_after(seq, round, FreePoint::Empty)
}

fn claim_after(seq: u64, round: u64, after: FreePoint) -> LogEntry {
    let mark = JournalMark::Claim {
        run: run(),
        from: 1,
        after: Some(after),
    };
    entry(seq, round, Some(mark), EntryBody::Claim(Claimer::default()))
}

fn snapshot(seq: u64, round: u64, claim: u64) -> LogEntry {
    entry(seq, round, mark(seq, claim), EntryBody::Snapshot(stored()))
}

fn delta(seq: u64, round: u64, claim: u64, base: u64) -> LogEntry {
    let link = DeltaLink {
        stored: stored(),
        base,
        base_checksum: String::new(),
        checksum: String::new(),
        page_size: 4096,
        db_pages: 1,
        changed_pages: 1,
    };
    entry(seq, round, mark(seq, claim), EntryBody::Delta(link))
}

fn release(seq: u64, round: u64) -> LogEntry {
    entry(seq, round, None, EntryBody::Release)
}

fn log(entries: Vec<LogEntry>) -> BTreeMap<u64, LogEntry> {
    entries.into_iter().map(|e| (e.seq(), e)).collect()
}

fn kept(log: &BTreeMap<u64, LogEntry>, section_base: Option<u64>) -> Vec<u64> {
    let view = LogView { log, section_base };
    keep(&view, |_| false, 1)
        .expect("whole chains")
        .into_iter()
        .collect()
}

/// One tenure (claim at 1) with a snapshot at 2 and deltas 3..=5 on it, then a snapshot at
/// 6 and a delta at 7: the newest checkpoint is 7, rebuilt from 6.
fn one_tenure() -> Vec<LogEntry> {
    vec![
        claim(1, 1),
        snapshot(2, 1, 1),
        delta(3, 1, 1, 2),
        delta(4, 1, 1, 3),
        delta(5, 1, 1, 4),
        snapshot(6, 1, 1),
        delta(7, 1, 1, 6),
    ]
}

#[test]
fn a_tenures_older_checkpoints_go_and_its_claim_and_newest_chain_stay() {
    assert_eq!(kept(&log(one_tenure()), None), vec![1, 6, 7]);
}

#[test]
fn the_base_the_newest_section_names_stays_with_its_chain() {
    // J3-6: a section captured before checkpoint 7 landed names 4 as its base.
    assert_eq!(kept(&log(one_tenure()), Some(4)), vec![1, 2, 3, 4, 6, 7]);
}

#[test]
fn a_young_entry_stays_with_everything_it_is_rebuilt_from() {
    let log = log(one_tenure());
    let view = LogView {
        log: &log,
        section_base: None,
    };
    let young = |e: &LogEntry| e.seq() == 4;
    let kept: Vec<u64> = keep(&view, young, 1)
        .expect("whole chains")
        .into_iter()
        .collect();
    assert_eq!(kept, vec![1, 2, 3, 4, 6, 7]);
}

#[test]
fn the_newest_snapshots_stay_up_to_keep_snapshots() {
    let log = log(one_tenure());
    let view = LogView {
        log: &log,
        section_base: None,
    };
    let kept: Vec<u64> = keep(&view, |_| false, 2)
        .expect("whole chains")
        .into_iter()
        .collect();
    assert_eq!(kept, vec![1, 2, 6, 7]);
}

#[test]
fn an_earlier_tenure_goes_below_the_newest_tenures_claim_and_its_releases_above_stay() {
    // Tenure 1 (claim 1) released at 5; tenure 2 claims at 6 and checkpoints at 7 and 8.
    let log = log(vec![
        claim(1, 1),
        snapshot(2, 1, 1),
        delta(3, 1, 1, 2),
        delta(4, 1, 1, 3),
        release(5, 1),
        claim(6, 2),
        snapshot(7, 2, 6),
        delta(8, 2, 6, 7),
        release(9, 2),
        claim(10, 3),
    ]);
    // The newest checkpoint is 8 (round 2); claims and Release entries from its claim 6
    // on stay; the earlier tenure goes whole.
    assert_eq!(kept(&log, None), vec![6, 7, 8, 9, 10]);
}

#[test]
fn a_claim_of_a_round_at_least_the_newest_checkpoints_stays_below_the_floor() {
    // An abandoned claim of round 3 at 4 (C2 met 5 above it), below the checkpoint of
    // round 2's adoption (no claim in the log): K1.2 must still count round 3.
    let mut entries = vec![claim(1, 1), snapshot(2, 1, 1), claim(4, 3)];
    let mut adopted = delta(5, 2, 1, 2);
    adopted.header.journal = Some(JournalMark::Checkpoint {
        run: run(),
        through: 5,
        tenure: Via::Adopt {
            run: run(),
            slot: 9,
        },
        released: false,
    });
    entries.push(adopted);
    entries.push(snapshot(6, 2, 1));
    // The adoption's newest checkpoint is 6 with no claim in the log: floor is 6.
    let mut newest = entries.pop().expect("pushed above");
    newest.header.journal = Some(JournalMark::Checkpoint {
        run: run(),
        through: 6,
        tenure: Via::Adopt {
            run: run(),
            slot: 9,
        },
        released: false,
    });
    entries.push(newest);
    assert_eq!(kept(&log(entries), None), vec![4, 6]);
}

#[test]
fn the_highest_entry_stays_whatever_it_is() {
    // A zombie's delta of round 1 landed above the newest checkpoint of round 2.
    let log = log(vec![
        claim(1, 1),
        snapshot(2, 1, 1),
        claim(3, 2),
        snapshot(4, 2, 3),
        delta(5, 1, 1, 2),
    ]);
    assert_eq!(kept(&log, None), vec![2, 3, 4, 5]);
}

#[test]
fn a_log_without_a_checkpoint_keeps_everything() {
    let log = log(vec![claim(1, 1), release(2, 1)]);
    assert_eq!(kept(&log, None), vec![1, 2]);
}

#[test]
fn kept_entries_are_closed_under_base_links() {
    // Whatever the roots, every kept delta's base is kept.
    for section_base in [None, Some(2), Some(3), Some(4), Some(5)] {
        let log = log(one_tenure());
        let view = LogView {
            log: &log,
            section_base,
        };
        for cut in 0..=8u64 {
            let kept: BTreeSet<u64> = keep(&view, |e| e.seq() >= cut, 1).expect("whole chains");
            for s in &kept {
                if let Some(base) = log.get(s).and_then(LogEntry::delta).map(|d| d.base) {
                    assert!(kept.contains(&base), "{s} kept without its base {base}");
                }
            }
        }
    }
}

#[test]
fn the_per_org_tenures_claims_and_releases_stay_up_to_the_first_journal_claim() {
    // A per-org holder (claim 1, snapshot 2) taken over by a forced per-org claim (3),
    // which shipped (4) and released (5); a journal claim names that Release (6) and
    // checkpoints (7). A paused holder of round 1 creates at 3 next: 3 must stay for its
    // create to collide (2a), and likewise every per-org claim and Release entry.
    let per_org = |seq, round, body| entry(seq, round, None, body);
    let log = log(vec![
        per_org(1, 1, EntryBody::Claim(Claimer::default())),
        per_org(2, 1, EntryBody::Snapshot(stored())),
        per_org(3, 2, EntryBody::Claim(Claimer::default())),
        per_org(4, 2, EntryBody::Snapshot(stored())),
        release(5, 2),
        claim_after(6, 3, FreePoint::Entry { seq: 5 }),
        snapshot(7, 3, 6),
    ]);
    assert_eq!(kept(&log, None), vec![1, 3, 5, 6, 7]);
}

#[test]
fn a_k16_claim_below_per_org_entries_and_the_per_org_fences_above_it_stay() {
    // P (claim 1, snapshot 3; its snapshot 2 deleted by 2a) is taken over by a forced
    // per-org claim Q (4), which ships (5) and releases (6). A paused K1.6 claimant's
    // claim naming P's claim lands in the freed slot 2, abandoned; a journal claim names
    // Q's Release (7) and checkpoints (8). P's next create is at 4: Q's claim stays, as
    // do Q's Release and the K1.6 claim, however low.
    let per_org = |seq, round, body| entry(seq, round, None, body);
    let log = log(vec![
        per_org(1, 1, EntryBody::Claim(Claimer::default())),
        claim_after(2, 3, FreePoint::Entry { seq: 1 }),
        per_org(3, 1, EntryBody::Snapshot(stored())),
        per_org(4, 2, EntryBody::Claim(Claimer::default())),
        per_org(5, 2, EntryBody::Snapshot(stored())),
        release(6, 2),
        claim_after(7, 4, FreePoint::Entry { seq: 6 }),
        snapshot(8, 4, 7),
    ]);
    assert_eq!(kept(&log, None), vec![1, 2, 4, 6, 7, 8]);
}

#[test]
fn a_kept_delta_whose_base_is_missing_stops_the_rule() {
    let mut entries = one_tenure();
    entries.retain(|e| e.seq() != 6);
    let log = log(entries);
    let view = LogView {
        log: &log,
        section_base: None,
    };
    assert_eq!(keep(&view, |_| false, 1), Err(6));
    // A link that does not go down is no chain either.
    let log = super::tests::log(vec![claim(1, 1), delta(2, 1, 1, 2)]);
    let view = LogView {
        log: &log,
        section_base: None,
    };
    assert_eq!(keep(&view, |_| false, 1), Err(2));
}
