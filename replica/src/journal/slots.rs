//! The objects a run listing holds, by slot: a bounded view of one shared map.
//!
//! A takeover walks the same run once per org, and every walk keeps its part of the one
//! listing the walks share (`coalesce.rs`). A view is an `Arc` and two bounds, so a part
//! costs nothing to take or drop; a copied map cost each walk one node and one reference
//! count per object of the run (a quadratic share of a 1,000-org takeover's CPU).

use std::collections::BTreeMap;
use std::collections::btree_map::Range;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use super::io::Listed;

/// Objects by slot, restricted to the slots `lo..=hi` of a shared map.
#[derive(Clone, Debug)]
pub struct Slots {
    map: Arc<BTreeMap<u64, Arc<Listed>>>,
    lo: u64,
    hi: u64,
}

impl Default for Slots {
    fn default() -> Self {
        Slots::from(BTreeMap::new())
    }
}

impl From<BTreeMap<u64, Arc<Listed>>> for Slots {
    fn from(map: BTreeMap<u64, Arc<Listed>>) -> Self {
        Slots {
            map: Arc::new(map),
            lo: 0,
            hi: u64::MAX,
        }
    }
}

impl PartialEq for Slots {
    fn eq(&self, other: &Slots) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for Slots {}

/// The inclusive slots of `r`, `None` when it holds none.
fn inclusive(r: &impl RangeBounds<u64>) -> Option<(u64, u64)> {
    let lo = match r.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.checked_add(1)?,
        Bound::Unbounded => 0,
    };
    let hi = match r.end_bound() {
        Bound::Included(&e) => e,
        Bound::Excluded(&e) => e.checked_sub(1)?,
        Bound::Unbounded => u64::MAX,
    };
    (lo <= hi).then_some((lo, hi))
}

impl Slots {
    /// The objects in `slots` and in this view, in slot order.
    pub fn range(&self, slots: impl RangeBounds<u64>) -> Range<'_, u64, Arc<Listed>> {
        match inclusive(&slots) {
            Some((lo, hi)) if lo.max(self.lo) <= hi.min(self.hi) => {
                self.map.range(lo.max(self.lo)..=hi.min(self.hi))
            }
            // An empty range of the map: `0..0` is a valid, empty one.
            _ => self.map.range(0..0),
        }
    }

    /// Every object of this view, in slot order.
    pub fn iter(&self) -> Range<'_, u64, Arc<Listed>> {
        self.range(..)
    }

    /// The slots of this view, ascending.
    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &u64> {
        self.iter().map(|(s, _)| s)
    }

    /// The objects of this view, in slot order.
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &Arc<Listed>> {
        self.iter().map(|(_, l)| l)
    }

    /// The object at `slot`, when this view holds one there.
    pub fn get(&self, slot: &u64) -> Option<&Arc<Listed>> {
        (self.lo..=self.hi)
            .contains(slot)
            .then(|| self.map.get(slot))
            .flatten()
    }

    /// True when this view holds an object at `slot`.
    pub fn contains_key(&self, slot: &u64) -> bool {
        self.get(slot).is_some()
    }

    /// This view in a map of its own: a part kept for long (the sealed listings' cache)
    /// must not keep the rest of the shared map alive, which its weight does not count.
    pub(crate) fn detached(&self) -> Slots {
        Slots::from(
            self.iter()
                .map(|(s, l)| (*s, l.clone()))
                .collect::<BTreeMap<_, _>>(),
        )
    }

    /// Objects the shared map holds, in this view or not: what keeping this view keeps.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.map.len()
    }

    /// The part of this view in `slots`, sharing the same map.
    pub(crate) fn part(&self, slots: impl RangeBounds<u64>) -> Slots {
        let (lo, hi) = match inclusive(&slots) {
            Some((lo, hi)) => (lo.max(self.lo), hi.min(self.hi)),
            None => (1, 0),
        };
        Slots {
            map: self.map.clone(),
            lo,
            hi,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::format::journal::{JournalHeader, JournalObject, RunName, Seal, SealKind};

    fn map(slots: &[u64]) -> BTreeMap<u64, Arc<Listed>> {
        slots
            .iter()
            .map(|&s| (s, listed(s, release_seal())))
            .collect()
    }

    /// A listed object of a test run at `slot`.
    pub(crate) fn listed(slot: u64, object: JournalObject) -> Arc<Listed> {
        let header = JournalHeader {
            run: RunName::new("0123456789abcdef0123456789abcdef", 1).expect("a valid run name"),
            slot,
            nonce: "n".into(),
            floor: 0,
            object,
        };
        Arc::new(Listed::new(header, 100, 100, 0))
    }

    /// A release seal.
    pub(crate) fn release_seal() -> JournalObject {
        JournalObject::Seal(Seal {
            by: "w".into(),
            instance: "i".into(),
            seal: SealKind::Release,
            continued: None,
            from: 0,
            retain_below: 0,
        })
    }

    fn keys(s: &Slots) -> Vec<u64> {
        s.keys().copied().collect()
    }

    #[test]
    fn a_part_sees_only_its_slots_and_every_lookup_agrees() {
        let all = Slots::from(map(&[1, 2, 3, 5, 8, 9]));
        let part = all.part(2..=8);
        assert_eq!(keys(&part), [2, 3, 5, 8]);
        assert_eq!(part.range(..).count(), 4);
        assert_eq!(part.range(4..).map(|(s, _)| *s).collect::<Vec<_>>(), [5, 8]);
        assert_eq!(
            part.range(..=3).map(|(s, _)| *s).collect::<Vec<_>>(),
            [2, 3]
        );
        assert_eq!(part.keys().next_back(), Some(&8));
        assert!(part.get(&9).is_none() && all.get(&9).is_some());
        assert!(!part.contains_key(&1) && part.contains_key(&2));
        let inner = part.part(3..);
        assert_eq!(keys(&inner), [3, 5, 8]);
        assert_eq!(inner, Slots::from(map(&[3, 5, 8])));
        assert_ne!(inner, part);
        assert_eq!(inner.held(), 6, "a part shares the whole map");
        let own = inner.detached();
        assert_eq!((own.held(), keys(&own)), (3, vec![3, 5, 8]));
        assert_eq!(own, inner);
    }

    #[test]
    fn empty_and_inverted_ranges_hold_nothing_and_never_panic() {
        let all = Slots::from(map(&[0, 1, u64::MAX]));
        assert_eq!(keys(&all.part(5..5)), Vec::<u64>::new());
        let (hi, lo) = (2, 3);
        assert_eq!(all.range(lo..hi).count(), 0);
        assert_eq!(all.range(..0).count(), 0);
        assert_eq!(
            all.range((Bound::Excluded(u64::MAX), Bound::Unbounded))
                .count(),
            0
        );
        let high = all.part(2..);
        assert_eq!(keys(&high), [u64::MAX]);
        assert_eq!(high.range(..2).count(), 0);
        assert!(high.get(&0).is_none());
        assert_eq!(Slots::default(), all.part(lo + 1..=lo));
    }
}
