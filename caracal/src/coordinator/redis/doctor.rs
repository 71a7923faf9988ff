//! The Redis side of `caracal doctor`: connects as the fleet would and checks, one fact at a
//! time, what caracal relies on. Every probe is bounded by the command timeout and touches one
//! key of caracal's key space (`caracal:v1:{doctor}:probe`, 10 s TTL) and one channel.

use std::time::Duration;

use tokio::time::Instant;

use redis::Value;

use super::connector::{Conn, Connector, Topology};
use super::node::Trust;
use super::scripts::{ACL_CHECK, DOCTOR_PROBE, DOCTOR_WRITE};
use crate::coordinator::doctor::Check;
use crate::kernel::Script;

const PROBE_KEY: &str = "caracal:v1:{doctor}:probe";
const PROBE_CHANNEL: &str = "caracal:v1:{doctor}:channel";
/// Empty Lua iterations the atomicity probe spins: tens of milliseconds on any server, long
/// enough for the other connection's write to arrive while it runs.
const SPINS: u64 = 3_000_000;
/// Round trips timed for `round_trip`.
const PINGS: usize = 100;

/// Every check of the server(s) behind `topology`, in the checklist's order.
pub(crate) async fn examine(topology: &Topology, trust: &Trust, timeout: Duration) -> Vec<Check> {
    let mut checks = Vec::new();
    let connector = match Connector::new(topology, trust, timeout) {
        Ok(connector) => connector,
        Err(error) => {
            checks.push(Check::new("server", false, error.to_string()));
            return checks;
        }
    };
    let connected = match connector.connect(|| {}, timeout, true).await {
        Ok(connected) => connected,
        Err(error) => {
            checks.push(Check::new("role", false, error.to_string()));
            return checks;
        }
    };
    let mut conn = connected.conn;
    match within(timeout, info(&mut conn)).await {
        Ok(Ok(nodes)) => {
            checks.extend(server_checks(topology, connected.master.as_deref(), &nodes))
        }
        Ok(Err(error)) => checks.push(Check::new("server", false, error)),
        Err(_) => checks.push(Check::new("server", false, "INFO timed out")),
    }
    if let Conn::Cluster(_) = conn {
        checks.push(match within(timeout, cluster_slots(&mut conn)).await {
            Ok(check) => check,
            Err(_) => Check::new("cluster_slots", false, "CLUSTER SLOTS timed out"),
        });
    }
    checks.push(
        within(timeout, acl(&mut conn))
            .await
            .unwrap_or_else(|_| Check::new("acl", false, "the grant check timed out")),
    );
    let other = connector
        .connect(|| {}, timeout, true)
        .await
        .map(|c| c.conn);
    checks.extend(match (other, within(timeout, scripts(&mut conn)).await) {
        (Ok(other), Ok(_)) => within(timeout, atomic(&mut conn, other))
            .await
            .unwrap_or_else(|_| vec![Check::new("scripts_atomic", false, "the probe timed out")]),
        (Err(error), _) => vec![Check::new("scripts_atomic", false, error.to_string())],
        (_, Err(_)) => vec![Check::new("scripts_atomic", false, "EVAL timed out")],
    });
    checks.push(
        within(timeout, pexpire(&mut conn))
            .await
            .unwrap_or_else(|_| Check::new("pexpiretime", false, "the probe timed out")),
    );
    checks.push(
        within(timeout, pubsub(&connector, &mut conn, timeout))
            .await
            .unwrap_or_else(|_| Check::new("pubsub", false, "no message came back in time")),
    );
    checks.push(
        within(timeout, admin_commands(&mut conn))
            .await
            .unwrap_or_else(|_| Check::new("admin_commands", true, "CONFIG GET timed out")),
    );
    checks.push(round_trip(&mut conn, timeout).await);
    checks
}

/// `cmd`'s reply, an error reply as an error.
async fn ask(conn: &mut Conn, cmd: &redis::Cmd) -> Result<Value, String> {
    match conn.send(cmd).await {
        Ok(Value::ServerError(error)) => Err(error.to_string()),
        Ok(value) => Ok(value),
        Err(error) => Err(error.to_string()),
    }
}

