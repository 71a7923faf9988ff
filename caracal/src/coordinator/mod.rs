//! The coordinator: where distributed policy state lives, and the process-wide installation.
//!
//! A [`Coordinator`] is either the embedded in-memory backend (everything in this process) or a
//! Redis backend (standalone or cluster) shared by every process that uses the same server and
//! namespace. Policies talk to it through the narrow operations below and never learn which
//! backend answers.

mod background;
mod breakers;
mod builder;
mod memory;
mod redis;
mod wakeups;

use std::fmt;
use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use uuid::Uuid;

use self::background::Background;
pub(crate) use self::breakers::Admission;
use self::breakers::Breakers;
pub use self::builder::RedisBuilder;
use self::memory::MemoryBackend;
use self::redis::RedisBackend;
use self::wakeups::Wakeups;
use crate::Error;
use crate::events::At;
use crate::identity::{KeyBase, Scope};
use crate::policy::breaker::kernel::{
    AdmitReply, ObserveReply, ProbeOutcome, Settings, SettleReply,
};

/// Where distributed policies keep their shared state.
///
/// Build one at start-up and [`install`] it. Cloning is cheap and every clone is the same
/// coordinator.
///
/// ```
/// # async fn start() -> Result<(), caracal::Error> {
/// // In-memory: no server needed; policies coordinate within this process.
/// caracal::install(caracal::Coordinator::in_memory())?;
///
/// // Redis: every process using the same URL and namespace shares each budget.
/// # if false {
/// let redis = caracal::Coordinator::redis("redis://127.0.0.1:6379")
///     .namespace("svc:prod")
///     .command_timeout(std::time::Duration::from_millis(250))
///     .connect()
///     .await?;
/// # }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Coordinator {
    inner: Arc<Inner>,
}

struct Inner {
    namespace: String,
    backend: Backend,
    background: Background,
    wakeups: Wakeups,
    breakers: Breakers,
    /// Whether this coordinator's transition feed (pub/sub subscription) is running; the task
    /// clears it when it ends, so the next breaker call starts another.
    feed: Arc<std::sync::atomic::AtomicBool>,
}

enum Backend {
    Memory(MemoryBackend),
    Redis(RedisBackend),
}

impl fmt::Debug for Coordinator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Coordinator")
            .field("backend", &self.backend_name())
            .field("namespace", &self.inner.namespace)
            .finish()
    }
}

/// What a lease command asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseAction {
    /// Take a new lease if fewer than `limit` are live.
    Acquire,
    /// Push an existing lease's deadline to now + ttl; fails if it is gone.
    Renew,
}

impl LeaseAction {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            LeaseAction::Acquire => "acquire",
            LeaseAction::Renew => "renew",
        }
    }
}

/// One lease command: `action` on `token`'s lease in the lease set of `key`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LeaseCommand<'a> {
    pub(crate) key: &'a KeyBase,
    pub(crate) action: LeaseAction,
    pub(crate) token: Uuid,
    pub(crate) ttl: Duration,
    pub(crate) limit: u32,
}

/// The answer to a [`LeaseCommand`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeaseReply {
    /// Whether the lease is now held (acquired, already held, or renewed).
    pub(crate) allowed: bool,
    /// Live leases after the command.
    pub(crate) occupancy: u32,
}

/// One rate-limit arrival at `key`'s cell.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RateCommand<'a> {
    pub(crate) key: &'a KeyBase,
    pub(crate) interval: Duration,
    pub(crate) burst: u32,
}

/// A breaker identity, the settings its commands carry, and the names its events carry.
#[derive(Debug, Clone)]
pub(crate) struct BreakerTarget {
    pub(crate) key: KeyBase,
    pub(crate) settings: Settings,
    pub(crate) name: &'static str,
    pub(crate) operation: &'static str,
    pub(crate) scope: Scope,
}

impl BreakerTarget {
    pub(crate) fn at(&self) -> At<'_> {
        At {
            policy: "circuit_breaker",
            name: self.name,
            operation: self.operation,
            scope: self.scope.as_str(),
            coordination: "distributed",
        }
    }
}

impl Coordinator {
    /// The embedded coordinator: policy state lives in this process, on tokio's clock.
    ///
    /// Distributed policies behave exactly as they do against Redis (leases, renewals,
    /// expiry), just without other processes. The namespace is `"default"`.
    ///
    /// ```
    /// let coordinator = caracal::Coordinator::in_memory();
    /// assert_eq!(coordinator.namespace(), "default");
    /// ```
    pub fn in_memory() -> Self {
        Self::new(
            builder::DEFAULT_NAMESPACE.to_owned(),
            Backend::Memory(MemoryBackend::default()),
        )
    }

