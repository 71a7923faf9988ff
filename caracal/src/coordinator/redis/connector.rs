//! How connections are made: to a standalone server, to the master a set of sentinels names,
//! or to a cluster; with the TLS trust asked for; and what a new connection must show before
//! it serves (a primary, not a replica).

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ConnectionAddr, IntoConnectionInfo, PushKind, RedisError, Value};
use std::time::Duration;

use super::failure::{self, failure};
use super::node::{Trust, invalid_url, node_client, tcp_settings};
use super::sentinel::{SentinelUrl, Sentinels};
use super::server::{self, ServerInfo};
use crate::coordinator::url::Url;
use crate::error::Error;
use crate::error::FailureKind;

/// Where the coordinator's state lives.
#[derive(Debug, Clone)]
pub(crate) enum Topology {
    Standalone(Url),
    /// A master that sentinels name, and follow through failovers.
    Sentinel(SentinelUrl),
    Cluster(Vec<Url>),
}

/// What makes a topology's connections.
pub(crate) enum Connector {
    Standalone(redis::Client),
    /// The sentinels, asked for the master before each connection.
    Sentinel(Box<Sentinels>),
    Cluster {
        client: Box<redis::cluster::ClusterClient>,
        /// The nodes named in the configuration: pub/sub connects to the first that answers.
        seeds: Vec<Url>,
        /// For pub/sub connections, which the cluster client does not make.
        trust: Trust,
    },
}

impl Connector {
    /// The connector of `topology`, trusting `trust`, each connection made within a budget
    /// derived from `timeout`. Nothing is connected yet: a URL that cannot be one fails here.
    pub(super) fn new(
        topology: &Topology,
        trust: &Trust,
        timeout: Duration,
    ) -> Result<Self, Error> {
        match topology {
            Topology::Standalone(url) => Ok(Connector::Standalone(
                node_client(url.expose(), trust).map_err(invalid_url)?,
            )),
            Topology::Sentinel(url) => Ok(Connector::Sentinel(Box::new(Sentinels::new(
                url.clone(),
                trust.clone(),
            )?))),
            Topology::Cluster(seeds) => {
                let builder =
                    redis::cluster::ClusterClientBuilder::new(seeds.iter().map(Url::expose))
                        // Retries would replay commands whose outcome is unknown; redirections are
                        // followed on the next call, once the slot map is refreshed.
                        .retries(0)
                        .connection_timeout(timeout)
                        .response_timeout(timeout)
                        // Each call is bounded by its own deadline (see `Checkout::send`), one
                        // that moves with work whose runtime stops; the client's overall timer,
                        // armed in the caller's future, panics when polled on another runtime.
                        .overall_response_timeout(None)
                        .tcp_settings(tcp_settings());
                #[cfg(feature = "tls")]
                let builder = match &trust.roots {
                    Some(roots) => builder.certs(trust.certificates(roots)),
                    None => builder,
                };
                let client = builder.build().map_err(invalid_url)?;
                Ok(Connector::Cluster {
                    client: Box::new(client),
                    seeds: seeds.clone(),
                    trust: trust.clone(),
                })
            }
        }
    }

    /// How long one connection attempt may take in all. A cluster node that takes connections
    /// but never answers costs the client one connection timeout when it links to the seeds,
    /// and another when it links to the primaries of the slot map; it must not keep the others
    /// from being reached. Through Sentinel, the sentinels are asked first (all at once, each
    /// within the timeout), then the master they name.
    fn budget(&self, timeout: Duration) -> Duration {
        match self {
            Connector::Standalone(_) => timeout,
            Connector::Sentinel(_) => timeout * 2,
            Connector::Cluster { .. } => timeout * 3,
        }
    }

    /// The master the sentinels named last and a connection found to be one (`None` for other
    /// topologies, whose address never moves): a pub/sub connection made to another master
    /// follows it.
    pub(crate) fn master(&self) -> Option<String> {
        match self {
            Connector::Sentinel(sentinels) => sentinels.master(),
            _ => None,
        }
    }

