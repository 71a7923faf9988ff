//! Redis Sentinel: the URL (Lettuce's form) and finding the master through the sentinels.
//!
//! A small resolver of caracal's own rather than redis-rs's `sentinel` feature: that one asks
//! the sentinels one after another with no deadline, opens a connection of its own to the
//! master only to check its `ROLE`, and hands back a client for the pool to connect again.
//! Here the sentinels are asked all at once, each within the command timeout, and the master's
//! role is read from the `INFO` every new pooled connection sends anyway, before it serves.
//!
//! The URL's credentials are the master's, and are sent to the sentinels too (as Lettuce and
//! redis-rb do): a sentinel without a password takes any password for its `default` user; a
//! sentinel that refuses them (say, a user name it does not have) is asked again without.

use std::sync::Mutex;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use redis::RedisError;
use redis::aio::MultiplexedConnection;

use super::failure::failure;
use super::node::{Trust, invalid_url, node_client};
use crate::error::Error;
use crate::error::FailureKind;
use crate::sync::lock;

/// The port of a sentinel the URL names without one.
const DEFAULT_PORT: u16 = 26379;

/// A parsed `redis-sentinel://[user:password@]host1[:port1][,host2[:port2]…][/db]#master-name`
/// (`rediss-sentinel://` for TLS to the sentinels and the master).
#[derive(Clone)]
pub(crate) struct SentinelUrl {
    tls: bool,
    /// `user:password` or `password` as written (percent-encoded), for the master's URL.
    credentials: Option<String>,
    /// `host:port` of every sentinel, IPv6 hosts in brackets.
    sentinels: Vec<String>,
    /// The database number, as written.
    db: Option<String>,
    master_name: String,
}

impl std::fmt::Debug for SentinelUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password.
        f.debug_struct("SentinelUrl")
            .field("tls", &self.tls)
            .field("sentinels", &self.sentinels)
            .field("db", &self.db)
            .field("master_name", &self.master_name)
            .finish_non_exhaustive()
    }
}

impl SentinelUrl {
    /// The master's name the sentinels know it by.
    pub(crate) fn master_name(&self) -> &str {
        &self.master_name
    }

    /// Whether `url` is a Sentinel URL (which lists several hosts, comma-separated, and so is
    /// one URL, not a list of cluster seeds).
    pub(crate) fn is_sentinel(url: &str) -> bool {
        let scheme = url.split_once("://").map(|(scheme, _)| scheme);
        matches!(scheme, Some("redis-sentinel" | "rediss-sentinel"))
    }

