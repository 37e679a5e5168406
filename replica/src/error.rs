//! The crate's one error type and what a caller should do about each case.

use crate::failpoint::FailPoint;

/// What a caller should do about an [`Error`].
///
/// Deliberately exhaustive: the set of actions is the contract, so layers above map every
/// kind with one `match` and a new kind is a breaking change, never a silent fallback.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Transient: retry the same operation as is (store hiccup, lost race, lease held).
    Retry,
    /// This claim can no longer ship: a newer round fenced it, or the outcome of a
    /// publish is unknown. Discard local state, claim again and hydrate (I7, I9).
    Reacquire,
    /// The caller passed something invalid; fix the input.
    Input,
    /// Stored data is missing, damaged or not what the log says; stop and investigate (I10).
    Corrupt,
    /// Misconfiguration or an unsupported store or format; retrying will not help.
    Fatal,
}

/// Every failure of `idem-replica`.
///
/// Variants carry the ids involved; messages are lowercase and chain their sources.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The org id does not match `^[a-z0-9][a-z0-9._-]{0,127}$`, contains `..` or ends in `.` (I12).
    #[error("invalid org id {id:?}: {reason}")]
    InvalidOrgId {
        /// The rejected id (truncated to 200 bytes).
        id: String,
        /// Which rule it broke.
        reason: &'static str,
    },
    /// The writer id is empty, longer than 256 bytes or contains control characters.
    #[error("invalid writer id {writer:?}: {reason}")]
    InvalidWriter {
        /// The rejected writer id (truncated to 200 bytes).
        writer: String,
        /// Which rule it broke.
        reason: &'static str,
    },
    /// The bytes handed to [`crate::Replica::ship`] are not an SQLite database image.
    #[error("invalid snapshot for org {org}: {reason}")]
    InvalidSnapshot {
        /// The org being shipped.
        org: String,
        /// What is wrong with the bytes.
        reason: String,
    },
    /// The pages handed to [`crate::Delta::new`] cannot form a delta (page size, page
    /// length, page number out of range).
    #[error("invalid delta: {reason}")]
    InvalidDelta {
        /// What is wrong with the pages.
        reason: String,
    },
    /// [`crate::Replica::ship_delta`] refused a delta that does not apply to the claim's chain
    /// tip: another page size, a page encoded against content the tip does not hold, or a
    /// compacted delta that misses a page changed since the snapshot. Nothing was published
    /// and the claim is unchanged; ship a full snapshot to restart the chain.
    #[error("org {org}: delta for log entry {seq} refused: {reason}")]
    DeltaRefused {
        /// The org.
        org: String,
        /// The log position the delta would have taken.
        seq: u64,
        /// Why it does not apply to the chain tip.
        reason: String,
    },
    /// A write through a replica opened with [`crate::Replica::open_read_only`].
    #[error("the store was opened read-only; {op} writes to it")]
    ReadOnly {
        /// What was refused (claim, retention).
        op: &'static str,
    },
    /// A store URL ([`crate::StoreUrl::parse`]) that is empty, malformed or of an unsupported
    /// scheme, a local path that is no directory where one must exist, or a store its
    /// builder cannot make from the URL and the environment (`source`).
    #[error("store URL {url:?}: {reason}")]
    InvalidStoreUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
        /// The store builder's error, when it refused.
        #[source]
        source: Option<object_store::Error>,
    },
    /// Settings or a retention policy are out of range.
    #[error("invalid settings: {reason}")]
    InvalidSettings {
        /// What is wrong.
        reason: String,
    },
    /// A restore by time ([`crate::Replica::position_at_time`]) named a moment before every
    /// position the store keeps.
    #[error(
        "org {org} has no published position at or before {}: the oldest kept is seq {oldest_seq}, published at {}",
        rfc3339(*at_ms),
        rfc3339(*oldest_ms)
    )]
    BeforeWindow {
        /// The org.
        org: String,
        /// The moment asked for, ms since the Unix epoch.
        at_ms: u64,
        /// The oldest kept position.
        oldest_seq: u64,
        /// When it was published (its writer's clock), ms since the Unix epoch.
        oldest_ms: u64,
    },
    /// The position lies in the point-in-time window, but retention kept only its bucket's
    /// last position (`docs/design.md` 2d): restore one of the kept positions around it.
    #[error(
        "org {org}: position {seq} is not kept (older than keep_ms, only its minute's last position is); {}",
        kept_around(*.before, *.after)
    )]
    PositionNotKept {
        /// The org.
        org: String,
        /// The requested log position.
        seq: u64,
        /// The nearest kept position below it.
        before: Option<u64>,
        /// The nearest kept position above it.
        after: Option<u64>,
    },
    /// `restore(at: Some(seq))` named a log position that holds no snapshot or delta entry.
    #[error("org {org} has no published snapshot or delta at seq {seq}")]
    NoSuchSnapshot {
        /// The org.
        org: String,
        /// The requested log position.
        seq: u64,
    },
    /// Another writer holds the advisory lease and was seen renewing it within a watch (or
    /// not watched long enough yet, I15); claim again later or with `force`.
    #[error("org {org} is leased by writer {holder}: {}", held_text(*retry_after_ms, *draining))]
    LeaseHeld {
        /// The org.
        org: String,
        /// Writer id of the current holder.
        holder: String,
        /// Ms of the claimant's own monotonic clock before a claim could go through, if the
        /// holder's lease does not change meanwhile ([`crate::Hold::wait_ms`], at least 1):
        /// never computed from a timestamp the holder wrote.
        retry_after_ms: u64,
        /// Where the holder's clients reach it, if it advertised an address.
        holder_addr: Option<String>,
        /// The holder's process lease says it is draining and lists this org (a graceful
        /// shutdown, `docs/design.md` 3f): its release is on the way, and a claim passes as
        /// soon as that lands, long before `retry_after_ms` (the bound should the holder die
        /// before it releases).
        draining: bool,
    },
    /// Every claim attempt collided with a concurrent claimer.
    #[error("org {org}: claim lost the race {attempts} times")]
    Contended {
        /// The org.
        org: String,
        /// Attempts made.
        attempts: u32,
    },
    /// A newer round owns the org: this claim must never ship again (I7, I11).
    #[error("org {org}: round {ours} is fenced by round {theirs}")]
    Fenced {
        /// The org.
        org: String,
        /// The round of the caller's claim.
        ours: u64,
        /// The round of the entry found in our slot or above it.
        theirs: u64,
    },
    /// The writer's journal run can acknowledge nothing more: another process sealed it
    /// (an adoption after a crash, `docs/design.md` 3g K2), or it holds an object this writer
    /// never made. Every org of the run is lost to this writer (I7): stop them all and drop
    /// their local files.
    #[error("journal {run}: fenced at slot {slot}: {reason}")]
    RunFenced {
        /// The run.
        run: String,
        /// The slot where the writer met the fence.
        slot: u64,
        /// What it met.
        reason: String,
    },
    /// A journal section was not acknowledged: the batch holding it did not enter the
    /// writer's resolved prefix (another writer's exclusion took its slot, or the run
    /// self-sealed below it, `docs/design.md` 3g J1-J3). Nothing of it is acknowledged and
    /// the tenure goes on: ship again (sections are cumulative).
    #[error("org {org}: journal {run} slot {slot}: section not acknowledged: {reason}")]
    NotAcknowledged {
        /// The org.
        org: String,
        /// The run the batch was issued in.
        run: String,
        /// The batch's slot.
        slot: u64,
        /// Why.
        reason: &'static str,
    },
    /// The slot a ship or release was published at holds a stray: a pipelined ship of the
    /// writer this claim fenced, landed above the claim (`docs/design.md` 3e, W5). The claim
    /// moved past it and stays usable; nothing was published. Ship again.
    #[error("org {org}: log entry {seq} holds a fenced writer's ship; publish again above it")]
    SlotTaken {
        /// The org.
        org: String,
        /// The log position the stray holds.
        seq: u64,
    },
    /// The store refused to write a log entry: the put failed twice and reading the slot back
    /// found it empty both times (I9: absent, retried once). Nothing was published under it
    /// and no newer round is implied; retry later.
    #[error("org {org}: the store refused to write log entry {seq}")]
    StoreRefused {
        /// The org.
        org: String,
        /// The log position it refused.
        seq: u64,
        /// The store's error on the last try.
        #[source]
        source: Box<Error>,
    },
    /// A publish failed and the re-read could not settle whether it landed (I9). Not a
    /// proof of a successor, but the claim is poisoned all the same: nothing may be
    /// acknowledged from it, and the writer claims again.
    #[error("org {org}: outcome of publishing log entry {seq} is unknown")]
    PublishUnknown {
        /// The org.
        org: String,
        /// The log position whose outcome is unknown.
        seq: u64,
        /// The failure that left it unknown.
        #[source]
        source: Box<Error>,
    },
    /// The claim was fenced, released, or left in an unknown state earlier.
    #[error("org {org}: claim of round {round} is unusable: {reason}")]
    ClaimUnusable {
        /// The org.
        org: String,
        /// The claim's round.
        round: u64,
        /// Why (fenced, released, unknown outcome).
        reason: &'static str,
    },
    /// The store does not honour create-only puts; refusing to run on it.
    #[error("unsafe object store: {reason}")]
    UnsafeStore {
        /// What the probe saw.
        reason: String,
    },
    /// An object-store call failed.
    #[error("object store {op} failed on {path}")]
    Store {
        /// The operation (`put`, `get`, `list`, `delete`).
        op: &'static str,
        /// The object path or prefix.
        path: String,
        /// The store's error.
        #[source]
        source: object_store::Error,
    },
    /// The log names an object that is not in the store (I10).
    #[error("object {path} is missing")]
    MissingObject {
        /// The missing object.
        path: String,
    },
    /// An object's content fails its checks (checksum, size, SQLite check, parse) (I10).
    #[error("object {path} is corrupt: {reason}")]
    Corrupt {
        /// The object or file.
        path: String,
        /// Which check failed.
        reason: String,
    },
    /// The delta chain after the newest snapshot does not lead to the state the writer
    /// published: a gap, a reordered or foreign delta, or a database checksum that does not
    /// match after applying a delta (I10). Never answered with an older database.
    #[error("org {org}: delta chain broken at seq {seq}: {reason}")]
    ChainBroken {
        /// The org.
        org: String,
        /// The log position where the chain stops making sense.
        seq: u64,
        /// What does not match.
        reason: String,
    },
    /// `ship_delta` was called on a claim that has published no snapshot yet (or whose last
    /// ship failed): ship a full snapshot first.
    #[error("org {org}: round {round} has no published snapshot to apply a delta to")]
    NoChainTip {
        /// The org.
        org: String,
        /// The claim's round.
        round: u64,
    },
    /// Entries listed in the log vanished before they could be read (retention ran
    /// concurrently), every time it was read; nothing was installed. Retry.
    #[error("org {org}: the log changed while it was read {attempts} times")]
    LogChanged {
        /// The org.
        org: String,
        /// Reads attempted.
        attempts: u32,
    },
    /// An object carries a format version or kind this build does not know.
    #[error("object {object} has an unknown format: {detail}")]
    UnknownFormat {
        /// The object path.
        object: String,
        /// The version or kind found.
        detail: String,
    },
    /// An org log entry of format 5 (a journal mark) met by a reader of the per-org path:
    /// the org is followed through the journal (`docs/design.md` 3g, K3), which this reader
    /// does not do. Hydrate, restore and read it with the journal's readers
    /// ([`crate::Replica::walk_org`], [`crate::Replica::restore`]).
    #[error(
        "{object} is a journal entry (format 5): this org is read through the journal, not as a per-org chain (docs/design.md 3g, K3)"
    )]
    JournalRequired {
        /// The log entry's path.
        object: String,
    },
    /// A test failpoint injected a failure.
    #[error("failpoint {point:?} injected a failure for org {org}: {message}")]
    Injected {
        /// The seam.
        point: FailPoint,
        /// The org.
        org: String,
        /// The failpoint's message.
        message: String,
    },
    /// SQLite failed while taking or checking a snapshot.
    #[error("sqlite failed while {op}")]
    Sqlite {
        /// What was being done.
        op: &'static str,
        /// SQLite's error.
        #[source]
        source: rusqlite::Error,
    },
    /// A local file operation failed (temp file, rename, fsync).
    #[error("local io failed on {path}")]
    Io {
        /// The local path.
        path: String,
        /// The io error.
        #[source]
        source: std::io::Error,
    },
    /// The database's files were changed outside its writer (another process wrote,
    /// checkpointed, replaced or removed them, I13): nothing captured from them was
    /// published. The claim must end and the org be hydrated again from the store.
    #[error("org {org}: files of the writer of round {round} changed outside it: {reason}")]
    FilesChanged {
        /// The org.
        org: crate::OrgId,
        /// The writer's round.
        round: u64,
        /// What was found changed.
        reason: String,
    },
    /// A log entry or lease could not be serialized.
    #[error("encoding a {what} failed")]
    Encode {
        /// What was being encoded (`log entry`, `lease`).
        what: &'static str,
        /// serde_json's error.
        #[source]
        source: serde_json::Error,
    },
    /// zstd failed to compress a snapshot image or delta body in memory.
    #[error("org {org}: compressing a {what} failed")]
    Compress {
        /// The org being shipped.
        org: String,
        /// What was being compressed (`snapshot`, `delta`).
        what: &'static str,
        /// zstd's error.
        #[source]
        source: std::io::Error,
    },
    /// The operating system's random number generator failed (nonces, instance ids).
    #[error("the system random number generator failed")]
    Random {
        /// getrandom's error.
        #[source]
        source: getrandom::Error,
    },
    /// This host's clock and the store's disagree by more than
    /// [`crate::Settings::max_clock_skew_ms`], so a decision by wall-clock age (`op`: key
    /// prune, snapshot retention) was refused and nothing was deleted (I15). The store's time
    /// is read from the Last-Modified of an object this process wrote
    /// ([`crate::Replica::store_time`]). Fix the host's clock (NTP); retrying as is will not help.
    #[error(
        "{op} refused: this host's clock is {} the store's ({}), more than max_clock_skew_ms ({max_skew_ms} ms) allows; fix the host's clock",
        skew_words(*host_ms, *store_ms),
        both_times(*host_ms, *store_ms)
    )]
    ClockSkew {
        /// The decision refused (`prune`, `retention`).
        op: &'static str,
        /// This host's clock, ms since the Unix epoch.
        host_ms: u64,
        /// The store's time (a lower bound), ms since the Unix epoch.
        store_ms: u64,
        /// The bound in force, ms.
        max_skew_ms: u64,
    },
    /// A blocking task panicked or was cancelled.
    #[error("blocking task failed while {op}")]
    Task {
        /// What the task was doing.
        op: &'static str,
        /// The join error.
        #[source]
        source: tokio::task::JoinError,
    },
}

