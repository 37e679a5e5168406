//! Settling a reservation, and [`run`]: reserve → execute → settle in one call.
//!
//! ```text
//! BEGIN IMMEDIATE -> UPDATE ... WHERE the row is exactly our reservation -> changed rows?
//!   0 -> re-read: already our target -> done; anything else -> EffectLost (reported)
//!   1 -> COMMIT: ok -> done; busy in band -> retry
//!        unknown -> re-read the whole row: our target -> done;
//!                   still our reservation -> re-issue the same UPDATE once; other -> EffectLost
//! ```

use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};

use rusqlite::Connection;

use super::history::{self, Entry};
use super::options::Options;
use super::output::Output;
use super::reserve::{Reservation, Reserved, ambiguous, reserve};
use super::row::{self, Effect, State};
use super::write::{BUSY_RETRIES, Ended, begin, busy, commit, reread};
use crate::error::BoxError;
use crate::failpoint::Write;
use idem_base::ErrorChain;

/// How an attempt's executor ended, as [`settle`] records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Settlement {
    /// It executed and returned this result → COMMITTED.
    Executed(Vec<u8>),
    /// It proved it did not execute (for example the API refused the request before acting)
    /// → FAILED; the key may be reserved again. The text is stored.
    NotExecuted(String),
    /// Anything else — an error that does not prove non-execution, a panic, a timeout —
    /// → AMBIGUOUS. The text is stored.
    Ambiguous(String),
}

/// The error an executor returns. Only [`Error::NotExecuted`] lets the key be retried:
/// return it only when the effect provably did not happen.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The effect provably did not happen → FAILED, retryable.
    #[error("effect not executed")]
    NotExecuted(#[source] BoxError),
    /// The effect may or may not have happened → AMBIGUOUS.
    #[error("effect outcome unknown")]
    Ambiguous(#[source] BoxError),
}

impl Error {
    /// The effect provably did not happen.
    pub fn not_executed(e: impl Into<BoxError>) -> Self {
        Error::NotExecuted(e.into())
    }

    /// The effect's outcome is unknown.
    pub fn ambiguous(e: impl Into<BoxError>) -> Self {
        Error::Ambiguous(e.into())
    }

    /// The settlement that records this error: [`Settlement::NotExecuted`] or
    /// [`Settlement::Ambiguous`], with the error and its sources as the stored text.
    pub fn settlement(&self) -> Settlement {
        match self {
            Error::NotExecuted(e) => Settlement::NotExecuted(ErrorChain::new(&**e).to_string()),
            Error::Ambiguous(e) => Settlement::Ambiguous(ErrorChain::new(&**e).to_string()),
        }
    }
}

/// What [`run`] returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The effect key.
    pub key: String,
    /// The executor's result, byte-identical on every replay.
    pub result: Vec<u8>,
    /// True when this call ran the executor; false for a replay.
    pub executed: bool,
}

