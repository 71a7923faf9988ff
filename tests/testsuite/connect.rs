//! What `connect` says when it cannot give a working coordinator.

use std::time::Duration;

use caracal::{Coordinator, FailureKind};
use caracal_tests::{FaultProxy, RedisServer};

use crate::common::ends;

fn code(result: Result<Coordinator, caracal::Error>) -> &'static str {
    result.map_or_else(|error| error.code(), |_| "connected")
}

#[tokio::test]
async fn a_malformed_url_is_invalid_config() {
    let result = Coordinator::redis("not a url").connect().await;
    assert_eq!(code(result), "invalid_config");
    let result = Coordinator::redis_cluster(["redis://127.0.0.1:1", "::"])
        .connect()
        .await;
    assert_eq!(code(result), "invalid_config");
}

#[tokio::test]
async fn bad_settings_are_invalid_config() {
    let server = RedisServer::start();
    for builder in [
        Coordinator::redis(server.url()).namespace("  "),
        Coordinator::redis(server.url()).namespace("n".repeat(1025)),
        Coordinator::redis(server.url()).command_timeout(Duration::ZERO),
        Coordinator::redis(server.url()).command_timeout(Duration::MAX),
        Coordinator::redis(server.url()).pool_size(0),
    ] {
        assert_eq!(code(builder.connect().await), "invalid_config");
    }
}

/// Why `connect` failed, when it did with `CoordinatorUnavailable`.
fn failure(result: &Result<Coordinator, caracal::Error>) -> Option<FailureKind> {
    match result {
        Err(caracal::Error::CoordinatorUnavailable { cause, .. }) => Some(cause.kind()),
        _ => None,
    }
}

#[tokio::test]
async fn an_unreachable_server_is_coordinator_unavailable() {
    // A port nothing listens on: reserve one by binding, then close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("free port")
        .port();
    let connecting = Coordinator::redis(format!("redis://127.0.0.1:{port}"))
        .command_timeout(Duration::from_millis(300))
        .connect();
    let result = ends("connect to a closed port", connecting).await;
    assert_eq!(
        failure(&result),
        Some(FailureKind::Disconnected),
        "{result:?}"
    );
}

/// A server that accepts the connection but never answers: `connect` gives up when the command
/// timeout fires, and says so.
#[tokio::test]
async fn a_silent_server_is_coordinator_unavailable_when_the_timeout_fires() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    proxy.blackhole();
    let connecting = Coordinator::redis(proxy.url())
        .command_timeout(Duration::from_millis(300))
        .connect();
    let result = ends("connect to a blackholed server", connecting).await;
    assert_eq!(failure(&result), Some(FailureKind::Timeout), "{result:?}");
}

/// Creates the ACL user `name` (password `pw`) with `rules` on `server`.
pub(crate) fn acl_user(server: &RedisServer, name: &str, rules: &str) {
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER").arg(name).arg("on").arg(">pw");
    for rule in rules.split_whitespace() {
        cmd.arg(rule);
    }
    cmd.exec(&mut server.connection()).expect("ACL SETUSER");
}

/// The URL of `server` as the ACL user `name`.
pub(crate) fn as_user(server: &RedisServer, name: &str) -> String {
    format!("redis://{name}:pw@127.0.0.1:{}", server.port())
}

/// The message of a connect that must fail with `InvalidConfig`.
fn invalid_config(result: Result<Coordinator, caracal::Error>) -> String {
    match result {
        Err(error @ caracal::Error::InvalidConfig { .. }) => error.to_string(),
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
}

/// An ACL user missing one command caracal needs used to connect, then fail silently (no ZREM:
/// releases never landed; no HMGET: a breaker never opened). `connect` checks the grant and
/// names what is missing; the documented rules are enough.
#[tokio::test]
async fn connect_checks_the_acl_grant_and_names_what_is_missing() {
    let server = RedisServer::start();
    for missing in ["zrem", "hmget", "subscribe", "evalsha"] {
        let user = format!("no-{missing}");
        acl_user(
            &server,
            &user,
            &format!("{} -{missing}", caracal::REDIS_ACL_RULES),
        );
        let message = invalid_config(Coordinator::redis(as_user(&server, &user)).connect().await);
        assert!(
            message.to_ascii_lowercase().contains(missing),
            "{missing}: {message}"
        );
    }
    acl_user(&server, "other-keys", "~other:* &* +@all");
    let message = invalid_config(
        Coordinator::redis(as_user(&server, "other-keys"))
            .connect()
            .await,
    );
    assert!(message.contains("keys `caracal:v1:*`"), "{message}");
    acl_user(&server, "minimal", caracal::REDIS_ACL_RULES);
    let coordinator = Coordinator::redis(as_user(&server, "minimal"))
        .connect()
        .await
        .expect("the documented rules are enough");
    coordinator.shutdown().await;
}

/// On a cluster too, the documented rules are enough: the client reads the slot map, and each
/// primary is asked who it is along with its `INFO`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_rules_are_enough_on_a_cluster() {
    let cluster = caracal_tests::RedisCluster::start(3);
    for node in cluster.nodes() {
        acl_user(node, "minimal", caracal::REDIS_ACL_RULES);
    }
    let seeds = cluster.nodes().iter().map(|node| as_user(node, "minimal"));
    let coordinator = Coordinator::redis_cluster(seeds)
        .connect()
        .await
        .expect("the documented rules are enough");
    let scope = crate::common::unique("acl-cluster");
    assert_eq!(
        crate::common::code(&coordinator.scoped(crate::bulkhead::one(&scope)).await),
        "ok"
    );
    coordinator.shutdown().await;
}

