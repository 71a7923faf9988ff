//! Building a Redis coordinator: the builder and the environment.

use std::time::Duration;

use super::redis::{RedisBackend, Topology};
use super::{Backend, Coordinator};
use crate::Error;
use crate::identity::check_part;

pub(super) const DEFAULT_NAMESPACE: &str = "default";
const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(1);
const DEFAULT_POOL_SIZE: usize = 4;
/// Beyond this a "timeout" means nothing, and deadlines would overflow.
const MAX_COMMAND_TIMEOUT: Duration = Duration::from_secs(3600);

/// Configures a Redis coordinator; finish with [`connect`](Self::connect).
///
/// ```no_run
/// # async fn f() -> Result<(), caracal::Error> {
/// use std::time::Duration;
/// let coordinator = caracal::Coordinator::redis("redis://127.0.0.1:6379")
///     .namespace("svc:prod")
///     .command_timeout(Duration::from_millis(250))
///     .pool_size(4)
///     .connect()
///     .await?;
/// caracal::install(coordinator)?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `connect` is called"]
pub struct RedisBuilder {
    urls: Vec<String>,
    cluster: bool,
    namespace: String,
    command_timeout: Duration,
    pool_size: usize,
}

impl RedisBuilder {
    pub(super) fn new(urls: Vec<String>, cluster: bool) -> Self {
        RedisBuilder {
            urls,
            cluster,
            namespace: DEFAULT_NAMESPACE.to_owned(),
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            pool_size: DEFAULT_POOL_SIZE,
        }
    }

    /// The namespace every identity lives in (default `"default"`): processes share state only
    /// within one namespace. Non-blank, at most 1024 bytes.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// How long any one command (and a connection attempt) may take before it counts as failed
    /// with an unknown outcome (default 1 s). Failed commands are never replayed.
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// How many multiplexed connections to keep (default 4). Commands are spread over them by
    /// task, so one task's commands stay in order on one connection.
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size;
        self
    }

    /// Validates the settings and connects every pooled connection.
    ///
    /// Fails with [`Error::InvalidConfig`] for a malformed URL or setting and with
    /// [`Error::CoordinatorUnavailable`] when the server cannot be reached.
    pub async fn connect(self) -> Result<Coordinator, Error> {
        check_part(&self.namespace)
            .map_err(|reason| Error::config(format!("namespace {reason}")))?;
        if self.command_timeout.is_zero() || self.command_timeout > MAX_COMMAND_TIMEOUT {
            return Err(Error::config(
                "command_timeout must be positive and at most an hour",
            ));
        }
        if self.pool_size == 0 {
            return Err(Error::config("pool_size must be at least 1"));
        }
        if self.urls.is_empty() {
            return Err(Error::config("at least one Redis URL is needed"));
        }
        let topology = if self.cluster {
            Topology::Cluster(self.urls)
        } else if let [url] = &self.urls[..] {
            Topology::Standalone(url.clone())
        } else {
            return Err(Error::config(
                "a standalone coordinator takes exactly one URL",
            ));
        };
        let backend = RedisBackend::connect(
            topology,
            self.command_timeout,
            self.pool_size,
            &self.namespace,
        )
        .await?;
        Ok(Coordinator::new(self.namespace, Backend::Redis(backend)))
    }
}

pub(super) async fn from_env() -> Result<Coordinator, Error> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let Some(urls) = var("CARACAL_REDIS_URL") else {
        return Ok(Coordinator::in_memory());
    };
    let urls: Vec<String> = urls.split(',').map(|u| u.trim().to_owned()).collect();
    let mut builder = if urls.len() > 1 {
        Coordinator::redis_cluster(urls)
    } else {
        Coordinator::redis(urls.into_iter().next().unwrap_or_default())
    };
    if let Some(namespace) = var("CARACAL_NAMESPACE") {
        builder = builder.namespace(namespace);
    }
    if let Some(timeout) = var("CARACAL_COMMAND_TIMEOUT") {
        let timeout = humantime::parse_duration(&timeout)
            .map_err(|e| Error::config(format!("CARACAL_COMMAND_TIMEOUT: {e}")))?;
        builder = builder.command_timeout(timeout);
    }
    builder.connect().await
}
