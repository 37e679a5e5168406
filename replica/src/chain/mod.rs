//! The chain rules: which log entries rebuild a published position, and the checks each
//! delta passes on the way (I10). One implementation for hydrate and restore (the newest
//! state below a position), verify (every snapshot's chain) and retention (what a kept
//! snapshot's chain reaches).
//!
//! A chain is a snapshot entry and the deltas after it, and it may cross rounds: a writer
//! that hydrated a chain continues it. A delta extends the chain when its base is the
//! chain's newest entry (or, compacted, the snapshot itself, in the snapshot's round: a
//! compacted delta carries every page changed since the snapshot and supersedes the deltas
//! before it) and its round is the round of the newest claim at or before it — the claim
//! that entitles it to publish, with no release of that round in between. Claims and
//! releases between two deltas are part of the chain; a delta of any other round (a
//! zombie's, after a newer claim) or after its own round's release breaks it. Entries after
//! a snapshot are contiguous (every publish takes the next free seq, and retention never
//! deletes them), so a gap is damage, except before a compaction, whose superseded
//! predecessors a reader may skip. Each delta is applied only if the database checksum
//! before it is its `base_checksum`, and must leave the checksum its entry records.

pub(crate) mod position;

use crate::chain::position::Inherited;
use crate::format::body::DeltaBody;
use crate::format::checksum::{PageHashes, checksum_hex};
use crate::format::entry::{DeltaLink, EntryBody};
use crate::{Error, LogEntry, OrgId};

/// A published position: a snapshot entry and the deltas after it, in order.
pub(crate) struct Chain {
    pub(crate) snapshot: LogEntry,
    pub(crate) deltas: Vec<LogEntry>,
}

impl Chain {
    /// Log position of the state the chain rebuilds: its last delta's, or the snapshot's.
    pub(crate) fn position(&self) -> u64 {
        self.deltas.last().unwrap_or(&self.snapshot).seq()
    }

    /// What the chain weighs, for a writer that continues it: its snapshot's compressed
    /// bytes, pages (of `page_size` bytes) and time, and the compressed bytes and number of
    /// the deltas a hydrate reads after it; `commit` is the commit counter at its position.
    pub(crate) fn inherited(&self, commit: u64, page_size: u32) -> Inherited {
        let stored = |e: &LogEntry| e.stored().map_or(0, |s| s.compressed_bytes);
        Inherited {
            commit,
            snapshot_bytes: stored(&self.snapshot),
            snapshot_pages: self
                .snapshot
                .stored()
                .map_or(0, |s| s.bytes / u64::from(page_size.max(1))),
            snapshot_at_ms: self.snapshot.at_ms(),
            delta_bytes: self.deltas.iter().map(stored).sum(),
            deltas: self.deltas.len() as u64,
        }
    }
}

/// [`Error::ChainBroken`] of `org` at `seq`.
pub(crate) fn broken(org: &OrgId, seq: u64, reason: impl Into<String>) -> Error {
    Error::ChainBroken {
        org: org.to_string(),
        seq,
        reason: reason.into(),
    }
}

/// True when `e` is a delta that applies to `snapshot` itself in the snapshot's round: the
/// first delta of its chain, or a compaction. A pipelined delta based on the snapshot is
/// judged by the general base rule instead (`Walk::step`): deltas issued before it may be the
/// bases of deltas after it, so a reader never skips what lies below it.
pub(crate) fn compacts(snapshot: &LogEntry, e: &LogEntry) -> bool {
    !e.is_pipelined()
        && matches!(e.delta(), Some(d) if d.base == snapshot.seq())
        && e.round() == snapshot.round()
}

/// The base of a delta read from the head of the log down that does not apply to the entry
/// right before it: a compaction, if that base is a snapshot of its round (which
/// [`compacts`] then confirms), or the first delta of a round that continued the chain
/// across claims and releases. `None` for a pipelined delta: a reader goes on down to the
/// snapshot (its base may lie below entries that later deltas are based on).
pub(crate) fn compaction_base(e: &LogEntry) -> Option<u64> {
    if e.is_pipelined() {
        return None;
    }
    e.delta()
        .map(|d| d.base)
        .filter(|base| base.saturating_add(1) < e.seq())
}

