//! Log entries this handle already holds: the ones it published and the ones retention read,
//! each with the size and ETag the store reported, so a later retention run reads only the
//! entries it has not seen (its cost follows the entries added since, not the length of the
//! log; I14).
//!
//! An entry is taken from here only when the listing reports the same size and the same ETag
//! for its slot: a slot emptied by retention and created again (by a claimer that read a
//! stale head) is a different object, and is read again. Inline bodies are dropped on the way
//! in (retention needs the kind, round, time, chain link and blob name, not the pages), and
//! the whole cache is bounded by [`crate::Settings::known_entries`]: when an insert would pass
//! the bound, everything held is forgotten, and the next run reads what it needs.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use crate::format::entry::{BlobRef, DeltaLink, EntryBody, Stored};
use crate::{LogEntry, OrgId};

/// What the store said about one entry's object, and the entry (inline body dropped).
#[derive(Debug)]
struct Seen {
    size: u64,
    e_tag: Option<String>,
    entry: LogEntry,
}

/// Entries by org and seq; see the module docs.
#[derive(Debug)]
pub(crate) struct Known {
    cap: usize,
    inner: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    orgs: HashMap<OrgId, BTreeMap<u64, Seen>>,
    len: usize,
}

impl Known {
    /// A cache holding at most `cap` entries (0: nothing is kept).
    pub(crate) fn new(cap: usize) -> Known {
        Known {
            cap,
            inner: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves at worst a stale count: the data is plain.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records `entry` of `org`, stored as an object of `size` bytes with `e_tag`.
    pub(crate) fn insert(&self, org: &OrgId, size: u64, e_tag: Option<String>, entry: &LogEntry) {
        if self.cap == 0 {
            return;
        }
        let entry = without_body(entry);
        let mut st = self.state();
        if st.len >= self.cap {
            st.orgs.clear();
            st.len = 0;
        }
        let seen = Seen { size, e_tag, entry };
        if st
            .orgs
            .entry(org.clone())
            .or_default()
            .insert(seen.entry.seq(), seen)
            .is_none()
        {
            st.len += 1;
        }
    }

    /// The entry at `seq` of `org`, if held and the listing's `size` and `e_tag` are the ones
    /// recorded for it.
    pub(crate) fn get(
        &self,
        org: &OrgId,
        seq: u64,
        size: u64,
        e_tag: Option<&str>,
    ) -> Option<LogEntry> {
        let st = self.state();
        let seen = st.orgs.get(org)?.get(&seq)?;
        (seen.size == size && seen.e_tag.as_deref() == e_tag && e_tag.is_some())
            .then(|| seen.entry.clone())
    }

    /// Forgets the entries of `org` at `seqs` (deleted), and every entry of it whose seq is
    /// not in `listed` (sorted; gone from the store).
    pub(crate) fn forget(&self, org: &OrgId, seqs: &[u64], listed: &[u64]) {
        let mut st = self.state();
        let Some(map) = st.orgs.get_mut(org) else {
            return;
        };
        let before = map.len();
        for seq in seqs {
            map.remove(seq);
        }
        map.retain(|seq, _| listed.binary_search(seq).is_ok());
        let removed = before - map.len();
        st.len -= removed;
    }
}

/// `entry` with an inline body replaced by an empty one: what retention needs, without the
/// pages.
fn without_body(entry: &LogEntry) -> LogEntry {
    let strip = |stored: &Stored| Stored {
        blob: match &stored.blob {
            BlobRef::Inline(_) => BlobRef::Inline(String::new()),
            other => other.clone(),
        },
        sha256: stored.sha256.clone(),
        bytes: stored.bytes,
        compressed_bytes: stored.compressed_bytes,
        commit: stored.commit,
    };
    let body = match &entry.body {
        EntryBody::Snapshot(stored) => EntryBody::Snapshot(strip(stored)),
        EntryBody::Delta(link) => EntryBody::Delta(DeltaLink {
            stored: strip(&link.stored),
            base: link.base,
            base_checksum: link.base_checksum.clone(),
            checksum: link.checksum.clone(),
            page_size: link.page_size,
            db_pages: link.db_pages,
            changed_pages: link.changed_pages,
        }),
        other => other.clone(),
    };
    LogEntry {
        header: entry.header.clone(),
        body,
    }
}