    /// A builder for a coordinator on a standalone Redis server (`redis://` or `rediss://`).
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), caracal::Error> {
    /// let c = caracal::Coordinator::redis("redis://127.0.0.1:6379").connect().await?;
    /// # Ok(()) }
    /// ```
    pub fn redis(url: impl Into<String>) -> RedisBuilder {
        RedisBuilder::new(vec![url.into()], false)
    }

    /// A builder for a coordinator on a Redis Cluster, given one or more seed nodes.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), caracal::Error> {
    /// let c = caracal::Coordinator::redis_cluster(["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"])
    ///     .namespace("svc:prod")
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn redis_cluster<I, S>(seeds: I) -> RedisBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedisBuilder::new(seeds.into_iter().map(Into::into).collect(), true)
    }

    /// A coordinator configured from the environment.
    ///
    /// `CARACAL_REDIS_URL` selects Redis (a comma-separated list means cluster seeds);
    /// `CARACAL_NAMESPACE` sets the namespace; `CARACAL_COMMAND_TIMEOUT` (e.g. `"250ms"`) the
    /// command timeout. With `CARACAL_REDIS_URL` unset or empty it is [`in_memory`](Self::in_memory).
    ///
    /// ```
    /// # async fn f() -> Result<(), caracal::Error> {
    /// let coordinator = caracal::Coordinator::from_env().await?;
    /// caracal::install(coordinator)?;
    /// # Ok(()) }
    /// ```
    pub async fn from_env() -> Result<Self, Error> {
        builder::from_env().await
    }

    fn new(namespace: String, backend: Backend) -> Self {
        Coordinator {
            inner: Arc::new(Inner {
                namespace,
                backend,
                background: Background::new(tokio::runtime::Handle::try_current().ok()),
                wakeups: Wakeups::default(),
                breakers: Breakers::default(),
                feed: Arc::default(),
            }),
        }
    }

    /// The namespace every identity of this coordinator lives in.
    pub fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    /// `"memory"`, `"redis"` or `"redis-cluster"`.
    pub fn backend_name(&self) -> &'static str {
        match &self.inner.backend {
            Backend::Memory(_) => "memory",
            Backend::Redis(redis) if redis.is_cluster() => "redis-cluster",
            Backend::Redis(_) => "redis",
        }
    }

    /// Flushes what is still in flight in the background (lease releases, probe settlements,
    /// batched breaker observations), then refuses further commands: later distributed calls
    /// fail with [`Error::CoordinatorUnavailable`].
    ///
    /// Waits at most the command timeout for the flush.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let coordinator = caracal::Coordinator::in_memory();
    /// coordinator.shutdown().await;
    /// # }
    /// ```
    pub async fn shutdown(&self) {
        self.flush_batches_now();
        let limit = match &self.inner.backend {
            Backend::Memory(_) => Duration::from_millis(100),
            Backend::Redis(redis) => redis.command_timeout(),
        };
        self.inner.background.flush(limit).await;
        match &self.inner.backend {
            Backend::Memory(memory) => memory.close(),
            Backend::Redis(redis) => redis.close(),
        }
    }

    /// Runs `future` with this coordinator in place of the installed one.
    ///
    /// Guarded calls made while `future` runs (on its task, not in tasks it spawns) use this
    /// coordinator. Useful in tests, and to keep several isolated coordinators in one process.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let coordinator = caracal::Coordinator::in_memory();
    /// let answer = coordinator.scoped(async { 42 }).await;
    /// assert_eq!(answer, 42);
    /// # }
    /// ```
    pub fn scoped<F: Future>(&self, future: F) -> impl Future<Output = F::Output> + use<F> {
        SCOPED.scope(self.clone(), future)
    }

    /// Runs one lease command.
    pub(crate) async fn lease(&self, command: LeaseCommand<'_>) -> Result<LeaseReply, Error> {
        match &self.inner.backend {
            Backend::Memory(memory) => memory.lease(command),
            Backend::Redis(redis) => redis.lease(command).await,
        }
    }

    /// Decides one rate-limit arrival: `Ok(Ok(()))` admitted (and charged), `Ok(Err(wait))`
    /// rejected with the wait until an admission is possible.
    pub(crate) async fn rate_limit(
        &self,
        command: RateCommand<'_>,
    ) -> Result<Result<(), Duration>, Error> {
        match &self.inner.backend {
            Backend::Memory(memory) => memory.rate_limit(command),
            Backend::Redis(redis) => redis.rate_limit(command).await,
        }
    }

    /// Releases `token`'s lease without waiting for the answer. The release is queued on the
    /// connection before this returns, so a later command from the same task cannot overtake it.
    /// `on_done` receives whether a live lease was removed, or the failure.
    pub(crate) fn release(
        &self,
        key: &KeyBase,
        token: Uuid,
        on_done: impl FnOnce(Result<bool, Error>) + Send + 'static,
    ) {
        match &self.inner.backend {
            Backend::Memory(memory) => on_done(memory.release(key, token)),
            Backend::Redis(redis) => {
                let release = redis.release(key, token);
                self.inner.background.start(async move {
                    on_done(release.await);
                });
            }
        }
    }
}

