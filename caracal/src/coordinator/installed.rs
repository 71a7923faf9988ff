//! The coordinator in force for a task: the one [`install`]ed for the process, or one a task
//! runs [`Coordinator::scoped`] under; what every call of a distributed policy looks up first.

use std::future::Future;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use super::Coordinator;
use crate::error::Error;

static INSTALLED: OnceLock<Coordinator> = OnceLock::new();

tokio::task_local! {
    static SCOPED: Coordinator;
}

/// Whether [`Coordinator::scoped`] was ever called: until it is, no task has a scoped
/// coordinator, and not looking for one (a task-local) halves what finding the coordinator
/// costs a call.
static EVER_SCOPED: AtomicBool = AtomicBool::new(false);

/// `future` with `coordinator` in force for it (see [`Coordinator::scoped`]).
pub(super) fn scope<F: Future>(
    coordinator: Coordinator,
    future: F,
) -> impl Future<Output = F::Output> {
    EVER_SCOPED.store(true, Ordering::Release);
    SCOPED.scope(coordinator, future)
}

/// Installs the process-wide coordinator that distributed policies use.
///
/// Call it once at start-up; a second call returns [`Error::AlreadyInstalled`] and leaves the
/// first coordinator in place.
///
/// ```
/// caracal::install(caracal::Coordinator::in_memory()).unwrap();
/// assert!(matches!(
///     caracal::install(caracal::Coordinator::in_memory()),
///     Err(caracal::Error::AlreadyInstalled)
/// ));
/// ```
pub fn install(coordinator: Coordinator) -> Result<(), Error> {
    INSTALLED
        .set(coordinator)
        .map_err(|_| Error::AlreadyInstalled)
}

/// The coordinator whose overrides apply to the current task's local policies: none at all
/// (without a lookup) while no coordinator of the process overrides anything.
#[inline]
pub(crate) fn overriding() -> Option<Coordinator> {
    if crate::config::overrides::anywhere() {
        current().ok()
    } else {
        None
    }
}

/// The coordinator in force for the current task: a [`Coordinator::scoped`] one, else the
/// installed one.
pub(crate) fn current() -> Result<Coordinator, Error> {
    with_current(Coordinator::clone)
}

/// `f` of the coordinator in force for the current task, without a clone of it (a hot path's
/// way to [`current`]).
pub(crate) fn with_current<R>(f: impl FnOnce(&Coordinator) -> R) -> Result<R, Error> {
    let mut f = Some(f);
    let mut call = |coordinator: &Coordinator| f.take().map(|f| f(coordinator));
    if EVER_SCOPED.load(Ordering::Acquire)
        && let Ok(Some(answer)) = SCOPED.try_with(&mut call)
    {
        return Ok(answer);
    }
    INSTALLED.get().and_then(call).ok_or(Error::NotInstalled)
}

/// What tells the coordinator in force for the current task from every other the process
/// has had (`0` when there is none).
pub(crate) fn current_id() -> u64 {
    with_current(|coordinator| coordinator.inner.id).unwrap_or(0)
}