/// Records how `reservation`'s executor ended and returns the row as written.
///
/// The write is a conditional UPDATE matching the reservation's state, attempt id and stamps,
/// with the changed-row count checked; a COMMIT with an unknown outcome is settled by a
/// whole-row re-read, and an unchanged row gets the same UPDATE once more (I9). The
/// transition's history entry (who: the holder; what: the result's size or the error) commits
/// with it.
///
/// A result larger than [`Options::max_result_bytes`] is checked before anything is written:
/// the row becomes COMMITTED without it (executed, never run again; the reason stored) and
/// the call gets [`crate::Error::EffectResultNotKept`] carrying the result.
///
/// # Errors
/// - [`crate::Error::EffectNotRecorded`] for an [`Settlement::Executed`] that was not written,
///   carrying the result and, as its source, why (any of the errors below): the executor ran,
///   and the caller still has what it returned.
/// - [`crate::Error::EffectResultNotKept`]: recorded as executed, without the result.
/// - [`crate::Error::EffectLost`]: the row is no longer this reservation (a contender found
///   the lease lapsed and made it AMBIGUOUS, or an operator resolved it); nothing written.
/// - [`crate::Error::Busy`], [`crate::Error::EffectCommitFailed`]: nothing written; the key
///   stays RESERVED and turns AMBIGUOUS when the lease lapses unless a later settle lands.
/// - [`crate::Error::EffectCommitUnknown`]: the re-read failed; nothing more written.
/// - [`crate::Error::InTransaction`], [`crate::Error::Sqlite`].
pub fn settle(
    conn: &mut Connection,
    reservation: &Reservation,
    settlement: Settlement,
    opts: &Options,
) -> Result<Effect, crate::Error> {
    let from = &reservation.row;
    let now = opts.now();
    let holder = from.holder.clone();
    let entry = |state: State, detail: String| Entry {
        state,
        actor: holder.clone(),
        detail: Some(detail),
    };
    let (to, log) = match &settlement {
        Settlement::Executed(result) if result.len() > opts.max_result() => {
            let reason = format!(
                "result of {} bytes exceeds the limit of {} bytes",
                result.len(),
                opts.max_result()
            );
            let to = Effect {
                state: State::Committed,
                result: None,
                error: Some(reason.clone()),
                updated_ms: now,
                ..from.clone()
            };
            (
                to,
                entry(State::Committed, format!("executed; {reason}: not kept")),
            )
        }
        Settlement::Executed(result) => {
            let to = Effect {
                state: State::Committed,
                result: Some(result.clone()),
                updated_ms: now,
                ..from.clone()
            };
            let detail = format!("executed: {} bytes of result", result.len());
            (to, entry(State::Committed, detail))
        }
        Settlement::NotExecuted(text) => {
            let to = Effect {
                state: State::Failed,
                error: Some(text.clone()),
                updated_ms: now,
                ..from.clone()
            };
            (to, entry(State::Failed, format!("not executed: {text}")))
        }
        Settlement::Ambiguous(text) => {
            let to = Effect {
                state: State::Ambiguous,
                error: Some(text.clone()),
                updated_ms: now,
                ..from.clone()
            };
            (
                to,
                entry(State::Ambiguous, format!("outcome unknown: {text}")),
            )
        }
    };
    let written = transition(conn, from, to, &[log], opts, Write::Settle);
    let Settlement::Executed(result) = settlement else {
        return written;
    };
    match written {
        Ok(row) if row.result_not_kept() => Err(crate::Error::EffectResultNotKept {
            key: from.key.clone(),
            reason: row.error.unwrap_or_default(),
            result: Some(Output::new(result)),
        }),
        Ok(row) => Ok(row),
        Err(source) => Err(crate::Error::EffectNotRecorded {
            key: from.key.clone(),
            result: Output::new(result),
            source: Box::new(source),
        }),
    }
}

/// Moves the row from exactly `from` to `to` (settle and resolve share it).
pub(crate) fn transition(
    conn: &mut Connection,
    from: &Effect,
    to: Effect,
    log: &[Entry],
    opts: &Options,
    write: Write,
) -> Result<Effect, crate::Error> {
    if !conn.is_autocommit() {
        return Err(crate::Error::InTransaction);
    }
    let key = from.key.as_str();
    let lost = |found: Option<Effect>| crate::Error::EffectLost {
        key: key.to_owned(),
        found: found.map(|f| f.state),
    };
    let mut busy_left = BUSY_RETRIES;
    let mut reissued = false;
    loop {
        let tx = match begin(conn)? {
            Ok(tx) => tx,
            Err(e) if busy_left > 0 => {
                busy_left -= 1;
                let _ = e;
                continue;
            }
            Err(e) => return Err(busy(key, e)),
        };
        if row::write(&tx, Some(from), &to)? == 0 {
            drop(tx);
            // Someone moved the row (a lapsed lease, an operator), or an earlier try landed.
            let found = row::read(conn, key)?;
            return if found.as_ref() == Some(&to) {
                Ok(to)
            } else {
                Err(lost(found))
            };
        }
        history::append(&tx, &to.key, to.updated_ms, &to.attempt, log)?;
        match commit(tx, opts, write)? {
            Ended::Committed => return Ok(to),
            Ended::Busy(e) => {
                if busy_left == 0 {
                    return Err(busy(key, e));
                }
                busy_left -= 1;
            }
            Ended::Unknown(source) => {
                let found = reread(conn, key, opts, write)?;
                if found.as_ref() == Some(&to) {
                    return Ok(to);
                }
                if found.as_ref() != Some(from) {
                    return Err(lost(found));
                }
                if reissued {
                    return Err(crate::Error::EffectCommitFailed {
                        key: key.to_owned(),
                        source,
                    });
                }
                reissued = true; // unchanged: the COMMIT did not land; same UPDATE once more
            }
        }
    }
}

