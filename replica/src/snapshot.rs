//! Taking a consistent SQLite snapshot, packing it into a blob, and verifying and
//! installing one (I10). All functions here are synchronous: call them on a blocking thread.

use std::io::Write;
use std::path::Path;

use rusqlite::{Connection, MAIN_DB};
use sha2::{Digest, Sha256};

use crate::Error;
use crate::entry::{blob_body, blob_header, corrupt};

const SQLITE_MAGIC: &[u8; 16] = b"SQLite format 3\0";

/// An uncompressed SQLite database image plus the caller's commit counter it contains.
///
/// The image is normalized to rollback-journal mode (header bytes 18–19 set to 1): a
/// hydrated file never expects a `-wal` file it does not have. Callers re-enable WAL
/// after hydrating.
#[derive(Clone)]
pub struct Snapshot {
    bytes: Vec<u8>,
    commit: u64,
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot")
            .field("bytes", &self.bytes.len())
            .field("commit", &self.commit)
            .finish()
    }
}

impl Snapshot {
    /// Takes a consistent snapshot of the live database on `conn` (WAL or not) inside ONE
    /// read transaction: `read_commit` runs in that same transaction, so the returned commit
    /// counter describes exactly the state in the image. Other connections may keep writing.
    ///
    /// Uses the online backup API from `conn` (pinned to its read transaction) into an
    /// in-memory database, then serializes that. Synchronous; run on a blocking thread.
    ///
    /// # Errors
    /// [`Error::Sqlite`] when the read transaction, `read_commit`, or the copy fails
    /// (e.g. `conn` is already inside a transaction).
    pub fn take(
        conn: &Connection,
        read_commit: impl FnOnce(&Connection) -> rusqlite::Result<u64>,
    ) -> Result<Snapshot, Error> {
        let sql = |op| move |source| Error::Sqlite { op, source };
        conn.execute_batch("BEGIN DEFERRED")
            .map_err(sql("beginning the snapshot read transaction"))?;
        let result = (|| {
            // Any read starts the read transaction; the schema read does it for every db.
            conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| {
                r.get::<_, i64>(0)
            })
            .map_err(sql("starting the snapshot read transaction"))?;
            let commit = read_commit(conn).map_err(sql("reading the commit counter"))?;
            let page_size: i64 = conn
                .query_row("PRAGMA page_size", [], |r| r.get(0))
                .map_err(sql("reading page_size"))?;
            let mut mem =
                Connection::open_in_memory().map_err(sql("opening the snapshot buffer"))?;
            mem.execute_batch(&format!("PRAGMA page_size = {page_size}"))
                .map_err(sql("setting the snapshot page size"))?;
            {
                let backup = rusqlite::backup::Backup::new(conn, &mut mem)
                    .map_err(sql("starting the backup"))?;
                backup
                    .run_to_completion(i32::MAX, std::time::Duration::ZERO, None)
                    .map_err(sql("copying the database"))?;
            }
            let data = mem
                .serialize(MAIN_DB)
                .map_err(sql("serializing the snapshot"))?;
            Ok(Snapshot::from_bytes(data.to_vec(), commit))
        })();
        let end = conn
            .execute_batch("COMMIT")
            .map_err(sql("ending the snapshot read transaction"));
        let snap = result?;
        end?;
        Ok(snap)
    }

    /// Wraps an existing database image (normalized to rollback-journal mode).
    pub fn from_bytes(mut bytes: Vec<u8>, commit: u64) -> Snapshot {
        if bytes.len() >= 100 && bytes[..16] == SQLITE_MAGIC[..] {
            bytes[18] = 1;
            bytes[19] = 1;
        }
        Snapshot { bytes, commit }
    }

    /// The commit counter contained in this snapshot.
    pub fn commit(&self) -> u64 {
        self.commit
    }

    /// Uncompressed size in bytes.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// True for a zero-byte image (never shippable).
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The uncompressed image.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Checks the image looks like an SQLite database.
    pub(crate) fn check(&self, org: &str) -> Result<(), Error> {
        if self.bytes.len() < 512 || self.bytes[..16] != SQLITE_MAGIC[..] {
            return Err(Error::InvalidSnapshot {
                org: org.into(),
                reason: "not an sqlite database image".into(),
            });
        }
        Ok(())
    }
}

/// A packed blob: header + zstd frame, plus the digest of the uncompressed bytes.
pub(crate) struct Packed {
    pub(crate) blob: Vec<u8>,
    pub(crate) sha256: String,
    pub(crate) bytes: u64,
}

/// Hashes and compresses uncompressed bytes (an image or a delta body) into a blob.
pub(crate) fn pack(bytes: &[u8], level: i32) -> Result<Packed, Error> {
    let sha256 = hex::encode(Sha256::digest(bytes));
    let mut blob = blob_header().to_vec();
    let mut enc = zstd::stream::Encoder::new(&mut blob, level)
        .map_err(|e| Error::io(Path::new("<zstd>"), e))?;
    enc.write_all(bytes)
        .map_err(|e| Error::io(Path::new("<zstd>"), e))?;
    enc.finish()
        .map_err(|e| Error::io(Path::new("<zstd>"), e))?;
    Ok(Packed {
        blob,
        sha256,
        bytes: bytes.len() as u64,
    })
}

