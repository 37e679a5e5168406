//! The audit trail of effect keys (`idem_effect_history`): one row per transition — who, when,
//! what — appended in the transition's own transaction, so a row and its history commit
//! together or not at all.
//!
//! The effect row says where a key is now; the history says how it got there. A row that is
//! resolved keeps no error text of the state it left, and a key reserved again after FAILED
//! overwrites its row — neither loses anything, because every earlier state is here.

use rusqlite::Connection;

use super::row::{Effect, State, to_i64, to_u64};
use crate::Error;
use crate::key::validate_key;
use crate::schema::{CREATE_EFFECTS, is_missing_table};

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

const INSERT: &str = "INSERT INTO idem_effect_history (key, seq, at_ms, state, attempt, actor, \
     detail) VALUES (?1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM idem_effect_history WHERE key = ?1), \
     ?2, ?3, ?4, ?5, ?6)";

/// Appends `entries` for `row` (the row as the transition writes it: its key, attempt and
/// `updated_ms` stamp every entry), inside the caller's write transaction. A database whose
/// effects table predates the history gets the history table here (see `CREATE_EFFECTS`).
pub(crate) fn append(tx: &Connection, row: &Effect, entries: &[Entry]) -> rusqlite::Result<()> {
    for entry in entries {
        let insert = || {
            tx.prepare_cached(INSERT)?.execute(rusqlite::params![
                row.key,
                to_i64(row.updated_ms),
                entry.state,
                row.attempt,
                entry.actor,
                entry.detail,
            ])
        };
        match insert() {
            Ok(_) => {}
            Err(e) if is_missing_table(&e) => {
                tx.execute_batch(CREATE_EFFECTS)?;
                insert()?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Every recorded transition of `key`, oldest first; empty when there is none (also when the
/// database has no history table yet). Reads only.
///
/// # Errors
/// [`Error::InvalidKey`]; [`Error::Sqlite`].
pub fn history(conn: &Connection, key: &str) -> Result<Vec<Transition>, Error> {
    validate_key(key)?;
    let rows = conn
        .prepare_cached(
            "SELECT key, seq, at_ms, state, attempt, actor, detail FROM idem_effect_history \
             WHERE key = ?1 ORDER BY seq",
        )
        .and_then(|mut s| {
            s.query_map([key], |r| {
                Ok(Transition {
                    key: r.get(0)?,
                    seq: to_u64(r.get(1)?),
                    at_ms: to_u64(r.get(2)?),
                    state: r.get(3)?,
                    attempt: r.get(4)?,
                    actor: r.get(5)?,
                    detail: r.get(6)?,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()
        });
    match rows {
        Ok(v) => Ok(v),
        Err(e) if is_missing_table(&e) => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}