/// Walks the entries after a snapshot in log order, deciding for each whether it extends
/// the snapshot's chain (the rule of the module docs, and for pipelined claims rules R1–R3
/// of `docs/design.md` 3e).
struct Walk<'a> {
    snapshot: &'a LogEntry,
    /// The chain's newest position (the highest delta that extends it, or the snapshot).
    tip: u64,
    /// The last entry seen.
    prev: u64,
    /// The round of the newest claim at or before the last entry seen: the only round that
    /// may publish the next delta. The snapshot's own round at the start (the snapshot was
    /// published under its claim).
    owner: u64,
    /// The slot of that claim; the snapshot's when the claim lies below it (a stray of the
    /// round it fenced lies below the claim's slot plus its window, so below this plus it).
    owner_claim: u64,
    /// The newest position below the owner's claim: the base of the round's first delta,
    /// and the lowest base a pipelined delta of the round may name.
    round_start: u64,
    /// The owner released the org: nothing of its round extends the chain any more.
    released: bool,
    /// Every position of the chain: seq → the seq of its base (the snapshot maps to itself).
    positions: std::collections::BTreeMap<u64, u64>,
}

/// What the walk made of one entry.
enum Step {
    /// A delta that extends the chain: a position of it.
    Extends,
    /// A claim or release: part of the chain's history, not a position.
    Passes,
    /// A pipelined ship of a fenced round that landed above the claim that fenced it (R1):
    /// never acknowledged, never a position.
    Stray,
    /// The chain breaks at this seq, for this reason.
    Breaks(u64, String),
}

