//! The reservation: under BEGIN IMMEDIATE exactly one attempt wins an effect key.
//!
//! ```text
//! BEGIN IMMEDIATE -> read the row
//!   none / FAILED       -> write RESERVED{our attempt, lease} -> COMMIT -> Reservation
//!   COMMITTED           -> Replay (nothing written); EffectResultNotKept if it has no result
//!   RESERVED, live      -> EffectInProgress (nothing written)
//!   RESERVED, lapsed    -> write AMBIGUOUS -> COMMIT -> EffectAmbiguous (never re-run)
//!                          ("lapsed" as Options::lapse judges it)
//!   AMBIGUOUS           -> EffectAmbiguous (nothing written)
//! COMMIT busy (in band)  -> retry the write
//! COMMIT unknown        -> re-read the whole row: ours -> proceed; anything else -> decide
//!                          afresh (absent -> insert again), at most one more write;
//!                          re-read failed -> EffectCommitUnknown
//! ```

use rusqlite::Connection;

use super::history::{self, Entry};
use super::options::Options;
use super::row::{self, Effect, State, lapse_reason};
use super::write::{BUSY_RETRIES, Ended, begin, busy, commit, expect_one, reread};
use crate::failpoint::Write;
use crate::{Error, key::validate_key};

/// A won reservation: this attempt alone may run the executor, then must
/// [`settle`](super::settle).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    pub(crate) row: Effect,
}

impl Reservation {
    /// The effect key.
    pub fn key(&self) -> &str {
        &self.row.key
    }

    /// This attempt's id.
    pub fn attempt(&self) -> &[u8] {
        &self.row.attempt
    }

    /// When the lease lapses, in ms since the Unix epoch. Settle before: after it a contender
    /// may turn the key AMBIGUOUS and the settlement is then refused.
    pub fn lease_until_ms(&self) -> u64 {
        self.row.lease_until_ms
    }

    /// The row exactly as the reservation wrote it.
    pub fn effect(&self) -> &Effect {
        &self.row
    }
}

/// What [`reserve`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reserved {
    /// This attempt holds the key: run the executor, then settle.
    Reservation(Reservation),
    /// The effect already executed: its stored row (COMMITTED, with the result). Do not run
    /// the executor.
    Replay(Effect),
}

enum Decision {
    Done(Result<Reserved, Error>),
    /// Write `to` where the row is `from`, with its history entry; `reserve` says whether
    /// success is a reservation (else the AMBIGUOUS of a lapsed lease).
    Write {
        from: Option<Effect>,
        to: Box<Effect>,
        reserve: bool,
        log: Entry,
    },
}

/// Reserves `key` for one attempt (E1: an effect executes at most once unless FAILED).
///
/// Runs one `BEGIN IMMEDIATE` transaction (creating the `idem_effects` table if this database
/// predates it) and holds nothing once it returns: no transaction is open while the executor
/// runs.
///
/// # Errors
/// - [`Error::InvalidKey`], [`Error::InTransaction`]: bad input, nothing written.
/// - [`Error::EffectInProgress`]: another attempt holds a live lease (holder and expiry given).
/// - [`Error::EffectAmbiguous`]: the key is AMBIGUOUS — now or because this call found a lapsed
///   lease ([`Options::lapse`]) and recorded it so. No retry clears it; see
///   [`resolve`](super::resolve).
/// - [`Error::EffectResultNotKept`]: the effect executed but its result was not kept; it is
///   never run again.
/// - [`Error::Busy`]: the write lock stayed busy through the retries; nothing written.
/// - [`Error::EffectCommitFailed`]: COMMIT failed twice without landing; nothing written.
/// - [`Error::EffectCommitUnknown`]: the re-read after a failed COMMIT failed; nothing more is
///   written and the executor must not run. The key may be reserved by this attempt, in which
///   case it turns AMBIGUOUS when its lease lapses.
/// - [`Error::Sqlite`], [`Error::Random`]: other failures, nothing written.
pub fn reserve(conn: &mut Connection, key: &str, opts: &Options) -> Result<Reserved, Error> {
    validate_key(key)?;
    if !conn.is_autocommit() {
        return Err(Error::InTransaction);
    }
    let attempt = match opts.attempt_id {
        Some(id) => id.to_vec(),
        None => random_attempt_id()?,
    };
    let mut busy_left = BUSY_RETRIES;
    // The first write, and one more after a COMMIT that did not land (I9).
    let mut writes_left = 2u32;
    loop {
        let now = opts.now();
        let tx = match begin(conn)? {
            Ok(tx) => tx,
            Err(e) if busy_left > 0 => {
                busy_left -= 1;
                let _ = e;
                continue;
            }
            Err(e) => return Err(busy(key, e)),
        };
        let current = row::read_for_write(&tx, key)?;
        let (from, to, reserve, log) = match decide(key, current, now, &attempt, opts) {
            Decision::Done(out) => return out, // dropping the transaction wrote nothing
            Decision::Write {
                from,
                to,
                reserve,
                log,
            } => (from, *to, reserve, log),
        };
        expect_one(row::write(&tx, from.as_ref(), &to)?)?;
        history::append(&tx, &to.key, to.updated_ms, &to.attempt, &[log])?;
        writes_left -= 1;
        let landed = match commit(tx, opts, Write::Reserve)? {
            Ended::Committed => true,
            Ended::Busy(e) => {
                writes_left += 1; // nothing was committed: this write does not count
                if busy_left == 0 {
                    return Err(busy(key, e));
                }
                busy_left -= 1;
                continue;
            }
            Ended::Unknown(source) => {
                // Whole-row identity, never the attempt id alone: a caller may reuse ids.
                let found = reread(conn, key, opts, Write::Reserve)?;
                if found.as_ref() == Some(&to) {
                    true
                } else if writes_left == 0 {
                    return Err(Error::EffectCommitFailed {
                        key: key.to_owned(),
                        source,
                    });
                } else {
                    false // absent or another's row: decide afresh
                }
            }
        };
        if landed {
            return if reserve {
                Ok(Reserved::Reservation(Reservation { row: to }))
            } else {
                Err(ambiguous(&to))
            };
        }
    }
}

