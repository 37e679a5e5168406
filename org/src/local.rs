//! Local files of one claim: named per claim and locked, so two writers never share them (I8).
//!
//! ```text
//! <data>/orgs/<org>/<round:020>-<nonce>.lock   flock held by the owning process
//! <data>/orgs/<org>/<round:020>-<nonce>.db     (+ -wal, -shm)
//! <data>/orgs/<org>/.<round:020>-<nonce>.db.hydrate-<n>  while a hydrate builds the .db
//! <data>/orgs/<org>/<round:020>-<nonce>.cache  after a clean release only: the position the
//!                                              closed .db holds (idem_replica::ResumePoint)
//! ```
//! A successor (another process on the same host during a rolling restart, or this process
//! after a crash) only ever deletes the files of a claim whose lock it can take, which means
//! their owner has closed them or died. The local file is a cache, never an authority: an
//! acquire takes a released claim's file (under that claim's lock, into its own claim's
//! name, so no two writers ever open it) and uses it only when the store proves it
//! holds the newest published state (`Replica::resume`); otherwise it hydrates a fresh one.
//! The file is copied into the new name rather than renamed: see [`take_cached`].

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
    /// A released claim's file, now at `db`, and the position it says it holds: a hint the
    /// store must confirm before the file is used.
    pub cached: Option<idem_replica::ResumePoint>,
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

/// True when the org's local directory holds a released claim's kept file (a `.cache`
/// record), which the next acquire may resume from instead of hydrating. A hint read before
/// the claim: [`LocalFiles::create`] takes the file only under its claim's lock.
pub(crate) fn has_kept(data_dir: &Path, org: &OrgId) -> bool {
    let dir = data_dir.join("orgs").join(org.as_str());
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.path().extension().is_some_and(|x| x == "cache"))
    })
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
        let db = dir.join(format!("{base}.db"));
        // Before the cleanup, which would delete a released claim's file as dead.
        let cached = take_cached(&dir, &db);
        remove_dead_claims(&dir, &lock_path);
        Ok(LocalFiles {
            db,
            lock_path,
            _lock: lock,
            cached,
        })
    }

    /// Deletes this claim's database, WAL, shm and lock file (the connections must be closed).
    pub fn remove(self) {
        remove_db(&self.db);
        let _ = std::fs::remove_file(&self.lock_path);
    }

    /// Keeps this claim's closed database file for a later acquire on this host, with the
    /// position it holds, then lets go of the lock (a cleanup may delete it from then on,
    /// which only costs that acquire a download). The writer connection must be closed,
    /// which checkpointed the WAL into the file and removed it; with a WAL still there, or
    /// a record that cannot be written, the files are deleted instead.
    pub fn keep(self, point: &idem_replica::ResumePoint) {
        let wal = sidecar(&self.db, "-wal");
        let wal_empty = std::fs::metadata(&wal).map_or(true, |m| m.len() == 0);
        let record = self.lock_path.with_extension("cache");
        let written = wal_empty
            && serde_json::to_vec(point).ok().is_some_and(|json| {
                let tmp = self.lock_path.with_extension("cache-tmp");
                std::fs::write(&tmp, json).is_ok() && std::fs::rename(&tmp, &record).is_ok()
            });
        if !written {
            tracing::debug!(db = %self.db.display(), "released file not kept");
            self.remove();
        }
    }
}

fn sidecar(db: &Path, suffix: &str) -> PathBuf {
    let mut p = db.as_os_str().to_owned();
    p.push(suffix);
    PathBuf::from(p)
}

/// Takes the newest released claim's file in `dir` whose lock is free, copying its database
/// to `dest` (this claim's name) while holding that claim's lock, and returns the position
/// its record names. Every record taken is removed with its claim's other files; older ones
/// are left to the cleanup.
///
/// A copy, not a rename: the released writer's handles in this process may still hold a
/// descriptor of the old inode (the shipper's reads), and closing it would drop the new
/// writer's SQLite locks on that inode for the whole process (I13). A new inode was never
/// opened by anyone else. (`std::fs::copy` uses the kernel's copy, a reflink where the file
/// system has them.)
fn take_cached(dir: &Path, dest: &Path) -> Option<idem_replica::ResumePoint> {
    let mut records: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "cache"))
        .collect();
    // Names start with the zero-padded round: the newest claim's record sorts last.
    records.sort();
    for record in records.iter().rev() {
        let lock_path = record.with_extension("lock");
        let Ok(lock) = File::open(&lock_path) else {
            continue;
        };
        if lock.try_lock().is_err() {
            continue;
        }
        let db = record.with_extension("db");
        let point = std::fs::read(record)
            .ok()
            .and_then(|b| serde_json::from_slice::<idem_replica::ResumePoint>(&b).ok());
        let taken = point.is_some()
            && std::fs::metadata(sidecar(&db, "-wal")).map_or(true, |m| m.len() == 0)
            && std::fs::copy(&db, dest).is_ok();
        remove_db(&db);
        let _ = std::fs::remove_file(record);
        let _ = std::fs::remove_file(&lock_path);
        drop(lock);
        if taken {
            return point;
        }
    }
    None
}

fn remove_db(db: &Path) {
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut p = db.as_os_str().to_owned();
        p.push(suffix);
        let _ = std::fs::remove_file(PathBuf::from(p));
    }
}

/// Removes the files of every other claim in `dir` whose lock can be taken (owner gone),
/// including what a hydrate of its database killed mid-way left.
fn remove_dead_claims(dir: &Path, ours: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    for path in &paths {
        if path == ours || path.extension().is_none_or(|e| e != "lock") {
            continue;
        }
        let Ok(file) = File::open(path) else {
            continue;
        };
        if file.try_lock().is_ok() {
            let db = path.with_extension("db");
            remove_db(&db);
            remove_hydrate_temps(&paths, &db);
            let _ = std::fs::remove_file(path.with_extension("cache"));
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Removes the temp files a hydrate into `db` builds its image in (`idem_replica` names them
/// `.<db name>.hydrate-<nonce>`, beside `db`, and renames one over `db` only once it is
/// verified): a writer killed mid-hydrate leaves one behind, as large as the database.
/// Called only under the claim's free lock, so no hydrate is writing them.
fn remove_hydrate_temps(paths: &[PathBuf], db: &Path) {
    let Some(name) = db.file_name() else {
        return;
    };
    let prefix = format!(".{}.hydrate-", name.to_string_lossy());
    for p in paths {
        if p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with(&prefix))
        {
            let _ = std::fs::remove_file(p);
        }
    }
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
        let mut held = crate::sync::lock(&self.lock);
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
