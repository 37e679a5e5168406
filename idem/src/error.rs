//! The crate's one error type and what a caller should do about each variant.

use std::error::Error as StdError;

/// A boxed error returned by the caller's `apply` closure.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// What a caller should do about an [`Error`].
///
/// Deliberately exhaustive: the set of actions is the contract, so layers above map every
/// kind with one `match` and a new kind is a breaking change, never a silent fallback.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Transient: call `once` again with the same key (it is safe: the key dedups).
    Retry,
    /// The caller's input is wrong (bad key, bad round): fix it; retrying changes nothing.
    Input,
    /// The request was refused by the stored state of its key (fingerprint mismatch, already
    /// applied in strict mode, attempts exhausted, or `apply` failed): report it to the client.
    Rejected,
    /// This writer is stale (a newer round wrote here): stop writing and re-acquire.
    Reacquire,
    /// The database is unusable for idem (schema too new, SQLite failure): stop and investigate.
    Fatal,
}

/// Every failure of the `idem` crate.
///
/// Each variant carries the key (or other ids) involved. [`Error::kind`] maps every variant to
/// what the caller should do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The idempotency key is empty, longer than 255 bytes, or contains NUL.
    #[error("invalid idempotency key: {reason}")]
    InvalidKey {
        /// Why the key was refused.
        reason: &'static str,
    },
    /// The round does not fit SQLite's signed 64-bit integer.
    #[error("invalid round {round}: must be at most {max}", max = i64::MAX)]
    InvalidRound {
        /// The round that was passed.
        round: u64,
    },
    /// A newer round has already written to this database; this writer must not write (I7).
    #[error("stale round {ours} for key {key:?}: round {highest} already wrote this database")]
    StaleRound {
        /// The key of the refused call.
        key: String,
        /// The round of the refused call.
        ours: u64,
        /// The highest round recorded in the database.
        highest: u64,
    },
    /// The key was applied with another request fingerprint (I4). Nothing was changed.
    #[error("idempotency key {key:?} was applied with a different request fingerprint")]
    FingerprintMismatch {
        /// The key.
        key: String,
    },
    /// Strict mode: the key was already applied; carries the stored result (I3).
    #[error("idempotency key {key:?} was already applied in round {round}")]
    AlreadyApplied {
        /// The key.
        key: String,
        /// The round of the first run.
        round: u64,
        /// The stored result of the first run, byte-identical.
        result: Vec<u8>,
    },
    /// The key reached its maximum number of failed attempts; `apply` was not run. An operator
    /// clears it with [`crate::clear_failures`].
    #[error("idempotency key {key:?} exhausted its {attempts} attempts; last error: {last_error}")]
    AttemptsExhausted {
        /// The key.
        key: String,
        /// Failed attempts recorded.
        attempts: u32,
        /// Text of the last failure.
        last_error: String,
    },
    /// `apply` returned an error. Its writes were rolled back; the attempt was counted (I5).
    #[error("apply failed for idempotency key {key:?}")]
    Apply {
        /// The key.
        key: String,
        /// The error `apply` returned.
        #[source]
        source: BoxError,
    },
    /// `apply` returned more bytes than the configured limit. Its writes were rolled back and
    /// the attempt was counted.
    #[error("result of {len} bytes for idempotency key {key:?} exceeds the limit of {limit} bytes")]
    ResultTooLarge {
        /// The key.
        key: String,
        /// Result length in bytes.
        len: usize,
        /// The limit in bytes.
        limit: usize,
    },
    /// `apply` ended the lent transaction itself (executed COMMIT or ROLLBACK), so its writes
    /// are no longer atomic with the key. The key is not recorded.
    #[error("apply ended the transaction of idempotency key {key:?} itself")]
    TransactionEnded {
        /// The key.
        key: String,
    },
    /// The connection is already inside a transaction; `once` needs to own it.
    #[error("the connection is already inside a transaction")]
    InTransaction,
    /// The write lock could not be taken within the busy timeout. `apply` did not run.
    #[error("database busy: could not take the write lock for idempotency key {key:?}")]
    Busy {
        /// The key.
        key: String,
        /// The SQLite error.
        #[source]
        source: rusqlite::Error,
    },
    /// COMMIT failed and the re-read shows it did not land: nothing was applied; safe to retry.
    #[error("commit failed for idempotency key {key:?}; nothing was applied")]
    CommitFailed {
        /// The key.
        key: String,
        /// The COMMIT error.
        #[source]
        source: BoxError,
    },
    /// COMMIT failed and the re-read that would settle it failed too (I9): the outcome is
    /// unknown. Nothing more was written; calling `once` again with the key settles it.
    #[error("commit outcome unknown for idempotency key {key:?}: the re-read failed")]
    CommitUnknown {
        /// The key.
        key: String,
        /// The re-read error.
        #[source]
        source: BoxError,
    },
    /// The database holds an idem schema newer than this library understands.
    #[error("idem schema version {found} is newer than the supported version {supported}")]
    SchemaTooNew {
        /// Version found in the database.
        found: i64,
        /// Highest version this library supports.
        supported: i64,
    },
    /// The operating system's random source failed while making an attempt id.
    #[error("random source failed: {reason}")]
    Random {
        /// The OS error text.
        reason: String,
    },
    /// Any other SQLite failure.
    #[error("sqlite error")]
    Sqlite(#[from] rusqlite::Error),
    /// Another attempt holds a live reservation of the effect key; its executor may be running.
    /// Retry after `lease_until_ms`: the key is then settled, or AMBIGUOUS.
    #[error("effect {key:?} is in progress by {holder} until {}", rfc3339(*lease_until_ms))]
    EffectInProgress {
        /// The effect key.
        key: String,
        /// The holder label of the reservation, else its attempt id in hex.
        holder: String,
        /// When its lease lapses, in ms since the Unix epoch.
        lease_until_ms: u64,
    },
    /// Nobody knows whether the effect executed (an executor error that did not prove
    /// non-execution, a panic, a lapsed lease). No retry clears it: an operator or a reconcile
    /// hook resolves it ([`crate::effect::resolve`]). The executor was not run again.
    #[error("effect {key:?} is ambiguous: {reason}")]
    EffectAmbiguous {
        /// The effect key.
        key: String,
        /// Why it is ambiguous, as stored.
        reason: String,
    },
    /// The executor proved it did not execute; the key is FAILED and a retry reserves it again.
    #[error("effect {key:?} was not executed")]
    EffectNotExecuted {
        /// The effect key.
        key: String,
        /// The executor's error.
        #[source]
        source: BoxError,
    },
    /// A settlement or resolution found the row no longer as it expected (a contender made a
    /// lapsed lease AMBIGUOUS, an operator resolved it); nothing was written.
    #[error(
        "effect {key:?} moved on before this write (now {})",
        state_name(found)
    )]
    EffectLost {
        /// The effect key.
        key: String,
        /// The state found instead, `None` when the row is gone.
        found: Option<crate::effect::State>,
    },
    /// Only an AMBIGUOUS effect can be resolved.
    #[error("effect {key:?} is not ambiguous (it is {})", state_name(state))]
    EffectNotAmbiguous {
        /// The effect key.
        key: String,
        /// Its state, `None` when there is no such effect.
        state: Option<crate::effect::State>,
    },
    /// The executor executed, but its result was not kept: it is larger than
    /// [`crate::effect::Options::max_result_bytes`]. The row is COMMITTED without a result
    /// (never run again; the reason is stored), and every call for the key gets this error:
    /// `result` carries the result to the call that ran the executor, `None` to later ones.
    #[error("effect {key:?} executed but its result was not kept: {reason}")]
    EffectResultNotKept {
        /// The effect key.
        key: String,
        /// Why, as stored (the result's size and the limit).
        reason: String,
        /// The executor's result, for the call that ran it.
        result: Option<crate::effect::Output>,
    },
    /// The executor executed and returned `result`, but the settlement recording it was not
    /// written: the row moved on first (a contender found the lease lapsed, an operator
    /// resolved it: `source` is [`Error::EffectLost`]) or the write failed (disk full, busy,
    /// commit unknown). Nothing was overwritten; the key stays as it was — RESERVED until its
    /// lease lapses, then AMBIGUOUS — and is never run again. Resolve it with `result`
    /// ([`crate::effect::resolve`]).
    #[error("effect {key:?} executed but its settlement was not recorded")]
    EffectNotRecorded {
        /// The effect key.
        key: String,
        /// The executor's result.
        result: crate::effect::Output,
        /// Why the settlement was not written.
        #[source]
        source: Box<Error>,
    },
    /// A resolution's result is larger than [`crate::effect::Options::max_result_bytes`];
    /// nothing was written.
    #[error("result of {len} bytes for effect {key:?} exceeds the limit of {limit} bytes")]
    EffectResultTooLarge {
        /// The effect key.
        key: String,
        /// Result length in bytes.
        len: usize,
        /// The limit in bytes.
        limit: usize,
    },
    /// An effect write's COMMIT failed twice without landing (the re-read showed it each
    /// time); nothing was written.
    #[error("effect {key:?}: commit failed; nothing was written")]
    EffectCommitFailed {
        /// The effect key.
        key: String,
        /// The last COMMIT error.
        #[source]
        source: BoxError,
    },
    /// An effect write's COMMIT failed and the re-read that would settle it failed too (I9).
    /// Nothing more was written; after a reservation the executor must not run (the key turns
    /// AMBIGUOUS if the write landed and its lease lapses).
    #[error("effect {key:?}: commit outcome unknown, the re-read failed")]
    EffectCommitUnknown {
        /// The effect key.
        key: String,
        /// The re-read error.
        #[source]
        source: BoxError,
    },
}

