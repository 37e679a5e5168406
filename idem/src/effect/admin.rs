//! Operator side: list effects by state, resolve an AMBIGUOUS effect (a reservation whose
//! lease lapsed included), and the reconcile hook.

use rusqlite::Connection;

use super::history::Entry;
use super::options::Options;
use super::row::{self, Effect, State, lapse_reason};
use super::settle::transition;
use crate::failpoint::Write;
use crate::{Error, key::validate_key};

/// How an AMBIGUOUS effect was found to have ended (by an operator or a reconcile hook).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// It did execute, with this result → COMMITTED; later calls replay the result.
    Executed(Vec<u8>),
    /// It did not execute → FAILED; a later call reserves the key and runs it.
    NotExecuted,
}

/// A service's reconcile function: asks the outside system what became of an AMBIGUOUS effect
/// (a payment provider's lookup by idempotency key, say). `None` leaves it AMBIGUOUS.
pub trait Reconcile {
    /// Decides `effect` (always AMBIGUOUS), or `None` when the outside system cannot tell.
    fn reconcile(&self, effect: &Effect) -> Option<Resolution>;
}

impl<F: Fn(&Effect) -> Option<Resolution>> Reconcile for F {
    fn reconcile(&self, effect: &Effect) -> Option<Resolution> {
        self(effect)
    }
}

/// The stored row of an effect key, or `None` (also when no effect was ever reserved here).
/// Reads only. A RESERVED row is returned as stored; see [`get_with`] for the row as a caller
/// judges it.
///
/// # Errors
/// [`Error::InvalidKey`]; [`Error::Sqlite`].
pub fn get(conn: &Connection, key: &str) -> Result<Option<Effect>, Error> {
    validate_key(key)?;
    row::read(conn, key)
}

/// Every effect row, or only those in `state`, in key order, as stored. Reads only.
///
/// # Errors
/// [`Error::Sqlite`].
pub fn list(conn: &Connection, state: Option<State>) -> Result<Vec<Effect>, Error> {
    row::list(conn, state)
}

/// Every RESERVED and AMBIGUOUS row, in key order, as stored: one read through the partial
/// index of open rows (what a registry counts at an org's open). Reads only.
///
/// # Errors
/// [`Error::Sqlite`].
pub fn list_open(conn: &Connection) -> Result<Vec<Effect>, Error> {
    row::list_open(conn)
}

/// [`get`] as `opts` judges the row now: a RESERVED row whose lease lapsed
/// ([`Options::lapse`]) reads as AMBIGUOUS ([`Effect::as_judged`]). Reads only.
///
/// # Errors
/// As [`get`].
pub fn get_with(conn: &Connection, key: &str, opts: &Options) -> Result<Option<Effect>, Error> {
    Ok(get(conn, key)?.map(|r| r.as_judged(opts)))
}

/// [`list`] as `opts` judges each row now: a RESERVED row whose lease lapsed is listed (and
/// filtered) as AMBIGUOUS, so `Some(State::Ambiguous)` lists every effect that needs a
/// resolution and `Some(State::Reserved)` only those still in progress. Reads only; the
/// RESERVED and AMBIGUOUS filters read only the open rows.
///
/// # Errors
/// As [`list`].
pub fn list_with(
    conn: &Connection,
    state: Option<State>,
    opts: &Options,
) -> Result<Vec<Effect>, Error> {
    let rows = match state {
        Some(State::Reserved | State::Ambiguous) => row::list_open(conn)?,
        other => row::list(conn, other)?,
    };
    let now = opts.now();
    Ok(rows
        .into_iter()
        .map(|r| r.judged_at(opts, now))
        .filter(|r| state.is_none_or(|s| r.state == s))
        .collect())
}

