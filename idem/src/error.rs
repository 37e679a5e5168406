//! The crate's one error type and what a caller should do about each variant.

use std::error::Error as StdError;

/// A boxed error returned by the caller's `apply` closure.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// What a caller should do about an [`Error`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
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
}

impl Error {
    /// What the caller should do about this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidKey { .. } | Error::InvalidRound { .. } | Error::InTransaction => {
                ErrorKind::Input
            }
            Error::StaleRound { .. } => ErrorKind::Reacquire,
            Error::FingerprintMismatch { .. }
            | Error::AlreadyApplied { .. }
            | Error::AttemptsExhausted { .. }
            | Error::Apply { .. }
            | Error::ResultTooLarge { .. }
            | Error::TransactionEnded { .. } => ErrorKind::Rejected,
            Error::Busy { .. } | Error::CommitFailed { .. } | Error::CommitUnknown { .. } => {
                ErrorKind::Retry
            }
            Error::SchemaTooNew { .. } | Error::Random { .. } | Error::Sqlite(_) => {
                ErrorKind::Fatal
            }
        }
    }

    /// True when calling `once` again with the same key may succeed.
    pub fn is_retryable(&self) -> bool {
        self.kind() == ErrorKind::Retry
    }
}

/// True for SQLITE_BUSY / SQLITE_LOCKED: the database said in band that nothing was done.
pub(crate) fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}
