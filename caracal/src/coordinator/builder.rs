//! Building a Redis coordinator: the builder and the environment.

use std::sync::Arc;
use std::time::Duration;

use super::background::Background;
use super::doctor::Check;
use super::incarnation::{DataLoss, Incarnation};
use super::redis::{RedisBackend, SentinelUrl, Topology, Trust, examine};
use super::url::Url;
use super::{Backend, Coordinator};
use crate::config::Config;
use crate::error::Error;
use crate::identity::check_part;

pub(super) const DEFAULT_NAMESPACE: &str = "default";
const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(1);
const DEFAULT_POOL_SIZE: usize = 4;
/// Beyond this a "timeout" means nothing, and deadlines would overflow.
const MAX_COMMAND_TIMEOUT: Duration = Duration::from_secs(3600);

/// Configures a Redis coordinator; finish with [`connect`](Self::connect).
///
/// Its `Debug` shows every URL with its password hidden (`redis://app:***@host`), as does
/// every error and event caracal makes: a builder may sit in a logged configuration.
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
    /// Redacted in `Debug`: a builder in a log field never prints a password.
    urls: Vec<Url>,
    cluster: bool,
    namespace: String,
    command_timeout: Duration,
    pool_size: usize,
    trust: Trust,
    after_data_loss: DataLoss,
}

