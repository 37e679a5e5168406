//! Journal headers this handle has read, so walks of many orgs over one run read each
//! header once (`docs/design.md` 3g, Costs): a batch's header indexes every org's section,
//! so at 1,000 orgs it is about 250 KB of JSON, which every org's walk would otherwise GET
//! and parse again.
//!
//! An entry is reused only when a LIST reports the same object (size and Last-Modified) at
//! the same name. Journal objects are create-only, so a name holds one object until
//! retention deletes it; a create landing later in a deleted slot is a different object (its
//! Last-Modified is later), and anything created there lies below every walk's entry (T3).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use crate::format::journal::{JournalObject, RunName};
use crate::journal::io::{Listed, RunListing};

/// Header bytes kept at most (64 MiB): the oldest go first.
const MAX_CACHED_HEADER_BYTES: usize = 64 << 20;

/// The cache: by object name, the listed size and Last-Modified with the header.
#[derive(Debug, Default)]
pub(crate) struct Headers {
    inner: Mutex<Cached>,
}

#[derive(Debug, Default)]
struct Cached {
    by_name: HashMap<String, (u64, u64, Arc<Listed>)>,
    order: VecDeque<String>,
    bytes: usize,
}

impl Headers {
    /// The header of `name` when it was read as the object a LIST reports now.
    pub(crate) fn get(&self, name: &str, size: u64, last_modified_ms: u64) -> Option<Arc<Listed>> {
        let cached = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        match cached.by_name.get(name) {
            Some((s, m, l)) if *s == size && *m == last_modified_ms => Some(l.clone()),
            _ => None,
        }
    }

    /// Remembers `listed` as the header of `name`, listed with `size` and Last-Modified.
    pub(crate) fn insert(
        &self,
        name: &str,
        (size, last_modified_ms): (u64, u64),
        listed: Arc<Listed>,
    ) {
        let mut cached = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let weight = listed.header_len.max(1);
        let entry = (size, last_modified_ms, listed);
        if let Some(old) = cached.by_name.insert(name.to_owned(), entry) {
            cached.bytes = cached.bytes.saturating_sub(old.2.header_len.max(1));
        } else {
            cached.order.push_back(name.to_owned());
        }
        cached.bytes += weight;
        while cached.bytes > MAX_CACHED_HEADER_BYTES {
            let Some(oldest) = cached.order.pop_front() else {
                break;
            };
            if let Some(old) = cached.by_name.remove(&oldest) {
                cached.bytes = cached.bytes.saturating_sub(old.2.header_len.max(1));
            }
        }
    }
}

/// Header bytes the sealed listings keep at most (64 MiB): the oldest runs go first.
const MAX_SEALED_LISTING_BYTES: usize = 64 << 20;

/// Listings of sealed runs, for walks (K0): a scan never reads past a run's first seal, and
/// an occupied slot never changes where a walk enters (objects are create-only; retention
/// deletes, and late creates land, only below every walk's entry: T1-T3). So the part of
/// one listing from a slot up to the seal with **no empty slot** serves every walk that
/// enters in it. An empty slot below a seal may still take the dead writer's batch in
/// flight or an adopter's hole-filling seal (J3-4), so a listing is kept only from above
/// its highest empty slot. A takeover's walks of the dead writer's run (one per org) then
/// cost one LIST, not one each.
#[derive(Debug, Default)]
pub(crate) struct SealedListings {
    inner: Mutex<Sealed>,
}

#[derive(Debug, Default)]
struct Sealed {
    by_run: HashMap<RunName, (u64, RunListing)>,
    order: VecDeque<RunName>,
    bytes: usize,
}

impl SealedListings {
    /// The objects of `run` from `from` up to its first seal, when a listing of it from at
    /// or below `from` that holds a seal at or above `from` was kept.
    pub(crate) fn get(&self, run: &RunName, from: u64) -> Option<RunListing> {
        let sealed = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let (seal, listing) = sealed.by_run.get(run)?;
        (listing.from <= from && from <= *seal).then(|| listing.part(from, from..=*seal))
    }

    /// Keeps the part of `listing` up to its first seal that has no empty slot, unless a
    /// part from a lower slot is kept.
    pub(crate) fn insert(&self, listing: &RunListing) {
        let Some(seal) = listing
            .objects
            .iter()
            .find(|(_, l)| matches!(l.header.object, JournalObject::Seal(_)))
            .map(|(s, _)| *s)
        else {
            return;
        };
        let mut from = seal;
        while from > listing.from && listing.objects.contains_key(&(from - 1)) {
            from -= 1;
        }
        // Its own map: a view would keep the whole listing alive, counted as its part.
        let kept = listing.part(from, from..=seal).detached();
        let weight = kept.header_bytes();
        let mut sealed = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, old)) = sealed.by_run.get(&listing.run) {
            if old.from <= from {
                return;
            }
            sealed.bytes = sealed.bytes.saturating_sub(old.header_bytes());
        } else {
            sealed.order.push_back(listing.run.clone());
        }
        sealed.by_run.insert(listing.run.clone(), (seal, kept));
        sealed.bytes += weight;
        while sealed.bytes > MAX_SEALED_LISTING_BYTES {
            let Some(oldest) = sealed.order.pop_front() else {
                break;
            };
            if let Some((_, old)) = sealed.by_run.remove(&oldest) {
                sealed.bytes = sealed.bytes.saturating_sub(old.header_bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::SealedListings;
    use crate::format::journal::{Batch, JournalObject, RunName};
    use crate::journal::io::RunListing;
    use crate::journal::slots::tests::{listed, release_seal};

    #[test]
    fn a_kept_part_holds_only_its_own_slots() {
        // Slots 1-4 and 6, a seal at 7, slots 8-9 past it: slot 5 is empty, so only 6..=7
        // is kept, and nothing else of the listing may stay alive uncounted.
        let mut objects = BTreeMap::new();
        for slot in [1, 2, 3, 4, 6, 8, 9] {
            objects.insert(slot, listed(slot, JournalObject::Batch(Batch::default())));
        }
        objects.insert(7, listed(7, release_seal()));
        let run = RunName::new("0123456789abcdef0123456789abcdef", 1).expect("a valid run name");
        let listing = RunListing {
            run: run.clone(),
            from: 1,
            objects: objects.into(),
        };
        let cache = SealedListings::default();
        cache.insert(&listing);
        let kept = cache.get(&run, 6).expect("the part from 6 is kept");
        let slots: Vec<u64> = kept.objects.keys().copied().collect();
        assert_eq!(slots, [6, 7]);
        assert_eq!(
            kept.objects.held(),
            2,
            "the cache holds the listing's other slots"
        );
        assert!(cache.get(&run, 5).is_none());
    }
}
