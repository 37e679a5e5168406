//! The stored row of an effect key (`idem_effects`) and the statements that read and move it.

use rusqlite::types::ToSql;
use rusqlite::{Connection, OptionalExtension, Row};

use crate::Error;
use crate::error::is_missing_table;
use crate::schema::CREATE_EFFECTS;

pub(crate) use super::state::State;

/// The whole stored row of an effect key. Two values are equal only when every column is: the
/// commit-unknown re-read compares rows this way, never by attempt id alone (I9).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Effect {
    /// The effect key (1–255 bytes, compared byte for byte).
    pub key: String,
    /// Its state.
    pub state: State,
    /// The attempt id of the reservation that wrote the row (random unless the caller fixed it).
    pub attempt: Vec<u8>,
    /// The reservation's lease expiry, in milliseconds since the Unix epoch.
    pub lease_until_ms: u64,
    /// The executor's result (COMMITTED); an empty result stays `Some(vec![])`. `None` on a
    /// COMMITTED row means it executed but its result was not kept (larger than
    /// [`super::Options::max_result_bytes`]); `error` says so.
    pub result: Option<Vec<u8>>,
    /// Why the row is FAILED (the executor's proof of non-execution) or AMBIGUOUS, or why a
    /// COMMITTED row's result was not kept. A resolution clears it (the history keeps it).
    pub error: Option<String>,
    /// When the current reservation was made, in ms since the Unix epoch.
    pub created_ms: u64,
    /// When the row last changed, in ms since the Unix epoch.
    pub updated_ms: u64,
    /// How many reservations the key has had (1 + re-reservations after FAILED).
    pub attempts: u32,
    /// The holder label of the reservation (writer id, host), if the caller gave one (the org
    /// layer always names its writer).
    pub holder: Option<String>,
    /// Who resolved an AMBIGUOUS row (operator or reconcile hook). A new reservation after a
    /// resolution clears it; [`super::history`] keeps every resolution.
    pub resolved_by: Option<String>,
}

