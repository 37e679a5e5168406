//! The commit counter: one number per database that every write transaction raises in the
//! same transaction (`idem_org_commit.n`), so a captured state proves from its own pages
//! which commits it holds (I6, I13) and a waiter knows which ship acknowledges it.
//!
//! This module is the counter's one owner: its table ([`SCHEMA`]), the one write
//! ([`bump`], inside the caller's transaction), the one read ([`read`]) and where its row
//! lives ([`root_page`]). [`crate::sqlite::Owned::capture`] takes the counter and its root
//! page from the connection it holds, so an embedder never hands them in, and the shipper
//! reads the same row back from the captured pages (`proof.rs`) before it acknowledges.
//! The table's name and shape are part of the stored format: do not change them.

use rusqlite::Connection;

/// The table: one row, `id` its rowid (0), `n` the sequence. Run it once in the database's
/// schema setup; it is idempotent.
pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS idem_org_commit (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    n  INTEGER NOT NULL
);
INSERT OR IGNORE INTO idem_org_commit (id, n) VALUES (0, 0);";

/// Reads the commit sequence (inside the caller's transaction, if any).
///
/// # Errors
/// SQLite's error (a database without the table included).
pub fn read(conn: &Connection) -> rusqlite::Result<u64> {
    let n: i64 = conn
        .prepare_cached("SELECT n FROM idem_org_commit WHERE id = 0")?
        .query_row([], |r| r.get(0))?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// Raises the commit sequence by one inside the caller's open transaction and returns it, so
/// the raise commits (or rolls back) with the transaction's writes (I1).
///
/// # Errors
/// SQLite's error; the caller's transaction then rolls back.
pub fn bump(conn: &Connection) -> rusqlite::Result<u64> {
    let n: i64 = conn
        .prepare_cached("UPDATE idem_org_commit SET n = n + 1 WHERE id = 0 RETURNING n")?
        .query_row([], |r| r.get(0))?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// The root page of the table: where captured pages hold the sequence (a page number,
/// 1-based).
///
/// # Errors
/// SQLite's error.
pub fn root_page(conn: &Connection) -> rusqlite::Result<u32> {
    conn.prepare_cached("SELECT rootpage FROM sqlite_schema WHERE name = 'idem_org_commit'")?
        .query_row([], |r| r.get(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bump_and_read_agree_and_a_rolled_back_bump_is_not_a_commit() -> rusqlite::Result<()> {
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
        Ok(())
    }
}
