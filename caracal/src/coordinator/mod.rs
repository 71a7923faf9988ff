//! The coordinator: where distributed policy state lives, and the process-wide installation.
//!
//! A [`Coordinator`] is either the embedded in-memory backend (everything in this process) or a
//! Redis backend (standalone or cluster) shared by every process that uses the same server and
//! namespace. Policies talk to it through the narrow operations below and never learn which
//! backend answers.

mod backend;
pub(crate) mod background;
mod builder;
mod doctor;
pub(crate) mod feed;
mod fleet;
mod incarnation;
mod installed;
mod kept;
mod memory;
mod operators;
mod protocol;
mod redis;
pub(crate) mod registry;
mod runtimes;
pub(crate) mod timer;
pub(crate) mod url;
pub(crate) mod uses;
mod wakeups;

/// The differential tests' harness, kind-blind, for each kind's test in its own folder.
#[cfg(test)]
pub(crate) use self::redis::differential;

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use self::backend::Backend;
use self::background::Background;
pub use self::builder::RedisBuilder;
pub use self::doctor::Check;
use self::fleet::Fleet;
pub use self::incarnation::DataLoss;
pub(crate) use self::incarnation::{Incarnation, LossCause};
pub use self::installed::install;
pub(crate) use self::installed::{current, current_id, overriding, with_current};
pub(crate) use self::kept::ForgetsIdle;
use self::kept::Kept;
pub use self::redis::REDIS_ACL_RULES;
use self::registry::{Registered, Snapshot, StatusRead};
use self::uses::{Usage, Uses};
use self::wakeups::Wakeups;
use crate::config::Config;
use crate::config::overrides::{Overrides, Resolved, Values};
use crate::error::Error;
use crate::identity::{Identity, KeyBase, PolicyKind, Scope};
pub(crate) use crate::kernel::Stamped;
use crate::kernel::{Kernel, Resent, Scripted};
use crate::priority::Priority;

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
    /// A number no other coordinator of the process has had (an address is reused).
    id: u64,
    namespace: String,
    backend: Backend,
    background: Background,
    wakeups: Wakeups,
    /// Whether this coordinator's feed (pub/sub subscription) is running; the task clears it
    /// when it ends, so the next call of a kind that listens starts another.
    feed: Arc<AtomicBool>,
    listeners: feed::Listeners,
    incarnation: Arc<Incarnation>,
    overrides: Overrides,
    fleet: Fleet,
    usage: Usage,
    /// Says "something an operator sees changed" (a transition, an override) to watchers.
    changes: tokio::sync::broadcast::Sender<()>,
    shut_down: AtomicBool,
    /// What kinds keep per coordinator (views of fleet-wide state), one value per type.
    kept: Kept,
}

impl fmt::Debug for Coordinator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Coordinator")
            .field("backend", &self.backend_name())
            .field("namespace", &self.inner.namespace)
            .finish()
    }
}

/// How long this process remembers an identity nobody calls: past it, what the process kept
/// of it (breaker views, retry-budget views, the registry's note of its use, the decisions
/// counted for `caracal top`, repeated events' summaries) is forgotten, so a scope per user
/// costs memory only while the user is active. An identity in use is never idle: a held lease,
/// a call in flight, observations or counts not yet sent keep it. An open breaker's view is
/// kept longer (see `docs/operations.md`): forgetting it would let a coordinator outage fail
/// that scope open. A forgotten identity costs its next call what a first call costs.
///
/// Give a Prometheus exporter an idle timeout a little longer than this for gauges, so their
/// per-scope series go too (see the `metrics` module).
///
/// ```
/// // A user's breaker, bulkhead and registry entries are gone a minute after their last call.
/// assert_eq!(caracal::FORGET_IDLE_AFTER, std::time::Duration::from_secs(60));
/// ```
pub const FORGET_IDLE_AFTER: Duration = Duration::from_secs(60);

impl Coordinator {
    /// Forgets what this coordinator and the process keep of identities idle for
    /// [`FORGET_IDLE_AFTER`]; run with each round of the registry's reports (every few
    /// seconds while the coordinator lives).
    pub(crate) fn forget_idle(&self) {
        for kept in self.inner.kept.forgetting() {
            kept.forget_idle();
        }
        crate::tally::forget_idle(FORGET_IDLE_AFTER);
        crate::summary::forget_quiet(FORGET_IDLE_AFTER);
        self.inner.backend.forget_expired();
    }