/// `8days ahead of` / `2m 5s behind`: how far `host_ms` reads from `store_ms`, in whole
/// seconds.
fn skew_words(host_ms: u64, store_ms: u64) -> String {
    let (apart, side) = if host_ms >= store_ms {
        (host_ms - store_ms, "ahead of")
    } else {
        (store_ms - host_ms, "behind")
    };
    let apart = std::time::Duration::from_secs(apart / 1000);
    format!("{} {side}", humantime::format_duration(apart))
}

/// `host T1, store T2`, for messages.
fn both_times(host_ms: u64, store_ms: u64) -> String {
    format!("host {}, store {}", rfc3339(host_ms), rfc3339(store_ms))
}

/// Milliseconds since the Unix epoch as RFC 3339 (UTC, milliseconds), for messages.
fn rfc3339(ms: u64) -> humantime::Rfc3339Timestamp {
    humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms))
}

impl Error {
    /// What the caller should do; one exhaustive match over every variant.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::ReadOnly { .. }
            | Error::InvalidOrgId { .. }
            | Error::InvalidWriter { .. }
            | Error::InvalidSnapshot { .. }
            | Error::InvalidDelta { .. }
            | Error::DeltaRefused { .. }
            | Error::InvalidSettings { .. }
            | Error::InvalidStoreUrl { .. }
            | Error::NoSuchSnapshot { .. }
            | Error::PositionNotKept { .. }
            | Error::BeforeWindow { .. }
            | Error::NoChainTip { .. } => ErrorKind::Input,
            Error::LeaseHeld { .. }
            | Error::Contended { .. }
            | Error::LogChanged { .. }
            | Error::Injected { .. }
            | Error::StoreRefused { .. }
            | Error::SlotTaken { .. }
            | Error::NotAcknowledged { .. }
            | Error::Io { .. } => ErrorKind::Retry,
            Error::Fenced { .. }
            | Error::RunFenced { .. }
            | Error::PublishUnknown { .. }
            | Error::ClaimUnusable { .. }
            | Error::FilesChanged { .. } => ErrorKind::Reacquire,
            Error::Store { source, .. } => store_kind(source),
            Error::MissingObject { .. } | Error::Corrupt { .. } | Error::ChainBroken { .. } => {
                ErrorKind::Corrupt
            }
            Error::UnsafeStore { .. }
            | Error::UnknownFormat { .. }
            | Error::JournalRequired { .. }
            | Error::Sqlite { .. }
            | Error::Encode { .. }
            | Error::Compress { .. }
            | Error::Random { .. }
            | Error::ClockSkew { .. }
            | Error::Task { .. } => ErrorKind::Fatal,
        }
    }

    /// True when retrying the same call as is may succeed ([`ErrorKind::Retry`]).
    pub fn is_retryable(&self) -> bool {
        self.kind() == ErrorKind::Retry
    }

    /// True when the claim can never publish again and the caller must discard its local
    /// state and claim again ([`ErrorKind::Reacquire`]): fenced by a newer round
    /// ([`Error::Fenced`]), a publish of unknown outcome ([`Error::PublishUnknown`]), or a
    /// claim already unusable ([`Error::ClaimUnusable`]). Nothing may be acknowledged from
    /// such a claim (I7, I9).
    pub fn is_claim_lost(&self) -> bool {
        self.kind() == ErrorKind::Reacquire
    }

    pub(crate) fn store(
        op: &'static str,
        path: &object_store::path::Path,
        source: object_store::Error,
    ) -> Self {
        Error::Store {
            op,
            path: path.to_string(),
            source,
        }
    }

    /// [`Error::Corrupt`]: `object` (a store path, or a local file) failed a check.
    pub(crate) fn corrupt(object: &str, reason: impl std::fmt::Display) -> Self {
        Error::Corrupt {
            path: object.into(),
            reason: reason.to_string(),
        }
    }

    pub(crate) fn io(path: &std::path::Path, source: std::io::Error) -> Self {
        Error::Io {
            path: path.display().to_string(),
            source,
        }
    }
}

