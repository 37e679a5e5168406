//! What this process has seen of other processes' liveness objects, on its own monotonic
//! clock (I15).
//!
//! A holder proves it lives by changing its lease object (every renewal writes a new
//! `renewals` count); an observer proves the holder stopped by reading the same bytes for a
//! whole watch. Two reads of one content bound when it was there: the content was in place
//! from the moment the first read returned until the moment the second read was sent, so the
//! time seen unchanged is `asked_ms` of the newest read minus `read_ms` of the first read of
//! that content, with no margin needed for the reads' own latency.
//!
//! One entry per liveness object (a process lease; an org lease only for holders of older
//! versions), never per org, and bounded: an entry not consulted for [`FORGET_AFTER_WATCHES`]
//! watches is forgotten, and at most [`MAX_WATCHED`] are kept (the least recently consulted
//! goes first). Forgetting is always safe: it only makes the next claimant watch again. Each
//! entry forgets by its own watch (its holder's term), not by the watch of whoever looks
//! next: a short-term holder's lookups must not evict a long-term dead holder's observation.
//! An entry keeps a sha256 and length of the bytes read, not the bytes, so its size does not
//! depend on what a lease object holds.

use std::collections::HashMap;
use std::sync::Mutex;

use bytes::Bytes;
use sha2::{Digest, Sha256};

/// Most liveness objects one handle keeps observations of: about 150 bytes each (path,
/// digest, three numbers).
pub(crate) const MAX_WATCHED: usize = 1024;

/// An observation not consulted for this many watches is forgotten: a claimant that retries
/// within its `Retry-After` plus nine watches keeps the watch its first attempt started; one
/// that comes back later watches again.
pub(crate) const FORGET_AFTER_WATCHES: u64 = 10;

/// What a read returned, for comparing with the next read: sha256 and length of the bytes,
/// `None` when the object did not exist. A renewal that collided in sha256 with the one
/// before would only make a live holder look silent, which fencing keeps safe (I7).
type Content = Option<([u8; 32], usize)>;

fn content(bytes: Option<&Bytes>) -> Content {
    bytes.map(|b| (Sha256::digest(b).into(), b.len()))
}

/// One liveness object as this process last read it.
#[derive(Debug)]
struct Seen {
    /// What it held.
    content: Content,
    /// Monotonic ms when a read first returned this content.
    since_ms: u64,
    /// Monotonic ms of the newest read, for forgetting.
    checked_ms: u64,
    /// Ms after `checked_ms` at which it is forgotten: [`FORGET_AFTER_WATCHES`] of the watch
    /// its newest reader judged it by (its holder's).
    forget_ms: u64,
}

/// Observations of liveness objects by path: see the module docs.
#[derive(Debug, Default)]
pub(crate) struct Watch {
    seen: Mutex<HashMap<String, Seen>>,
}

impl Watch {
    /// Records a read of `object` sent at `asked_ms` that returned `bytes` at `read_ms`
    /// (monotonic ms of this process) and answers for how long, in ms, the object has been
    /// seen unchanged: 0 at a first read or a change. `watch_ms`, the watch this object is
    /// judged by, sizes when this entry is forgotten.
    pub(crate) fn saw(
        &self,
        object: &str,
        bytes: Option<Bytes>,
        asked_ms: u64,
        read_ms: u64,
        watch_ms: u64,
    ) -> u64 {
        // A poisoned lock only means another thread panicked while holding it; the map is
        // still a valid set of observations (each insert is one step).
        let mut seen = idem_base::lock(&self.seen);
        let content = content(bytes.as_ref());
        let forget_ms = watch_ms.saturating_mul(FORGET_AFTER_WATCHES);
        if let Some(s) = seen.get_mut(object)
            && s.content == content
        {
            s.checked_ms = s.checked_ms.max(read_ms);
            s.forget_ms = forget_ms;
            return asked_ms.saturating_sub(s.since_ms);
        }
        seen.retain(|_, s| read_ms.saturating_sub(s.checked_ms) <= s.forget_ms);
        if seen.len() >= MAX_WATCHED && !seen.contains_key(object) {
            let oldest = seen
                .iter()
                .min_by_key(|(_, s)| s.checked_ms)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                seen.remove(&k);
            }
        }
        seen.insert(
            object.to_owned(),
            Seen {
                content,
                since_ms: read_ms,
                checked_ms: read_ms,
                forget_ms,
            },
        );
        0
    }

    /// How many objects are being watched (tests of the bound).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        idem_base::lock(&self.seen).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &'static str) -> Option<Bytes> {
        Some(Bytes::from_static(s.as_bytes()))
    }

    #[test]
    fn unchanged_time_runs_from_the_first_read_back_to_the_newest_read_sent() {
        let w = Watch::default();
        // First read sent at 0, back at 40: nothing seen yet.
        assert_eq!(w.saw("p", b("r1"), 0, 40, 1_000), 0);
        // Same bytes, read sent at 900: unchanged since 40 at least.
        assert_eq!(w.saw("p", b("r1"), 900, 960, 1_000), 860);
        // A change restarts the watch from the read that saw it.
        assert_eq!(w.saw("p", b("r2"), 1_000, 1_050, 1_000), 0);
        assert_eq!(w.saw("p", b("r2"), 2_000, 2_010, 1_000), 950);
        // An object that vanished is a change too, and absence is watched like content.
        assert_eq!(w.saw("p", None, 2_100, 2_120, 1_000), 0);
        assert_eq!(w.saw("p", None, 3_200, 3_210, 1_000), 1_080);
    }

    /// Regression: forgetting used the watch of whoever looked last for every
    /// entry, so lookups of short-term holders evicted a long-term dead holder's observation
    /// before its own watch ended, and its orgs never moved.
    #[test]
    fn each_observation_is_forgotten_by_its_own_watch_not_the_callers() {
        let w = Watch::default();
        // A long-term holder (watch 100 s) seen at 0; short-term ones (watch 1 s) looked up
        // every second for 60 s, far past ten of their watches.
        assert_eq!(w.saw("long", b("l"), 0, 0, 100_000), 0);
        for t in 1..=60u64 {
            w.saw(&format!("short{t}"), b("s"), t * 1_000, t * 1_000, 1_000);
        }
        // The long holder's watch still runs from its first sighting.
        assert_eq!(w.saw("long", b("l"), 100_000, 100_000, 100_000), 100_000);
        // And the short ones, unconsulted for ten of their own watches, went.
        assert!(w.len() < 20, "{}", w.len());
    }

    #[test]
    fn observations_are_forgotten_when_unused_and_bounded_in_number() {
        let w = Watch::default();
        w.saw("old", b("x"), 0, 0, 100);
        w.saw("kept", b("x"), 900, 900, 100);
        // Consulted within ten watches: kept.
        assert_eq!(w.saw("kept", b("x"), 1_000, 1_000, 100), 100);
        // Ten watches later, an insert forgets what nobody consulted for longer.
        w.saw("new", b("y"), 1_001, 1_001, 100);
        assert_eq!(w.len(), 2);
        assert_eq!(w.saw("old", b("x"), 1_002, 1_002, 100), 0);
        for i in 0..(MAX_WATCHED + 10) {
            w.saw(
                &format!("p{i}"),
                b("z"),
                400 + i as u64,
                400 + i as u64,
                1_000_000,
            );
        }
        assert_eq!(w.len(), MAX_WATCHED);
        // The least recently consulted went first; the newest are kept.
        let last = format!("p{}", MAX_WATCHED + 9);
        assert!(w.saw(&last, b("z"), 5_000, 5_000, 1_000_000) > 0);
    }
}