    /// How many kernel commands (script calls, were it Redis) the in-memory backend ran.
    #[cfg(test)]
    pub(crate) fn runs_in_memory(&self) -> u64 {
        self.inner.backend.runs()
    }

    /// Makes the in-memory backend answer each later kernel command `delay` after deciding
    /// it, as over a slow link (zero: at once): what counts from a command's send can then be
    /// told from what counts from its reply.
    #[cfg(test)]
    pub(crate) fn delay_replies_in_memory(&self, delay: std::time::Duration) {
        self.inner.backend.delay_replies(delay);
    }

    /// How many identities the in-memory backend holds state or a registry entry for.
    #[cfg(test)]
    pub(crate) fn held_in_memory(&self) -> usize {
        self.inner.backend.held()
    }

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
            Backend::Memory(Default::default()),
            (Arc::default(), Background::here()),
        )
    }

    /// A builder for a coordinator on a standalone Redis server (`redis://` or `rediss://`),
    /// or on the master a set of Redis Sentinels names, followed through their failovers
    /// (`redis-sentinel://[user:password@]host1:26379[,host2:26379…][/db]#master-name`;
    /// `rediss-sentinel://` with the feature `tls`). The credentials are the master's, and are
    /// offered to the sentinels too (one without a password accepts any).
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), caracal::Error> {
    /// let c = caracal::Coordinator::redis("redis://127.0.0.1:6379").connect().await?;
    /// let s = caracal::Coordinator::redis("redis-sentinel://10.0.0.1:26379,10.0.0.2:26379#main")
    ///     .connect()
    ///     .await?;
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
    /// `CARACAL_REDIS_URL` selects Redis (a comma-separated list means cluster seeds, but for one
    /// `redis-sentinel://` URL, whose commas separate its sentinels);
    /// `CARACAL_NAMESPACE` sets the namespace; `CARACAL_COMMAND_TIMEOUT` (e.g. `"250ms"`) the
    /// command timeout. With `CARACAL_REDIS_URL` unset it is [`in_memory`](Self::in_memory).
    /// `CARACAL_CONFIG` names a TOML file of [`Config`] to apply (read before connecting).
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

    fn new(
        namespace: String,
        backend: Backend,
        (incarnation, background): (Arc<Incarnation>, Background),
    ) -> Self {
        crate::events::coordinator_ready(&namespace);
        Coordinator {
            inner: Arc::new(Inner {
                id: {
                    static COORDINATORS: AtomicU64 = AtomicU64::new(1);
                    COORDINATORS.fetch_add(1, Ordering::Relaxed)
                },
                namespace,
                backend,
                background,
                wakeups: Wakeups::default(),
                feed: Arc::default(),
                listeners: feed::Listeners::default(),
                incarnation,
                overrides: Overrides::default(),
                fleet: Fleet::new(),
                usage: Usage::default(),
                changes: tokio::sync::broadcast::Sender::new(16),
                shut_down: AtomicBool::new(false),
                kept: Kept::default(),
            }),
        }
    }

    /// Applies `config` in this process, replacing the previous one: its values override the
    /// attributes' for calls admitted from now on (calls already admitted keep theirs). An
    /// empty [`Config`] clears every local override; fleet-wide overrides still win over it.
    ///
    /// ```
    /// let coordinator = caracal::Coordinator::in_memory();
    /// let config = caracal::Config::from_toml_str("[bulkhead.partner-api]\nlimit = 40")?;
    /// coordinator.set_config(config);
    /// coordinator.set_config(caracal::Config::default());
    /// # Ok::<(), caracal::Error>(())
    /// ```
    pub fn set_config(&self, config: Config) {
        self.inner.overrides.set_config(config);
        self.changed();
    }

    /// `attribute`'s values for the policy `name`, with `coordinator`'s overrides applied
    /// (none without a coordinator).
    pub(crate) fn resolve<V: Values>(
        coordinator: Option<&Coordinator>,
        name: &str,
        attribute: &V,
    ) -> Resolved<V> {
        match coordinator {
            Some(coordinator) => coordinator.inner.overrides.resolve(name, attribute),
            None => Resolved::attribute(attribute),
        }
    }

    /// Whether this process's configuration or the fleet's overrides name the policy `kind`
    /// `name` (a table `[kind.name]`).
    pub(crate) fn configures(&self, kind: PolicyKind, name: &str) -> bool {
        self.inner.overrides.names(kind, name)
    }

    /// Starts what a Redis coordinator runs for as long as it lives: the feed and the fleet
    /// overrides' sync; and applies the fleet's overrides before the first call. When the node
    /// holding them cannot be reached (one cluster primary down), the process serves on the
    /// identities the others hold rather than not at all: the sync reads the overrides as soon
    /// as that node answers.
    async fn start(self) -> Result<Self, Error> {
        self.ensure_feed();
        match self.fleet().sync().await {
            Ok(()) => {}
            Err(error @ Error::CoordinatorUnavailable { .. }) => {
                crate::events::config_unread(&error);
            }
            Err(error) => return Err(error),
        }
        self.fleet().start();
        Ok(self)
    }

    fn is_shut_down(&self) -> bool {
        self.inner.shut_down.load(Ordering::Acquire)
    }

    /// Tells watchers something changed.
    fn changed(&self) {
        let _ = self.inner.changes.send(());
    }

    /// The key base of this namespace's own keys (registry, overrides).
    fn namespace_base(&self) -> KeyBase {
        KeyBase::namespace(&self.inner.namespace)
    }

    /// The namespace every identity of this coordinator lives in.
    pub fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    /// `"memory"`, `"redis"` or `"redis-cluster"`.
    ///
    /// ```
    /// assert_eq!(caracal::Coordinator::in_memory().backend_name(), "memory");
    /// ```
    pub fn backend_name(&self) -> &'static str {
        self.inner.backend.name()
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
        self.inner.shut_down.store(true, Ordering::Release);
        for kept in self.inner.kept.forgetting() {
            kept.flush_now();
        }
        self.inner.background.flush(self.command_timeout()).await;
        self.inner.backend.close();
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
        installed::scope(self.clone(), future)
    }

    /// The identity of `kind`'s (name, operation, scope) in this coordinator's namespace.
    pub(crate) fn identity(
        &self,
        kind: PolicyKind,
        name: impl Into<std::borrow::Cow<'static, str>>,
        operation: impl Into<std::borrow::Cow<'static, str>>,
        scope: &Scope,
    ) -> Identity {
        Identity::new(&self.inner.namespace, kind, name, operation, scope)
    }

    /// How long one command may take (for the in-memory backend, the time it gives background
    /// work at shutdown).
    pub(crate) fn command_timeout(&self) -> Duration {
        self.inner.backend.command_timeout()
    }

    /// Which incarnation of the server holds this coordinator's state (see [`Incarnation`]).
    pub(crate) fn incarnation(&self) -> &Incarnation {
        &self.inner.incarnation
    }

    /// The `T` this coordinator keeps for a kind (what its processes know of fleet-wide state),
    /// made on first use: each coordinator its own, as each process of a fleet has its own.
    pub(crate) fn kept<T: Default + Send + Sync + 'static>(&self) -> Arc<T> {
        self.inner.kept.get(|_| {})
    }

    /// [`kept`](Self::kept), for a `T` that remembers identities: swept with the others.
    pub(crate) fn kept_forgetting<T: Default + ForgetsIdle>(&self) -> Arc<T> {
        self.inner.kept.get_forgetting()
    }

    /// Runs one command of kernel `K` on `identity`'s state, wherever this coordinator keeps it.
    pub(crate) async fn run<K: Scripted>(
        &self,
        identity: &Identity,
        command: K::Command,
    ) -> Result<K::Reply, Error>
    where
        <K as Kernel>::State: fmt::Debug,
    {
        self.inner.backend.run::<K>(&identity.key, command).await
    }

    /// [`run`](Self::run), with when the command was sent: whatever its answer set on the
    /// server (a lease's deadline), it set it after that. A batched command may wait in its
    /// identity's lane before its batch is sent, so this is later than when its caller asked.
    pub(crate) async fn run_sent<K: Scripted>(
        &self,
        identity: &Identity,
        command: K::Command,
    ) -> Result<(K::Reply, tokio::time::Instant), Error>
    where
        <K as Kernel>::State: fmt::Debug,
    {
        self.inner
            .backend
            .run_sent::<K>(&identity.key, command)
            .await
    }

    /// Sends `command` of `K` on `identity`'s state without waiting for the answer (a lease's
    /// release). It is queued on the connection before this returns, so a later command from
    /// the same task cannot overtake it; one whose outcome stays unknown is sent again until
    /// `until` (when the lease would have expired anyway). `on_done` receives whether it took
    /// effect (what it acts on was there, e.g. the lease to remove), or the failure.
    pub(crate) fn send_until<K: Resent>(
        &self,
        identity: &Identity,
        command: &K::Command,
        until: tokio::time::Instant,
        on_done: impl FnOnce(Result<bool, Error>) + Send + 'static,
    ) where
        <K as Kernel>::State: fmt::Debug,
    {
        self.inner
            .backend
            .send_until::<K>(&identity.key, command, until, on_done);
    }
}