impl Coordinator {
    /// Asks whether a call may run through `target`'s breaker; `token` names the probe slot
    /// it takes if it becomes a probe.
    pub(crate) async fn breaker_admit(
        &self,
        target: &BreakerTarget,
        token: Uuid,
    ) -> Result<AdmitReply, Error> {
        match &self.inner.backend {
            Backend::Memory(memory) => memory.breaker_admit(target, token),
            Backend::Redis(redis) => redis.breaker_admit(target, token).await,
        }
    }

    /// Records closed-state outcomes (`true` = failure) admitted under `generation`. The
    /// request is sent at the first poll; the future owns everything it needs.
    pub(crate) fn breaker_observe(
        &self,
        target: BreakerTarget,
        generation: u64,
        failures: Vec<bool>,
    ) -> impl Future<Output = Result<ObserveReply, Error>> + Send + 'static {
        let coordinator = self.clone();
        let mint = mint_generation();
        async move {
            match &coordinator.inner.backend {
                Backend::Memory(memory) => {
                    memory.breaker_observe(&target, generation, &failures, mint)
                }
                Backend::Redis(redis) => {
                    redis
                        .breaker_observe(&target, generation, &failures, mint)
                        .await
                }
            }
        }
    }

    /// Settles the probe `token` admitted under `generation`. The request is sent at the first
    /// poll; the future owns everything it needs.
    pub(crate) fn breaker_settle(
        &self,
        target: BreakerTarget,
        token: Uuid,
        outcome: ProbeOutcome,
        generation: u64,
    ) -> impl Future<Output = Result<SettleReply, Error>> + Send + 'static {
        let coordinator = self.clone();
        async move {
            match &coordinator.inner.backend {
                Backend::Memory(memory) => {
                    memory.breaker_settle(&target, token, outcome, generation)
                }
                Backend::Redis(redis) => {
                    redis
                        .breaker_settle(&target, token, outcome, generation)
                        .await
                }
            }
        }
    }

    /// Makes sure this process listens for breaker transitions published by other processes.
    fn ensure_transition_feed(&self) {
        use std::sync::atomic::Ordering;
        let Backend::Redis(redis) = &self.inner.backend else {
            return;
        };
        if self.inner.feed.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        let started = redis.subscribe_transitions(Arc::clone(&self.inner.feed), move |message| {
            match weak.upgrade() {
                Some(inner) => {
                    if let Some(message) = message {
                        inner.breakers.on_message(message);
                    }
                    true
                }
                None => false,
            }
        });
        if !started {
            self.inner.feed.store(false, Ordering::Release);
        }
    }

    /// Runs `work` in the background, tracked so [`shutdown`](Self::shutdown) can flush it.
    /// It is polled once before this returns (see [`Background::start`]).
    pub(crate) fn in_background(&self, work: impl Future<Output = ()> + Send + 'static) {
        self.inner.background.start(work);
    }

    /// Completes when [`wake`](Self::wake) is next called for `key`; registered from the start.
    pub(crate) fn released(&self, key: &KeyBase) -> wakeups::Released<'_> {
        self.inner.wakeups.released(key)
    }

    /// Wakes the tasks of this process waiting for a lease of `key` to be released.
    pub(crate) fn wake(&self, key: &KeyBase) {
        self.inner.wakeups.wake(key);
    }
}

/// A generation for an epoch started after its state was lost: random, non-zero, and below
/// 2^44 so it survives Lua's double-precision numbers exactly.
fn mint_generation() -> u64 {
    let random = (Uuid::new_v4().as_u128() >> 64) as u64;
    (random & ((1 << 44) - 1)).max(1)
}

static INSTALLED: OnceLock<Coordinator> = OnceLock::new();

tokio::task_local! {
    static SCOPED: Coordinator;
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

/// The coordinator in force for the current task: a [`Coordinator::scoped`] one, else the
/// installed one.
pub(crate) fn current() -> Result<Coordinator, Error> {
    SCOPED
        .try_with(Coordinator::clone)
        .ok()
        .or_else(|| INSTALLED.get().cloned())
        .ok_or(Error::NotInstalled)
}
