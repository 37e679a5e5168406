//! Exactly-once execution of a request's SQLite effect.
//!
//! **The guarantee.** [`once`] runs `apply` for an idempotency key at most once per database and
//! returns the first run's result, byte-identical, on every later call. The key is the PRIMARY
//! KEY of a row written in the same SQLite transaction as every write `apply` makes through the
//! transaction it is lent, so key and effect commit together or not at all — under an error, a
//! panic, or `kill -9` at any instant. **What it does not cover:** effects outside the database
//! (an HTTP call, an email, a payment API) — `apply` may run again for those if its transaction
//! does not commit; and durability beyond this machine, which the `idem-org` crate adds by
//! shipping the database to object storage before acknowledging.
//!
//! ```
//! use rusqlite::Connection;
//!
//! let dir = tempfile::tempdir()?;
//! let mut conn = Connection::open(dir.path().join("acme.db"))?;
//! conn.execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE ledger (key TEXT, cents INTEGER)")?;
//!
//! let pay = |tx: &rusqlite::Transaction<'_>| {
//!     tx.execute("INSERT INTO ledger VALUES ('pay-7', 1250)", [])?;
//!     Ok::<_, rusqlite::Error>(br#"{"status":"paid"}"#.to_vec())
//! };
//! let first = idem::once(&mut conn, "pay-7", 1, pay)?;
//! let retry = idem::once(&mut conn, "pay-7", 1, pay)?; // a client retry: apply does not run
//! assert!(first.applied && !retry.applied);
//! assert_eq!(first.result, retry.result);
//! let n: i64 = conn.query_row("SELECT count(*) FROM ledger", [], |r| r.get(0))?;
//! assert_eq!(n, 1);
//! # Ok::<_, Box<dyn std::error::Error>>(())
//! ```
//!
//! # Core types
//! - [`once`] / [`once_with`] with [`Options`] (fingerprint, attempt limit, result limit,
//!   clock, failpoints): the dedup transaction, returning an [`Outcome`].
//! - [`applied`]: the read-only check, returning a [`Record`]; [`stats`]: counts of applied
//!   and failed-only keys, returning [`Stats`].
//! - [`ensure_schema`], [`prune`] (retention), [`clear_failures`] (operator reset).
//! - [`effect`]: external effects (payments, email, webhooks): [`effect::reserve`] → execute
//!   → [`effect::settle`], or [`effect::run`] in one call; [`effect::list_with`],
//!   [`effect::history`], [`effect::resolve`] and [`effect::reconcile`] for AMBIGUOUS ones.
//! - [`Clock`] ([`SystemClock`], [`ManualClock`] for tests): the one clock of the workspace,
//!   re-exported from `idem_base` (the same trait `idem_replica::Clock` names).
//! - [`failpoint`]: named fault-injection points ([`failpoint::FailPoint`]) a test passes per
//!   call as [`failpoint::Failpoints`].
//!
//! # Error semantics
//! Every failure is an [`Error`]; [`Error::kind`] says what to do: retry with the same key
//! (busy, commit failed or unknown — the key makes the retry safe), fix the input, report a
//! rejection (fingerprint mismatch, exhausted attempts, `apply` failed), re-acquire (a newer
//! round wrote the database), or stop (schema too new, SQLite failure).
//!
//! # Invariants
//! I1 atomic, I2 at most once, I3 byte-identical replay, I4 fingerprint, I5 failure bookkeeping
//! never overwrites success, I9 a failed COMMIT is settled by re-reading the whole row. See
//! `docs/design.md` in the repository.

#![forbid(unsafe_code)]

pub mod effect;
mod error;
pub mod failpoint;
mod key;
mod once;
mod options;
mod prune;
mod record;
mod schema;
mod stats;
#[cfg(test)]
mod tests;

pub use error::{BoxError, Error, ErrorKind};
pub use idem_base::clock::{Clock, ManualClock, SystemClock, system_time_ms};
pub use key::{MAX_KEY_BYTES, validate_key};
pub use once::{once, once_with};
pub use options::{DEFAULT_MAX_RESULT_BYTES, Options, Outcome};
pub use prune::{PRUNE_BATCH, clear_failures, prune};
pub use record::{Record, applied};
pub use schema::{SCHEMA_VERSION, ensure_schema, restart_rounds};
pub use stats::{Stats, stats};
