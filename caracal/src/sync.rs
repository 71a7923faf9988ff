//! Small synchronisation helpers.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `mutex`, recovering from poisoning: every value caracal guards with a mutex is plain
/// data that stays consistent even if a holder panicked, and a poisoned lock must not turn into
/// a panic on every later call.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