#[tokio::test]
async fn refused_credentials_are_invalid_config() {
    let server = RedisServer::start();
    acl_user(&server, "someone", caracal::REDIS_ACL_RULES);
    let url = format!("redis://someone:wrong@127.0.0.1:{}", server.port());
    let message = invalid_config(Coordinator::redis(url).connect().await);
    assert!(message.contains("refused the credentials"), "{message}");
}

/// The server answering an error (here WRONGTYPE: a lease set's key holds a string) is a
/// server error, not a lost connection.
#[tokio::test]
async fn errors_the_server_answers_are_server_errors() {
    let server = RedisServer::start();
    let coordinator = crate::common::redis(&server.url()).await;
    let scope = crate::common::unique("wrongtype");
    assert_eq!(
        crate::common::code(&coordinator.scoped(crate::bulkhead::one(&scope)).await),
        "ok"
    );
    let mut conn = server.connection();
    let mut leases = crate::common::Leases::on(&server);
    crate::common::eventually("the call's release", || leases.live() == 0).await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("caracal:v1:*:fence")
        .query(&mut conn)
        .expect("KEYS");
    let leases_key = keys[0].replace(":fence", ":leases");
    redis::cmd("SET")
        .arg(&leases_key)
        .arg("not a sorted set")
        .exec(&mut conn)
        .expect("SET");
    let result = coordinator.scoped(crate::bulkhead::one(&scope)).await;
    assert_eq!(
        crate::common::failure_kind(&result),
        Some(FailureKind::Server),
        "{result:?}"
    );
    coordinator.shutdown().await;
}

/// `rediss://` with the feature `tls`: the server's certificate is checked, against a CA given
/// to the builder (or, without one, the system's, which does not know the test's CA).
#[tokio::test]
async fn tls_connections_check_the_certificate() {
    let server = caracal_tests::TlsRedisServer::start();
    // TLS handshakes in a debug build on a loaded machine can take longer than the default
    // timeout: a timeout here would say nothing about certificates.
    let patience = crate::common::PATIENCE;
    let coordinator = Coordinator::redis(server.url())
        .namespace(crate::common::unique("tls"))
        .tls_root_certificates(server.ca_pem())
        .command_timeout(patience)
        .connect()
        .await
        .expect("connect over TLS");
    let scope = crate::common::unique("tls");
    assert_eq!(
        crate::common::code(&coordinator.scoped(crate::bulkhead::one(&scope)).await),
        "ok"
    );
    coordinator.shutdown().await;
    let untrusted = Coordinator::redis(server.url())
        .command_timeout(patience)
        .connect()
        .await;
    let error = untrusted.expect_err("a certificate the system does not trust");
    assert!(
        format!("{error:?}")
            .to_ascii_lowercase()
            .contains("certificate"),
        "{error:?}"
    );
}

/// A server that may evict caracal's keys under memory pressure is reported at connect.
#[tokio::test(flavor = "current_thread")]
async fn an_evicting_server_is_reported() {
    let (log, _guard) = caracal_tests::EventLog::capture_thread_default();
    let evicting = RedisServer::start_with_args(&["--maxmemory-policy", "allkeys-lru"]);
    let coordinator = Coordinator::redis(evicting.url())
        .connect()
        .await
        .expect("connect");
    let event = log.wait_for("coordinator.eviction_risk", Duration::from_secs(1));
    assert_eq!(event.field("maxmemory_policy"), Some("allkeys-lru"));
    coordinator.shutdown().await;
    log.clear();
    let safe = RedisServer::start();
    let coordinator = Coordinator::redis(safe.url())
        .connect()
        .await
        .expect("connect");
    assert_eq!(log.count("coordinator.eviction_risk"), 0);
    coordinator.shutdown().await;
}

