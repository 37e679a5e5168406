//! The commit sequence: one number per org database that every write transaction raises in
//! the same transaction (`idem_org_commit.n`), so a captured state proves which commits it
//! holds (I6, I13) and a waiter knows which ship acknowledges it.
//!
//! Written in one place ([`bump`]), read in one place ([`read`]); the writer thread keeps the
//! last value it read or wrote in a [`CommitSeq`] that requests wait on.

use std::sync::atomic::{AtomicU64, Ordering};

use rusqlite::Connection;

/// The table: one row, `id` its rowid (0), `n` the sequence. The shape is what
/// `idem_replica::sqlite` reads back from captured pages; do not change it.
pub(crate) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS idem_org_commit (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    n  INTEGER NOT NULL
);
INSERT OR IGNORE INTO idem_org_commit (id, n) VALUES (0, 0);";

/// Reads the commit sequence (inside the caller's transaction, if any).
///
/// # Errors
/// SQLite's error (a database without the table included).
pub(crate) fn read(conn: &Connection) -> rusqlite::Result<u64> {
    let n: i64 = conn
        .prepare_cached("SELECT n FROM idem_org_commit WHERE id = 0")?
        .query_row([], |r| r.get(0))?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// Raises the commit sequence by one inside the caller's open transaction and returns it.
///
/// # Errors
/// SQLite's error; the caller's transaction then rolls back.
pub(crate) fn bump(conn: &Connection) -> rusqlite::Result<u64> {
    let n: i64 = conn
        .prepare_cached("UPDATE idem_org_commit SET n = n + 1 WHERE id = 0 RETURNING n")?
        .query_row([], |r| r.get(0))?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// The root page of the table: where captured pages hold the sequence.
///
/// # Errors
/// SQLite's error.
pub(crate) fn root_page(conn: &Connection) -> rusqlite::Result<u32> {
    conn.prepare_cached("SELECT rootpage FROM sqlite_schema WHERE name = 'idem_org_commit'")?
        .query_row([], |r| r.get(0))
}

/// The newest commit sequence the writer thread has seen in its database. Only raised, and
/// always before the reply of the job that raised it, so a waiter never waits for less than
/// it committed.
#[derive(Debug, Default)]
pub(crate) struct CommitSeq(AtomicU64);

impl CommitSeq {
    pub(crate) fn new(n: u64) -> CommitSeq {
        CommitSeq(AtomicU64::new(n))
    }

    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }

    /// Raises the value to `n` (never lowers it) and returns the value now.
    pub(crate) fn raise(&self, n: u64) -> u64 {
        self.0.fetch_max(n, Ordering::SeqCst).max(n)
    }
}

/// A job's answer and the commit sequence the caller must see shipped (and, for answers
/// that commit nothing, confirmed) before acknowledging it.
#[derive(Debug)]
pub(crate) struct Answer<T> {
    pub value: T,
    pub commit_seq: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bump_and_read_agree_and_the_sequence_only_rises() -> rusqlite::Result<()> {
        let mut conn = Connection::open_in_memory()?;
        conn.execute_batch(SCHEMA)?;
        assert_eq!(read(&conn)?, 0);
        let tx = conn.transaction()?;
        assert_eq!(bump(&tx)?, 1);
        tx.rollback()?;
        assert_eq!(read(&conn)?, 0, "a rolled-back bump is not a commit");
        let tx = conn.transaction()?;
        assert_eq!(bump(&tx)?, 1);
        tx.commit()?;
        assert_eq!(read(&conn)?, 1);
        assert!(root_page(&conn)? >= 2);
        let seq = CommitSeq::new(5);
        assert_eq!(seq.raise(3), 5);
        assert_eq!(seq.raise(9), 9);
        assert_eq!(seq.get(), 9);
        Ok(())
    }
}