/// Milliseconds since the Unix epoch as RFC 3339 in UTC (`2025-12-01T00:00:00.123Z`), for
/// messages; days to a civil date by Howard Hinnant's `civil_from_days`.
pub(crate) fn rfc3339(ms: u64) -> String {
    let (days, rem) = ((ms / 86_400_000) as i64, ms % 86_400_000);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, s, milli) = (
        rem / 3_600_000,
        rem / 60_000 % 60,
        rem / 1000 % 60,
        rem % 1000,
    );
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{milli:03}Z")
}

/// An effect state for messages: its name, or "absent" when there is no row.
fn state_name(state: &Option<crate::effect::State>) -> String {
    state.map_or_else(|| "absent".to_owned(), |s| s.to_string())
}

impl Error {
    /// What the caller should do about this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidKey { .. }
            | Error::InvalidRound { .. }
            | Error::InTransaction
            | Error::EffectNotAmbiguous { .. }
            | Error::EffectResultTooLarge { .. } => ErrorKind::Input,
            Error::StaleRound { .. } => ErrorKind::Reacquire,
            Error::FingerprintMismatch { .. }
            | Error::AlreadyApplied { .. }
            | Error::AttemptsExhausted { .. }
            | Error::Apply { .. }
            | Error::ResultTooLarge { .. }
            | Error::TransactionEnded { .. }
            | Error::EffectAmbiguous { .. }
            | Error::EffectNotExecuted { .. }
            | Error::EffectLost { .. }
            // The effect ran: report it (with its result) instead of retrying; the key is
            // never run again, and an operator settles its record.
            | Error::EffectResultNotKept { .. }
            | Error::EffectNotRecorded { .. } => ErrorKind::Rejected,
            Error::Busy { .. }
            | Error::CommitFailed { .. }
            | Error::CommitUnknown { .. }
            | Error::EffectInProgress { .. }
            | Error::EffectCommitFailed { .. }
            | Error::EffectCommitUnknown { .. } => ErrorKind::Retry,
            Error::SchemaTooNew { .. } | Error::Random { .. } | Error::Sqlite(_) => {
                ErrorKind::Fatal
            }
        }
    }

    /// True when calling `once` again with the same key may succeed.
    pub fn is_retryable(&self) -> bool {
        self.kind() == ErrorKind::Retry
    }

    /// The executor's result when this error says an effect executed without its result
    /// being stored ([`Error::EffectNotRecorded`], and [`Error::EffectResultNotKept`] for the
    /// call that ran it): the caller still has what the executor returned.
    pub fn effect_result(&self) -> Option<&[u8]> {
        match self {
            Error::EffectNotRecorded { result, .. } => Some(result.as_bytes()),
            Error::EffectResultNotKept {
                result: Some(result),
                ..
            } => Some(result.as_bytes()),
            _ => None,
        }
    }
}