/// A replica used to be accepted: `connect` succeeded, then every call failed `READONLY`
/// while the pool reconnected to it over and over. It is refused, naming its primary.
#[tokio::test]
async fn a_replica_is_refused_naming_its_primary() {
    let primary = RedisServer::start();
    let replica =
        RedisServer::start_with_args(&["--replicaof", "127.0.0.1", &primary.port().to_string()]);
    let message = invalid_config(Coordinator::redis(replica.url()).connect().await);
    assert!(message.contains("replica"), "{message}");
    assert!(
        message.contains(&format!("127.0.0.1:{}", primary.port())),
        "{message}"
    );
    assert!(message.contains("redis-sentinel://"), "{message}");
}

/// Why a coordinator failed, when it is `CoordinatorUnavailable`.
fn kind_of(error: &caracal::Error) -> Option<FailureKind> {
    match error {
        caracal::Error::CoordinatorUnavailable { cause, .. } => Some(cause.kind()),
        _ => None,
    }
}

/// The full text of an error: its message and every source's.
fn full_text(error: &caracal::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(&format!(" / {cause}"));
        source = cause.source();
    }
    text
}

/// Lets the server take at most `clients` connections from now on.
fn set_maxclients(conn: &mut redis::Connection, clients: u32) {
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxclients")
        .arg(clients)
        .exec(conn)
        .expect("CONFIG SET maxclients");
}

/// One slot, and a lease short enough that one left by an acquire whose answer was lost with
/// its connection (granted by the server, never seen by the caller) ends within the suite's
/// patience: under load, the killed connection can take such an acquire with it.
#[caracal::bulkhead(name = "suite-maxclients", limit = 1, lease = "2s", scope = scope)]
async fn one_short_lease(scope: &str) -> Result<(), crate::common::TestError> {
    Ok(())
}

/// A server at `maxclients` answers a new connection with `-ERR max number of clients
/// reached` and closes it. That used to be reported as a lost connection ("broken pipe"); it is
/// the server's refusal, at connect and when a pooled connection reconnects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maxclients_is_the_servers_refusal() {
    let server = RedisServer::start();
    let mut held = server.connection();
    set_maxclients(&mut held, 1);
    for _ in 0..5 {
        let result = Coordinator::redis(server.url()).connect().await;
        let error = result.expect_err("no room for another client");
        assert_eq!(kind_of(&error), Some(FailureKind::Server), "{error:?}");
        assert!(full_text(&error).contains("maxclients"), "{error:?}");
    }
    set_maxclients(&mut held, 100);

    let coordinator = Coordinator::redis(server.url())
        .namespace(crate::common::unique("maxclients"))
        .pool_size(1)
        .command_timeout(Duration::from_millis(500))
        .connect()
        .await
        .expect("connect");
    let scope = crate::common::unique("maxclients");
    assert_eq!(
        crate::common::code(&coordinator.scoped(one_short_lease(&scope)).await),
        "ok"
    );
    // Its one pooled connection is killed while the server is full: the reconnection is
    // refused. (Kept by the server: this connection, the held one and the pub/sub one.)
    let mut other = server.connection();
    let ours: Vec<i64> = [&mut held, &mut other]
        .into_iter()
        .map(|conn| {
            redis::cmd("CLIENT")
                .arg("ID")
                .query(conn)
                .expect("CLIENT ID")
        })
        .collect();
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut held)
        .expect("CLIENT LIST");
    let pooled: Vec<i64> = list
        .lines()
        .filter(|line| !line.contains("flags=P"))
        .filter_map(|line| line.strip_prefix("id=")?.split(' ').next()?.parse().ok())
        .filter(|id| !ours.contains(id))
        .collect();
    assert_eq!(pooled.len(), 1, "one pooled connection:\n{list}");
    redis::pipe()
        .atomic()
        .cmd("CONFIG")
        .arg("SET")
        .arg("maxclients")
        .arg(3)
        .cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(pooled[0])
        .exec(&mut held)
        .expect("fill the server and kill the pooled connection");
    let refused = crate::common::until_code("coordinator_unavailable", || async {
        match coordinator.scoped(one_short_lease(&scope)).await {
            Err(crate::common::TestError::Caracal(error))
                if kind_of(&error) == Some(FailureKind::Server) =>
            {
                Err(crate::common::TestError::Caracal(error))
            }
            other => Ok(format!("{other:?}")),
        }
    })
    .await;
    for earlier in &refused {
        assert!(
            earlier
                .as_ref()
                .is_ok_and(|text| text.contains("Disconnected")),
            "before the reconnection was refused: {earlier:?}"
        );
    }
    let result = coordinator.scoped(one_short_lease(&scope)).await;
    let Err(crate::common::TestError::Caracal(error)) = result else {
        panic!("a call while the server is full: {result:?}");
    };
    assert!(full_text(&error).contains("maxclients"), "{error:?}");
    set_maxclients(&mut held, 100);
    crate::common::until_ok(|| coordinator.scoped(one_short_lease(&scope))).await;
    coordinator.shutdown().await;
}

