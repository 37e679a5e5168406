//! The dedup table and its schema version.
//!
//! `idem_keys` is a WITHOUT ROWID table keyed by the idempotency key (BINARY collation), so a
//! key row lives in exactly one B-tree: inserting it dirties about one leaf page, which keeps the
//! dedup row's cost to about one extra WAL page per request. `idem_meta` holds the schema version
//! and the highest round that wrote the database (for the stale-round check).

use rusqlite::{Connection, OptionalExtension};

use crate::Error;
use crate::error::is_missing_table;

/// The schema version this library writes and understands.
pub const SCHEMA_VERSION: i64 = 1;

const CREATE: &str = "
CREATE TABLE IF NOT EXISTS idem_meta (
    name  TEXT PRIMARY KEY NOT NULL,
    value INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS idem_keys (
    key         TEXT PRIMARY KEY NOT NULL COLLATE BINARY,
    applied     INTEGER NOT NULL,
    round       INTEGER NOT NULL,
    attempt     BLOB NOT NULL,
    at_ms       INTEGER NOT NULL,
    result      BLOB,
    fingerprint BLOB,
    attempts    INTEGER NOT NULL,
    last_error  TEXT
) WITHOUT ROWID;
INSERT OR IGNORE INTO idem_meta (name, value) VALUES ('schema_version', 1), ('max_round', 0);
";

/// The external-effect reservations (`crate::effect`), with their audit trail in the row, and
/// the index of the rows still open. Adding them keeps schema version 1: older libraries
/// ignore the table, the `history` column and the index, and a version 1 database that
/// predates any of them gets them at its first effect write (the table when it is missing;
/// the column and the index by [`MIGRATE_EFFECTS`] when the history append finds no column).
/// A version bump would make every older library refuse the database, so a rolling upgrade
/// could not run old and new writers side by side.
///
/// `history` is a JSON array, one object per transition (who, when, what), appended by the
/// transition's own transaction to the row it writes — the same B-tree page, so the audit
/// trail costs no page of its own. Its entries begin at the first transition a library with
/// the column made.
///
/// `idem_effects_open` indexes only RESERVED and AMBIGUOUS rows (a partial index), so
/// listing and counting what needs attention costs what is open, not what ever ran.
pub(crate) const CREATE_EFFECTS: &str = "
CREATE TABLE IF NOT EXISTS idem_effects (
    key            TEXT PRIMARY KEY NOT NULL COLLATE BINARY,
    state          TEXT NOT NULL,
    attempt        BLOB NOT NULL,
    lease_until_ms INTEGER NOT NULL,
    result         BLOB,
    error          TEXT,
    created_ms     INTEGER NOT NULL,
    updated_ms     INTEGER NOT NULL,
    attempts       INTEGER NOT NULL,
    holder         TEXT,
    resolved_by    TEXT,
    history        TEXT
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idem_effects_open ON idem_effects (state)
    WHERE state IN ('reserved', 'ambiguous');
";

/// Brings an `idem_effects` table of an earlier version up to [`CREATE_EFFECTS`]: the
/// `history` column (an O(1) schema change in SQLite: no row is rewritten) and the index.
pub(crate) const MIGRATE_EFFECTS: &str = "
ALTER TABLE idem_effects ADD COLUMN history TEXT;
CREATE INDEX IF NOT EXISTS idem_effects_open ON idem_effects (state)
    WHERE state IN ('reserved', 'ambiguous');
";

/// Schema facts read inside a write transaction.
pub(crate) struct Meta {
    pub max_round: u64,
}

/// Creates the dedup tables if missing and records the schema version. Safe to call repeatedly
/// and from several processes; inside an open transaction it runs in a savepoint of it.
///
/// `once` calls this itself, so callers rarely need to.
///
/// # Errors
/// [`Error::SchemaTooNew`] if the database was written by a newer idem; [`Error::Sqlite`] on
/// any SQLite failure (for example `SQLITE_BUSY` after the busy timeout).
pub fn ensure_schema(conn: &Connection) -> Result<(), Error> {
    if let Some(found) = schema_version(conn)? {
        return check_version(found);
    }
    if conn.is_autocommit() {
        conn.execute_batch("BEGIN IMMEDIATE")?;
        let created = create_in_tx(conn);
        let end = if created.is_ok() {
            "COMMIT"
        } else {
            "ROLLBACK"
        };
        conn.execute_batch(end)?;
        created
    } else {
        conn.execute_batch("SAVEPOINT idem_schema")?;
        let created = create_in_tx(conn);
        conn.execute_batch(if created.is_ok() {
            "RELEASE idem_schema"
        } else {
            "ROLLBACK TO idem_schema; RELEASE idem_schema"
        })?;
        created
    }
}

fn create_in_tx(conn: &Connection) -> Result<(), Error> {
    conn.execute_batch(CREATE)?;
    conn.execute_batch(CREATE_EFFECTS)?;
    match schema_version(conn)? {
        Some(found) => check_version(found),
        None => Ok(()),
    }
}

fn check_version(found: i64) -> Result<(), Error> {
    if found > SCHEMA_VERSION {
        return Err(Error::SchemaTooNew {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    Ok(())
}

/// The recorded schema version, or `None` when the tables do not exist yet.
fn schema_version(conn: &Connection) -> Result<Option<i64>, Error> {
    let found = conn
        .prepare_cached("SELECT value FROM idem_meta WHERE name = 'schema_version'")
        .and_then(|mut s| s.query_row([], |r| r.get::<_, i64>(0)).optional());
    match found {
        Ok(v) => Ok(v),
        Err(e) if is_missing_table(&e) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

pub(crate) const SELECT_META: &str = "SELECT (SELECT value FROM idem_meta WHERE name = 'schema_version'), \
     (SELECT value FROM idem_meta WHERE name = 'max_round')";

/// Reads, inside the caller's write transaction, the schema version and the highest round
/// that wrote the database; creates the schema first if it is absent.
///
/// # Errors
/// [`Error::SchemaTooNew`] for a database of a newer idem; [`Error::Sqlite`] otherwise.
pub(crate) fn meta_in_tx(conn: &Connection) -> Result<Meta, Error> {
    let read = || -> rusqlite::Result<(Option<i64>, Option<i64>)> {
        conn.prepare_cached(SELECT_META)?
            .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))
    };
    let (version, max_round) = match read() {
        Ok(v) => v,
        Err(e) if is_missing_table(&e) => {
            create_in_tx(conn)?;
            read()?
        }
        Err(e) => return Err(e.into()),
    };
    check_version(version.unwrap_or(SCHEMA_VERSION))?;
    Ok(Meta {
        max_round: u64::try_from(max_round.unwrap_or(0)).unwrap_or(0),
    })
}

/// Records `round` as the highest round that wrote the database.
pub(crate) fn raise_max_round(conn: &Connection, round: i64) -> Result<(), Error> {
    conn.prepare_cached(
        "INSERT INTO idem_meta (name, value) VALUES ('max_round', ?1)
         ON CONFLICT(name) DO UPDATE SET value = excluded.value WHERE excluded.value > value",
    )?
    .execute([round])?;
    Ok(())
}

/// Forgets the highest round that wrote `conn`'s database, for a database that starts a new
/// history under new rounds (an existing idem database imported as a new org, whose first
/// writers claim rounds from 1 again). Applied keys and their results are kept. Never call it
/// on a database a writer of the current history may still write: the stale-round check (I7)
/// relies on the highest round only growing.
///
/// # Errors
/// [`Error::Sqlite`]; the schema must exist ([`ensure_schema`]).
pub fn restart_rounds(conn: &Connection) -> Result<(), Error> {
    conn.execute(
        "UPDATE idem_meta SET value = 0 WHERE name = 'max_round'",
        [],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ensure_schema_is_idempotent_and_refuses_newer() -> Result<(), Error> {
        let conn = Connection::open_in_memory()?;
        ensure_schema(&conn)?;
        ensure_schema(&conn)?;
        conn.execute(
            "UPDATE idem_meta SET value = ?1 WHERE name = 'schema_version'",
            [SCHEMA_VERSION + 1],
        )?;
        match ensure_schema(&conn) {
            Err(Error::SchemaTooNew { found, supported }) => {
                assert_eq!((found, supported), (SCHEMA_VERSION + 1, SCHEMA_VERSION));
                Ok(())
            }
            other => panic!("expected SchemaTooNew, got {other:?}"),
        }
    }

    #[test]
    fn ensure_schema_inside_a_transaction_uses_a_savepoint() -> Result<(), Error> {
        let mut conn = Connection::open_in_memory()?;
        let tx = conn.transaction()?;
        ensure_schema(&tx)?;
        tx.rollback()?;
        assert_eq!(
            schema_version(&conn)?,
            None,
            "rolled back with the caller's transaction"
        );
        Ok(())
    }
}
