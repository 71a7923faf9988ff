//! Small synchronisation helpers.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `mutex`, recovering from poisoning: every value caracal guards with a mutex is plain
/// data that stays consistent even if a holder panicked, and a poisoned lock must not turn into
/// a panic on every later call.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Gives back what a map emptied by forgetting no longer needs: a map keeps its capacity
/// after entries are removed, so a burst of identities would hold its peak for good. Only
/// when at most a quarter is used, so a map that hovers around a size is not regrown.
pub(crate) fn shrink<K: Eq + std::hash::Hash, V, S: std::hash::BuildHasher>(
    map: &mut std::collections::HashMap<K, V, S>,
) {
    if map.capacity() > 64 && map.len() * 4 <= map.capacity() {
        map.shrink_to(map.len() * 2);
    }
}
