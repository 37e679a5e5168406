//! Poison-tolerant locking, the one way org takes a `std::sync::Mutex`.
//!
//! A panic while a guard is held poisons the mutex. Every critical section in this crate keeps
//! its data consistent at each statement (it pushes, drains, assigns or swaps whole values), so
//! the data behind a poisoned mutex is still whole: refusing it would turn one panicked job
//! into a dead org or a dead registry without protecting any invariant. Panics are handled
//! where they happen instead (a writer job that panics stops that org's writer).

use std::sync::{Condvar, Mutex, MutexGuard};

/// Locks `m`, taking the guard of a poisoned mutex as is (see the module docs).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Waits on `cv` with `guard`, taking the guard back as [`lock`] does when poisoned.
pub(crate) fn wait<'a, T>(cv: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    cv.wait(guard).unwrap_or_else(|p| p.into_inner())
}
