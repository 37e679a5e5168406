//! The top of an org's log as one LIST and one round of concurrent GETs saw it: what a claim
//! reads to choose its round and judge the holder, and what the hydrate or resume of that
//! claim reads instead of listing and reading the log again (I16).
//!
//! A claim lands at the slot [`Window::claim_slot`] picks from this listing (`head + 1`
//! unless a pipelined writer had ships in flight) and then lists above its own entry; once that
//! check shows nothing above, the entries below the claim are the ones listed here, except
//! for objects retention deleted since (a read of one finds it gone, and the hydrate lists
//! afresh) and entries a fenced writer created in a slot retention freed (never
//! acknowledged, I11). So the hydrate may take its tail from here (`docs/design.md`,
//! section 3a).

use std::collections::BTreeMap;

use futures::{StreamExt, TryStreamExt};

use super::Log;
use crate::{Error, LogEntry, OrgId};

/// The listed positions of an org's log, and the newest of them as read at once.
#[derive(Debug, Clone, Default)]
pub(crate) struct Window {
    /// Every position the LIST returned, ascending.
    pub(crate) seqs: Vec<u64>,
    /// The entries read, by seq: the top few of `seqs` ([`Log::window`]), bodies included,
    /// less any that vanished before they were read.
    pub(crate) entries: BTreeMap<u64, LogEntry>,
}

impl Window {
    /// The highest listed position, 0 for an empty log.
    pub(crate) fn head(&self) -> u64 {
        self.seqs.last().copied().unwrap_or(0)
    }

    /// The entry at the head; `None` for an empty log or a head that vanished.
    pub(crate) fn top(&self) -> Option<&LogEntry> {
        self.seqs.last().and_then(|s| self.entries.get(s))
    }

    /// The entry that decides the org's round, holder and release: the highest entry read of
    /// the highest round read, among the entries no later entry shadows. It is the head's,
    /// unless a fenced writer's pipelined ships landed above the claim that fenced it
    /// (strays, `docs/design.md` 3e, rules C1 and C3). An entry is shadowed, and so is no
    /// evidence of its round's ownership, when an entry of a lower round that is not a stray
    /// of it lies above it: a claim abandoned in a slot retention freed, under the owner's
    /// newer entries.
    pub(crate) fn newest(&self) -> Option<&LogEntry> {
        let read: Vec<&LogEntry> = self.entries.values().collect();
        let shadowed = |i: usize| {
            let e = read[i];
            read[i + 1..].iter().any(|x| {
                x.round() < e.round()
                    && !(x.is_pipelined()
                        && x.is_delta()
                        && x.seq() < e.seq().saturating_add(x.ship_window()))
            })
        };
        let live: Vec<&LogEntry> = (0..read.len())
            .filter(|i| !shadowed(*i))
            .map(|i| read[i])
            .collect();
        let round = live.iter().map(|e| e.round()).max()?;
        live.into_iter().rev().find(|e| e.round() == round)
    }

    /// The slot a claim takes (C1): the lowest slot at or above the newest entry's floor
    /// that the LIST did not show. `head + 1` when nothing was in flight there; 1 for an
    /// empty log.
    pub(crate) fn claim_slot(&self) -> u64 {
        let floor = self
            .newest()
            .map_or(self.head() + 1, LogEntry::floor)
            .max(1);
        let mut slot = floor;
        for s in self.seqs.iter().copied().filter(|s| *s >= floor) {
            if s != slot {
                break;
            }
            slot += 1;
        }
        slot
    }

    /// The entry at `seq`, if it was read.
    pub(crate) fn entry(&self, seq: u64) -> Option<&LogEntry> {
        self.entries.get(&seq)
    }

    /// Keeps only what lies below `limit` (a claim's own seq).
    pub(crate) fn below(mut self, limit: u64) -> Window {
        self.seqs.retain(|s| *s < limit);
        self.entries.retain(|s, _| *s < limit);
        self
    }
}

impl Log {
    /// One LIST of `org`'s log, then its top `reads` entries (at least the head) read
    /// concurrently (one round trip), each recorded in the known-entries cache.
    ///
    /// # Errors
    /// [`Error::Store`]; [`Error::Corrupt`]/[`Error::UnknownFormat`] for an unreadable entry.
    pub(crate) async fn window(&self, org: &OrgId, reads: usize) -> Result<Window, Error> {
        let seqs = self.seqs(org).await?;
        let from = seqs.len().saturating_sub(reads.max(1));
        let reads: Vec<_> = seqs[from..]
            .iter()
            .map(|s| self.read_entry_noting(org, *s))
            .collect();
        let read: Vec<Option<LogEntry>> = futures::stream::iter(reads)
            .buffered(self.read_concurrency.max(1))
            .try_collect()
            .await?;
        let entries = read.into_iter().flatten().map(|e| (e.seq(), e)).collect();
        Ok(Window { seqs, entries })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::entry::{EntryBody, EntryHeader, Pipeline, Stored};

    fn entry(seq: u64, round: u64, body: EntryBody, pipelined: bool) -> LogEntry {
        LogEntry {
            header: EntryHeader {
                seq,
                round,
                writer: "w".into(),
                nonce: "00".into(),
                at_ms: 0,
                pipeline: pipelined.then_some(Pipeline {
                    window: 4,
                    floor: seq,
                }),
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

    fn window(entries: Vec<LogEntry>) -> Window {
        Window {
            seqs: entries.iter().map(LogEntry::seq).collect(),
            entries: entries.into_iter().map(|e| (e.seq(), e)).collect(),
        }
    }

    #[test]
    fn the_newest_entry_skips_strays_above_a_claim_and_claims_abandoned_below_newer_entries() {
        let claim = |seq, round| entry(seq, round, EntryBody::Claim(Default::default()), true);
        let snapshot = |seq, round| entry(seq, round, EntryBody::Snapshot(stored()), false);
        let stray = |seq, round| {
            let mut e = entry(seq, round, EntryBody::Snapshot(stored()), true);
            e.body = EntryBody::Delta(crate::format::entry::DeltaLink {
                stored: stored(),
                base: 1,
                base_checksum: String::new(),
                checksum: String::new(),
                page_size: 512,
                db_pages: 1,
                changed_pages: 0,
            });
            e.header.pipeline = Some(Pipeline {
                window: 4,
                floor: 2,
            });
            e
        };
        // Round 2 claimed at 3; round 1's ship landed at 5 (a stray), 4 is free.
        let w = window(vec![snapshot(2, 1), claim(3, 2), stray(5, 1)]);
        assert_eq!(w.newest().map(LogEntry::seq), Some(3));
        assert_eq!(w.claim_slot(), 4);
        // A claim of round 3 abandoned in a freed slot under round 2's newer entries.
        let w = window(vec![claim(5, 3), snapshot(6, 2), claim(7, 2)]);
        assert_eq!(w.newest().map(LogEntry::seq), Some(7));
        assert_eq!(w.claim_slot(), 8);
    }
}
