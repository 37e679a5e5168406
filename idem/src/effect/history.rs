//! The audit trail of an effect key: one entry per transition — who, when, what — appended to
//! the row's `history` column (a JSON array) by the transition's own transaction, so a row and
//! its history commit together or not at all, on the page the transition writes anyway.
//!
//! The row's other columns say where a key is now; the history says how it got there. A row
//! that is resolved keeps no error text of the state it left, and a key reserved again after
//! FAILED overwrites its columns — neither loses anything, because every earlier state is in
//! the history, which a transition only ever appends to.

use rusqlite::Connection;

use super::row::{State, to_i64, to_u64};
use crate::Error;
use crate::error::{is_missing_column, is_missing_table};
use crate::key::validate_key;
use crate::schema::MIGRATE_EFFECTS;

/// One recorded transition of an effect key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    /// The effect key.
    pub key: String,
    /// Position in the key's history: 1, 2, … in the order the transitions committed.
    pub seq: u64,
    /// When, in ms since the Unix epoch, by the clock of the writer that made it (for people;
    /// no decision compares it with another clock).
    pub at_ms: u64,
    /// The state the key entered.
    pub state: State,
    /// The attempt id of the reservation the row held then.
    pub attempt: Vec<u8>,
    /// Who: the reservation's holder (reserve, settle), the contender that found a lease
    /// lapsed, or the operator / reconcile hook that resolved it. `None` when the caller gave
    /// no name.
    pub actor: Option<String>,
    /// What: the lease of a reservation, the size of a result, the executor's error, why a
    /// lease lapsed, how it was resolved.
    pub detail: Option<String>,
}

/// One transition to append: the state entered, who made it, what it carried.
pub(crate) struct Entry {
    pub state: State,
    pub actor: Option<String>,
    pub detail: Option<String>,
}

const APPEND: &str = "UPDATE idem_effects SET history = json_insert(COALESCE(history, '[]'), \
     '$[#]', json_object('at', ?2, 'state', ?3, 'attempt', ?4, 'actor', ?5, 'detail', ?6)) \
     WHERE key = ?1";

/// Appends `entries` to the history of `key`'s row, stamped `at_ms` with `attempt`, inside
/// the caller's write transaction, right after the transition wrote the row. A table of an
/// earlier version gets its `history` column (and the open-rows index) here.
pub(crate) fn append(
    tx: &Connection,
    key: &str,
    at_ms: u64,
    attempt: &[u8],
    entries: &[Entry],
) -> rusqlite::Result<()> {
    let attempt: String = attempt.iter().map(|b| format!("{b:02x}")).collect();
    for entry in entries {
        let append = || {
            tx.prepare_cached(APPEND)?.execute(rusqlite::params![
                key,
                to_i64(at_ms),
                entry.state,
                attempt,
                entry.actor,
                entry.detail,
            ])
        };
        match append() {
            Ok(_) => {}
            Err(e) if is_missing_column(&e) => {
                tx.execute_batch(MIGRATE_EFFECTS)?;
                append()?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Every recorded transition of `key`, oldest first; empty when there is none (also for a
/// row, or a database, of a version without the history). Reads only.
///
/// # Errors
/// [`Error::InvalidKey`]; [`Error::Sqlite`].
pub fn history(conn: &Connection, key: &str) -> Result<Vec<Transition>, Error> {
    validate_key(key)?;
    let rows = conn
        .prepare_cached(
            "SELECT h.key, h.value ->> 'at', h.value ->> 'state', h.value ->> 'attempt', \
             h.value ->> 'actor', h.value ->> 'detail' \
             FROM idem_effects AS e, json_each(e.history) AS h WHERE e.key = ?1 ORDER BY h.key",
        )
        .and_then(|mut s| {
            s.query_map([key], |r| {
                let attempt: String = r.get(3)?;
                Ok(Transition {
                    key: key.to_owned(),
                    seq: to_u64(r.get(0)?).saturating_add(1),
                    at_ms: to_u64(r.get(1)?),
                    state: r.get(2)?,
                    attempt: from_hex(&attempt),
                    actor: r.get(4)?,
                    detail: r.get(5)?,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()
        });
    match rows {
        Ok(v) => Ok(v),
        Err(e) if is_missing_table(&e) || is_missing_column(&e) => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

/// Lowercase hex (as `append` writes it) to bytes; a malformed pair reads as 0.
fn from_hex(text: &str) -> Vec<u8> {
    text.as_bytes()
        .chunks(2)
        .map(|pair| {
            std::str::from_utf8(pair)
                .ok()
                .and_then(|p| u8::from_str_radix(p, 16).ok())
                .unwrap_or(0)
        })
        .collect()
}