fn decide(
    key: &str,
    current: Option<Effect>,
    now: u64,
    attempt: &[u8],
    opts: &Options,
) -> Decision {
    let reserved = |attempts: u32| Effect {
        key: key.to_owned(),
        state: State::Reserved,
        attempt: attempt.to_vec(),
        lease_until_ms: now.saturating_add(opts.lease()),
        result: None,
        error: None,
        created_ms: now,
        updated_ms: now,
        attempts,
        holder: opts.holder.clone(),
        resolved_by: None,
    };
    let reserved_log = |row: &Effect| Entry {
        state: State::Reserved,
        actor: row.holder.clone(),
        detail: Some(format!(
            "reserved until {}",
            crate::error::rfc3339(row.lease_until_ms)
        )),
    };
    let Some(cur) = current else {
        let to = reserved(1);
        return Decision::Write {
            log: reserved_log(&to),
            from: None,
            to: Box::new(to),
            reserve: true,
        };
    };
    match cur.state {
        State::Failed => {
            let to = reserved(cur.attempts.saturating_add(1));
            Decision::Write {
                log: reserved_log(&to),
                to: Box::new(to),
                from: Some(cur),
                reserve: true,
            }
        }
        State::Committed if cur.result.is_none() => {
            Decision::Done(Err(Error::EffectResultNotKept {
                key: key.to_owned(),
                reason: cur.error.clone().unwrap_or_default(),
                result: None,
            }))
        }
        State::Committed => Decision::Done(Ok(Reserved::Replay(cur))),
        State::Ambiguous => Decision::Done(Err(ambiguous(&cur))),
        State::Reserved if !opts.is_lapsed_at(&cur, now) => {
            Decision::Done(Err(Error::EffectInProgress {
                key: key.to_owned(),
                holder: cur.holder_or_attempt(),
                lease_until_ms: opts.lapses_at(&cur),
            }))
        }
        State::Reserved => {
            // A lapsed lease: the holder may have executed or died mid-way. Nobody can know,
            // so the key turns AMBIGUOUS; it is never silently re-run.
            let reason = lapse_reason(&cur, opts.lapses_at(&cur));
            let to = Effect {
                state: State::Ambiguous,
                error: Some(reason.clone()),
                updated_ms: now,
                ..cur.clone()
            };
            Decision::Write {
                from: Some(cur),
                to: Box::new(to),
                reserve: false,
                log: Entry {
                    state: State::Ambiguous,
                    actor: opts.holder.clone(),
                    detail: Some(reason),
                },
            }
        }
    }
}

pub(crate) fn ambiguous(row: &Effect) -> Error {
    Error::EffectAmbiguous {
        key: row.key.clone(),
        reason: row.error.clone().unwrap_or_default(),
    }
}

fn random_attempt_id() -> Result<Vec<u8>, Error> {
    let mut id = [0u8; 16];
    getrandom::fill(&mut id).map_err(|e| Error::Random {
        reason: e.to_string(),
    })?;
    Ok(id.to_vec())
}
