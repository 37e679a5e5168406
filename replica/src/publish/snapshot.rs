//! A consistent SQLite database image and the commit counter it holds: what a full ship
//! publishes (I6). Taking one is synchronous: call it on a blocking thread.

use rusqlite::{Connection, MAIN_DB};

use crate::Error;
use crate::format::pages;

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

    /// Wraps an existing database image holding the caller's commit counter `commit`,
    /// normalized to rollback-journal mode (header bytes 18–19 set to 1). The bytes are
    /// checked when shipped ([`crate::Replica::ship`]), not here.
    pub fn from_bytes(mut bytes: Vec<u8>, commit: u64) -> Snapshot {
        pages::canonical_page1(&mut bytes);
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

    /// The uncompressed image, taken.
    pub(crate) fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    /// Checks the image looks like an SQLite database of `org`: a header, and at least one
    /// page of the smallest size.
    pub(crate) fn check(&self, org: &str) -> Result<(), Error> {
        if self.bytes.len() < pages::MIN_PAGE_SIZE as usize || !pages::has_header(&self.bytes) {
            return Err(Error::InvalidSnapshot {
                org: org.into(),
                reason: "not an sqlite database image".into(),
            });
        }
        Ok(())
    }
}