/// True for SQLITE_BUSY / SQLITE_LOCKED: the database said in band that nothing was done.
pub(crate) fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// True for "no such table": the schema has not been created in this database yet.
pub(crate) fn is_missing_table(e: &rusqlite::Error) -> bool {
    message(e).is_some_and(|m| m.starts_with("no such table"))
}

/// True for SQLite's "no such column" (a table of an earlier version).
pub(crate) fn is_missing_column(e: &rusqlite::Error) -> bool {
    message(e).is_some_and(|m| m.starts_with("no such column"))
}

/// SQLite's message, however rusqlite reports it (a statement that fails to prepare comes
/// back as `SqlInputError` with the SQL and the offset).
fn message(e: &rusqlite::Error) -> Option<&str> {
    match e {
        rusqlite::Error::SqliteFailure(_, Some(msg)) => Some(msg),
        rusqlite::Error::SqlInputError { msg, .. } => Some(msg),
        _ => None,
    }
}

/// Reads a key row if present, `Ok(None)` also when the schema does not exist yet.
pub(crate) fn optional_missing<T>(r: rusqlite::Result<Option<T>>) -> Result<Option<T>, Error> {
    match r {
        Ok(v) => Ok(v),
        Err(e) if is_missing_table(&e) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod message_tests {
    use super::Error;

    /// Regression: messages showed Rust `Debug` output (`state None`).
    #[test]
    fn effect_states_read_as_words() {
        let absent = Error::EffectNotAmbiguous {
            key: "k".into(),
            state: None,
        };
        assert_eq!(
            absent.to_string(),
            "effect \"k\" is not ambiguous (it is absent)"
        );
        let lost = Error::EffectLost {
            key: "k".into(),
            found: Some(crate::effect::State::Committed),
        };
        assert_eq!(
            lost.to_string(),
            "effect \"k\" moved on before this write (now committed)"
        );
    }
}