impl Effect {
    /// The attempt id in lowercase hex, as shown to operators.
    pub fn attempt_hex(&self) -> String {
        self.attempt.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Who holds the reservation: the holder label, else `attempt <id in hex>`.
    pub fn holder_or_attempt(&self) -> String {
        self.holder
            .clone()
            .unwrap_or_else(|| format!("attempt {}", self.attempt_hex()))
    }

    /// True for a COMMITTED row whose result was not kept (see [`Effect::result`]).
    pub fn result_not_kept(&self) -> bool {
        self.state == State::Committed && self.result.is_none()
    }
}

/// Why a reservation turned AMBIGUOUS when its lease lapsed at `at_ms` (names the holder once).
pub(crate) fn lapse_reason(row: &Effect, at_ms: u64) -> String {
    format!(
        "the lease of {} lapsed at {} before it settled",
        row.holder_or_attempt(),
        crate::error::rfc3339(at_ms)
    )
}

const COLUMNS: &str = "key, state, attempt, lease_until_ms, result, error, created_ms, \
     updated_ms, attempts, holder, resolved_by";

pub(crate) fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

pub(crate) fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn from_row(r: &Row<'_>) -> rusqlite::Result<Effect> {
    let state: State = r.get(1)?;
    let result: Option<Vec<u8>> = r.get(4)?;
    let error: Option<String> = r.get(5)?;
    Ok(Effect {
        key: r.get(0)?,
        state,
        attempt: r.get(2)?,
        lease_until_ms: to_u64(r.get(3)?),
        // A committed row carries a result (a zero-length BLOB reads back as empty), unless it
        // says why it was not kept.
        result: match (state, result) {
            (State::Committed, None) if error.is_none() => Some(Vec::new()),
            (_, result) => result,
        },
        error,
        created_ms: to_u64(r.get(6)?),
        updated_ms: to_u64(r.get(7)?),
        attempts: u32::try_from(r.get::<_, i64>(8)?).unwrap_or(u32::MAX),
        holder: r.get(9)?,
        resolved_by: r.get(10)?,
    })
}

/// Reads the row of `key`; `None` when absent or when the table does not exist yet.
pub(crate) fn read(conn: &Connection, key: &str) -> Result<Option<Effect>, Error> {
    let sql = format!("SELECT {COLUMNS} FROM idem_effects WHERE key = ?1");
    match conn
        .prepare_cached(&sql)
        .and_then(|mut s| s.query_row([key], from_row).optional())
    {
        Ok(v) => Ok(v),
        Err(e) if is_missing_table(&e) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Reads the row inside a write transaction, creating the table first if this database
/// predates it (the migration path of schema version 1 databases).
pub(crate) fn read_for_write(conn: &Connection, key: &str) -> Result<Option<Effect>, Error> {
    let sql = format!("SELECT {COLUMNS} FROM idem_effects WHERE key = ?1");
    let read = || {
        conn.prepare_cached(&sql)
            .and_then(|mut s| s.query_row([key], from_row).optional())
    };
    match read() {
        Ok(v) => Ok(v),
        Err(e) if is_missing_table(&e) => {
            conn.execute_batch(CREATE_EFFECTS)?;
            Ok(read()?)
        }
        Err(e) => Err(e.into()),
    }
}

/// Every row, or those in `state`, in key order. RESERVED and AMBIGUOUS rows are read
/// through the partial index of open rows when it exists (`idem_effects_open`).
pub(crate) fn list(conn: &Connection, state: Option<State>) -> Result<Vec<Effect>, Error> {
    let sql = match state {
        None => format!("SELECT {COLUMNS} FROM idem_effects ORDER BY key"),
        Some(State::Reserved | State::Ambiguous) => format!(
            "SELECT {COLUMNS} FROM idem_effects \
             WHERE state IN ('reserved', 'ambiguous') AND state = ?1 ORDER BY key"
        ),
        Some(_) => format!("SELECT {COLUMNS} FROM idem_effects WHERE state = ?1 ORDER BY key"),
    };
    let rows = conn.prepare_cached(&sql).and_then(|mut s| {
        match state {
            None => s.query_map([], from_row)?,
            Some(st) => s.query_map([st], from_row)?,
        }
        .collect::<rusqlite::Result<Vec<_>>>()
    });
    match rows {
        Ok(v) => Ok(v),
        Err(e) if is_missing_table(&e) => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

/// Every RESERVED and AMBIGUOUS row, in key order (through the partial index of open rows).
pub(crate) fn list_open(conn: &Connection) -> Result<Vec<Effect>, Error> {
    let sql = format!(
        "SELECT {COLUMNS} FROM idem_effects WHERE state IN ('reserved', 'ambiguous') ORDER BY key"
    );
    let rows = conn.prepare_cached(&sql).and_then(|mut s| {
        s.query_map([], from_row)?
            .collect::<rusqlite::Result<Vec<_>>>()
    });
    match rows {
        Ok(v) => Ok(v),
        Err(e) if is_missing_table(&e) => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

/// Writes `to` where the row must be `from`: an INSERT when `from` is `None` (fails if a row
/// exists), else a conditional UPDATE matching `from`'s state, attempt id and stamps. Returns
/// the changed-row count.
pub(crate) fn write(
    conn: &Connection,
    from: Option<&Effect>,
    to: &Effect,
) -> rusqlite::Result<usize> {
    let new = rusqlite::params![
        to.key,
        to.state,
        to.attempt,
        to_i64(to.lease_until_ms),
        to.result,
        to.error,
        to_i64(to.created_ms),
        to_i64(to.updated_ms),
        i64::from(to.attempts),
        to.holder,
        to.resolved_by,
    ];
    let Some(from) = from else {
        let sql = format!(
            "INSERT INTO idem_effects ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, \
             ?10, ?11)"
        );
        return conn.prepare_cached(&sql)?.execute(new);
    };
    let mut params: Vec<&dyn ToSql> = new.to_vec();
    let old_updated = to_i64(from.updated_ms);
    let old_created = to_i64(from.created_ms);
    let old_attempts = i64::from(from.attempts);
    params.extend_from_slice(&[
        &from.state as &dyn ToSql,
        &from.attempt,
        &old_created,
        &old_updated,
        &old_attempts,
    ]);
    conn.prepare_cached(
        "UPDATE idem_effects SET state = ?2, attempt = ?3, lease_until_ms = ?4, result = ?5,
           error = ?6, created_ms = ?7, updated_ms = ?8, attempts = ?9, holder = ?10,
           resolved_by = ?11
         WHERE key = ?1 AND state = ?12 AND attempt = ?13 AND created_ms = ?14
           AND updated_ms = ?15 AND attempts = ?16",
    )?
    .execute(params.as_slice())
}
