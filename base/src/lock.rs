//! A poison-tolerant `Mutex` lock.
//!
//! A holder that panicked leaves the mutex poisoned; the state it guards in this workspace is
//! always left whole between statements (counters, maps replaced in one assignment), so the
//! next caller takes the guard rather than propagating the panic to every later caller.

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

/// Locks `mutex`, taking the guard even if a previous holder panicked while holding it.
///
/// ```
/// # use std::sync::Mutex;
/// let m = Mutex::new(1);
/// *idem_base::lock(&m) += 1;
/// assert_eq!(*idem_base::lock(&m), 2);
/// ```
pub fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Waits on `cv` with `guard`, taking the guard back as [`lock`] does when the mutex was
/// poisoned meanwhile.
pub fn wait<'a, T>(cv: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    cv.wait(guard).unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_mutex_still_gives_its_guard() {
        let m = std::sync::Arc::new(Mutex::new(5));
        let held = m.clone();
        let _ = std::thread::spawn(move || {
            let _guard = lock(&held);
            panic!("a holder panics");
        })
        .join();
        assert!(m.is_poisoned());
        assert_eq!(*lock(&m), 5);
    }
}
