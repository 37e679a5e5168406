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

use crate::journal::io::Listed;

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
