//! Poison-tolerant locking, the one way org takes a `std::sync::Mutex` (`idem_base::lock`).
//!
//! A panic while a guard is held poisons the mutex. Every critical section in this crate keeps
//! its data consistent at each statement (it pushes, drains, assigns or swaps whole values), so
//! the data behind a poisoned mutex is still whole: refusing it would turn one panicked job
//! into a dead org or a dead registry without protecting any invariant. Panics are handled
//! where they happen instead (a writer job that panics stops that org's writer).

pub(crate) use idem_base::lock::{lock, wait};
