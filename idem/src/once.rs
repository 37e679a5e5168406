//! The dedup transaction: the key row commits in the same SQLite transaction as the effect.
//!
//! Write path (one `BEGIN IMMEDIATE` transaction, so checks and writes are serialized):
//!
//! ```text
//! read meta (schema, highest round) -> stale round? -> read key row
//!   applied   -> fingerprint check -> replay
//!   exhausted -> AttemptsExhausted
//!   otherwise -> SAVEPOINT; apply(tx)
//!       Ok  -> upsert applied row (keeps counted failures) -> write hook -> COMMIT
//!       Err -> ROLLBACK TO savepoint; count the attempt, only if not applied
//!              -> write hook -> COMMIT
//! COMMIT error -> re-read the whole row (I9): ours -> applied; another's -> replay;
//!                 absent -> CommitFailed (safe to retry); re-read error -> CommitUnknown
//! ```

use rusqlite::{Connection, Transaction, TransactionBehavior};

use crate::error::{BoxError, is_busy};
use crate::failpoint::{self, FailPoint, Write};
use crate::record::{KeyRow, state_in_tx};
use crate::schema::raise_max_round;
use crate::{Error, Options, Outcome, key::validate_key};

/// Runs `apply` at most once for `key` and returns its result on every call (I1–I3).
///
/// `apply` receives the open write transaction; every write it makes through it commits
/// together with the key row, or not at all (I1). On a later call the stored result comes back
/// byte-identical with `applied == false`, and `apply` is not run (I3). `round` is the writer's
/// fencing epoch, recorded with the key for audit; a round below the highest that already wrote
/// this database is refused. Uses [`Options::default`]; see [`once_with`].
///
/// # Errors
/// See [`once_with`].
///
/// # Examples
/// ```
/// let mut conn = rusqlite::Connection::open_in_memory()?;
/// conn.execute_batch("CREATE TABLE ledger (key TEXT, cents INTEGER)")?;
/// for _ in 0..3 {
///     let out = idem::once(&mut conn, "transfer-42", 1, |tx| {
///         tx.execute("INSERT INTO ledger VALUES ('transfer-42', 500)", [])?;
///         Ok::<_, rusqlite::Error>(b"ok".to_vec())
///     })?;
///     assert_eq!(out.result, b"ok");
/// }
/// let rows: i64 = conn.query_row("SELECT count(*) FROM ledger", [], |r| r.get(0))?;
/// assert_eq!(rows, 1);
/// # Ok::<_, Box<dyn std::error::Error>>(())
/// ```
pub fn once<F, E>(conn: &mut Connection, key: &str, round: u64, apply: F) -> Result<Outcome, Error>
where
    F: FnOnce(&Transaction<'_>) -> Result<Vec<u8>, E>,
    E: Into<BoxError>,
{
    once_with(conn, key, round, &Options::default(), apply)
}

/// [`once`] with [`Options`]: fingerprint, attempt limit, result size limit, clock,
/// failpoints.
///
/// # Errors
/// - [`Error::InvalidKey`], [`Error::InvalidRound`], [`Error::InTransaction`]: bad input;
///   `apply` is not called.
/// - [`Error::StaleRound`]: a newer round wrote this database; nothing is written.
/// - [`Error::FingerprintMismatch`] (I4), [`Error::AttemptsExhausted`]: `apply` not called,
///   nothing changed.
/// - [`Error::Apply`], [`Error::ResultTooLarge`]: `apply`'s writes rolled back, the attempt
///   counted (I5). A panic in `apply` rolls everything back and propagates.
/// - [`Error::Busy`]: the write lock was not free within the busy timeout; `apply` not called.
/// - [`Error::CommitFailed`] / [`Error::CommitUnknown`]: see I9; retrying with the key is safe.
pub fn once_with<F, E>(
    conn: &mut Connection,
    key: &str,
    round: u64,
    opts: &Options,
    apply: F,
) -> Result<Outcome, Error>
where
    F: FnOnce(&Transaction<'_>) -> Result<Vec<u8>, E>,
    E: Into<BoxError>,
{
    validate_key(key)?;
    let round_i = i64::try_from(round).map_err(|_| Error::InvalidRound { round })?;
    if !conn.is_autocommit() {
        return Err(Error::InTransaction);
    }
    // One write transaction for every path: the org layer runs one writer per database, so an
    // uncontended BEGIN IMMEDIATE costs less than a second lookup of a random key would.
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|e| busy_or(key, e))?;
    let (meta, existing) = state_in_tx(&tx, key).map_err(|e| match e {
        Error::Sqlite(s) => busy_or(key, s),
        other => other,
    })?;
    if round < meta.max_round {
        return Err(Error::StaleRound {
            key: key.to_owned(),
            ours: round,
            highest: meta.max_round,
        });
    }
    if let Some(row) = &existing {
        if row.applied {
            return replay(key, row.clone(), opts);
        }
        if let Some(max) = opts.max_attempts
            && row.attempts >= i64::from(max)
        {
            return Err(Error::AttemptsExhausted {
                key: key.to_owned(),
                attempts: u32::try_from(row.attempts).unwrap_or(u32::MAX),
                last_error: row.last_error.clone().unwrap_or_default(),
            });
        }
    }
    if round > meta.max_round {
        raise_max_round(&tx, round_i)?;
    }

    let attempt = match opts.attempt_id {
        Some(id) => id.to_vec(),
        None => random_attempt_id()?,
    };
    let now = i64::try_from(opts.now()).unwrap_or(i64::MAX);
    tx.prepare_cached("SAVEPOINT idem_apply")?.execute([])?;
    failpoint::hit(opts.failpoints.as_ref(), FailPoint::BeforeApply).map_err(|e| Error::Apply {
        key: key.to_owned(),
        source: Box::new(e),
    })?;
    let applied = apply(&tx);
    if tx.is_autocommit() {
        return Err(Error::TransactionEnded {
            key: key.to_owned(),
        });
    }
    let failure = match applied {
        Ok(result) if result.len() <= opts.max_result_bytes => {
            tx.prepare_cached("RELEASE idem_apply")?.execute([])?;
            let had_row = existing.is_some();
            let ours = KeyRow {
                applied: true,
                round: round_i,
                attempt,
                at_ms: now,
                result: Some(result),
                fingerprint: opts.fingerprint.clone(),
                attempts: existing.as_ref().map_or(0, |r| r.attempts),
                last_error: existing.and_then(|r| r.last_error),
            };
            write_applied(&tx, key, &ours, had_row)?;
            if let Some(hook) = &opts.on_write {
                hook(&tx).map_err(|e| busy_or(key, e))?;
            }
            return match commit(tx, opts) {
                Ok(()) => Ok(outcome_of(key, &ours)),
                Err(commit_err) => settle(conn, key, &ours, opts, commit_err),
            };
        }
        Ok(result) => Error::ResultTooLarge {
            key: key.to_owned(),
            len: result.len(),
            limit: opts.max_result_bytes,
        },
        Err(e) => Error::Apply {
            key: key.to_owned(),
            source: e.into(),
        },
    };
    tx.execute_batch("ROLLBACK TO idem_apply; RELEASE idem_apply")?;
    count_failure(&tx, key, round_i, &attempt, now, &failure)?;
    // If the write hook or this COMMIT fails the count is lost, which I5 allows; the caller
    // still learns why its attempt failed, and nothing of apply's was kept either way.
    let hooked = opts.on_write.as_ref().is_none_or(|hook| hook(&tx).is_ok());
    if hooked {
        let _ = tx.commit();
    }
    Err(failure)
}

fn busy_or(key: &str, e: rusqlite::Error) -> Error {
    if is_busy(&e) {
        Error::Busy {
            key: key.to_owned(),
            source: e,
        }
    } else {
        Error::Sqlite(e)
    }
}

/// A replay: the fingerprint must match (I4), then the stored result comes back (I3).
fn replay(key: &str, row: KeyRow, opts: &Options) -> Result<Outcome, Error> {
    if row.fingerprint != opts.fingerprint {
        return Err(Error::FingerprintMismatch {
            key: key.to_owned(),
        });
    }
    Ok(Outcome {
        key: key.to_owned(),
        result: row.result.unwrap_or_default(),
        applied: false,
        round: u64::try_from(row.round).unwrap_or(0),
        applied_at_ms: u64::try_from(row.at_ms).unwrap_or(0),
    })
}

/// One statement for the key row: a plain INSERT when the key had no row (the common case,
/// and the cheapest statement), or an UPDATE turning a failures-only row into the applied
/// row. `WHERE applied = 0` means nothing ever turns an applied row back (I5).
fn write_applied(
    tx: &Transaction<'_>,
    key: &str,
    row: &KeyRow,
    had_row: bool,
) -> Result<(), Error> {
    let sql = if had_row {
        "UPDATE idem_keys SET applied = 1, round = ?2, attempt = ?3, at_ms = ?4, result = ?5, \
         fingerprint = ?6 WHERE key = ?1 AND applied = 0"
    } else {
        "INSERT INTO idem_keys (key, applied, round, attempt, at_ms, result, fingerprint, \
         attempts, last_error) VALUES (?1, 1, ?2, ?3, ?4, ?5, ?6, 0, NULL)"
    };
    let changed = tx.prepare_cached(sql)?.execute(rusqlite::params![
        key,
        row.round,
        row.attempt,
        row.at_ms,
        row.result.as_deref().unwrap_or_default(),
        row.fingerprint,
    ])?;
    if changed != 1 {
        // Unreachable while we hold the write lock and read the row unapplied; refuse rather
        // than commit an effect without its key.
        return Err(Error::Sqlite(rusqlite::Error::StatementChangedRows(
            changed,
        )));
    }
    Ok(())
}

/// Counts a failed attempt, only if the key is not applied (I5).
fn count_failure(
    tx: &Transaction<'_>,
    key: &str,
    round: i64,
    attempt: &[u8],
    now: i64,
    failure: &Error,
) -> Result<(), Error> {
    // Every message of the chain, as stored in `last_error`.
    let text = idem_base::ErrorChain::every(failure).to_string();
    tx.prepare_cached(
        "INSERT INTO idem_keys (key, applied, round, attempt, at_ms, result, fingerprint, \
         attempts, last_error) VALUES (?1, 0, ?2, ?3, ?4, NULL, NULL, 1, ?5)
         ON CONFLICT(key) DO UPDATE SET attempts = attempts + 1, last_error = excluded.last_error,
           at_ms = excluded.at_ms, round = excluded.round, attempt = excluded.attempt
         WHERE applied = 0",
    )?
    .execute(rusqlite::params![key, round, attempt, now, text])?;
    Ok(())
}

/// COMMIT, with the failpoints that stand in for a COMMIT that failed or landed-but-failed.
fn commit(tx: Transaction<'_>, opts: &Options) -> Result<(), BoxError> {
    let failpoints = opts.failpoints.as_ref();
    if let Err(injected) = failpoint::hit(failpoints, FailPoint::BeforeCommit(Write::Once)) {
        drop(tx); // rolls back, as SQLite does for a COMMIT that fails
        return Err(Box::new(injected));
    }
    tx.commit()?;
    failpoint::hit(failpoints, FailPoint::AfterCommit(Write::Once))?;
    Ok(())
}

/// Settles a failed COMMIT by re-reading the whole row, attempt id included (I9): the row
/// exactly as we wrote it means it landed; another call's applied row is a replay of its
/// result; anything else means nothing landed. A failed re-read writes nothing.
fn settle(
    conn: &Connection,
    key: &str,
    ours: &KeyRow,
    opts: &Options,
    commit_err: BoxError,
) -> Result<Outcome, Error> {
    let unknown = |source: BoxError| Error::CommitUnknown {
        key: key.to_owned(),
        source,
    };
    if !conn.is_autocommit() {
        // SQLite left the transaction open and rusqlite's rollback on drop failed: a read now
        // would see our own uncommitted row, so it cannot settle anything.
        conn.execute_batch("ROLLBACK")
            .map_err(|e| unknown(Box::new(e)))?;
    }
    failpoint::hit(
        opts.failpoints.as_ref(),
        FailPoint::BeforeReread(Write::Once),
    )
    .map_err(|injected| unknown(Box::new(injected)))?;
    match KeyRow::read(conn, key).map_err(|e| unknown(Box::new(e)))? {
        Some(row) if row == *ours => Ok(outcome_of(key, ours)),
        Some(row) if row.applied => replay(key, row, opts),
        _ => Err(Error::CommitFailed {
            key: key.to_owned(),
            source: commit_err,
        }),
    }
}

fn outcome_of(key: &str, row: &KeyRow) -> Outcome {
    Outcome {
        key: key.to_owned(),
        result: row.result.clone().unwrap_or_default(),
        applied: true,
        round: u64::try_from(row.round).unwrap_or(0),
        applied_at_ms: u64::try_from(row.at_ms).unwrap_or(0),
    }
}

/// A per-call attempt id: 8 random bytes drawn once per thread from the OS, then an 8-byte
/// per-thread counter. Unique per call (the I9 re-read needs uniqueness, not secrecy) without
/// a system call on every request.
fn random_attempt_id() -> Result<Vec<u8>, Error> {
    thread_local! {
        static SEED: std::cell::Cell<Option<([u8; 8], u64)>> = const { std::cell::Cell::new(None) };
    }
    SEED.with(|cell| {
        let (seed, n) = match cell.get() {
            Some(v) => v,
            None => {
                let mut seed = [0u8; 8];
                getrandom::fill(&mut seed).map_err(|e| Error::Random {
                    reason: e.to_string(),
                })?;
                (seed, 0)
            }
        };
        cell.set(Some((seed, n.wrapping_add(1))));
        let mut id = Vec::with_capacity(16);
        id.extend_from_slice(&seed);
        id.extend_from_slice(&n.to_be_bytes());
        Ok(id)
    })
}
