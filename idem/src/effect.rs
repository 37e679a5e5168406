//! External effects: reserve → execute → settle, for effects no SQLite transaction can roll
//! back (a payment API, an email, a webhook).
//!
//! [`crate::once`] covers writes made through the lent transaction. An external effect cannot
//! join that transaction, so it gets a reservation instead: the store records the effect key
//! before the executor runs, exactly one attempt wins, and every later transition is checked.
//! **The invariant (E1): an effect key's executor runs at most once** unless its row says FAILED
//! (the executor proved it did not execute). The price is that some outcomes are AMBIGUOUS and
//! need an operator ([`resolve`]) or a reconcile hook ([`reconcile`]).
//!
//! Words: an executor either **executed** (the row becomes COMMITTED, its result replayed),
//! proved it was **not executed** (FAILED: the only state that may be reserved again), or
//! ended **ambiguous** (AMBIGUOUS: nobody knows). "Failed" always means proved not done — a
//! FAILED effect, a `CommitFailed` write — and never an unknown outcome.
//!
//! ```text
//!             reserve (BEGIN IMMEDIATE, one winner)
//!   (none) ───────────────► RESERVED{attempt, lease_until}
//!   FAILED ───────────────►    │
//!                              ├─ executor Ok(bytes ≤ limit) ───► COMMITTED{result}  (replayed)
//!                              ├─ executor Ok(bytes > limit) ───► COMMITTED, result not kept
//!                              ├─ executor NotExecuted ─────────► FAILED             (may reserve again)
//!                              ├─ Ambiguous error, panic ───────► AMBIGUOUS
//!                              └─ lease lapsed (Options::lapse) ► AMBIGUOUS (read so at once)
//!   AMBIGUOUS ── resolve(executed, result) ──► COMMITTED
//!   AMBIGUOUS ── resolve(not executed) ──────► FAILED
//! ```
//!
//! What an executor returned is never lost silently: after its `Ok`, a settlement that cannot
//! be written is [`crate::Error::EffectNotRecorded`] carrying the result, and a result above
//! [`Options::max_result_bytes`] is recorded as executed without it
//! ([`crate::Error::EffectResultNotKept`]). Every transition appends to the key's
//! [`history`] (who, when, what) in its own transaction. When a reservation's lease lapses is
//! the caller's rule ([`Options::lapse`]): a reader must not compare a stamp another host's
//! clock wrote with its own (I15); a lapsed reservation reads AMBIGUOUS to every reader
//! ([`list_with`], [`get_with`]) and is resolvable.
//!
//! Every transition after the reservation is a conditional UPDATE that matches the row the
//! writer expects (state, attempt id and stamps), with the changed-row count checked; zero rows
//! means someone else moved the row, which is re-read and reported. No transaction is open while
//! the executor runs.
//!
//! Commit failures (I9): an error SQLite reports in band before anything is committed
//! (`SQLITE_BUSY`) retries the write; a COMMIT whose outcome is unknown is settled by re-reading
//! the whole row — exactly the row we wrote means it landed; the row as it was before (or no row)
//! means it did not, and the write is issued once more; anything else is decided afresh. A
//! re-read that fails writes nothing and returns [`crate::Error::EffectCommitUnknown`]: the key
//! then stays RESERVED until its lease lapses and turns AMBIGUOUS — availability is the price,
//! never a second execution.
//!
//! ```
//! use idem::effect;
//!
//! let mut conn = rusqlite::Connection::open_in_memory()?;
//! let opts = effect::Options::new().lease_ms(30_000);
//! let mut calls = 0;
//! for _ in 0..2 {
//!     let out = effect::run(&mut conn, "email-41", &opts, || {
//!         calls += 1; // send the email here
//!         Ok::<_, effect::Error>(b"queued".to_vec())
//!     })?;
//!     assert_eq!(out.result, b"queued");
//! }
//! assert_eq!(calls, 1);
//! # Ok::<_, Box<dyn std::error::Error>>(())
//! ```

mod admin;
mod history;
mod judge;
mod options;
mod output;
mod reserve;
mod row;
mod settle;
mod state;
mod write;

pub use admin::{
    Reconcile, Resolution, get, get_with, list, list_open, list_with, reconcile, resolve,
    resolve_with,
};
pub use history::{Transition, history};
pub use options::{DEFAULT_LEASE_MS, LapseFn, Options, WriteHook};
pub use output::Output;
pub use reserve::{Reservation, Reserved, reserve};
pub use row::Effect;
pub use settle::{Error, Outcome, Settlement, run, settle};
pub use state::State;