    /// The master a majority of the sentinels name now (`None` without Sentinel, or when they
    /// do not agree or cannot be asked).
    pub(super) async fn named_master(&self, timeout: Duration) -> Option<String> {
        match self {
            Connector::Sentinel(sentinels) => sentinels.named(timeout).await,
            _ => None,
        }
    }

    /// A dedicated pub/sub connection (for cluster: to the first seed that answers; classic
    /// pub/sub messages reach every node; through Sentinel: to the master they name).
    pub(crate) async fn pubsub(&self, timeout: Duration) -> Result<redis::aio::PubSub, Error> {
        let attempt = async {
            match self {
                Connector::Standalone(client) => {
                    client.get_async_pubsub().await.map_err(|e| failure(&e))
                }
                Connector::Sentinel(sentinels) => {
                    let (client, _) = sentinels.resolve(timeout).await?;
                    client.get_async_pubsub().await.map_err(|e| failure(&e))
                }
                Connector::Cluster { seeds, trust, .. } => {
                    let mut last =
                        Error::unavailable(FailureKind::Disconnected, "no seed answered");
                    for seed in seeds {
                        let conn = seed
                            .expose()
                            .into_connection_info()
                            .and_then(|info| trust.client(info))
                            .map_err(|e| failure(&e))?;
                        match conn.get_async_pubsub().await {
                            Ok(pubsub) => return Ok(pubsub),
                            Err(e) => last = failure(&e),
                        }
                    }
                    Err(last)
                }
            }
        };
        within(
            self.budget(timeout),
            "pub/sub connection timed out",
            attempt,
        )
        .await
    }

    /// A new connection, and what a standalone server (or the master) told about itself on it:
    /// asked before the connection serves anything, all within the attempt's budget. A server
    /// that is a replica is refused: at `connect` (`first`) a standalone one is a configuration
    /// error, later a failed attempt. `on_closed` hears the connection's end. A cluster's
    /// primaries are checked one by one instead, by its
    /// [`ClusterCheck`](super::cluster_check::ClusterCheck).
    pub(super) async fn connect(
        &self,
        on_closed: impl Fn() + Send + Sync + 'static,
        timeout: Duration,
        first: bool,
    ) -> Result<Connected, Error> {
        let attempt = async {
            let (client, master) = match self {
                Connector::Standalone(client) => (client.clone(), None),
                Connector::Sentinel(sentinels) => {
                    let (client, master) = sentinels.resolve(timeout).await?;
                    (client, Some(master))
                }
                Connector::Cluster { client, .. } => {
                    let conn = client.get_async_connection().await;
                    return Ok(Connected {
                        conn: Conn::Cluster(conn.map_err(|e| failure(&e))?),
                        info: None,
                        master: None,
                    });
                }
            };
            // The connection reports its own end, so a restarted server is reconnected before
            // the next command has to fail on the dead socket.
            let on_push = move |push: redis::PushInfo| {
                if push.kind == PushKind::Disconnection {
                    on_closed();
                }
                Ok::<(), std::convert::Infallible>(())
            };
            let config = redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(timeout))
                .set_response_timeout(None)
                .set_push_sender(on_push);
            let mut conn = match client
                .get_multiplexed_async_connection_with_config(&config)
                .await
            {
                Ok(conn) => Conn::Single(conn),
                Err(error) => return Err(diagnose(&client, &error, timeout).await),
            };
            let info = conn
                .send(&server::info_command())
                .await
                .map_err(|e| failure(&e))?;
            let info = ServerInfo::parse("", &info)?;
            self.admit(&info, &client, master.as_deref(), first)?;
            Ok(Connected {
                conn,
                info: Some(info),
                master,
            })
        };
        within(self.budget(timeout), "connecting took too long", attempt).await
    }

    /// Refuses a connection to a replica: caracal writes. `master` is the address the
    /// sentinels named, remembered once the node there turned out to be a master.
    fn admit(
        &self,
        info: &ServerInfo,
        client: &redis::Client,
        master: Option<&str>,
        first: bool,
    ) -> Result<(), Error> {
        let Some(primary) = &info.replica_of else {
            if let (Connector::Sentinel(sentinels), Some(master)) = (self, master) {
                sentinels.found(master.to_owned());
            }
            return Ok(());
        };
        Err(match self {
            Connector::Sentinel(sentinels) => Error::unavailable(
                FailureKind::Server,
                format!(
                    "the sentinels name {} as the master of `{}`, but it is a replica of \
                     {primary} (a failover under way?)",
                    master.unwrap_or_default(),
                    sentinels.name()
                ),
            ),
            _ if first => Error::config(format!(
                "the Redis server at {} is a replica (of {primary}), and caracal writes: give \
                 it the primary's URL, or a Sentinel URL (`redis-sentinel://host:26379#\
                 master-name`) to follow the primary through failovers",
                address(client.get_connection_info().addr())
            )),
            _ => failure::replica(Some(primary)),
        })
    }
}