fn store_kind(e: &object_store::Error) -> ErrorKind {
    use object_store::Error as E;
    match e {
        E::InvalidPath { .. }
        | E::NotSupported { .. }
        | E::NotImplemented { .. }
        | E::PermissionDenied { .. }
        | E::Unauthenticated { .. }
        | E::UnknownConfigurationKey { .. } => ErrorKind::Fatal,
        _ => ErrorKind::Retry,
    }
}

/// Where to restore instead, for [`Error::PositionNotKept`].
fn kept_around(before: Option<u64>, after: Option<u64>) -> String {
    match (before, after) {
        (Some(b), Some(a)) => format!("the kept positions around it are seq {b} and seq {a}"),
        (Some(b), None) => format!("the kept position before it is seq {b}"),
        (None, Some(a)) => format!("the kept position after it is seq {a}"),
        (None, None) => "no position around it is kept".to_owned(),
    }
}

/// What a [`Error::LeaseHeld`] says of the wait.
fn held_text(retry_after_ms: u64, draining: bool) -> String {
    let watch = humantime::format_duration(std::time::Duration::from_millis(retry_after_ms));
    if draining {
        format!(
            "it is draining: claimable once its release lands, or after {watch} without a renewal"
        )
    } else {
        format!("claimable after {watch} without a renewal")
    }
}