/// `what`, unless it takes longer than `timeout`.
async fn within<T>(timeout: Duration, what: impl Future<Output = T>) -> Result<T, ()> {
    tokio::time::timeout(timeout, what).await.map_err(drop)
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(text) | Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

/// `INFO`'s text from every primary: one for a standalone server, each primary's for a
/// cluster (the client asks them all).
async fn info(conn: &mut Conn) -> Result<Vec<(String, String)>, String> {
    let mut cmd = redis::cmd("INFO");
    cmd.arg("server")
        .arg("memory")
        .arg("persistence")
        .arg("replication");
    let reply = ask(conn, &cmd).await?;
    match &reply {
        Value::Map(nodes) => Ok(nodes
            .iter()
            .filter_map(|(node, info)| Some((text(node)?, text(info)?)))
            .collect()),
        other => text(other)
            .map(|info| vec![(String::new(), info)])
            .ok_or_else(|| format!("INFO answered {other:?}")),
    }
}

fn field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|line| line.trim().strip_prefix(name)?.strip_prefix(':'))
}

/// `server`, `role`, `eviction` and `persistence`, from each primary's `INFO`.
fn server_checks(
    topology: &Topology,
    master: Option<&str>,
    nodes: &[(String, String)],
) -> Vec<Check> {
    let on = |node: &str| {
        if node.is_empty() {
            String::new()
        } else {
            format!("{node}: ")
        }
    };
    let mut servers = Vec::new();
    let mut too_old = false;
    let (mut eviction, mut evicts) = (Vec::new(), false);
    let mut persistence = Vec::new();
    for (node, info) in nodes {
        let redis = field(info, "redis_version").unwrap_or("?");
        let kind = match (field(info, "server_name"), field(info, "valkey_version")) {
            (Some(name), Some(version)) => format!("{name} {version} (redis_version {redis})"),
            _ => format!("redis {redis}"),
        };
        let mut version = redis
            .split('.')
            .map(|part| part.parse::<u32>().unwrap_or(0));
        too_old |= (version.next().unwrap_or(0), version.next().unwrap_or(0)) < (7, 0);
        servers.push(format!("{}{kind}", on(node)));
        let policy = field(info, "maxmemory_policy").unwrap_or("?");
        evicts |= policy != "noeviction";
        eviction.push(format!("{}{policy}", on(node)));
        let aof = field(info, "aof_enabled") == Some("1");
        persistence.push(format!(
            "{}{}",
            on(node),
            if aof { "AOF on" } else { "no AOF" }
        ));
    }
    let mut checks = vec![Check::new(
        "server",
        !too_old && !servers.is_empty(),
        if too_old {
            format!("{}: caracal needs Redis 7.0 or later", servers.join(", "))
        } else {
            servers.join(", ")
        },
    )];
    let role = match (topology, master) {
        (Topology::Cluster(_), _) => format!("cluster, {} primaries answered", nodes.len()),
        (Topology::Sentinel(url), Some(master)) => {
            format!(
                "primary {master}, named by the sentinels of `{}`",
                url.master_name()
            )
        }
        _ => "primary".to_owned(),
    };
    checks.push(Check::new("role", true, role));
    checks.push(Check::new(
        "eviction",
        !evicts,
        if evicts {
            format!(
                "maxmemory-policy {}: the server may evict state the fleet still holds \
                 (held leases, failure windows: set noeviction)",
                eviction.join(", ")
            )
        } else {
            format!("maxmemory-policy {}", eviction.join(", "))
        },
    ));
    checks.push(Check::new(
        "persistence",
        true,
        format!(
            "{}: a restart that loses the data is noticed, and costs the grace (2 s by \
             default) with no bulkhead admission",
            persistence.join(", ")
        ),
    ));
    checks
}

