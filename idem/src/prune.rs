//! Retention of idempotency keys: [`prune`] and the operator's [`clear_failures`].

use std::time::SystemTime;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior};

use crate::error::optional_missing;
use crate::{Error, key::validate_key, system_time_ms};

/// Rows examined per write transaction of [`prune`], so the write lock is held only briefly.
pub const PRUNE_BATCH: usize = 1000;

/// Deletes every key row whose last write (the application, or for a failures-only row the
/// last failed attempt) is strictly before `cutoff`, and returns how many rows were deleted.
///
/// Retention rule: a pruned key is forgotten. A request that arrives again with it runs
/// `apply` again, so the cutoff must lie beyond the longest time clients retry (Stripe keeps
/// keys for 24 hours; AWS Powertools defaults to one hour).
///
/// Works in key order, [`PRUNE_BATCH`] rows per `BEGIN IMMEDIATE` transaction, so each write
/// transaction is short and bounded however large the table is, and no index on time is needed
/// (which would cost every `once` a second B-tree write).
///
/// # Errors
/// [`Error::InTransaction`] if `conn` is inside a transaction; [`Error::Sqlite`] on a SQLite
/// failure (rows deleted by earlier batches stay deleted).
pub fn prune(conn: &mut Connection, cutoff: SystemTime) -> Result<u64, Error> {
    if !conn.is_autocommit() {
        return Err(Error::InTransaction);
    }
    let cutoff_ms = i64::try_from(system_time_ms(cutoff)).unwrap_or(i64::MAX);
    let mut after = String::new();
    let mut deleted = 0u64;
    loop {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let last: Option<String> = optional_missing(
            tx.prepare_cached(
                "SELECT max(key) FROM (SELECT key FROM idem_keys WHERE key > ?1 ORDER BY key \
                 LIMIT ?2)",
            )
            .and_then(|mut s| {
                s.query_row(rusqlite::params![after, PRUNE_BATCH as i64], |r| r.get(0))
                    .optional()
            }),
        )?
        .flatten();
        let Some(last) = last else {
            return Ok(deleted);
        };
        let n = tx
            .prepare_cached("DELETE FROM idem_keys WHERE key > ?1 AND key <= ?2 AND at_ms < ?3")?
            .execute(rusqlite::params![after, last, cutoff_ms])?;
        tx.commit()?;
        deleted += n as u64;
        after = last;
    }
}

/// Operator action: forgets the failed attempts of a key that is not applied, so a key that
/// reached its attempt limit can run again. Returns whether a row was removed. An applied key
/// is never touched (I5).
///
/// # Errors
/// [`Error::InvalidKey`] for a bad key; [`Error::Sqlite`] on a SQLite failure.
pub fn clear_failures(conn: &Connection, key: &str) -> Result<bool, Error> {
    validate_key(key)?;
    let n = optional_missing(
        conn.prepare_cached("DELETE FROM idem_keys WHERE key = ?1 AND applied = 0")
            .and_then(|mut s| s.execute([key]))
            .map(Some),
    )?;
    Ok(n.unwrap_or(0) > 0)
}
