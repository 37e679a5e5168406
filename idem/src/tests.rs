//! Unit tests that span several modules (the write path: `once` over the record and schema
//! statements), kept here so no module's tests import a module that imports it.

use rusqlite::Connection;

use crate::{Error, record, schema};

#[test]
fn the_write_path_statements_are_prepared_once_and_never_re_prepared() -> Result<(), Error> {
    // Regression guard: a one-statement LEFT JOIN form of the state read was re-prepared
    // by SQLite on every call (STAT4 build), about a quarter of once's CPU.
    let dir = tempfile::tempdir().map_err(|e| Error::Random {
        reason: e.to_string(),
    })?;
    let mut conn = Connection::open(dir.path().join("t.db"))?;
    conn.execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE e (k TEXT)")?;
    for i in 0..50 {
        let key = format!("k{i}");
        crate::once(&mut conn, &key, 1, |tx| {
            tx.execute("INSERT INTO e VALUES (?1)", [&key])?;
            Ok::<_, rusqlite::Error>(vec![])
        })?;
    }
    for sql in [schema::SELECT_META, record::SELECT_ROW] {
        let stmt = conn.prepare_cached(sql)?;
        assert_eq!(stmt.get_status(rusqlite::StatementStatus::Run), 50, "{sql}");
        assert_eq!(
            stmt.get_status(rusqlite::StatementStatus::RePrepare),
            0,
            "{sql}"
        );
    }
    Ok(())
}
