//! One effect write transaction: BEGIN IMMEDIATE, the statement, the write hook, COMMIT — and
//! the classification of how it ended, which decides between "retry" and "re-read" (I9).

use rusqlite::{Connection, Transaction, TransactionBehavior};

use super::options::Options;
use super::row::{self, Effect};
use crate::Error;
use crate::error::{BoxError, is_busy};
use crate::failpoint::{FailPoint, Write};

/// How often an in-band `SQLITE_BUSY` (nothing committed) is retried beyond the busy timeout.
pub(crate) const BUSY_RETRIES: u32 = 3;

/// How a write transaction ended.
pub(crate) enum Ended {
    /// COMMIT returned Ok.
    Committed,
    /// SQLite said in band that nothing was committed (busy): retry the write.
    Busy(rusqlite::Error),
    /// COMMIT failed with an unknown outcome: re-read before deciding anything.
    Unknown(BoxError),
}

/// Opens the write transaction; `Ok(Err(busy))` when the write lock was not free.
pub(crate) fn begin(
    conn: &mut Connection,
) -> Result<Result<Transaction<'_>, rusqlite::Error>, Error> {
    match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
        Ok(tx) => Ok(Ok(tx)),
        Err(e) if is_busy(&e) => Ok(Err(e)),
        Err(e) => Err(e.into()),
    }
}

fn injected_busy(point: FailPoint) -> rusqlite::Error {
    rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
        Some(format!("injected busy at {point:?}")),
    )
}

/// Runs the write hook, then COMMIT, with the failpoints of `write`.
pub(crate) fn commit(tx: Transaction<'_>, opts: &Options, write: Write) -> Result<Ended, Error> {
    if let Some(hook) = &opts.on_write {
        match hook(&tx) {
            Ok(()) => {}
            Err(e) if is_busy(&e) => return Ok(Ended::Busy(e)),
            Err(e) => return Err(e.into()),
        }
    }
    if opts.hit(FailPoint::Busy(write)).is_err() {
        return Ok(Ended::Busy(injected_busy(FailPoint::Busy(write))));
    }
    if let Err(injected) = opts.hit(FailPoint::BeforeCommit(write)) {
        drop(tx); // rolls back: a COMMIT whose outcome is unknown and which did not land
        return Ok(Ended::Unknown(Box::new(injected)));
    }
    match tx.commit() {
        Ok(()) => {}
        // The database says in band that it rolled back; dropping the transaction finished it.
        Err(e) if is_busy(&e) => return Ok(Ended::Busy(e)),
        Err(e) => return Ok(Ended::Unknown(Box::new(e))),
    }
    if let Err(injected) = opts.hit(FailPoint::AfterCommit(write)) {
        return Ok(Ended::Unknown(Box::new(injected)));
    }
    Ok(Ended::Committed)
}

/// Re-reads the whole row after a COMMIT with an unknown outcome. A failure here is
/// [`Error::EffectCommitUnknown`]: the caller writes nothing more and runs no executor.
pub(crate) fn reread(
    conn: &Connection,
    key: &str,
    opts: &Options,
    write: Write,
) -> Result<Option<Effect>, Error> {
    let unknown = |source: BoxError| Error::EffectCommitUnknown {
        key: key.to_owned(),
        source,
    };
    if !conn.is_autocommit() {
        // The failed COMMIT left the transaction open: a read now would see our own write.
        conn.execute_batch("ROLLBACK")
            .map_err(|e| unknown(Box::new(e)))?;
    }
    opts.hit(FailPoint::BeforeReread(write))
        .map_err(|e| unknown(Box::new(e)))?;
    row::read(conn, key).map_err(|e| unknown(Box::new(e)))
}

/// The error for a write that stayed busy through every retry.
pub(crate) fn busy(key: &str, source: rusqlite::Error) -> Error {
    Error::Busy {
        key: key.to_owned(),
        source,
    }
}

/// A statement that should have changed exactly one row under the write lock changed another
/// number: refuse rather than commit something unexpected.
pub(crate) fn expect_one(changed: usize) -> Result<(), Error> {
    if changed == 1 {
        Ok(())
    } else {
        Err(Error::Sqlite(rusqlite::Error::StatementChangedRows(
            changed,
        )))
    }
}