/// `attempt`, given up after `budget` as a timeout that says `what`.
async fn within<T>(
    budget: Duration,
    what: &'static str,
    attempt: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    tokio::time::timeout(budget, attempt)
        .await
        .unwrap_or_else(|_| Err(Error::unavailable(FailureKind::Timeout, what)))
}

/// A new connection, what the server told about itself on it (but for a cluster's), and the
/// master it reaches when the sentinels named it.
pub(super) struct Connected {
    /// The connection.
    pub(super) conn: Conn,
    /// What the server told about itself (`None` on a cluster, whose check reads it).
    pub(super) info: Option<ServerInfo>,
    /// The master reached, when the sentinels named it.
    pub(super) master: Option<String>,
}

/// `host:port` of a node.
fn address(addr: &ConnectionAddr) -> String {
    match addr {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            format!("{host}:{port}")
        }
        other => format!("{other:?}"),
    }
}

/// What a failed connection attempt means. A server at `maxclients` writes its refusal as
/// soon as it accepts the connection, and closes it; the client, writing its handshake, mostly
/// sees the connection reset instead. So after a connection that dropped before answering,
/// a second one is made that only listens: what the server says on it is why (plain TCP only;
/// over TLS a server speaks only after a handshake).
async fn diagnose(client: &redis::Client, error: &RedisError, timeout: Duration) -> Error {
    if error.is_connection_dropped()
        && !error.is_connection_refusal()
        && let ConnectionAddr::Tcp(host, port) = client.get_connection_info().addr()
        && let Some(greeting) = greeting(host, *port, timeout).await
        && failure::is_maxclients(&greeting)
    {
        return failure::maxclients();
    }
    failure(error)
}

/// The first bytes a server sends on a connection it accepted, without being asked anything;
/// `None` when it sends nothing within `timeout` (as a server with room never does).
async fn greeting(host: &str, port: u16, timeout: Duration) -> Option<String> {
    let listen = async {
        let stream = tokio::net::TcpStream::connect((host, port)).await.ok()?;
        let mut buffer = [0u8; 128];
        loop {
            stream.readable().await.ok()?;
            match stream.try_read(&mut buffer) {
                Ok(0) => return None,
                Ok(read) => return Some(String::from_utf8_lossy(&buffer[..read]).into_owned()),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => return None,
            }
        }
    };
    tokio::time::timeout(timeout, listen).await.ok().flatten()
}

/// A pooled connection: multiplexed to one node, or a cluster connection.
#[derive(Clone)]
pub(super) enum Conn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Conn {
    /// Sends `cmd`, with no deadline of its own (the caller's bounds it).
    pub(super) async fn send(&mut self, cmd: &Cmd) -> redis::RedisResult<Value> {
        match self {
            Conn::Single(conn) => conn.send_packed_command(cmd).await,
            Conn::Cluster(conn) => conn.req_packed_command(cmd).await,
        }
    }
}