/// Whether every slot is served, by how many primaries.
async fn cluster_slots(conn: &mut Conn) -> Check {
    let reply = match ask(conn, redis::cmd("CLUSTER").arg("SLOTS")).await {
        Ok(reply) => reply,
        Err(error) => return Check::new("cluster_slots", false, error.to_string()),
    };
    let Value::Array(ranges) = reply else {
        return Check::new(
            "cluster_slots",
            false,
            format!("CLUSTER SLOTS answered {reply:?}"),
        );
    };
    let (mut covered, mut primaries) = (0_i64, std::collections::BTreeSet::new());
    for range in &ranges {
        if let Value::Array(parts) = range
            && let [
                Value::Int(first),
                Value::Int(last),
                Value::Array(primary),
                ..,
            ] = &parts[..]
        {
            covered += last - first + 1;
            if let [host, Value::Int(port), ..] = &primary[..] {
                primaries.insert(format!("{}:{port}", text(host).unwrap_or_default()));
            }
        }
    }
    Check::new(
        "cluster_slots",
        covered == 16_384,
        format!(
            "{covered} of 16384 slots served by {} primaries",
            primaries.len()
        ),
    )
}

fn eval(script: &Script, arg: Option<u64>) -> redis::Cmd {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(script.body()).arg(1).arg(PROBE_KEY);
    if let Some(arg) = arg {
        cmd.arg(arg);
    }
    cmd
}

/// `acl`: the commands caracal needs, known to the server and allowed to this user on its
/// keys and channel (the check `connect` makes, told command by command).
async fn acl(conn: &mut Conn) -> Check {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(ACL_CHECK.body())
        .arg(1)
        .arg(PROBE_KEY)
        .arg(PROBE_CHANNEL);
    let lists = match ask(conn, &cmd).await {
        Ok(Value::Array(lists)) => lists,
        Ok(other) => return Check::new("acl", false, format!("the check answered {other:?}")),
        Err(error) => return Check::new("acl", false, error.to_string()),
    };
    let names = |list: Option<&Value>| match list {
        Some(Value::Array(items)) => items.iter().filter_map(text).collect::<Vec<_>>(),
        _ => Vec::new(),
    };
    let (denied, unknown) = (names(lists.first()), names(lists.get(1)));
    if denied.is_empty() && unknown.is_empty() {
        return Check::new(
            "acl",
            true,
            "every command caracal needs is known and allowed on `caracal:v1:*`",
        );
    }
    let mut missing = Vec::new();
    if !denied.is_empty() {
        missing.push(format!("not allowed to this user: {}", denied.join(", ")));
    }
    if !unknown.is_empty() {
        missing.push(format!(
            "unknown to the server (renamed?): {}",
            unknown.join(", ")
        ));
    }
    Check::new(
        "acl",
        false,
        format!(
            "{}; grant at least `{}`",
            missing.join("; "),
            super::REDIS_ACL_RULES
        ),
    )
}

/// Whether the server runs scripts at all (`EVAL` with a key).
async fn scripts(conn: &mut Conn) -> Result<(), String> {
    ask(conn, &eval(&DOCTOR_PROBE, Some(1))).await.map(drop)
}

/// `scripts_atomic` and `script_time`: a write sent while the probe spins must wait for it.
async fn atomic(conn: &mut Conn, mut other: Conn) -> Vec<Check> {
    let marker = uuid::Uuid::new_v4().to_string();
    let probe = eval(&DOCTOR_PROBE, Some(SPINS));
    let mut write = redis::cmd("SET");
    write.arg(PROBE_KEY).arg(&marker).arg("PX").arg(10_000);
    let probing = ask(conn, &probe);
    let writing = async {
        // Sent once the probe is under way on the server.
        tokio::time::sleep(Duration::from_millis(5)).await;
        ask(&mut other, &write).await
    };
    let (probed, written) = tokio::join!(probing, writing);
    let reply = match (probed, written) {
        (Err(error), _) | (_, Err(error)) => {
            return vec![Check::new("scripts_atomic", false, error.to_string())];
        }
        (Ok(Value::Array(reply)), Ok(_)) => reply,
        (Ok(other), Ok(_)) => {
            return vec![Check::new(
                "scripts_atomic",
                false,
                format!("the probe answered {other:?}"),
            )];
        }
    };
    let value = |i: usize| reply.get(i).and_then(text);
    let interleaved = value(0) != value(1);
    let time = match (reply.get(2), reply.get(3)) {
        (Some(seconds), Some(micros)) => text(seconds).zip(text(micros)),
        _ => None,
    };
    vec![
        Check::new(
            "scripts_atomic",
            !interleaved,
            if interleaved {
                "a write from another connection landed while a script ran: caracal's \
                 scripts would decide on state that changes under them"
            } else {
                "a write from another connection waited for the running script"
            },
        ),
        Check::new(
            "script_time",
            time.is_some(),
            match time {
                Some((seconds, micros)) => format!("TIME in a script: {seconds}.{micros:0>6}"),
                None => "a script could not read TIME".to_owned(),
            },
        ),
    ]
}

