//! The stored row of an idempotency key and the read-only check [`applied`].

use rusqlite::{Connection, OptionalExtension, Row};

use crate::error::optional_missing;
use crate::schema::{self, Meta};
use crate::{Error, key::validate_key};

/// The stored state of one idempotency key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The idempotency key.
    pub key: String,
    /// The stored result of the run that applied the key; `None` while only failed attempts
    /// are recorded. An empty result is `Some(vec![])`, never `None` (I3).
    pub result: Option<Vec<u8>>,
    /// The round of the run that applied the key, or of the last failed attempt.
    pub round: u64,
    /// When the key was applied, in milliseconds since the Unix epoch.
    pub applied_at_ms: Option<u64>,
    /// The request fingerprint stored with the applied key.
    pub fingerprint: Option<Vec<u8>>,
    /// Failed attempts counted for this key (I5).
    pub attempts: u32,
    /// Text of the last failed attempt's error.
    pub last_error: Option<String>,
    /// When the last failed attempt was recorded, in milliseconds since the Unix epoch.
    pub last_error_at_ms: Option<u64>,
}

impl Record {
    /// True when the key's effect is committed.
    pub fn is_applied(&self) -> bool {
        self.result.is_some()
    }
}

/// The whole stored row, as the I9 re-read compares it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KeyRow {
    pub applied: bool,
    pub round: i64,
    pub attempt: Vec<u8>,
    pub at_ms: i64,
    pub result: Option<Vec<u8>>,
    pub fingerprint: Option<Vec<u8>>,
    pub attempts: i64,
    pub last_error: Option<String>,
}

pub(crate) const SELECT_ROW: &str = "SELECT applied, round, attempt, at_ms, result, fingerprint, \
     attempts, last_error FROM idem_keys WHERE key = ?1";

impl KeyRow {
    /// Reads the eight row columns starting at column `at`; `None` for the NULLs of a
    /// LEFT JOIN that found no row.
    pub(crate) fn from_row_at(r: &Row<'_>, at: usize) -> rusqlite::Result<Option<Self>> {
        let Some(applied) = r.get::<_, Option<i64>>(at)? else {
            return Ok(None);
        };
        let applied = applied != 0;
        let result: Option<Vec<u8>> = r.get(at + 4)?;
        Ok(Some(KeyRow {
            applied,
            round: r.get(at + 1)?,
            attempt: r.get(at + 2)?,
            at_ms: r.get(at + 3)?,
            // An applied row always has a result: SQLite returns a zero-length BLOB as an
            // empty Vec, and the column is written as a BLOB, so empty stays empty.
            result: if applied {
                Some(result.unwrap_or_default())
            } else {
                None
            },
            fingerprint: r.get(at + 5)?,
            attempts: r.get(at + 6)?,
            last_error: r.get(at + 7)?,
        }))
    }

    pub(crate) fn read(conn: &Connection, key: &str) -> Result<Option<KeyRow>, Error> {
        let row = conn
            .prepare_cached(SELECT_ROW)
            .and_then(|mut s| s.query_row([key], |r| KeyRow::from_row_at(r, 0)).optional());
        Ok(optional_missing(row)?.flatten())
    }

    pub(crate) fn into_record(self, key: &str) -> Record {
        let at = u64::try_from(self.at_ms).unwrap_or(0);
        Record {
            key: key.to_owned(),
            round: u64::try_from(self.round).unwrap_or(0),
            applied_at_ms: self.applied.then_some(at),
            last_error_at_ms: (!self.applied && self.attempts > 0).then_some(at),
            result: self.result,
            fingerprint: self.fingerprint,
            attempts: u32::try_from(self.attempts).unwrap_or(u32::MAX),
            last_error: self.last_error,
        }
    }
}

/// Reads, inside the caller's write transaction, the schema version, the highest round and
/// the key's row; creates the schema first if it is absent.
///
/// Two statements rather than one join: a single `(SELECT 1) LEFT JOIN idem_keys ... = ?1`
/// was re-prepared by SQLite on every bind (measured with `SQLITE_STMTSTATUS_REPREPARE`),
/// which cost more than the second statement.
///
/// # Errors
/// [`Error::SchemaTooNew`] for a database of a newer idem; [`Error::Sqlite`] otherwise.
pub(crate) fn state_in_tx(conn: &Connection, key: &str) -> Result<(Meta, Option<KeyRow>), Error> {
    let meta = schema::meta_in_tx(conn)?;
    Ok((meta, KeyRow::read(conn, key)?))
}

/// Reads the stored record of `key` without writing: `Some` once the key was applied or a
/// failed attempt was counted, `None` otherwise (also when the schema does not exist yet).
///
/// # Errors
/// [`Error::InvalidKey`] for a bad key; [`Error::Sqlite`] on a SQLite failure.
pub fn applied(conn: &Connection, key: &str) -> Result<Option<Record>, Error> {
    validate_key(key)?;
    Ok(KeyRow::read(conn, key)?.map(|r| r.into_record(key)))
}
