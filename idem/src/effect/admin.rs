//! Operator side: list effects by state, resolve an AMBIGUOUS effect, and the reconcile hook.

use rusqlite::Connection;

use super::options::Options;
use super::row::{self, Effect, State};
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
/// Reads only.
///
/// # Errors
/// [`Error::InvalidKey`]; [`Error::Sqlite`].
pub fn get(conn: &Connection, key: &str) -> Result<Option<Effect>, Error> {
    validate_key(key)?;
    row::read(conn, key)
}

/// Every effect row, or only those in `state`, in key order. Reads only.
///
/// # Errors
/// [`Error::Sqlite`].
pub fn list(conn: &Connection, state: Option<State>) -> Result<Vec<Effect>, Error> {
    row::list(conn, state)
}

/// Resolves an AMBIGUOUS effect as executed (with its result) or not executed, recording who
/// resolved it (`by`) and when (`at_ms`, ms since the Unix epoch). Only an AMBIGUOUS row can be
/// resolved: a RESERVED one may still be executing, and COMMITTED / FAILED are already decided.
///
/// # Errors
/// [`Error::EffectNotAmbiguous`] (nothing written); otherwise as [`settle`](super::settle).
pub fn resolve(
    conn: &mut Connection,
    key: &str,
    resolution: Resolution,
    by: &str,
    at_ms: u64,
) -> Result<Effect, Error> {
    resolve_with(conn, key, resolution, by, at_ms, &Options::new())
}

/// [`resolve`] with [`Options`] (write hook, failpoints).
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
    let current = row::read(conn, key)?;
    let Some(from) = current.filter(|r| r.state == State::Ambiguous) else {
        return Err(Error::EffectNotAmbiguous {
            key: key.to_owned(),
            state: row::read(conn, key)?.map(|r| r.state),
        });
    };
    let (state, result) = match resolution {
        Resolution::Executed(result) => (State::Committed, Some(result)),
        Resolution::NotExecuted => (State::Failed, None),
    };
    let to = Effect {
        state,
        result,
        resolved_by: Some(by.to_owned()),
        updated_ms: at_ms,
        ..from.clone()
    };
    transition(conn, &from, to, opts, Write::Resolve)
}

/// Offers every AMBIGUOUS effect to `hook` and records its decisions as resolved `by` it at
/// `at_ms`. Returns the rows it resolved.
///
/// # Errors
/// The first failure of [`resolve_with`]; rows resolved before it stay resolved. A row that
/// left AMBIGUOUS meanwhile ([`Error::EffectLost`] / [`Error::EffectNotAmbiguous`]) is skipped.
pub fn reconcile(
    conn: &mut Connection,
    hook: &dyn Reconcile,
    by: &str,
    at_ms: u64,
    opts: &Options,
) -> Result<Vec<Effect>, Error> {
    let mut resolved = Vec::new();
    for effect in row::list(conn, Some(State::Ambiguous))? {
        let Some(resolution) = hook.reconcile(&effect) else {
            continue;
        };
        match resolve_with(conn, &effect.key, resolution, by, at_ms, opts) {
            Ok(row) => resolved.push(row),
            Err(Error::EffectLost { .. } | Error::EffectNotAmbiguous { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(resolved)
}