/// Unpacks a blob and checks its size and sha256 against the log entry (I10).
pub(crate) fn unpack(
    object: &str,
    blob: &[u8],
    bytes: u64,
    sha256: &str,
) -> Result<Vec<u8>, Error> {
    let frame = blob_body(object, blob)?;
    let cap = usize::try_from(bytes).map_err(|_| corrupt(object, "size does not fit in memory"))?;
    // The log's size field is not trusted for allocation: a corrupt entry claiming terabytes
    // would abort the process (allocation failure is not a panic). Preallocate at most what a
    // generous compression ratio allows; the copy below grows as needed up to `bytes + 1`.
    let mut out = Vec::with_capacity(cap.min(frame.len().saturating_mul(16)));
    let mut dec = zstd::stream::read::Decoder::new(frame).map_err(|e| corrupt(object, e))?;
    // Read at most one byte more than expected so a bloated blob cannot exhaust memory.
    std::io::copy(
        &mut std::io::Read::take(&mut dec, bytes.saturating_add(1)),
        &mut out,
    )
    .map_err(|e| corrupt(object, format!("zstd: {e}")))?;
    if out.len() as u64 != bytes {
        return Err(corrupt(
            object,
            format!("{} bytes after decompression, log says {bytes}", out.len()),
        ));
    }
    let got = hex::encode(Sha256::digest(&out));
    if got != sha256 {
        return Err(corrupt(
            object,
            format!("sha256 {got} does not match log {sha256}"),
        ));
    }
    Ok(out)
}

/// Runs `PRAGMA <check>` on an open database; anything but `ok` is corruption.
pub(crate) fn sqlite_check(conn: &Connection, check: &str, what: &str) -> Result<(), Error> {
    let mut stmt = conn
        .prepare(&format!("PRAGMA {check}"))
        .map_err(|e| corrupt(what, format!("{check}: {e}")))?;
    let rows: Vec<String> = stmt
        .query_map([], |r| r.get::<_, String>(0))
        .and_then(|it| it.collect())
        .map_err(|e| corrupt(what, format!("{check}: {e}")))?;
    if rows.len() == 1 && rows[0] == "ok" {
        Ok(())
    } else {
        Err(corrupt(what, format!("{check}: {}", rows.join("; "))))
    }
}

/// Full `integrity_check` of an image in memory (no files).
pub(crate) fn integrity_check_image(what: &str, image: &[u8]) -> Result<(), Error> {
    let mut conn = Connection::open_in_memory().map_err(|source| Error::Sqlite {
        op: "opening a check buffer",
        source,
    })?;
    conn.deserialize_read_exact(MAIN_DB, image, image.len(), true)
        .map_err(|e| corrupt(what, format!("deserialize: {e}")))?;
    sqlite_check(&conn, "integrity_check", what)
}

/// Sidecar files SQLite keeps next to a database.
pub(crate) fn sidecars(dest: &Path) -> Vec<std::path::PathBuf> {
    ["-wal", "-shm", "-journal"]
        .iter()
        .map(|s| {
            let mut p = dest.as_os_str().to_owned();
            p.push(s);
            std::path::PathBuf::from(p)
        })
        .collect()
}

fn remove_if_exists(p: &Path) -> Result<(), Error> {
    match std::fs::remove_file(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(p, e)),
    }
}

/// Removes `dest` and its sidecars: the local file is a cache, never an authority (I8).
pub(crate) fn remove_db(dest: &Path) -> Result<(), Error> {
    for s in sidecars(dest) {
        remove_if_exists(&s)?;
    }
    remove_if_exists(dest)
}

fn sync_dir(dir: &Path) -> Result<(), Error> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(dir, e))
}

/// Atomically installs a verified image at `dest`: temp file in dest's directory, fsync,
/// `quick_check` on the temp file, remove stale sidecars, rename, fsync the directory.
/// On any failure nothing is installed and the temp file is removed (I10).
pub(crate) fn install(object: &str, image: &[u8], dest: &Path, nonce: &str) -> Result<(), Error> {
    let dir = match dest.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let name = dest
        .file_name()
        .ok_or_else(|| Error::io(dest, std::io::Error::other("destination has no file name")))?;
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let tmp = dir.join(format!(".{}.hydrate-{nonce}", name.to_string_lossy()));
    let result = (|| {
        let mut f = std::fs::File::create_new(&tmp).map_err(|e| Error::io(&tmp, e))?;
        f.write_all(image).map_err(|e| Error::io(&tmp, e))?;
        f.sync_all().map_err(|e| Error::io(&tmp, e))?;
        drop(f);
        {
            let conn =
                Connection::open_with_flags(&tmp, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
                    .map_err(|e| corrupt(object, format!("open: {e}")))?;
            sqlite_check(&conn, "quick_check", object)?;
        }
        for s in sidecars(&tmp) {
            remove_if_exists(&s)?;
        }
        for s in sidecars(dest) {
            remove_if_exists(&s)?;
        }
        std::fs::rename(&tmp, dest).map_err(|e| Error::io(dest, e))?;
        sync_dir(&dir)
    })();
    if result.is_err() {
        let _ = remove_if_exists(&tmp);
        for s in sidecars(&tmp) {
            let _ = remove_if_exists(&s);
        }
    }
    result
}
