//! The org layer's error type.

use std::sync::Arc;

use idem_replica::OrgId;

/// What the caller should do about an [`Error`]. Exhaustive on purpose: the set of actions
/// is the contract, so callers map every kind with one `match`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Transient: retry the request with the same idempotency key.
    Retry,
    /// This handle is fenced or closed: acquire the org again (possibly on another replica) and
    /// retry with the same key.
    Reacquire,
    /// Fix the input (org id, key, settings).
    Input,
    /// The request was refused by its key's stored state (fingerprint mismatch, `apply` failed,
    /// attempts exhausted): report it to the client; retrying changes nothing.
    Rejected,
    /// Stored data is corrupt: stop and investigate; nothing falls back to older data.
    Corrupt,
    /// Misconfiguration or an unexpected failure: stop.
    Fatal,
}

/// Every failure of the org layer. Variants carry the org and round involved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A newer writer claimed the org: this handle is poisoned and its local database
    /// discarded; nothing it committed since its last ship is acknowledged (I7).
    #[error("org {org}: writer of round {ours} is fenced by a newer round")]
    Fenced {
        /// The org.
        org: OrgId,
        /// This writer's round.
        ours: u64,
    },
    /// This writer's claim can no longer publish for another reason than a newer round (a
    /// publish whose outcome is unknown, I9): as with [`Error::Fenced`], nothing it committed
    /// since its last ship is acknowledged, the handle is poisoned and its local database
    /// discarded. Acquire again: the next claim hydrates whatever was published.
    #[error("org {org}: writer of round {round} lost its claim: {reason}")]
    ClaimLost {
        /// The org.
        org: OrgId,
        /// This writer's round.
        round: u64,
        /// The replica's error.
        reason: String,
    },
    /// The org's local files were changed outside its writer (another process wrote,
    /// checkpointed, replaced or removed them, I13): nothing captured from them was published
    /// and nothing since the last ship is acknowledged. The handle is poisoned and its local
    /// files discarded; acquiring the org again hydrates it from the store.
    #[error("org {org}: writer of round {round} stopped: {reason}")]
    Poisoned {
        /// The org.
        org: OrgId,
        /// The poisoned writer's round.
        round: u64,
        /// What was found changed.
        reason: String,
    },
    /// A read on the writer connection ([`crate::Org::read`]) failed.
    #[error("org {org}: read failed")]
    Read {
        /// The org.
        org: OrgId,
        /// The SQLite error, or the panic.
        #[source]
        source: idem::BoxError,
    },
    /// The registry is shutting down (SIGTERM): no org opens in this process any more; the
    /// client retries on another replica.
    #[error("org {org}: this process is shutting down")]
    ShuttingDown {
        /// The org.
        org: OrgId,
    },
    /// The handle was released (shutdown, eviction, explicit release): acquire again.
    #[error("org {org}: handle of round {round} is closed")]
    Closed {
        /// The org.
        org: OrgId,
        /// The round of the closed handle.
        round: u64,
    },
    /// The ship that would acknowledge this request failed; the request's commit is local
    /// only. Retry with the same key: the retry waits for a ship that succeeds (I6).
    #[error("org {org}: ship failed; the request is not acknowledged")]
    ShipFailed {
        /// The org.
        org: OrgId,
        /// The ship error, shared by every request the ship would have acknowledged.
        #[source]
        source: Arc<idem_replica::Error>,
    },
    /// From the dedup transaction or an effect call. The message names the org only: the idem
    /// error is the source, so a walk of the source chain prints it once.
    #[error("org {org}")]
    Idem {
        /// The org.
        org: OrgId,
        /// The idem error.
        #[source]
        source: Box<idem::Error>,
    },
    /// An effect's executor ran and returned `result`, but its settlement is not
    /// acknowledged: the settlement write failed or found the row moved on (an
    /// `idem::Error` source), or the ship that would acknowledge it failed, or the handle was
    /// fenced or closed first. It is never run again for the key. The result is logged with
    /// the key too, so an operator can resolve the key with it once it reads AMBIGUOUS
    /// (`Org::resolve`, `idem resolve`). [`Error::kind`] is the source's: after a failed ship
    /// a retry with the key waits for the next ship and replays the result.
    #[error("org {org}: effect {key:?} executed but its settlement is not acknowledged")]
    EffectUnacknowledged {
        /// The org.
        org: OrgId,
        /// The effect key.
        key: String,
        /// The executor's result.
        result: idem::effect::Output,
        /// Why it is not acknowledged.
        #[source]
        source: Box<Error>,
    },
    /// From the snapshot store (claim, hydrate, release).
    // The replica's messages name the org already: not repeated here.
    #[error("{source}")]
    Replica {
        /// The org.
        org: OrgId,
        /// The replica error.
        #[source]
        source: Box<idem_replica::Error>,
    },
    /// Local file handling of one org (its directory, lock and database files).
    #[error("org {org}: local file {path}")]
    Local {
        /// The org.
        org: OrgId,
        /// The path involved.
        path: std::path::PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The registry's data directory cannot be created or locked.
    #[error("data directory {path}")]
    DataDir {
        /// The directory.
        path: std::path::PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The writer connection could not take the org's files as their one owner (I13).
    #[error("org {org}: cannot open the writer on {path}")]
    Writer {
        /// The org.
        org: OrgId,
        /// The database file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: idem_replica::sqlite::OwnError,
    },
    /// The hydrated database's commit sequence differs from the one the store's entry says
    /// it holds: the installed state is not what was published, so nothing is served.
    #[error(
        "org {org}: the store's entry holds commit {hydrated}, the hydrated file holds {in_file}"
    )]
    CommitMismatch {
        /// The org.
        org: OrgId,
        /// The commit sequence of the entry hydrated.
        hydrated: u64,
        /// The commit sequence in the installed file.
        in_file: u64,
    },
    /// A blocking task of this org panicked or was cancelled.
    #[error("org {org}: blocking task failed while {op}")]
    Task {
        /// The org.
        org: OrgId,
        /// What the task was doing.
        op: &'static str,
        /// The join error.
        #[source]
        source: tokio::task::JoinError,
    },
    /// SQLite failed while opening or configuring the org database.
    #[error("org {org}: sqlite")]
    Sqlite {
        /// The org.
        org: OrgId,
        /// The SQLite error.
        #[source]
        source: rusqlite::Error,
    },
    /// The org's writer thread stopped unexpectedly (a panic in `apply` ends it).
    #[error("org {org}: writer stopped")]
    WriterGone {
        /// The org.
        org: OrgId,
    },
    /// Settings are invalid.
    #[error("invalid settings: {reason}")]
    InvalidSettings {
        /// Why.
        reason: String,
    },
}