impl<'a> Walk<'a> {
    fn new(snapshot: &'a LogEntry) -> Walk<'a> {
        let seq = snapshot.seq();
        Walk {
            snapshot,
            tip: seq,
            prev: seq,
            owner: snapshot.round(),
            owner_claim: seq,
            round_start: seq,
            released: false,
            positions: std::iter::once((seq, seq)).collect(),
        }
    }

    /// Notes a claim or release among superseded entries the walk skips.
    fn observe(&mut self, e: &LogEntry) {
        match e.body {
            EntryBody::Claim(_) => self.claimed(e),
            EntryBody::Release => self.released |= e.round() == self.owner,
            _ => {}
        }
    }

    fn claimed(&mut self, e: &LogEntry) {
        (self.owner, self.owner_claim, self.released) = (e.round(), e.seq(), false);
        self.round_start = self.tip;
    }

    /// Judges `e`, the entry after the last one seen; `skips`: a compaction may follow a gap
    /// (the superseded entries before it a reader need not have).
    fn step(&mut self, e: &LogEntry, skips: bool) -> Step {
        let compacted = compacts(self.snapshot, e);
        let seq = e.seq();
        // R3: slots a pipelined entry's claim had in flight when it was issued may stay
        // empty (a ship that never landed); any other missing slot is damage.
        let in_flight = e.is_pipelined() && e.floor() <= self.prev + 1;
        if seq != self.prev + 1 && !(compacted && skips) && !in_flight {
            return Step::Breaks(self.prev + 1, "log entry missing in the chain".into());
        }
        self.prev = seq;
        let base = match &e.body {
            EntryBody::Claim(_) => {
                self.claimed(e);
                return Step::Passes;
            }
            EntryBody::Release => {
                self.released |= e.round() == self.owner;
                return Step::Passes;
            }
            EntryBody::Snapshot(_) => {
                return Step::Breaks(seq, "snapshot after the newest snapshot".into());
            }
            EntryBody::Delta(DeltaLink { base, .. }) => *base,
        };
        // R1: a fenced writer's ship in flight when the claim landed, landing above it.
        if e.round() < self.owner
            && e.is_pipelined()
            && seq < self.owner_claim.saturating_add(e.ship_window())
        {
            return Step::Stray;
        }
        // R2: a pipelined delta is based on the newest position its claim had seen land,
        // which is the round's starting position or any later position of the round.
        let based = if e.is_pipelined() {
            base < seq && base >= self.round_start && self.positions.contains_key(&base)
        } else {
            base == self.tip || compacted
        };
        let why = if e.round() != self.owner {
            format!(
                "delta of round {} after the claim of round {}",
                e.round(),
                self.owner
            )
        } else if self.released {
            format!("delta of round {} after that round's release", e.round())
        } else if !based {
            format!(
                "delta applies to seq {base}, but the chain ends at seq {}",
                self.tip
            )
        } else {
            self.positions.insert(seq, base);
            self.tip = seq;
            return Step::Extends;
        };
        Step::Breaks(seq, why)
    }

    /// The deltas from the snapshot to the newest position, in the order they apply: each
    /// one's base is the one before it (or the snapshot). For a chain of one ship in flight
    /// at a time that is every delta since the newest compaction.
    fn path(&self, deltas: &[LogEntry]) -> Vec<LogEntry> {
        let mut seqs = Vec::new();
        let mut at = self.tip;
        while at != self.snapshot.seq() {
            seqs.push(at);
            match self.positions.get(&at) {
                Some(base) => at = *base,
                None => break,
            }
        }
        seqs.reverse();
        seqs.iter()
            .filter_map(|s| deltas.iter().find(|d| d.seq() == *s).cloned())
            .collect()
    }
}

/// The chain that rebuilds the newest state of `log` below `limit`: the newest snapshot and
/// the deltas from it to the newest position, in the order they apply (from the newest
/// compaction on, for a chain of one ship in flight at a time).
///
/// # Errors
/// [`Error::ChainBroken`] for a missing entry after the snapshot (other than before a
/// compaction, or a pipelined claim's ship that never landed), a delta that does not extend
/// the chain (another base, a round other than the newest claim's, after its round's
/// release), or deltas with no snapshot below them — never a reason to stop early and
/// install an older state (I10).
pub(crate) fn newest(org: &OrgId, log: &[LogEntry], limit: u64) -> Result<Option<Chain>, Error> {
    let below: Vec<&LogEntry> = log.iter().filter(|e| e.seq() < limit).collect();
    let Some(start) = below.iter().rposition(|e| e.is_snapshot()) else {
        // Published deltas but no snapshot under them: the snapshot they need is gone. An
        // empty database here would silently drop acknowledged state (I10).
        if let Some(d) = below.iter().find(|e| e.is_delta()) {
            return Err(broken(org, d.seq(), "no snapshot entry below this delta"));
        }
        return Ok(None);
    };
    let snapshot = below[start].clone();
    // The entries between the snapshot and its newest compaction are superseded: a reader
    // may not even have them. A compaction is of the snapshot's round, so the walk resumes
    // there with that round as the owner.
    let from = below[start + 1..]
        .iter()
        .rposition(|e| compacts(&snapshot, e))
        .map_or(start + 1, |i| start + 1 + i);
    let mut deltas = Vec::new();
    let mut walk = Walk::new(&snapshot);
    // The claims and releases among the superseded entries still decide who may publish
    // the compaction and what follows it.
    for e in &below[start + 1..from] {
        walk.observe(e);
    }
    for e in &below[from..] {
        match walk.step(e, true) {
            Step::Extends => deltas.push((*e).clone()),
            Step::Passes | Step::Stray => {}
            Step::Breaks(seq, reason) => return Err(broken(org, seq, reason)),
        }
    }
    let deltas = walk.path(&deltas);
    Ok(Some(Chain { snapshot, deltas }))
}

/// Every delta of `rest` (the entries right after `snapshot`) on the snapshot's chain,
/// across the claims and releases between them, stopping at the first entry that breaks
/// it: what verify replays and what retention keeps with a kept snapshot. Strays are
/// skipped; a pipelined chain's deltas are all positions of it, each applying to its own
/// base.
pub(crate) fn after(snapshot: &LogEntry, rest: &[LogEntry]) -> Vec<LogEntry> {
    let mut walk = Walk::new(snapshot);
    let mut out = Vec::new();
    for e in rest {
        match walk.step(e, false) {
            // Verify and retention see the contiguous chain: a compaction after the first
            // delta is a position of its own, reached by applying it to the snapshot.
            Step::Extends => out.push(e.clone()),
            Step::Passes | Step::Stray => {}
            Step::Breaks(..) => break,
        }
    }
    out
}

/// The strays among `rest` (the entries right after `snapshot`), up to where its chain
/// breaks: pipelined ships of fenced rounds that landed above the claim that fenced them
/// (R1). Never positions and never acknowledged, so verify reports them as neither.
pub(crate) fn strays(snapshot: &LogEntry, rest: &[LogEntry]) -> Vec<u64> {
    let mut walk = Walk::new(snapshot);
    let mut out = Vec::new();
    for e in rest {
        match walk.step(e, false) {
            Step::Stray => out.push(e.seq()),
            Step::Extends | Step::Passes => {}
            Step::Breaks(..) => break,
        }
    }
    out
}

/// Where a chain starts: its snapshot's log position and database checksum.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Start {
    pub(crate) seq: u64,
    pub(crate) checksum: u64,
}

