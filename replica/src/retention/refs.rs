//! The segment names of manifests this handle has read, so retention reads each kept
//! snapshot's manifest once, not on every run. A manifest is immutable (it is named by its
//! sha256), so a cached list never goes stale; the cache forgets everything when it would
//! hold more than [`MAX_NAMES`] names, and the next run reads what it needs again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Segment names held at most (about 100 bytes each: 25 MiB).
pub(crate) const MAX_NAMES: usize = 256 * 1024;

/// Segment names by manifest object path, and how many names that is.
type Names = (HashMap<String, Arc<Vec<String>>>, usize);

/// Segment names by manifest object path.
#[derive(Debug, Default)]
pub(crate) struct SegmentRefs {
    inner: Mutex<Names>,
}

impl SegmentRefs {
    fn state(&self) -> std::sync::MutexGuard<'_, Names> {
        // A panic while holding the lock leaves at worst a stale count: the data is plain.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The segment names of the manifest at `path`, if read before.
    pub(crate) fn get(&self, path: &str) -> Option<Arc<Vec<String>>> {
        self.state().0.get(path).cloned()
    }

    /// Records the segment names of the manifest at `path`.
    pub(crate) fn insert(&self, path: &str, names: Arc<Vec<String>>) {
        let mut st = self.state();
        if st.1 + names.len() > MAX_NAMES {
            st.0.clear();
            st.1 = 0;
        }
        st.1 += names.len();
        if let Some(old) = st.0.insert(path.to_owned(), names) {
            st.1 -= old.len();
        }
    }
}