#[cfg(test)]
mod message_tests {
    use super::Error;

    #[test]
    fn a_held_lease_says_how_long_a_claim_waits() {
        let e = Error::LeaseHeld {
            org: "acme".into(),
            holder: "w".into(),
            retry_after_ms: 33_000,
            holder_addr: None,
            draining: false,
        };
        assert_eq!(
            e.to_string(),
            "org acme is leased by writer w: claimable after 33s without a renewal"
        );
        let e = Error::LeaseHeld {
            org: "acme".into(),
            holder: "w".into(),
            retry_after_ms: 33_000,
            holder_addr: None,
            draining: true,
        };
        assert_eq!(
            e.to_string(),
            "org acme is leased by writer w: it is draining: claimable once its release lands, or after 33s without a renewal"
        );
    }

    #[test]
    fn a_clock_refusal_says_which_way_how_far_and_both_times() {
        let e = Error::ClockSkew {
            op: "prune",
            host_ms: 1_764_547_200_123 + 8 * 86_400_000,
            store_ms: 1_764_547_200_123,
            max_skew_ms: 300_000,
        };
        assert_eq!(
            e.to_string(),
            "prune refused: this host's clock is 8days ahead of the store's (host \
             2025-12-09T00:00:00.123Z, store 2025-12-01T00:00:00.123Z), more than \
             max_clock_skew_ms (300000 ms) allows; fix the host's clock"
        );
        let behind = Error::ClockSkew {
            op: "retention",
            host_ms: 1_000_000,
            store_ms: 1_000_000 + 125_400,
            max_skew_ms: 60_000,
        };
        assert!(
            behind
                .to_string()
                .starts_with("retention refused: this host's clock is 2m 5s behind the store's"),
            "{behind}"
        );
    }
}