/// `pexpiretime`: the lease set's TTL rule (`PEXPIREAT … GT`) honoured.
async fn pexpire(conn: &mut Conn) -> Check {
    let reply = match ask(conn, &eval(&DOCTOR_WRITE, None)).await {
        Ok(Value::Array(reply)) => reply,
        Ok(other) => {
            return Check::new(
                "pexpiretime",
                false,
                format!("the probe answered {other:?}"),
            );
        }
        Err(error) => return Check::new("pexpiretime", false, error.to_string()),
    };
    match &reply[..] {
        [Value::Int(deadline), Value::Int(expiretime)] => Check::new(
            "pexpiretime",
            deadline == expiretime,
            if deadline == expiretime {
                "PEXPIREAT … GT kept the later deadline, as PEXPIRETIME shows".to_owned()
            } else {
                format!("PEXPIREAT … GT moved the deadline {deadline} to {expiretime}")
            },
        ),
        [Value::Int(_), _] => Check::new(
            "pexpiretime",
            true,
            "PEXPIREAT … GT accepted; PEXPIRETIME is not allowed to this user (caracal does not \
             need it)",
        ),
        other => Check::new(
            "pexpiretime",
            false,
            format!("the probe answered {other:?}"),
        ),
    }
}

/// `pubsub`: a message published comes back to a subscriber, how fast.
async fn pubsub(connector: &Connector, conn: &mut Conn, timeout: Duration) -> Check {
    use futures_util::StreamExt as _;
    let mut subscriber = match connector.pubsub(timeout).await {
        Ok(subscriber) => subscriber,
        Err(error) => return Check::new("pubsub", false, error.to_string()),
    };
    if let Err(error) = subscriber.subscribe(PROBE_CHANNEL).await {
        return Check::new("pubsub", false, error.to_string());
    }
    let started = Instant::now();
    let mut publish = redis::cmd("PUBLISH");
    publish.arg(PROBE_CHANNEL).arg("doctor");
    if let Err(error) = ask(conn, &publish).await {
        return Check::new("pubsub", false, error.to_string());
    }
    match subscriber.on_message().next().await {
        Some(_) => Check::new(
            "pubsub",
            true,
            format!(
                "a message came back in {} µs",
                started.elapsed().as_micros()
            ),
        ),
        None => Check::new("pubsub", false, "the subscription ended with no message"),
    }
}

/// `admin_commands`: whether `CONFIG` answers (caracal itself needs no admin command).
async fn admin_commands(conn: &mut Conn) -> Check {
    let mut config = redis::cmd("CONFIG");
    config.arg("GET").arg("maxmemory-policy");
    let detail = match ask(conn, &config).await {
        Ok(_) => "CONFIG answers".to_owned(),
        Err(error) => format!(
            "CONFIG refused ({error}): caracal needs no admin command; the doctor read INFO \
             instead"
        ),
    };
    Check::new("admin_commands", true, detail)
}

/// `round_trip`: p50 and p99 of sequential `PING`s, each given the command timeout (a busy
/// client machine slows the hundred; only one answered too late is a failure).
async fn round_trip(conn: &mut Conn, timeout: Duration) -> Check {
    let mut times = Vec::with_capacity(PINGS);
    for _ in 0..PINGS {
        let started = Instant::now();
        match within(timeout, ask(conn, &redis::cmd("PING"))).await {
            Ok(Ok(_)) => times.push(started.elapsed().as_micros()),
            Ok(Err(error)) => return Check::new("round_trip", false, error),
            Err(()) => return Check::new("round_trip", false, "a PING timed out"),
        }
    }
    times.sort_unstable();
    let at = |q: usize| times[(times.len() * q / 100).min(times.len() - 1)];
    Check::new(
        "round_trip",
        true,
        format!("p50 {} µs, p99 {} µs", at(50), at(99)),
    )
}
