//! The chain rules: which log entries rebuild a published position, and the checks each
//! delta passes on the way (I10). One implementation for hydrate and restore (the newest
//! state below a position), verify (every snapshot's chain) and retention (what a kept
//! snapshot's chain reaches).
//!
//! A chain is a snapshot entry and the deltas after it. A delta extends the chain when it is
//! of the snapshot's round and its base is the chain's newest entry — or, compacted, the
//! snapshot itself: a compacted delta carries every page changed since the snapshot and
//! supersedes the deltas before it. Entries after a snapshot are contiguous (every publish
//! takes the next free seq, and retention never deletes them), so a gap is damage, except
//! before a compaction, whose superseded predecessors a reader may skip. Each delta is
//! applied only if the database checksum before it is its `base_checksum`, and must leave
//! the checksum its entry records.

use crate::checksum::{PageHashes, checksum_hex};
use crate::delta::body::DeltaBody;
use crate::log::entry::{DeltaLink, EntryBody};
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
}

/// [`Error::ChainBroken`] of `org` at `seq`.
pub(crate) fn broken(org: &OrgId, seq: u64, reason: impl Into<String>) -> Error {
    Error::ChainBroken {
        org: org.to_string(),
        seq,
        reason: reason.into(),
    }
}

/// True when `e` is a delta that applies to `snapshot` itself: the first delta of its chain,
/// or a compaction.
pub(crate) fn compacts(snapshot: &LogEntry, e: &LogEntry) -> bool {
    matches!(e.delta(), Some(d) if d.base == snapshot.seq()) && e.round() == snapshot.round()
}

/// True when `e` is a delta that extends the chain of `snapshot` whose newest entry is at
/// `tip`: of the snapshot's round, based on `tip` or (compacted) on the snapshot.
fn extends(snapshot: &LogEntry, tip: u64, e: &LogEntry) -> bool {
    (matches!(e.delta(), Some(d) if d.base == tip) && e.round() == snapshot.round())
        || compacts(snapshot, e)
}

/// The base of a delta read from the head of the log down that does not apply to the entry
/// right before it: it can only be a compaction, if that base is a snapshot of its round
/// (which [`compacts`] then confirms).
pub(crate) fn compaction_base(e: &LogEntry) -> Option<u64> {
    e.delta()
        .map(|d| d.base)
        .filter(|base| base.saturating_add(1) < e.seq())
}

/// The chain that rebuilds the newest state of `log` below `limit`: the newest snapshot and
/// the deltas after it, from the newest compaction on (or all of them).
///
/// # Errors
/// [`Error::ChainBroken`] for a missing entry after the snapshot (other than before a
/// compaction), a delta that does not extend the chain (another round, another base), a
/// delta after the writer's claim or release ended the chain, or deltas with no snapshot
/// below them — never a reason to stop early and install an older state (I10).
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
    // may not even have them.
    let from = below[start + 1..]
        .iter()
        .rposition(|e| compacts(&snapshot, e))
        .map_or(start + 1, |i| start + 1 + i);
    let mut deltas = Vec::new();
    let (mut prev_seq, mut tip) = (snapshot.seq(), snapshot.seq());
    let mut ended = false;
    for e in &below[from..] {
        let compacted = compacts(&snapshot, e);
        if e.seq() != prev_seq + 1 && !compacted {
            return Err(broken(
                org,
                prev_seq + 1,
                "log entry missing after the newest snapshot",
            ));
        }
        prev_seq = e.seq();
        match &e.body {
            EntryBody::Delta(_) if !ended && extends(&snapshot, tip, e) => {
                if compacted {
                    deltas.clear();
                }
                tip = e.seq();
                deltas.push((*e).clone());
            }
            EntryBody::Delta(DeltaLink { base, .. }) => {
                return Err(broken(
                    org,
                    e.seq(),
                    format!(
                        "delta of round {} applies to seq {base}, but the chain of round {} ends at seq {tip}",
                        e.round(),
                        snapshot.round()
                    ),
                ));
            }
            EntryBody::Snapshot(_) => {
                return Err(broken(org, e.seq(), "snapshot after the newest snapshot"));
            }
            EntryBody::Claim | EntryBody::Release => ended = true,
        }
    }
    Ok(Some(Chain { snapshot, deltas }))
}

/// Every delta of `rest` (the entries right after `snapshot`) on the snapshot's chain,
/// contiguous, stopping at the first entry that is not: what verify replays and what
/// retention keeps with a kept snapshot.
pub(crate) fn after(snapshot: &LogEntry, rest: &[LogEntry]) -> Vec<LogEntry> {
    let mut tip = snapshot.seq();
    let mut out = Vec::new();
    for e in rest {
        if !(e.seq() == tip + 1 && extends(snapshot, tip, e)) {
            break;
        }
        tip = e.seq();
        out.push(e.clone());
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
    image: &mut Vec<u8>,
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
    use crate::log::entry::{EntryHeader, Stored};

    fn entry(seq: u64, round: u64, body: EntryBody) -> LogEntry {
        LogEntry {
            header: EntryHeader {
                seq,
                round,
                writer: "w".into(),
                nonce: "00".into(),
                at_ms: 0,
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
        let claim = entry(1, 1, EntryBody::Claim);
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
            entry(4, 2, EntryBody::Claim),
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

    #[test]
    fn compaction_bases_are_deltas_not_based_on_the_entry_before() {
        assert_eq!(compaction_base(&delta(6, 1, 2)), Some(2));
        assert_eq!(compaction_base(&delta(3, 1, 2)), None);
        assert_eq!(compaction_base(&snapshot(3, 1)), None);
        assert!(compacts(&snapshot(2, 1), &delta(6, 1, 2)));
        assert!(!compacts(&snapshot(2, 1), &delta(6, 2, 2)));
    }
}