impl Error {
    /// What the caller should do; one exhaustive match over every variant.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Fenced { .. }
            | Error::ClaimLost { .. }
            | Error::ShuttingDown { .. }
            | Error::Closed { .. }
            | Error::WriterGone { .. }
            | Error::Poisoned { .. } => ErrorKind::Reacquire,
            Error::ShipFailed { .. } => ErrorKind::Retry,
            Error::Idem { source, .. } => match source.kind() {
                idem::ErrorKind::Retry => ErrorKind::Retry,
                idem::ErrorKind::Input => ErrorKind::Input,
                idem::ErrorKind::Rejected => ErrorKind::Rejected,
                idem::ErrorKind::Reacquire => ErrorKind::Reacquire,
                idem::ErrorKind::Fatal => ErrorKind::Fatal,
            },
            Error::Replica { source, .. } => match source.kind() {
                idem_replica::ErrorKind::Retry => ErrorKind::Retry,
                idem_replica::ErrorKind::Reacquire => ErrorKind::Reacquire,
                idem_replica::ErrorKind::Input => ErrorKind::Input,
                idem_replica::ErrorKind::Corrupt => ErrorKind::Corrupt,
                idem_replica::ErrorKind::Fatal => ErrorKind::Fatal,
            },
            Error::EffectUnacknowledged { source, .. } => source.kind(),
            Error::CommitMismatch { .. } => ErrorKind::Corrupt,
            Error::Local { .. }
            | Error::DataDir { .. }
            | Error::Writer { .. }
            | Error::Task { .. }
            | Error::Sqlite { .. }
            | Error::Read { .. } => ErrorKind::Fatal,
            Error::InvalidSettings { .. } => ErrorKind::Input,
        }
    }

    /// How long a client should wait before retrying, when this error knows: while another
    /// writer's advisory lease holds the org, how long this replica still has to see it
    /// unchanged before it may claim (at least one second). Measured on this replica's own
    /// monotonic clock; no wall clock, and nothing the holder wrote, enters it (I15). One
    /// second when the holder is draining and releasing the org (a rolling upgrade, 3f): the
    /// org is claimable here as soon as its release lands, usually well within that second,
    /// where the watch would send a client away for the whole lease term.
    /// `None` for every other error (retry soon; HTTP answers `Retry-After: 1`).
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        let Error::Replica { source, .. } = self else {
            return None;
        };
        let idem_replica::Error::LeaseHeld {
            retry_after_ms,
            draining,
            ..
        } = **source
        else {
            return None;
        };
        let ms = if draining { 1_000 } else { retry_after_ms };
        Some(std::time::Duration::from_millis(ms.max(1_000)))
    }

    /// Where the writer holding the org's lease says its clients reach it, when this error
    /// is that lease and the holder advertised an address (`idem_replica::Settings::advertise`):
    /// a client can retry there instead of waiting. `None` while the holder drains: it takes
    /// no new request, and the org is claimable here once its release lands.
    pub fn holder_addr(&self) -> Option<&str> {
        match self {
            Error::Replica { source, .. } => match &**source {
                idem_replica::Error::LeaseHeld {
                    holder_addr,
                    draining: false,
                    ..
                } => holder_addr.as_deref(),
                _ => None,
            },
            _ => None,
        }
    }

    /// True when a decision by wall-clock age (prune, retention) was refused because this
    /// host's clock and the store's disagree beyond `idem_replica::Settings::max_clock_skew_ms`
    /// (`idem_replica::Error::ClockSkew`, I15): a fault of the host, not of the org.
    pub fn is_clock_skew(&self) -> bool {
        matches!(self, Error::Replica { source, .. }
            if matches!(**source, idem_replica::Error::ClockSkew { .. }))
    }

    /// True when retrying the request as is (same key, same handle) may succeed.
    pub fn is_retryable(&self) -> bool {
        self.kind() == ErrorKind::Retry
    }

    /// The dedup transaction's error, when this is one: match it to tell a fingerprint
    /// mismatch (422) from an in-flight key or another rejection.
    pub fn idem(&self) -> Option<&idem::Error> {
        match self {
            Error::Idem { source, .. } => Some(source),
            _ => None,
        }
    }

    /// The executor's result when this error says an effect executed without its result
    /// being acknowledged ([`Error::EffectUnacknowledged`]; the idem errors of
    /// `idem::Error::effect_result`).
    pub fn effect_result(&self) -> Option<&[u8]> {
        match self {
            Error::EffectUnacknowledged { result, .. } => Some(result.as_bytes()),
            Error::Idem { source, .. } => source.effect_result(),
            _ => None,
        }
    }

    /// True when the request was refused because its fingerprint differs from the one the
    /// key was applied with (I4): the client changed the payload under the same key.
    pub fn is_fingerprint_mismatch(&self) -> bool {
        matches!(self.idem(), Some(idem::Error::FingerprintMismatch { .. }))
    }

    pub(crate) fn replica(org: &OrgId, source: idem_replica::Error) -> Self {
        Error::Replica {
            org: org.clone(),
            source: Box::new(source),
        }
    }

    pub(crate) fn from_idem(org: &OrgId, source: idem::Error) -> Self {
        Error::Idem {
            org: org.clone(),
            source: Box::new(source),
        }
    }
}
