//! Locking the server's mutexes so that a task that panicked holding one does not stop the
//! others.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks ignoring poisoning: the guarded data (counters, a join handle) stays valid.
pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