impl RedisBuilder {
    pub(super) fn new(urls: Vec<String>, cluster: bool) -> Self {
        RedisBuilder {
            urls: urls.into_iter().map(Url::new).collect(),
            cluster,
            namespace: DEFAULT_NAMESPACE.to_owned(),
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            pool_size: DEFAULT_POOL_SIZE,
            trust: Trust::default(),
            after_data_loss: DataLoss::default(),
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

    /// What this process does after it notices that the server lost its data (a restart
    /// without persistence, a failover, a flush): by default ([`DataLoss::Grace`], 2 s) it
    /// admits no bulkhead caller for two seconds, by when every process holding a lease has
    /// cancelled its holders; [`DataLoss::WholeLease`] waits one lease period instead.
    /// Env `CARACAL_AFTER_DATA_LOSS`: a duration (`"2s"`) or `lease`.
    pub fn after_data_loss(mut self, after: DataLoss) -> Self {
        self.after_data_loss = after;
        self
    }

    /// Trusts these certificate authorities (PEM) instead of the system's for `rediss://`
    /// connections: for a server whose certificate a private CA signed. The server's
    /// certificate is always checked.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), caracal::Error> {
    /// let ca = std::fs::read("/etc/redis/ca.crt").expect("CA file");
    /// let coordinator = caracal::Coordinator::redis("rediss://redis.internal:6380")
    ///     .tls_root_certificates(ca)
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    pub fn tls_root_certificates(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.trust = Trust {
            roots: Some(pem.into()),
        };
        self
    }

    /// The topology its URLs name.
    fn topology(&self) -> Result<Topology, Error> {
        if self.urls.is_empty() {
            return Err(Error::config("at least one Redis URL is needed"));
        }
        Ok(if self.cluster {
            Topology::Cluster(self.urls.clone())
        } else if let [url] = &self.urls[..] {
            if SentinelUrl::is_sentinel(url.expose()) {
                Topology::Sentinel(SentinelUrl::parse(url.expose())?)
            } else {
                Topology::Standalone(url.clone())
            }
        } else {
            return Err(Error::config(
                "a standalone coordinator takes exactly one URL",
            ));
        })
    }

    /// `caracal doctor`: connects as [`connect`](Self::connect) would, then checks one by one
    /// what caracal relies on (the server's kind and version, its role, the cluster's slots,
    /// scripts run atomically and able to read `TIME`, `PEXPIREAT … GT`, pub/sub, the eviction
    /// policy, persistence, admin commands, the round trip). The first check, `connect`, is
    /// `connect`'s own verdict (the ACL grant, a replica, a server too old); the others are
    /// made on connections of the doctor's own, so they report even when `connect` refuses.
    ///
    /// ```no_run
    /// # async fn f() {
    /// let checks = caracal::Coordinator::redis("redis://127.0.0.1:6379").doctor().await;
    /// for check in &checks {
    ///     println!("{check}");
    /// }
    /// let healthy = checks.iter().all(|check| check.ok);
    /// # }
    /// ```
    pub async fn doctor(self) -> Vec<Check> {
        let timeout = self.command_timeout;
        let topology = self.topology();
        let trust = self.trust.clone();
        let mut checks = vec![match self.connect().await {
            Ok(coordinator) => {
                coordinator.shutdown().await;
                Check::new("connect", true, "as the fleet connects: accepted")
            }
            Err(error) => Check::new("connect", false, error.to_string()),
        }];
        if let Ok(topology) = topology {
            checks.extend(examine(&topology, &trust, timeout).await);
        }
        checks
    }

    /// Validates the settings, connects every pooled connection, and checks that the server
    /// can carry caracal: a primary (through Sentinel: the master the sentinels name), Redis
    /// 7.0 or later, every command caracal needs known to it (none renamed away) and allowed
    /// to the user on its keys and channel, and scripts that run and read `TIME`: all in one
    /// small script. Whether scripts run atomically is [`doctor`](Self::doctor)'s probe (it
    /// stalls the server for tens of milliseconds, which no process start should cost a
    /// production server; `docs/operations.md`, "What `connect` checks").
    ///
    /// Fails with [`Error::InvalidConfig`] for a malformed URL or setting, refused credentials,
    /// a replica, a server too old, a command renamed or missing permissions (naming them), a
    /// server that runs no scripts or whose scripts cannot read `TIME` (saying so), a master
    /// name no sentinel knows; with [`Error::CoordinatorUnavailable`] when the server
    /// cannot be reached or refuses the connection (`server_error`, as at `maxclients`). A server whose
    /// `maxmemory-policy` may evict caracal's keys is reported by a `coordinator.eviction_risk`
    /// event.
    pub async fn connect(self) -> Result<Coordinator, Error> {
        check_part(&self.namespace)
            .map_err(|reason| Error::config(format!("namespace {reason}")))?;
        if self.command_timeout.is_zero() || self.command_timeout > MAX_COMMAND_TIMEOUT {
            return Err(Error::config(
                "command_timeout must be positive and at most an hour",
            ));
        }
        if let DataLoss::Grace(grace) = self.after_data_loss
            && (grace.is_zero() || grace > MAX_COMMAND_TIMEOUT)
        {
            return Err(Error::config(
                "the grace after a data loss must be positive and at most an hour",
            ));
        }
        if self.pool_size == 0 {
            return Err(Error::config("pool_size must be at least 1"));
        }
        let topology = self.topology()?;
        let incarnation = Arc::new(Incarnation::new(self.after_data_loss));
        let background = Background::here();
        let backend = RedisBackend::connect(
            (topology, self.trust),
            self.command_timeout,
            self.pool_size,
            &self.namespace,
            (Arc::clone(&incarnation), background.clone()),
        )
        .await?;
        Coordinator::new(
            self.namespace,
            Backend::Redis(backend),
            (incarnation, background),
        )
        .start()
        .await
    }
}

pub(super) async fn from_env() -> Result<Coordinator, Error> {
    let (wanted, config) = from_vars(|name| std::env::var(name).ok())?;
    // Read before connecting: a bad file fails start-up before anything else happens.
    let config = config.map(Config::from_toml_file).transpose()?;
    let coordinator = wanted.connect().await?;
    if let Some(config) = config {
        coordinator.set_config(config);
    }
    Ok(coordinator)
}

/// The coordinator the variables `var` reads describe — a builder for Redis, or the in-memory
/// coordinator when `CARACAL_REDIS_URL` is unset — and the configuration file `CARACAL_CONFIG`
/// names, if any. A variable that is set but blank or malformed is an error, never a silent
/// default.
fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<(FromEnv, Option<String>), Error> {
    let set = |name: &str| -> Result<Option<String>, Error> {
        match var(name) {
            None => Ok(None),
            Some(value) if value.trim().is_empty() => Err(Error::config(format!(
                "{name} is set but blank; unset it{}",
                if name == "CARACAL_REDIS_URL" {
                    " for the in-memory coordinator"
                } else {
                    " for the default"
                }
            ))),
            Some(value) => Ok(Some(value.trim().to_owned())),
        }
    };
    let config = set("CARACAL_CONFIG")?;
    let Some(urls) = set("CARACAL_REDIS_URL")? else {
        for name in [
            "CARACAL_NAMESPACE",
            "CARACAL_COMMAND_TIMEOUT",
            "CARACAL_AFTER_DATA_LOSS",
        ] {
            set(name)?;
        }
        return Ok((FromEnv::Memory, config));
    };
    // A Sentinel URL lists its sentinels with commas: it is one URL, not cluster seeds.
    let urls: Vec<String> = if SentinelUrl::is_sentinel(&urls) {
        vec![urls]
    } else {
        urls.split(',').map(|u| u.trim().to_owned()).collect()
    };
    if urls.iter().any(String::is_empty) {
        return Err(Error::config(
            "CARACAL_REDIS_URL lists an empty URL (a stray comma?)",
        ));
    }
    let mut builder = if urls.len() > 1 {
        Coordinator::redis_cluster(urls)
    } else {
        Coordinator::redis(urls.into_iter().next().unwrap_or_default())
    };
    if let Some(namespace) = set("CARACAL_NAMESPACE")? {
        builder = builder.namespace(namespace);
    }
    if let Some(timeout) = set("CARACAL_COMMAND_TIMEOUT")? {
        let timeout = humantime::parse_duration(&timeout).map_err(|e| {
            Error::config(format!(
                "CARACAL_COMMAND_TIMEOUT {timeout:?}: {e} (write it with a unit, as \"250ms\")"
            ))
        })?;
        builder = builder.command_timeout(timeout);
    }
    if let Some(after) = set("CARACAL_AFTER_DATA_LOSS")? {
        builder = builder.after_data_loss(data_loss(&after)?);
    }
    Ok((FromEnv::Redis(builder), config))
}

/// `CARACAL_AFTER_DATA_LOSS`: `lease`, or the grace as a duration.
fn data_loss(value: &str) -> Result<DataLoss, Error> {
    if value == "lease" {
        return Ok(DataLoss::WholeLease);
    }
    humantime::parse_duration(value)
        .map(DataLoss::Grace)
        .map_err(|e| {
            Error::config(format!(
                "CARACAL_AFTER_DATA_LOSS {value:?}: {e} (a grace such as \"2s\", or \"lease\")"
            ))
        })
}

/// What the environment asks for.
#[derive(Debug)]
enum FromEnv {
    Memory,
    Redis(RedisBuilder),
}

impl FromEnv {
    async fn connect(self) -> Result<Coordinator, Error> {
        match self {
            FromEnv::Memory => Ok(Coordinator::in_memory()),
            FromEnv::Redis(builder) => builder.connect().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(vars: &[(&str, &str)]) -> Result<FromEnv, Error> {
        from_with_config(vars).map(|(wanted, _)| wanted)
    }

    fn from_with_config(vars: &[(&str, &str)]) -> Result<(FromEnv, Option<String>), Error> {
        from_vars(|name| {
            vars.iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| (*value).to_owned())
        })
    }

    fn message(vars: &[(&str, &str)]) -> String {
        match from(vars) {
            Err(error) => {
                assert_eq!(error.code(), "invalid_config");
                error.to_string()
            }
            Ok(chosen) => panic!("{vars:?} accepted: {chosen:?}"),
        }
    }

    #[test]
    fn unset_means_in_memory_and_set_means_redis() {
        assert!(matches!(from(&[]), Ok(FromEnv::Memory)));
        assert!(matches!(
            from(&[("CARACAL_REDIS_URL", "redis://127.0.0.1:1")]),
            Ok(FromEnv::Redis(builder)) if !builder.cluster
        ));
        assert!(matches!(
            from(&[("CARACAL_REDIS_URL", "redis://a:1, redis://b:1")]),
            Ok(FromEnv::Redis(builder)) if builder.cluster && builder.urls.len() == 2
        ));
        assert!(matches!(
            from(&[("CARACAL_REDIS_URL", "redis-sentinel://a:26379,b:26379#main")]),
            Ok(FromEnv::Redis(builder)) if !builder.cluster && builder.urls.len() == 1
        ));
    }

    #[test]
    fn a_blank_or_malformed_variable_is_invalid_config() {
        assert!(
            message(&[("CARACAL_REDIS_URL", " ")]).contains("CARACAL_REDIS_URL is set but blank")
        );
        assert!(message(&[("CARACAL_REDIS_URL", "")]).contains("CARACAL_REDIS_URL"));
        assert!(message(&[("CARACAL_REDIS_URL", "redis://a:1,")]).contains("empty URL"));
        let url = ("CARACAL_REDIS_URL", "redis://127.0.0.1:1");
        assert!(message(&[url, ("CARACAL_NAMESPACE", "  ")]).contains("CARACAL_NAMESPACE"));
        assert!(
            message(&[url, ("CARACAL_COMMAND_TIMEOUT", " ")]).contains("CARACAL_COMMAND_TIMEOUT")
        );
        assert!(message(&[url, ("CARACAL_COMMAND_TIMEOUT", "250")]).contains("unit"));
        // Settings meant for Redis are checked even when it is not used.
        assert!(message(&[("CARACAL_NAMESPACE", "")]).contains("CARACAL_NAMESPACE"));
        assert!(message(&[("CARACAL_CONFIG", " ")]).contains("CARACAL_CONFIG is set but blank"));
        assert!(
            message(&[url, ("CARACAL_AFTER_DATA_LOSS", "soon")])
                .contains("CARACAL_AFTER_DATA_LOSS")
        );
    }

    #[test]
    fn the_wait_after_a_data_loss_comes_from_the_environment() {
        let url = ("CARACAL_REDIS_URL", "redis://127.0.0.1:1");
        let after = |value: &str| match from(&[url, ("CARACAL_AFTER_DATA_LOSS", value)]) {
            Ok(FromEnv::Redis(builder)) => builder.after_data_loss,
            other => panic!("{other:?}"),
        };
        assert_eq!(after("lease"), DataLoss::WholeLease);
        assert_eq!(
            after("5s"),
            DataLoss::Grace(std::time::Duration::from_secs(5))
        );
        match from(&[url]) {
            Ok(FromEnv::Redis(builder)) => assert_eq!(builder.after_data_loss, DataLoss::default()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn caracal_config_names_the_file_to_load() {
        let (_, config) =
            from_with_config(&[("CARACAL_CONFIG", " /etc/svc/caracal.toml ")]).expect("valid");
        assert_eq!(config.as_deref(), Some("/etc/svc/caracal.toml"));
        assert!(matches!(from_with_config(&[]), Ok((FromEnv::Memory, None))));
    }
}
