//! What the kinds keep per coordinator (what its processes know of fleet-wide state, such as
//! the breakers' views), one value per type, made on first use: the coordinator holds them,
//! sweeps and flushes them without naming a kind.

use std::any::{Any, TypeId};
use std::sync::{Arc, Mutex};

use crate::sync::lock;

/// What a kind keeps per coordinator about identities, which forgets the idle ones (see
/// [`FORGET_IDLE_AFTER`](super::FORGET_IDLE_AFTER)) when the coordinator sweeps.
pub(crate) trait ForgetsIdle: Send + Sync + 'static {
    fn forget_idle(&self);

    /// Starts sending now what it holds back to send later: the coordinator shuts down, and
    /// waits for its background work only so long.
    fn flush_now(&self) {}
}

/// The values of one coordinator.
#[derive(Default)]
pub(super) struct Kept {
    /// A few (one per kind that keeps something), found on every call of the kind: a scan
    /// beats hashing the type's id.
    values: Mutex<Vec<(TypeId, Arc<dyn Any + Send + Sync>)>>,
    /// Those of `values` that remember identities, swept and flushed.
    forgetting: Mutex<Vec<Arc<dyn ForgetsIdle>>>,
}

impl Kept {
    /// The `T`, made on first use (and then handed to `made`).
    pub(super) fn get<T: Default + Send + Sync + 'static>(
        &self,
        made: impl FnOnce(&Arc<T>),
    ) -> Arc<T> {
        let id = TypeId::of::<T>();
        let mut values = lock(&self.values);
        let value = match values.iter().find(|(filed, _)| *filed == id) {
            Some((_, value)) => Arc::clone(value),
            None => {
                let value = Arc::new(T::default());
                made(&value);
                values.push((id, Arc::clone(&value) as _));
                return value;
            }
        };
        value
            .downcast()
            .unwrap_or_else(|_| unreachable!("filed under its own type"))
    }

    /// The `T` that remembers identities, made on first use: swept with the others.
    pub(super) fn get_forgetting<T: Default + ForgetsIdle>(&self) -> Arc<T> {
        self.get(|made: &Arc<T>| lock(&self.forgetting).push(Arc::clone(made) as _))
    }

    /// Those that remember identities.
    pub(super) fn forgetting(&self) -> Vec<Arc<dyn ForgetsIdle>> {
        lock(&self.forgetting).clone()
    }
}