/// caracal's scripts read the server's clock with `TIME`: a server where it is renamed or
/// disabled used to connect, then answer every call with an outage-like `server_error`.
#[tokio::test]
async fn a_server_without_time_is_invalid_config() {
    for renamed in ["", "clock-of-the-server"] {
        let server = RedisServer::start_with_args(&["--rename-command", "TIME", renamed]);
        let message = invalid_config(Coordinator::redis(server.url()).connect().await);
        assert!(message.contains("TIME"), "{renamed:?}: {message}");
        assert!(message.contains("rename-command"), "{renamed:?}: {message}");
    }
}

/// A server that speaks enough RESP for `connect` (HELLO, CLIENT, INFO, PING) and looks like a
/// Redis 7.2 primary, but answers every script with `script_reply` (raw RESP). Serves until the
/// test ends.
async fn fake_server(script_reply: &'static [u8]) -> String {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free port");
    let url = format!("redis://{}", listener.local_addr().expect("its address"));
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (read, mut write) = socket.into_split();
                let mut lines = BufReader::new(read).lines();
                // Each command: `*N`, then `$len` and the argument for each of its N parts.
                while let Ok(Some(header)) = lines.next_line().await {
                    let parts: usize = header.trim_start_matches('*').parse().unwrap_or(0);
                    let mut command = Vec::with_capacity(parts);
                    for _ in 0..parts {
                        let _length = lines.next_line().await;
                        command.push(lines.next_line().await.ok().flatten().unwrap_or_default());
                    }
                    let name = command.first().map(|c| c.to_ascii_uppercase());
                    let info = "# Server\r\nredis_version:7.2.4\r\nrun_id:fake\r\n\
                                # Memory\r\nmaxmemory_policy:noeviction\r\n\
                                # Replication\r\nrole:master\r\n";
                    let reply: Vec<u8> = match name.as_deref() {
                        Some("HELLO") => b"%3\r\n+server\r\n+redis\r\n+version\r\n+7.2.4\r\n\
                                           +proto\r\n:3\r\n"
                            .to_vec(),
                        Some("INFO") => format!("${}\r\n{info}\r\n", info.len()).into_bytes(),
                        Some("PING") => b"+PONG\r\n".to_vec(),
                        Some("EVAL" | "EVALSHA") => script_reply.to_vec(),
                        _ => b"+OK\r\n".to_vec(),
                    };
                    if write.write_all(&reply).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    url
}

/// A server that cannot run caracal's scripts used to connect, then answer every call with an
/// outage-like `server_error`. `connect` runs one small script (the grant check, no spinning
/// probe) and refuses the server, naming why: scripting off (Garnet's default), or scripts
/// that cannot read `TIME`. A real server still connects.
#[tokio::test]
async fn a_server_that_cannot_run_the_scripts_is_invalid_config() {
    let no_scripts = fake_server(b"-ERR This instance has Lua scripting support disabled\r\n");
    let message = invalid_config(Coordinator::redis(no_scripts.await).connect().await);
    assert!(
        message.contains("does not run caracal's scripts")
            && message.contains("scripting support disabled"),
        "{message}"
    );
    let no_clock =
        fake_server(b"*3\r\n*0\r\n*0\r\n+ERR This command is not allowed from script\r\n");
    let message = invalid_config(Coordinator::redis(no_clock.await).connect().await);
    assert!(
        message.contains("cannot read TIME") && message.contains("not allowed from script"),
        "{message}"
    );
    let server = RedisServer::start();
    Coordinator::redis(server.url())
        .connect()
        .await
        .expect("a real server runs the scripts")
        .shutdown()
        .await;
}