/// Resolves an AMBIGUOUS effect as executed (with its result) or not executed, recording who
/// resolved it (`by`) and when (`at_ms`, ms since the Unix epoch, also the "now" at which a
/// reservation's lease is judged). Only an AMBIGUOUS row can be resolved — a RESERVED one
/// whose lease lapsed counts as AMBIGUOUS — because a live reservation may still be
/// executing, and COMMITTED / FAILED are already decided. The resolved row keeps no error
/// text; the history keeps every transition with who and when.
///
/// # Errors
/// [`Error::EffectInProgress`] (a live reservation: nothing written);
/// [`Error::EffectNotAmbiguous`] (nothing written); [`Error::EffectResultTooLarge`]
/// (nothing written); otherwise as [`settle`](super::settle).
pub fn resolve(
    conn: &mut Connection,
    key: &str,
    resolution: Resolution,
    by: &str,
    at_ms: u64,
) -> Result<Effect, Error> {
    resolve_with(conn, key, resolution, by, at_ms, &Options::new())
}

/// [`resolve`] with [`Options`] (result limit, lapse rule, write hook, failpoints).
///
/// # Errors
/// As [`resolve`].
pub fn resolve_with(
    conn: &mut Connection,
    key: &str,
    resolution: Resolution,
    by: &str,
    at_ms: u64,
    opts: &Options,
) -> Result<Effect, Error> {
    validate_key(key)?;
    if let Resolution::Executed(result) = &resolution
        && result.len() > opts.max_result()
    {
        return Err(Error::EffectResultTooLarge {
            key: key.to_owned(),
            len: result.len(),
            limit: opts.max_result(),
        });
    }
    let from = match row::read(conn, key)? {
        Some(r) if r.state == State::Ambiguous => r,
        Some(r) if opts.is_lapsed_at(&r, at_ms) => r,
        Some(r) if r.state == State::Reserved => {
            return Err(Error::EffectInProgress {
                key: key.to_owned(),
                holder: r.holder_or_attempt(),
                lease_until_ms: opts.lapses_at(&r),
            });
        }
        found => {
            return Err(Error::EffectNotAmbiguous {
                key: key.to_owned(),
                state: found.map(|r| r.state),
            });
        }
    };
    let mut log = Vec::with_capacity(2);
    if from.state == State::Reserved {
        // The lapse a contender would have recorded, then the resolution: the history reads
        // as the states the key went through.
        log.push(Entry {
            state: State::Ambiguous,
            actor: Some(by.to_owned()),
            detail: Some(lapse_reason(&from, opts.lapses_at(&from))),
        });
    }
    let (state, result, detail) = match resolution {
        Resolution::Executed(result) => {
            let detail = format!("resolved as executed: {} bytes of result", result.len());
            (State::Committed, Some(result), detail)
        }
        Resolution::NotExecuted => (State::Failed, None, "resolved as not executed".to_owned()),
    };
    log.push(Entry {
        state,
        actor: Some(by.to_owned()),
        detail: Some(detail),
    });
    let to = Effect {
        state,
        result,
        error: None,
        resolved_by: Some(by.to_owned()),
        updated_ms: at_ms,
        ..from.clone()
    };
    transition(conn, &from, to, &log, opts, Write::Resolve)
}

/// Offers every AMBIGUOUS effect (a reservation whose lease lapsed, as `opts` judges it at
/// `at_ms`, included) to `hook` and records its decisions as resolved `by` it at `at_ms`.
/// Returns the rows it resolved.
///
/// # Errors
/// The first failure of [`resolve_with`]; rows resolved before it stay resolved. A row that
/// left AMBIGUOUS meanwhile ([`Error::EffectLost`] / [`Error::EffectNotAmbiguous`] /
/// [`Error::EffectInProgress`]) is skipped.
pub fn reconcile(
    conn: &mut Connection,
    hook: &dyn Reconcile,
    by: &str,
    at_ms: u64,
    opts: &Options,
) -> Result<Vec<Effect>, Error> {
    let mut resolved = Vec::new();
    for stored in row::list_open(conn)? {
        let effect = stored.judged_at(opts, at_ms);
        if effect.state != State::Ambiguous {
            continue;
        }
        let Some(resolution) = hook.reconcile(&effect) else {
            continue;
        };
        match resolve_with(conn, &effect.key, resolution, by, at_ms, opts) {
            Ok(row) => resolved.push(row),
            Err(
                Error::EffectLost { .. }
                | Error::EffectNotAmbiguous { .. }
                | Error::EffectInProgress { .. },
            ) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(resolved)
}
