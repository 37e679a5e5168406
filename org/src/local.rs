//! Local files of one claim: named per claim and locked, so two writers never share them (I8).
//!
//! ```text
//! <data>/orgs/<org>/<round:020>-<nonce>.lock   flock held by the owning process
//! <data>/orgs/<org>/<round:020>-<nonce>.db     (+ -wal, -shm)
//! ```
//! A successor (another process on the same host during a rolling restart, or this process
//! after a crash) only ever deletes the files of a claim whose lock it can take, which means
//! their owner has closed them or died. The local file is a cache, never an authority: every
//! acquire hydrates a fresh file from the store.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};

use idem_replica::OrgId;

use crate::Error;

/// The locked local files of one claim.
#[derive(Debug)]
pub(crate) struct LocalFiles {
    pub db: PathBuf,
    lock_path: PathBuf,
    _lock: File,
}

fn local_err(org: &OrgId, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let (org, path) = (org.clone(), path.to_owned());
    move |source| Error::Local { org, path, source }
}

/// Makes sure the org's local directory exists and takes a new file, before anything is
/// claimed: a writer that cannot make its files must not fence the org's current writer.
///
/// # Errors
/// [`Error::Local`] when the directory cannot be created or written.
pub(crate) fn prepare(data_dir: &Path, org: &OrgId) -> Result<(), Error> {
    let dir = data_dir.join("orgs").join(org.as_str());
    std::fs::create_dir_all(&dir).map_err(local_err(org, &dir))?;
    let probe = dir.join(format!(".probe-{}", std::process::id()));
    std::fs::write(&probe, b"").map_err(local_err(org, &probe))?;
    std::fs::remove_file(&probe).map_err(local_err(org, &probe))
}

impl LocalFiles {
    /// Creates and locks the lock file of this claim, then removes files of dead claims.
    pub fn create(data_dir: &Path, org: &OrgId, round: u64, nonce: &str) -> Result<Self, Error> {
        // OrgId is validated ([a-z0-9][a-z0-9._-]*, never "..", never a trailing "."): one
        // path component, one spelling per tenant on any file system (I12).
        let dir = data_dir.join("orgs").join(org.as_str());
        std::fs::create_dir_all(&dir).map_err(local_err(org, &dir))?;
        let base = format!("{round:020}-{nonce}");
        let lock_path = dir.join(format!("{base}.lock"));
        // Lock under a name other processes' cleanup ignores, then rename into place: a
        // `.lock` file is never visible unlocked, so no cleanup can take and delete it.
        let pending = dir.join(format!("{base}.pending"));
        let lock = OpenOptions::new()
            .create_new(true)
            .write(true)
            .open(&pending)
            .map_err(local_err(org, &pending))?;
        lock.try_lock().map_err(|e| {
            local_err(org, &pending)(match e {
                TryLockError::Error(e) => e,
                TryLockError::WouldBlock => std::io::Error::other("lock held"),
            })
        })?;
        std::fs::rename(&pending, &lock_path).map_err(local_err(org, &lock_path))?;
        remove_dead_claims(&dir, &lock_path);
        Ok(LocalFiles {
            db: dir.join(format!("{base}.db")),
            lock_path,
            _lock: lock,
        })
    }

    /// Deletes this claim's database, WAL, shm and lock file (the connections must be closed).
    pub fn remove(self) {
        remove_db(&self.db);
        let _ = std::fs::remove_file(&self.lock_path);
    }
}

fn remove_db(db: &Path) {
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut p = db.as_os_str().to_owned();
        p.push(suffix);
        let _ = std::fs::remove_file(PathBuf::from(p));
    }
}

/// Removes the files of every other claim in `dir` whose lock can be taken (owner gone).
fn remove_dead_claims(dir: &Path, ours: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path == ours || path.extension().is_none_or(|e| e != "lock") {
            continue;
        }
        let Ok(file) = File::open(&path) else {
            continue;
        };
        if file.try_lock().is_ok() {
            remove_db(&path.with_extension("db"));
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// Count of claim lock files under a data directory (for tests of bounded open files).
pub fn open_claims(data_dir: &Path) -> usize {
    let Ok(orgs) = std::fs::read_dir(data_dir.join("orgs")) else {
        return 0;
    };
    orgs.flatten()
        .filter_map(|o| std::fs::read_dir(o.path()).ok())
        .flat_map(|d| d.flatten())
        .filter(|e| e.path().extension().is_some_and(|x| x == "lock"))
        .count()
}

/// The data directory's identity and exclusive lock, which prove a restart (DESIGN's writer
/// identity): `<data>/home.id` holds a random id made once, and `<data>/home.lock` is held by
/// the process working in the directory. A process that holds the lock knows every earlier
/// process that worked here is gone (each held it until it died), so a live lease of its own
/// writer id and this home is a dead process's, and need not be waited out.
#[derive(Debug)]
pub(crate) struct Home {
    pub id: String,
    lock_path: PathBuf,
    lock: std::sync::Mutex<Option<File>>,
}

impl Home {
    /// Reads or creates the id, and tries the lock once.
    pub fn open(data_dir: &Path) -> std::io::Result<Home> {
        let id = home_id(data_dir)?;
        let home = Home {
            id,
            lock_path: data_dir.join("home.lock"),
            lock: std::sync::Mutex::new(None),
        };
        home.locked();
        Ok(home)
    }

    /// True when this process holds the data directory's lock (tried again if not yet held:
    /// the process that held it may have died since).
    pub fn locked(&self) -> bool {
        let mut held = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        if held.is_none()
            && let Ok(f) = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&self.lock_path)
            && f.try_lock().is_ok()
        {
            *held = Some(f);
        }
        held.is_some()
    }
}

/// The id of a data directory: random, made once and kept in `<data>/home.id`. Default writer
/// ids are built from it, so a process restarted on the same data directory keeps its id.
///
/// # Errors
/// The I/O error of reading or creating the file; a file that holds no id.
pub fn home_id(data_dir: &Path) -> std::io::Result<String> {
    let id_path = data_dir.join("home.id");
    if !id_path.exists() {
        // Written aside, then linked into place: a concurrent reader never sees it empty.
        let mut raw = [0u8; 12];
        getrandom::fill(&mut raw).map_err(|e| std::io::Error::other(e.to_string()))?;
        let id = hex::encode(raw);
        let tmp = data_dir.join(format!("home.id.{id}"));
        std::fs::write(&tmp, &id)?;
        File::open(&tmp)?.sync_all()?;
        let linked = std::fs::hard_link(&tmp, &id_path);
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
    }
    let id = std::fs::read_to_string(&id_path)?.trim().to_owned();
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(std::io::Error::other(format!(
            "{} is not a data directory id",
            id_path.display()
        )));
    }
    Ok(id)
}
