//! What a connection learns about the server before it serves a command: the primaries'
//! `run_id`s (a new one means lost data, see `coordinator::incarnation`), their versions and
//! eviction policies; and, once at `connect`, whether the server and the user's permissions
//! can carry caracal at all.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use redis::Value;

use crate::error::Error;
use crate::events;

/// Facts from `INFO server memory replication`, over the primaries that answered (one for a standalone
/// server).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct ServerInfo {
    /// The `run_id` of every primary that answered, by node (`""` for a standalone server).
    pub(crate) run_ids: BTreeMap<String, String>,
    /// `(major, minor)` of every primary.
    pub(crate) versions: Vec<(u32, u32)>,
    /// `maxmemory_policy` of every primary.
    pub(crate) eviction: Vec<String>,
    /// `host:port` of its master, when the node that answered is a replica (read by the
    /// standalone and Sentinel topologies: caracal writes, so a replica may not serve).
    pub(crate) replica_of: Option<String>,
}

/// The command that gathers [`ServerInfo`] from one node.
pub(crate) fn info_command() -> redis::Cmd {
    let mut cmd = redis::cmd("INFO");
    cmd.arg("server").arg("memory").arg("replication");
    cmd
}

impl ServerInfo {
    /// Parses `node`'s reply to [`info_command`]. A reply that is an error, or that does not
    /// name the `run_id`, is an error: read as an empty set of `run_id`s, it would say that
    /// every primary seen before is gone.
    pub(crate) fn parse(node: &str, reply: &Value) -> Result<Self, Error> {
        let text = match reply {
            Value::BulkString(bytes) => String::from_utf8_lossy(bytes),
            Value::SimpleString(text) | Value::VerbatimString { text, .. } => Cow::from(text),
            other => return Err(told_nothing(node, format_args!("it answered {other:?}"))),
        };
        let mut info = ServerInfo::default();
        let (mut replica, mut master_host, mut master_port) = (false, None, None);
        for line in text.lines() {
            let Some((field, value)) = line.trim().split_once(':') else {
                continue;
            };
            match field {
                "run_id" => {
                    info.run_ids.insert(node.to_owned(), value.to_owned());
                }
                "redis_version" => {
                    let mut parts = value.split('.').map(|part| part.parse().unwrap_or(0));
                    let major = parts.next().unwrap_or(0);
                    info.versions.push((major, parts.next().unwrap_or(0)));
                }
                "maxmemory_policy" => info.eviction.push(value.to_owned()),
                "role" => replica = value == "slave",
                "master_host" => master_host = Some(value),
                "master_port" => master_port = Some(value),
                _ => {}
            }
        }
        if replica {
            let host = master_host.unwrap_or("?");
            info.replica_of = Some(format!("{host}:{}", master_port.unwrap_or("?")));
        }
        if info.run_ids.is_empty() {
            return Err(told_nothing(node, format_args!("it names no run_id")));
        }
        Ok(info)
    }

    /// The primaries that answered.
    pub(crate) fn primaries(&self) -> BTreeSet<String> {
        self.run_ids.keys().cloned().collect()
    }

    /// Adds what another primary told.
    pub(crate) fn merge(&mut self, other: ServerInfo) {
        self.run_ids.extend(other.run_ids);
        self.versions.extend(other.versions);
        self.eviction.extend(other.eviction);
    }

    /// Refuses a server caracal cannot run on, and says so loudly about one that may drop its
    /// state: anything but `noeviction` may evict lease sets (they carry TTLs, so `volatile-*`
    /// policies pick them too) and open breakers.
    pub(crate) fn check(&self) -> Result<(), Error> {
        if let Some((major, minor)) = self.versions.iter().copied().find(|&v| v < (7, 0)) {
            return Err(Error::config(format!(
                "Redis {major}.{minor} is too old: caracal needs Redis 7.0 or later \
                 (PEXPIREAT … GT, redis.acl_check_cmd)"
            )));
        }
        for policy in self.eviction.iter().filter(|p| p.as_str() != "noeviction") {
            events::eviction_risk(policy);
        }
        Ok(())
    }
}

fn told_nothing(node: &str, why: std::fmt::Arguments<'_>) -> Error {
    let node = if node.is_empty() { "the server" } else { node };
    Error::config(format!(
        "`INFO server` told nothing about {node} ({why}); caracal needs every primary's run_id \
         to notice a restart"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "# Server\r\nredis_version:7.0.15\r\nrun_id:abc\r\n\r\n# Memory\r\n\
                        maxmemory_policy:noeviction\r\n";

    #[test]
    fn parses_replies_and_merges_the_nodes() {
        let mut info = ServerInfo::parse("n1", &Value::BulkString(INFO.as_bytes().to_vec()))
            .expect("a complete reply");
        assert_eq!(info.run_ids, BTreeMap::from([("n1".into(), "abc".into())]));
        assert_eq!(info.versions, [(7, 0)]);
        assert_eq!(info.eviction, ["noeviction"]);
        assert!(info.check().is_ok());
        assert_eq!(info.replica_of, None);
        let replica = format!(
            "{INFO}# Replication\r\nrole:slave\r\nmaster_host:10.0.0.1\r\nmaster_port:6380\r\n"
        );
        let replica = ServerInfo::parse("", &Value::BulkString(replica.into_bytes()))
            .expect("a complete reply");
        assert_eq!(replica.replica_of.as_deref(), Some("10.0.0.1:6380"));
        let other = INFO.replace("abc", "def").replace("7.0.15", "6.2.14");
        let verbatim = Value::VerbatimString {
            format: redis::VerbatimFormat::Text,
            text: other,
        };
        info.merge(ServerInfo::parse("n2", &verbatim).expect("a complete reply"));
        assert_eq!(info.run_ids.len(), 2);
        let error = info.check().expect_err("6.2 is refused");
        assert!(error.to_string().contains("Redis 6.2"), "{error}");
    }

    /// An `INFO` answered with an error (here: `+info` revoked) used to parse as a node
    /// without a `run_id`, which read as a server that had lost its data.
    #[test]
    fn an_error_reply_or_one_without_a_run_id_tells_nothing() {
        let refused = redis::parse_redis_value(
            b"-NOPERM this user has no permissions to run the 'info' command\r\n",
        )
        .expect("an error value");
        assert!(matches!(refused, Value::ServerError(_)));
        let silent = Value::BulkString(INFO.replace("run_id:abc", "").into_bytes());
        for reply in [refused, silent, Value::Nil] {
            let error = ServerInfo::parse("", &reply).expect_err("no run_id learned");
            assert!(error.to_string().contains("run_id"), "{error}");
        }
    }
}
