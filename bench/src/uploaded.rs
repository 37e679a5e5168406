//! Bytes a replicator wrote to a local-directory store over a window, counted the same way
//! for idem and Litestream: the size of every distinct file seen in the directory, polled
//! while the window runs, so a file written and deleted inside it (a compacted level's
//! inputs, a retention run) still counts. Both write each object once under a new name
//! (idem's puts are create-only; Litestream's LTX files are immutable), so summing distinct
//! names is the bytes uploaded. Files present when the window opened are not counted.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The largest size seen of every file under `root`, by path relative to it. Staging files
/// are skipped: object_store's local store writes `NAME#N` and renames it, Litestream writes
/// `NAME.tmp` and renames it, so their bytes are counted once, under the final name.
pub(crate) fn scan(root: &Path, into: &mut HashMap<PathBuf, u64>) {
    let mut dirs = vec![root.to_owned()];
    while let Some(dir) = dirs.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(meta) = e.metadata() else { continue };
            let path = e.path();
            if meta.is_dir() {
                dirs.push(path);
                continue;
            }
            let name = e.file_name().to_string_lossy().into_owned();
            if name.contains('#') || name.ends_with(".tmp") {
                continue;
            }
            let rel = path.strip_prefix(root).unwrap_or(&path).to_owned();
            let size = into.entry(rel).or_insert(0);
            *size = (*size).max(meta.len());
        }
    }
}

/// What a window wrote: every new file and its size.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub files: HashMap<PathBuf, u64>,
}

impl Tally {
    /// Total bytes of the new files.
    pub(crate) fn bytes(&self) -> u64 {
        self.files.values().sum()
    }

    /// How many files.
    pub(crate) fn files(&self) -> usize {
        self.files.len()
    }

    /// Files and bytes grouped by `key` of each relative path (e.g. Litestream's level).
    pub(crate) fn by(&self, key: impl Fn(&Path) -> String) -> BTreeMap<String, (usize, u64)> {
        let mut out: BTreeMap<String, (usize, u64)> = BTreeMap::new();
        for (p, b) in &self.files {
            let e = out.entry(key(p)).or_default();
            e.0 += 1;
            e.1 += b;
        }
        out
    }
}

/// A window over a directory: [`Uploaded::start`] notes what exists, a thread polls every
/// `every`, and [`Uploaded::finish`] scans once more and returns what is new.
pub(crate) struct Uploaded {
    root: PathBuf,
    base: HashMap<PathBuf, u64>,
    stop: Arc<AtomicBool>,
    poller: Option<std::thread::JoinHandle<HashMap<PathBuf, u64>>>,
}

impl Uploaded {
    /// Opens the window; `every` of zero polls only at the start and the end (for a store
    /// whose files nothing deletes during the window).
    pub(crate) fn start(root: &Path, every: Duration) -> Uploaded {
        let mut base = HashMap::new();
        scan(root, &mut base);
        let stop = Arc::new(AtomicBool::new(false));
        let poller = (!every.is_zero()).then(|| {
            let (root, stop) = (root.to_owned(), stop.clone());
            std::thread::spawn(move || {
                let mut seen = HashMap::new();
                while !stop.load(Ordering::SeqCst) {
                    scan(&root, &mut seen);
                    std::thread::sleep(every);
                }
                seen
            })
        });
        Uploaded {
            root: root.to_owned(),
            base,
            stop,
            poller,
        }
    }

    /// Closes the window.
    pub(crate) fn finish(mut self) -> Tally {
        self.stop.store(true, Ordering::SeqCst);
        let mut seen = self
            .poller
            .take()
            .and_then(|p| p.join().ok())
            .unwrap_or_default();
        scan(&self.root, &mut seen);
        seen.retain(|p, _| !self.base.contains_key(p));
        Tally { files: seen }
    }
}

impl Drop for Uploaded {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}