/// Reserve → execute → settle in one call (E1).
///
/// On a replay the stored result comes back and `executor` does not run. Otherwise `executor`
/// runs with no transaction open, and its end is recorded: `Ok(bytes)` → COMMITTED;
/// [`Error::NotExecuted`] → FAILED (a later call reserves and runs again);
/// [`Error::Ambiguous`] or a panic → AMBIGUOUS. A panic is re-raised after it is recorded.
///
/// # Errors
/// Those of [`reserve`] (the executor did not run) and [`settle`] (it did: after an `Ok`,
/// every failure to record it is [`crate::Error::EffectNotRecorded`] or
/// [`crate::Error::EffectResultNotKept`], carrying the result); plus
/// [`crate::Error::EffectNotExecuted`] carrying the executor's error when it proved
/// non-execution, and [`crate::Error::EffectAmbiguous`] when its outcome is unknown.
pub fn run<F>(
    conn: &mut Connection,
    key: &str,
    opts: &Options,
    executor: F,
) -> Result<Outcome, crate::Error>
where
    F: FnOnce() -> Result<Vec<u8>, Error>,
{
    let reservation = match reserve(conn, key, opts)? {
        Reserved::Replay(row) => {
            return Ok(Outcome {
                key: key.to_owned(),
                result: row.result.unwrap_or_default(),
                executed: false,
            });
        }
        Reserved::Reservation(r) => r,
    };
    let ran = catch_unwind(AssertUnwindSafe(executor));
    let (settlement, then) = settlement_of(ran);
    let row = settle(conn, &reservation, settlement, opts);
    finish(key, row, then)
}

/// What happens after the settlement is written.
pub(crate) enum Then {
    Return,
    NotExecuted(BoxError),
    Panic(Box<dyn std::any::Any + Send>),
}

/// Maps an executor's end to the settlement to record.
pub(crate) fn settlement_of(
    ran: std::thread::Result<Result<Vec<u8>, Error>>,
) -> (Settlement, Then) {
    match ran {
        Ok(Ok(result)) => (Settlement::Executed(result), Then::Return),
        Ok(Err(e)) => {
            let settlement = e.settlement();
            match e {
                Error::NotExecuted(e) => (settlement, Then::NotExecuted(e)),
                Error::Ambiguous(_) => (settlement, Then::Return),
            }
        }
        Err(panic) => {
            let text = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            (
                Settlement::Ambiguous(format!("executor panicked: {text}")),
                Then::Panic(panic),
            )
        }
    }
}

/// Turns the settled row into [`run`]'s answer.
pub(crate) fn finish(
    key: &str,
    row: Result<Effect, crate::Error>,
    then: Then,
) -> Result<Outcome, crate::Error> {
    if let Then::Panic(p) = then {
        resume_unwind(p);
    }
    let row = row?;
    match (row.state, then) {
        (State::Committed, _) => Ok(Outcome {
            key: key.to_owned(),
            result: row.result.unwrap_or_default(),
            executed: true,
        }),
        (State::Failed, Then::NotExecuted(source)) => Err(crate::Error::EffectNotExecuted {
            key: key.to_owned(),
            source,
        }),
        _ => Err(ambiguous(&row)),
    }
}