impl Coordinator {
    /// This coordinator's reports of which call sites use which identities.
    pub(crate) fn uses(&self) -> Uses<'_> {
        Uses { coordinator: self }
    }

    /// This coordinator's copy of the fleet's overrides.
    pub(crate) fn fleet(&self) -> fleet::FleetSync<'_> {
        fleet::FleetSync { coordinator: self }
    }

    /// A handle on this coordinator that does not keep it alive (for background work).
    fn downgrade(&self) -> Weak<Inner> {
        Arc::downgrade(&self.inner)
    }

    /// Has `listener` read the feed's messages about `kind`'s identities, and makes sure the
    /// feed runs. A kind calls it before it can be told of a change: on each call that relies
    /// on the feed (which restarts it after the subscription ended).
    pub(crate) fn listen(&self, kind: PolicyKind, listener: feed::Listener) {
        self.inner.listeners.add(kind, listener);
        self.ensure_feed();
    }

    /// Makes sure this process listens to the namespace's feed: what other processes publish
    /// (kinds' changes, the fleet's overrides, a loss of data).
    fn ensure_feed(&self) {
        let Some(redis) = self.inner.backend.redis() else {
            return;
        };
        if self.inner.feed.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        let started = redis.subscribe_transitions(Arc::clone(&self.inner.feed), move |message| {
            match weak.upgrade() {
                Some(inner) => {
                    match message.and_then(feed::parse) {
                        Some(feed::Message::Identity(heard)) => {
                            let coordinator = Coordinator { inner };
                            if coordinator.inner.listeners.hand(&coordinator, &heard) {
                                coordinator.changed();
                            }
                        }
                        Some(feed::Message::Config { version }) => {
                            inner.fleet.announced(version);
                        }
                        Some(feed::Message::Lost { own: false }) => {
                            inner.incarnation.lost(LossCause::Announced);
                        }
                        Some(feed::Message::Lost { own: true }) => {}
                        None => {}
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

    /// Tells the other processes of the namespace `payload` about `key`'s identity, for the
    /// listener of its kind ([`listen`](Self::listen)): published on the feed, in the
    /// background and once; `sent` hears whether the server took the message. In memory
    /// there is no other process to tell, and nothing can fail: `sent(true)` at once.
    pub(crate) fn publish(
        &self,
        key: &KeyBase,
        payload: &str,
        sent: impl FnOnce(bool) + Send + 'static,
    ) {
        match self.inner.backend.redis() {
            Some(redis) => redis.publish(key, payload, sent),
            None => sent(true),
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

    /// Counts a call of `priority` as waiting for a lease of `key` in this process, until the
    /// guard is dropped: a waiter of a lower class defers to it
    /// ([`Waiting::outranked_until`](wakeups::Waiting::outranked_until)).
    pub(crate) fn waiting(&self, key: &KeyBase, priority: Priority) -> wakeups::Waiting<'_> {
        self.inner.wakeups.waiting(key, priority)
    }

    /// Whether a call waits for a lease of `key` in this process (see
    /// [`waiting`](Self::waiting)).
    pub(crate) fn anyone_waits(&self, key: &KeyBase) -> bool {
        self.inner.wakeups.anyone_waits(key)
    }

    /// Wakes the tasks of this process waiting for a lease of `key` to be released.
    pub(crate) fn wake(&self, key: &KeyBase) {
        self.inner.wakeups.wake(key);
    }
}

/// A handle on a coordinator that does not keep it alive: what a call site caches of the
/// coordinator it met.
#[derive(Debug, Clone)]
pub(crate) struct WeakCoordinator(Weak<Inner>);

impl WeakCoordinator {
    pub(crate) fn of(coordinator: &Coordinator) -> Self {
        WeakCoordinator(coordinator.downgrade())
    }

    /// The coordinator, while it lives.
    pub(crate) fn upgrade(&self) -> Option<Coordinator> {
        upgrade(&self.0)
    }

    /// The coordinator, while it lives and has not been shut down.
    pub(crate) fn live(&self) -> Option<Coordinator> {
        live(&self.0)
    }

    /// Whether `coordinator` is this one (while this handle lives no other can take its
    /// address).
    pub(crate) fn is(&self, coordinator: &Coordinator) -> bool {
        std::ptr::eq(self.0.as_ptr(), Arc::as_ptr(&coordinator.inner))
    }
}

/// The coordinator behind `weak`, while it lives.
fn upgrade(weak: &Weak<Inner>) -> Option<Coordinator> {
    weak.upgrade().map(|inner| Coordinator { inner })
}

/// The coordinator behind `weak`, while it lives and has not been shut down: what a
/// background loop of it runs for.
fn live(weak: &Weak<Inner>) -> Option<Coordinator> {
    upgrade(weak).filter(|coordinator| !coordinator.is_shut_down())
}

impl Coordinator {
    /// Spawns `work` (given a weak handle on this coordinator) unless `running` says it runs
    /// already. It needs a runtime: without one it is left for a later call that has one.
    fn start_once<F>(&self, running: &AtomicBool, work: impl FnOnce(Weak<Inner>) -> F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        if running.load(Ordering::Acquire)
            || tokio::runtime::Handle::try_current().is_err()
            || running.swap(true, Ordering::AcqRel)
        {
            return;
        }
        tokio::spawn(work(Arc::downgrade(&self.inner)));
    }
}

/// What the operator's view reads, on either backend.
impl Coordinator {
    /// `caracal doctor`'s checklist for the server this coordinator connected to.
    pub(crate) async fn doctor(&self) -> Vec<Check> {
        match self.inner.backend.redis() {
            Some(redis) => redis.doctor().await,
            None => vec![Check::new(
                "server",
                true,
                "in-memory: nothing to check (one process, no server)",
            )],
        }
    }

    /// Every identity the namespace's registry holds.
    pub(crate) async fn registry_read(&self) -> Result<Vec<Registered>, Error> {
        let namespace = self.namespace_base();
        self.inner.backend.registry_read(&namespace).await
    }

    /// Lists `identity` in the namespace's registry for `lasts_ms` whether or not a process
    /// uses it: an operator stored a state there, which `status` must show.
    pub(crate) async fn registry_hold(
        &self,
        identity: &crate::identity::Identity,
        lasts_ms: u64,
    ) -> Result<(), Error> {
        let namespace = self.namespace_base();
        let description = registry::describe(identity);
        self.inner
            .backend
            .registry_hold(&namespace, &identity.key, &description, lasts_ms)
            .await
    }

    /// Every process reporting to this coordinator's namespace.
    pub(crate) async fn processes(&self) -> Result<Vec<registry::Process>, Error> {
        let namespace = self.namespace_base();
        self.inner.backend.processes(&namespace).await
    }

    /// Runs a kind's status read on the identities at `keys`: one snapshot each, in order.
    pub(crate) async fn identity_reads(
        &self,
        read: &StatusRead,
        keys: &[KeyBase],
    ) -> Result<Vec<Snapshot>, Error> {
        self.inner.backend.identity_reads(read, keys).await
    }

    /// The fleet's overrides as this process applies them.
    pub(crate) fn fleet_overrides(&self) -> crate::config::Tables {
        self.inner.overrides.fleet()
    }

    /// Completes on the next change an operator would see.
    pub(crate) fn subscribe_changes(&self) -> tokio::sync::broadcast::Receiver<()> {
        self.ensure_feed();
        self.inner.changes.subscribe()
    }
}