/// Checks the delta `entry` of `org` (its body `body`, read from `object`) against the
/// running checksum in `hashes`, applies it to `image`, and checks the checksum after it. A
/// delta based on the chain's `start` snapshot (a compaction) must find the snapshot's
/// checksum: applied to any later state of the chain it gives the same database as applied
/// to the snapshot, because it carries every page changed since.
///
/// # Errors
/// [`Error::ChainBroken`] when a checksum does not match; [`Error::Corrupt`] when the body
/// does not parse, does not match its entry or does not apply.
pub(crate) fn apply(
    org: &OrgId,
    start: Start,
    entry: &LogEntry,
    object: &str,
    body: &[u8],
    image: &mut dyn crate::rebuild::image::PageImage,
    hashes: &mut PageHashes,
) -> Result<(), Error> {
    let Some(link) = entry.delta() else {
        return Err(broken(org, entry.seq(), "not a delta"));
    };
    let seq = entry.seq();
    let before = checksum_hex(if link.base == start.seq {
        start.checksum
    } else {
        hashes.sum()
    });
    if before != link.base_checksum {
        return Err(broken(
            org,
            seq,
            format!(
                "database checksum before the delta is {before}, the delta expects {}",
                link.base_checksum
            ),
        ));
    }
    let delta = DeltaBody::parse(object, body)?;
    if delta.page_size() != link.page_size
        || delta.db_pages() != link.db_pages
        || delta.changed_pages() != link.changed_pages as usize
        || delta.page_size() != hashes.page_size()
    {
        return Err(Error::corrupt(
            object,
            "delta body does not match its log entry",
        ));
    }
    delta.apply(image, hashes)?;
    let after = checksum_hex(hashes.sum());
    if after != link.checksum {
        return Err(broken(
            org,
            seq,
            format!(
                "database checksum after the delta is {after}, the log says {}",
                link.checksum
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::entry::{EntryHeader, Stored};

    fn entry(seq: u64, round: u64, body: EntryBody) -> LogEntry {
        LogEntry {
            header: EntryHeader {
                seq,
                round,
                writer: "w".into(),
                nonce: "00".into(),
                at_ms: 0,
                pipeline: None,
                journal: None,
            },
            body,
        }
    }

    fn stored() -> Stored {
        Stored {
            blob: "1.db.zst".into(),
            sha256: String::new(),
            bytes: 0,
            compressed_bytes: 0,
            commit: 0,
        }
    }

    fn snapshot(seq: u64, round: u64) -> LogEntry {
        entry(seq, round, EntryBody::Snapshot(stored()))
    }

    fn delta(seq: u64, round: u64, base: u64) -> LogEntry {
        entry(
            seq,
            round,
            EntryBody::Delta(DeltaLink {
                stored: stored(),
                base,
                base_checksum: String::new(),
                checksum: String::new(),
                page_size: 512,
                db_pages: 1,
                changed_pages: 0,
            }),
        )
    }

    fn seqs(chain: &Option<Chain>) -> Option<(u64, Vec<u64>)> {
        chain.as_ref().map(|c| {
            (
                c.snapshot.seq(),
                c.deltas.iter().map(LogEntry::seq).collect(),
            )
        })
    }

    fn acme() -> OrgId {
        match OrgId::new("acme") {
            Ok(o) => o,
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn the_newest_state_starts_at_the_newest_compaction_and_skips_what_it_supersedes()
    -> Result<(), Error> {
        let claim = entry(1, 1, EntryBody::Claim(Default::default()));
        // 2 snapshot, 3 and 4 deltas, (5 gone), 6 a compaction onto 2, 7 a delta onto 6.
        let log = [
            claim,
            snapshot(2, 1),
            delta(3, 1, 2),
            delta(4, 1, 3),
            delta(6, 1, 2),
            delta(7, 1, 6),
        ];
        let state = newest(&acme(), &log, u64::MAX)?;
        assert_eq!(seqs(&state), Some((2, vec![6, 7])));
        // Verify and retention see the contiguous chain only: 3 and 4.
        assert_eq!(
            after(&log[1], &log[2..])
                .iter()
                .map(LogEntry::seq)
                .collect::<Vec<_>>(),
            vec![3, 4]
        );
        assert_eq!(seqs(&newest(&acme(), &log, 5)?), Some((2, vec![3, 4])));
        Ok(())
    }

    #[test]
    fn a_gap_a_foreign_delta_or_a_delta_after_a_claim_breaks_the_chain() {
        let gap = [snapshot(2, 1), delta(3, 1, 2), delta(5, 1, 4)];
        let foreign = [snapshot(2, 1), delta(3, 2, 2)];
        let after_claim = [
            snapshot(2, 1),
            delta(3, 1, 2),
            entry(4, 2, EntryBody::Claim(Default::default())),
            delta(5, 1, 3),
        ];
        let orphan = [delta(3, 1, 2)];
        for log in [&gap[..], &foreign, &after_claim, &orphan] {
            let got = newest(&acme(), log, u64::MAX);
            assert!(
                matches!(got, Err(Error::ChainBroken { .. })),
                "{log:?}: {:?}",
                got.map(|c| seqs(&c))
            );
        }
    }

    fn claim(seq: u64, round: u64) -> LogEntry {
        entry(seq, round, EntryBody::Claim(Default::default()))
    }

    fn release(seq: u64, round: u64) -> LogEntry {
        entry(seq, round, EntryBody::Release)
    }

    fn after_seqs(log: &[LogEntry]) -> Vec<u64> {
        let Some(i) = log.iter().position(LogEntry::is_snapshot) else {
            return Vec::new();
        };
        after(&log[i], &log[i + 1..])
            .iter()
            .map(LogEntry::seq)
            .collect()
    }

    #[test]
    fn a_chain_continues_across_claims_and_releases_of_later_rounds() -> Result<(), Error> {
        // Round 1 ships a snapshot and a delta and releases; round 2 continues from seq 3;
        // round 3 claims and dies without shipping; round 4 continues from round 2's tip.
        let log = [
            claim(1, 1),
            snapshot(2, 1),
            delta(3, 1, 2),
            release(4, 1),
            claim(5, 2),
            delta(6, 2, 3),
            claim(7, 3),
            claim(8, 4),
            delta(9, 4, 6),
            delta(10, 4, 9),
        ];
        assert_eq!(
            seqs(&newest(&acme(), &log, u64::MAX)?),
            Some((2, vec![3, 6, 9, 10]))
        );
        // Every position of it, as restore --at reads them.
        assert_eq!(seqs(&newest(&acme(), &log, 7)?), Some((2, vec![3, 6])));
        assert_eq!(seqs(&newest(&acme(), &log, 9)?), Some((2, vec![3, 6])));
        assert_eq!(seqs(&newest(&acme(), &log, 10)?), Some((2, vec![3, 6, 9])));
        // Verify and retention reach the same deltas from the snapshot.
        assert_eq!(after_seqs(&log), vec![3, 6, 9, 10]);
        Ok(())
    }

    #[test]
    fn a_zombie_delta_after_a_newer_claim_breaks_the_chain() {
        // Round 1's writer, fenced by round 2's claim, appends after round 2's delta (a slot
        // it could only reach through damage): never part of the chain.
        let log = [
            snapshot(2, 1),
            delta(3, 1, 2),
            claim(4, 2),
            delta(5, 2, 3),
            delta(6, 1, 5),
        ];
        let got = newest(&acme(), &log, u64::MAX);
        assert!(
            matches!(got, Err(Error::ChainBroken { seq: 6, .. })),
            "{:?}",
            got.map(|c| seqs(&c))
        );
        assert_eq!(after_seqs(&log), vec![3, 5]);
        // The same as a compaction onto the snapshot.
        let compaction = [
            snapshot(2, 1),
            delta(3, 1, 2),
            claim(4, 2),
            delta(5, 2, 3),
            delta(6, 1, 2),
        ];
        assert!(matches!(
            newest(&acme(), &compaction, u64::MAX),
            Err(Error::ChainBroken { seq: 6, .. })
        ));
        // A compaction the reader reaches by skipping: the claim among the skipped
        // entries still fences it.
        let skipped = [snapshot(2, 1), delta(3, 1, 2), claim(4, 2), delta(6, 1, 2)];
        assert!(matches!(
            newest(&acme(), &skipped, u64::MAX),
            Err(Error::ChainBroken { .. })
        ));
    }

    #[test]
    fn a_delta_after_its_own_release_a_gap_or_a_wrong_base_across_rounds_breaks_the_chain() {
        let after_release = [
            snapshot(2, 1),
            delta(3, 1, 2),
            release(4, 1),
            delta(5, 1, 3),
        ];
        let gap = [snapshot(2, 1), delta(3, 1, 2), claim(5, 2), delta(6, 2, 3)];
        // The successor's first delta must apply to the tip (3), not to the snapshot: a
        // later round never compacts onto an older round's snapshot.
        let wrong_base = [snapshot(2, 1), delta(3, 1, 2), claim(4, 2), delta(5, 2, 2)];
        // A round with no claim in the log since the snapshot.
        let unclaimed = [snapshot(2, 1), delta(3, 1, 2), claim(4, 2), delta(5, 3, 3)];
        for log in [&after_release[..], &gap, &wrong_base, &unclaimed] {
            let got = newest(&acme(), log, u64::MAX);
            assert!(
                matches!(got, Err(Error::ChainBroken { .. })),
                "{log:?}: {:?}",
                got.map(|c| seqs(&c))
            );
            assert_eq!(after_seqs(log), vec![3], "{log:?}");
        }
    }

    #[test]
    fn a_snapshot_of_a_later_round_starts_the_chain_again() -> Result<(), Error> {
        let log = [
            snapshot(2, 1),
            delta(3, 1, 2),
            claim(4, 2),
            delta(5, 2, 3),
            snapshot(6, 2),
            delta(7, 2, 6),
        ];
        assert_eq!(seqs(&newest(&acme(), &log, u64::MAX)?), Some((6, vec![7])));
        assert_eq!(after(&log[0], &log[1..]).len(), 2);
        Ok(())
    }

    fn pdelta(seq: u64, round: u64, base: u64, floor: u64) -> LogEntry {
        let mut e = delta(seq, round, base);
        e.header.pipeline = Some(crate::format::entry::Pipeline { window: 4, floor });
        e
    }

    fn pclaim(seq: u64, round: u64) -> LogEntry {
        let mut e = claim(seq, round);
        e.header.pipeline = Some(crate::format::entry::Pipeline {
            window: 4,
            floor: seq,
        });
        e
    }

    #[test]
    fn a_pipelined_delta_applies_to_any_landed_position_and_the_newest_one_is_its_path()
    -> Result<(), Error> {
        // 3 and 4 were in flight together, both based on the snapshot; 5 was issued after 3
        // landed (base 3) while 4 was still in flight (floor 4); 6 never landed; 7 was issued
        // with 6 in flight, after 5 landed.
        let log = [
            pclaim(1, 1),
            snapshot(2, 1),
            pdelta(3, 1, 2, 3),
            pdelta(4, 1, 2, 3),
            pdelta(5, 1, 3, 4),
            pdelta(7, 1, 5, 6),
        ];
        assert_eq!(
            seqs(&newest(&acme(), &log, u64::MAX)?),
            Some((2, vec![3, 5, 7]))
        );
        // Every landed position is one restore --at can reach.
        assert_eq!(seqs(&newest(&acme(), &log, 5)?), Some((2, vec![4])));
        assert_eq!(seqs(&newest(&acme(), &log, 6)?), Some((2, vec![3, 5])));
        assert_eq!(after_seqs(&log), vec![3, 4, 5, 7]);
        Ok(())
    }

    #[test]
    fn a_hole_below_a_pipelined_entrys_floor_or_before_an_entry_of_one_in_flight_is_damage() {
        // 4 says everything below it was resolved when it was issued: 3 landed, and is gone.
        let below_floor = [snapshot(2, 1), pdelta(4, 1, 2, 4)];
        let not_pipelined = [snapshot(2, 1), pdelta(3, 1, 2, 3), delta(5, 1, 3)];
        // A claim is issued with nothing of its own in flight and at the lowest free slot.
        let before_claim = [snapshot(2, 1), pdelta(3, 1, 2, 3), pclaim(5, 2)];
        // A base that is no position (a missing slot).
        let missing_base = [snapshot(2, 1), pdelta(4, 1, 3, 3)];
        for log in [
            &below_floor[..],
            &not_pipelined,
            &before_claim,
            &missing_base,
        ] {
            let got = newest(&acme(), log, u64::MAX);
            assert!(
                matches!(got, Err(Error::ChainBroken { .. })),
                "{log:?}: {:?}",
                got.map(|c| seqs(&c))
            );
        }
    }

    #[test]
    fn a_fenced_writers_ships_above_the_claim_are_strays_within_its_window_only()
    -> Result<(), Error> {
        // Round 1 had 3..6 in flight (window 4); 3 landed, round 2 claimed 4 (the lowest
        // free slot at or above 3's floor); 5 landed after the claim. Round 2's first
        // delta collided with 5, skipped it and landed at 6, based on 3.
        let log = [
            pclaim(1, 1),
            snapshot(2, 1),
            pdelta(3, 1, 2, 3),
            pclaim(4, 2),
            pdelta(5, 1, 2, 3),
            pdelta(6, 2, 3, 6),
        ];
        assert_eq!(
            seqs(&newest(&acme(), &log, u64::MAX)?),
            Some((2, vec![3, 6]))
        );
        assert_eq!(after_seqs(&log), vec![3, 6]);
        // Beyond the window of the claim, or not pipelined: damage, as before.
        let beyond = [
            snapshot(2, 1),
            pdelta(3, 1, 2, 3),
            pclaim(4, 2),
            pdelta(8, 1, 2, 3),
        ];
        let old = [
            snapshot(2, 1),
            pdelta(3, 1, 2, 3),
            pclaim(4, 2),
            delta(5, 1, 3),
        ];
        for log in [&beyond[..], &old] {
            assert!(matches!(
                newest(&acme(), log, u64::MAX),
                Err(Error::ChainBroken { .. })
            ));
        }
        Ok(())
    }

    #[test]
    fn a_rounds_first_pipelined_delta_applies_to_the_newest_position_below_its_claim() {
        // Round 2 claimed after 3: its deltas may not apply to the snapshot (older than 3).
        let log = [
            snapshot(2, 1),
            pdelta(3, 1, 2, 3),
            pclaim(4, 2),
            pdelta(5, 2, 2, 5),
        ];
        assert!(matches!(
            newest(&acme(), &log, u64::MAX),
            Err(Error::ChainBroken { seq: 5, .. })
        ));
        // A stray is no base: round 2's delta on round 1's stray breaks the chain.
        let on_stray = [
            snapshot(2, 1),
            pdelta(3, 1, 2, 3),
            pclaim(4, 2),
            pdelta(5, 1, 3, 3),
            pdelta(6, 2, 5, 6),
        ];
        assert!(matches!(
            newest(&acme(), &on_stray, u64::MAX),
            Err(Error::ChainBroken { seq: 6, .. })
        ));
    }

    #[test]
    fn compaction_bases_are_deltas_not_based_on_the_entry_before() {
        assert_eq!(compaction_base(&delta(6, 1, 2)), Some(2));
        assert_eq!(compaction_base(&delta(3, 1, 2)), None);
        assert_eq!(compaction_base(&snapshot(3, 1)), None);
        assert!(compacts(&snapshot(2, 1), &delta(6, 1, 2)));
        assert!(!compacts(&snapshot(2, 1), &delta(6, 2, 2)));
        // A pipelined delta on the snapshot is no compaction: a reader reads below it.
        assert!(!compacts(&snapshot(2, 1), &pdelta(6, 1, 2, 3)));
        assert_eq!(compaction_base(&pdelta(6, 1, 2, 3)), None);
    }
}
