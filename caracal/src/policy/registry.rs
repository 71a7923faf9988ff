//! Process-local policy state, one value per identity (name, operation, scope), shared by every
//! call site with that identity — the local counterpart of a Redis key.
//!
//! A call site caches its default-scope value, so the common case skips the map entirely.
//! Values for per-call scopes are dropped once idle, so arbitrary scopes cannot grow the map
//! without bound: when their last user lets go (if the value says it is idle), and in a sweep
//! every [`SWEEP_EVERY`] lookups (for values that become idle with time).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::identity::Scope;
use crate::sync::lock;

const SWEEP_EVERY: u32 = 4096;

type Key = (&'static str, &'static str, Scope);

/// Values of one policy kind.
pub(crate) struct Registry<V> {
    values: OnceLock<Mutex<HashMap<Key, Arc<V>>>>,
    lookups: AtomicU32,
    /// Whether a value nobody holds can be forgotten without losing anything.
    idle: fn(&V) -> bool,
}

/// A call site's handle on its default-scope value, and on what its policy derives from the
/// attribute alone (computed once rather than on every call).
pub(crate) struct SiteCache<V, A = ()> {
    value: OnceLock<Arc<V>>,
    attribute: OnceLock<A>,
}

impl<V, A> std::fmt::Debug for SiteCache<V, A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SiteCache")
    }
}

impl<V, A> SiteCache<V, A> {
    pub(crate) const fn new() -> Self {
        SiteCache {
            value: OnceLock::new(),
            attribute: OnceLock::new(),
        }
    }

    /// What the policy derives from the attribute, made by `make` on first use.
    pub(crate) fn attribute(&self, make: impl FnOnce() -> A) -> &A {
        self.attribute.get_or_init(make)
    }
}

impl<V> Registry<V> {
    pub(crate) const fn new(idle: fn(&V) -> bool) -> Self {
        Registry {
            values: OnceLock::new(),
            lookups: AtomicU32::new(0),
            idle,
        }
    }

    fn map(&self) -> &Mutex<HashMap<Key, Arc<V>>> {
        self.values.get_or_init(Mutex::default)
    }

    /// The value of (name, operation, scope), made by `make` if there is none yet.
    // Always inlined: the site's cached value of the global scope is every call's path (a call
    // to this function cost the local bulkhead a fifth of its time); the rest is out of line.
    #[inline(always)]
    pub(crate) fn get<'s, A>(
        &self,
        site: &'s SiteCache<V, A>,
        key: (&'static str, &'static str, &Scope),
        make: impl FnOnce() -> V,
    ) -> Held<'s, V> {
        let (name, operation, scope) = key;
        if scope.is_global()
            && let Some(value) = site.value.get()
        {
            return Held::Site(value);
        }
        // The key's parts apart, in registers: a tuple passed whole is written to the stack
        // first, and the compiler hoisted those stores above the test, onto every call's path.
        self.look_up(site, name, operation, scope, make)
    }

    /// [`get`](Self::get) but for a site's cached value: the map, under its lock.
    #[inline(never)]
    fn look_up<'s, A>(
        &self,
        site: &'s SiteCache<V, A>,
        name: &'static str,
        operation: &'static str,
        scope: &Scope,
        make: impl FnOnce() -> V,
    ) -> Held<'s, V> {
        let lookup = || {
            let mut values = lock(self.map());
            if self
                .lookups
                .fetch_add(1, Ordering::Relaxed)
                .is_multiple_of(SWEEP_EVERY)
            {
                // Entries only the map holds, and that say they are idle.
                values.retain(|_, value| Arc::strong_count(value) > 1 || !(self.idle)(value));
            }
            Arc::clone(
                values
                    .entry((name, operation, scope.clone()))
                    .or_insert_with(|| Arc::new(make())),
            )
        };
        if scope.is_global() {
            Held::Site(site.value.get_or_init(lookup))
        } else {
            Held::Shared(lookup())
        }
    }

    /// Called by a user of `held` when it is done: forgets the entry if nobody else holds it
    /// and it is idle.
    #[inline]
    pub(crate) fn release(
        &self,
        (name, operation, scope): (&'static str, &'static str, &Scope),
        held: &Held<'_, V>,
    ) {
        let Held::Shared(value) = held else {
            return;
        };
        // Users clone an entry only under the map lock, so under that lock a count of 2 (the
        // map and the caller) means nobody else can reach it.
        if Arc::strong_count(value) != 2 || !(self.idle)(value) {
            return;
        }
        let mut values = lock(self.map());
        if Arc::strong_count(value) == 2 && (self.idle)(value) {
            values.remove(&(name, operation, scope.clone()));
        }
    }
}

/// A value from the registry: borrowed from the call site's cache (the default scope, which
/// costs no reference count), or shared from the map.
pub(crate) enum Held<'s, V> {
    Site(&'s Arc<V>),
    Shared(Arc<V>),
}

#[cfg(feature = "tower")]
impl<V> Held<'_, V> {
    /// The value, no longer borrowed from its site (a tower response outlives the borrow):
    /// the site's cached value costs a reference count.
    pub(crate) fn into_owned(self) -> Held<'static, V> {
        match self {
            Held::Site(value) => Held::Shared(Arc::clone(value)),
            Held::Shared(value) => Held::Shared(value),
        }
    }
}

impl<V> std::ops::Deref for Held<'_, V> {
    type Target = V;

    fn deref(&self) -> &V {
        match self {
            Held::Site(value) => value,
            Held::Shared(value) => value,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::*;

    static REGISTRY: Registry<AtomicBool> = Registry::new(|busy| !busy.load(Ordering::SeqCst));

    fn scope(s: &str) -> Scope {
        Scope::new(s.to_owned()).expect("valid scope")
    }

    #[test]
    fn one_value_per_identity_and_idle_ones_are_forgotten() {
        static SITE: SiteCache<AtomicBool> = SiteCache::new();
        let site = &SITE;
        let a = REGISTRY.get(site, ("n", "o", &scope("a")), || AtomicBool::new(true));
        let again = REGISTRY.get(site, ("n", "o", &scope("a")), || AtomicBool::new(false));
        assert!(std::ptr::eq(&*a, &*again));
        drop(again);
        REGISTRY.release(("n", "o", &scope("a")), &a);
        assert!(
            lock(REGISTRY.map()).contains_key(&("n", "o", scope("a"))),
            "busy: kept"
        );
        a.store(false, Ordering::SeqCst);
        REGISTRY.release(("n", "o", &scope("a")), &a);
        assert!(
            !lock(REGISTRY.map()).contains_key(&("n", "o", scope("a"))),
            "idle: forgotten"
        );
    }

    #[test]
    fn the_default_scope_is_cached_by_the_site() {
        static SITE: SiteCache<AtomicBool> = SiteCache::new();
        let first = REGISTRY.get(&SITE, ("g", "o", &Scope::GLOBAL), || AtomicBool::new(false));
        let second = REGISTRY.get(&SITE, ("g", "o", &Scope::GLOBAL), || AtomicBool::new(true));
        assert!(std::ptr::eq(&*first, &*second));
        assert!(!second.load(Ordering::SeqCst));
    }
}