    pub(crate) fn parse(url: &str) -> Result<Self, Error> {
        let form = "redis-sentinel://[user:password@]host:26379[,host:26379…][/db]#master-name";
        let invalid = |why: &str| {
            Error::config(format!(
                "invalid Sentinel URL ({why}); the form is `{form}`"
            ))
        };
        let (tls, rest) = match url.split_once("://") {
            Some(("redis-sentinel", rest)) => (false, rest),
            Some(("rediss-sentinel", rest)) => (true, rest),
            _ => {
                return Err(invalid(
                    "its scheme is neither redis-sentinel nor rediss-sentinel",
                ));
            }
        };
        if tls && !cfg!(feature = "tls") {
            return Err(Error::config(
                "rediss-sentinel:// needs caracal's feature `tls`",
            ));
        }
        let Some((rest, master_name)) = rest.split_once('#') else {
            return Err(invalid("it names no master after `#`"));
        };
        if master_name.trim().is_empty() {
            return Err(invalid("the master's name after `#` is blank"));
        }
        let (credentials, rest) = match rest.rsplit_once('@') {
            Some((credentials, rest)) => (Some(credentials.to_owned()), rest),
            None => (None, rest),
        };
        let (hosts, db) = match rest.split_once('/') {
            Some((hosts, "")) => (hosts, None),
            Some((hosts, db)) if db.bytes().all(|b| b.is_ascii_digit()) => {
                (hosts, Some(db.to_owned()))
            }
            Some(_) => return Err(invalid("the path after the hosts is not a database number")),
            None => (rest, None),
        };
        let sentinels = hosts
            .split(',')
            .map(|host| {
                with_port(host.trim())
                    .ok_or_else(|| invalid(&format!("`{host}` is not host[:port]")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(SentinelUrl {
            tls,
            credentials,
            sentinels,
            db,
            master_name: master_name.to_owned(),
        })
    }

    /// The URL of a node at `host:port` (a sentinel, or the master) with the credentials
    /// (unless `anonymous`) and, for the master, the database.
    fn node_url(&self, address: &str, anonymous: bool, db: Option<&str>) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        let credentials = match &self.credentials {
            Some(credentials) if !anonymous => format!("{credentials}@"),
            _ => String::new(),
        };
        let db = db.map(|db| format!("/{db}")).unwrap_or_default();
        format!("{scheme}://{credentials}{address}{db}")
    }
}

/// `host:port` with the default port if none is given; `None` for a malformed one.
fn with_port(host: &str) -> Option<String> {
    let (name, port) = match host.strip_prefix('[') {
        Some(v6) => {
            let (name, rest) = v6.split_once(']')?;
            (format!("[{name}]"), rest.strip_prefix(':'))
        }
        None => match host.rsplit_once(':') {
            Some((name, port)) => (name.to_owned(), Some(port)),
            None => (host.to_owned(), None),
        },
    };
    let port = match port {
        Some(port) => port.parse::<u16>().ok()?,
        None => DEFAULT_PORT,
    };
    (!name.is_empty() && !name.contains(['/', '@', '?'])).then(|| format!("{name}:{port}"))
}

/// The sentinels of one master, and the master a connection found last.
pub(crate) struct Sentinels {
    url: SentinelUrl,
    sentinels: Vec<Sentinel>,
    trust: Trust,
    /// `host:port` of the master a connection last found to be one.
    master: Mutex<Option<String>>,
}

/// One sentinel: a client with the URL's credentials, one without (when there are), and the
/// connection last made to it (kept: the primary check asks every second).
struct Sentinel {
    with: redis::Client,
    without: Option<redis::Client>,
    conn: Mutex<Option<MultiplexedConnection>>,
}

/// What the sentinels that answered say the master is.
struct Vote {
    master: String,
    /// Whether a majority of all the sentinels (not only of those that answered) name it.
    majority: bool,
}

impl Sentinels {
    pub(crate) fn new(url: SentinelUrl, trust: Trust) -> Result<Self, Error> {
        let sentinels = url
            .sentinels
            .iter()
            .map(|address| {
                let with = node_client(&url.node_url(address, false, None), &trust)?;
                let without = match url.credentials {
                    Some(_) => Some(node_client(&url.node_url(address, true, None), &trust)?),
                    None => None,
                };
                let conn = Mutex::new(None);
                Ok(Sentinel {
                    with,
                    without,
                    conn,
                })
            })
            .collect::<Result<_, RedisError>>()
            .map_err(invalid_url)?;
        Ok(Sentinels {
            url,
            sentinels,
            trust,
            master: Mutex::new(None),
        })
    }

    /// The master's name the sentinels know.
    pub(crate) fn name(&self) -> &str {
        &self.url.master_name
    }

    /// The master a connection last found to be one.
    pub(crate) fn master(&self) -> Option<String> {
        lock(&self.master).clone()
    }

    /// Remembers `master` as found to be one.
    pub(crate) fn found(&self, master: String) {
        *lock(&self.master) = Some(master);
    }

    /// The master's `host:port` as a majority of the sentinels name it now, if they do.
    pub(crate) async fn named(&self, timeout: Duration) -> Option<String> {
        let vote = self.vote(timeout).await.ok()?;
        vote.majority.then_some(vote.master)
    }

    /// A client for the master the sentinels name, and its `host:port`. Whether it really is
    /// the master is for the connection to check.
    pub(crate) async fn resolve(
        &self,
        timeout: Duration,
    ) -> Result<(redis::Client, String), Error> {
        let master = self.vote(timeout).await?.master;
        let url = self.url.node_url(&master, false, self.url.db.as_deref());
        let client = node_client(&url, &self.trust).map_err(invalid_url)?;
        Ok((client, master))
    }

    /// Asks every sentinel at once (each within `timeout`), until a majority of them name the
    /// same master, else until all have answered or failed: then the master most of those that
    /// answered name. A sentinel that has not heard of a failover yet is outvoted.
    async fn vote(&self, timeout: Duration) -> Result<Vote, Error> {
        let mut asked: FuturesUnordered<_> = self
            .sentinels
            .iter()
            .map(|sentinel| sentinel.ask(self.name(), timeout))
            .collect();
        let majority = self.sentinels.len() / 2 + 1;
        let mut votes: Vec<(String, usize)> = Vec::new();
        let (mut unknown, mut last) = (false, None);
        while let Some(answer) = asked.next().await {
            match answer {
                Ok(Some((host, port))) => {
                    let host = if host.contains(':') {
                        format!("[{host}]")
                    } else {
                        host
                    };
                    let master = format!("{host}:{port}");
                    let count = match votes.iter_mut().find(|(named, _)| *named == master) {
                        Some((_, count)) => {
                            *count += 1;
                            *count
                        }
                        None => {
                            votes.push((master.clone(), 1));
                            1
                        }
                    };
                    if count >= majority {
                        return Ok(Vote {
                            master,
                            majority: true,
                        });
                    }
                }
                Ok(None) => unknown = true,
                Err(error) => last = Some(error),
            }
        }
        // The first named wins a tie.
        let most = votes.iter().map(|(_, count)| *count).max().unwrap_or(0);
        if let Some((master, _)) = votes.into_iter().find(|(_, count)| *count == most) {
            return Ok(Vote {
                master,
                majority: false,
            });
        }
        if unknown {
            return Err(Error::config(format!(
                "no sentinel knows a master named `{}`",
                self.name()
            )));
        }
        Err(last.unwrap_or_else(|| {
            Error::unavailable(
                FailureKind::Disconnected,
                "the Sentinel URL names no sentinel",
            )
        }))
    }
}

impl Sentinel {
    /// `SENTINEL get-master-addr-by-name` within `timeout`: the address, or `None` when this
    /// sentinel knows no master of that name.
    async fn ask(&self, name: &str, timeout: Duration) -> Result<Option<(String, u16)>, Error> {
        let mut cmd = redis::cmd("SENTINEL");
        cmd.arg("get-master-addr-by-name").arg(name);
        let attempt = async {
            let mut conn = self.connection(timeout).await?;
            let answer = cmd.query_async::<Option<(String, u16)>>(&mut conn).await;
            if answer.is_err() {
                *lock(&self.conn) = None;
            }
            answer
        };
        match tokio::time::timeout(timeout, attempt).await {
            Ok(answer) => answer.map_err(|error| {
                let cause = failure(&error);
                let kind = cause.failure_kind().unwrap_or(FailureKind::Disconnected);
                Error::unavailable_because(kind, "no sentinel could name the master", error)
            }),
            Err(_) => Err(Error::unavailable(
                FailureKind::Timeout,
                "no sentinel named the master within the command timeout",
            )),
        }
    }

    /// The kept connection, or a new one: with the credentials, and without if it refuses
    /// them.
    async fn connection(&self, timeout: Duration) -> redis::RedisResult<MultiplexedConnection> {
        if let Some(conn) = lock(&self.conn).clone() {
            return Ok(conn);
        }
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        let conn = match self
            .with
            .get_multiplexed_async_connection_with_config(&config)
            .await
        {
            Err(error) if refused_credentials(&error) => match &self.without {
                Some(without) => {
                    without
                        .get_multiplexed_async_connection_with_config(&config)
                        .await
                }
                None => Err(error),
            },
            conn => conn,
        }?;
        *lock(&self.conn) = Some(conn.clone());
        Ok(conn)
    }
}

fn refused_credentials(error: &RedisError) -> bool {
    error.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(error.code(), Some("NOAUTH" | "WRONGPASS"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lettuces_form() {
        let url =
            SentinelUrl::parse("redis-sentinel://app:s%40cret@10.0.0.1:26380,h2,[::1]:5/2#main")
                .expect("valid");
        assert!(!url.tls);
        assert_eq!(url.sentinels, ["10.0.0.1:26380", "h2:26379", "[::1]:5"]);
        assert_eq!(url.master_name, "main");
        assert_eq!(
            url.node_url("10.0.0.9:6379", false, url.db.as_deref()),
            "redis://app:s%40cret@10.0.0.9:6379/2"
        );
        assert_eq!(url.node_url("h2:26379", true, None), "redis://h2:26379");
        assert!(
            !format!("{url:?}").contains("cret"),
            "no password in {url:?}"
        );
        let bare = SentinelUrl::parse("redis-sentinel://h1:1#m").expect("valid");
        assert_eq!(bare.node_url("h1:1", false, None), "redis://h1:1");
        assert!(SentinelUrl::is_sentinel("rediss-sentinel://h#m"));
        assert!(!SentinelUrl::is_sentinel("redis://h:1"));
    }

    #[test]
    fn a_malformed_url_is_invalid_config() {
        for url in [
            "redis://h:1#m",
            "redis-sentinel://h:1",
            "redis-sentinel://h:1#",
            "redis-sentinel://h:x#m",
            "redis-sentinel://h:1,,h:2#m",
            "redis-sentinel://h:1/db#m",
            "redis-sentinel://[::1#m",
        ] {
            let error = SentinelUrl::parse(url).map(|_| ()).expect_err(url);
            assert_eq!(error.code(), "invalid_config", "{url}");
        }
    }
}
