//! Self-tests of the harness: each piece does what the suites rely on.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use caracal_tests::cluster::key_slot;
use caracal_tests::ledger::{AsyncLedger, Ledger};
use caracal_tests::wait::wait_until;
use caracal_tests::{
    AsyncWitness, CommandStats, EventLog, FaultProxy, ProxyMode, RedisCluster, RedisServer,
    Witness, stats,
};

use crate::common::PATIENCE;

fn ping(conn: &mut redis::Connection) -> redis::RedisResult<String> {
    redis::cmd("PING").query(conn)
}

/// A connection through `url` with short timeouts, so a fault shows up fast.
fn short_connection(url: &str, timeout: Duration) -> redis::RedisResult<redis::Connection> {
    let conn = redis::Client::open(url)?.get_connection_with_timeout(timeout)?;
    conn.set_read_timeout(Some(timeout))?;
    conn.set_write_timeout(Some(timeout))?;
    Ok(conn)
}

#[test]
fn harness_types_are_shareable_between_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<RedisServer>();
    assert_send_sync::<RedisCluster>();
    assert_send_sync::<FaultProxy>();
    assert_send_sync::<EventLog>();
    assert_send_sync::<Witness>();
    assert_send_sync::<AsyncWitness>();
    assert_send_sync::<CommandStats>();
}

#[test]
fn server_starts_stops_and_restarts_on_the_same_port() {
    let mut server = RedisServer::start();
    let port = server.port();
    assert_eq!(server.url(), format!("redis://127.0.0.1:{port}"));
    assert_eq!(server.addr().port(), port);
    let mut conn = server.connection();
    assert_eq!(ping(&mut conn).unwrap(), "PONG");
    redis::cmd("SET")
        .arg("k")
        .arg("v")
        .query::<()>(&mut conn)
        .unwrap();

    server.stop();
    assert!(!server.is_running());
    assert!(
        ping(&mut conn).is_err(),
        "PING must fail on a stopped server"
    );
    assert!(
        TcpStream::connect(server.addr()).is_err(),
        "nothing may listen on a stopped server's port"
    );

    server.restart();
    assert_eq!(server.port(), port, "restart keeps the port");
    let mut conn = server.connection();
    assert_eq!(ping(&mut conn).unwrap(), "PONG");
    let value: Option<String> = redis::cmd("GET").arg("k").query(&mut conn).unwrap();
    assert_eq!(value, None, "a restarted server starts empty");
}

#[test]
fn server_pause_freezes_and_resume_thaws() {
    let mut server = RedisServer::start();
    let mut conn = short_connection(&server.url(), Duration::from_millis(300)).unwrap();
    server.pause();
    let err = ping(&mut conn).expect_err("a paused server must not answer");
    assert!(err.is_timeout(), "expected the read timeout, got {err:?}");
    server.resume();
    let mut conn = server.connection();
    assert_eq!(ping(&mut conn).unwrap(), "PONG");
}

#[test]
fn parallel_servers_get_distinct_ports_and_dirs() {
    let servers: Vec<RedisServer> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4).map(|_| s.spawn(RedisServer::start)).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut ports: Vec<u16> = servers.iter().map(RedisServer::port).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), 4, "ports must be distinct: {ports:?}");
    let mut dirs: Vec<_> = servers.iter().map(|s| s.dir().to_owned()).collect();
    dirs.sort();
    dirs.dedup();
    assert_eq!(dirs.len(), 4);
    for server in &servers {
        assert_eq!(ping(&mut server.connection()).unwrap(), "PONG");
    }
    let dir = servers[0].dir().to_owned();
    drop(servers);
    assert!(!dir.exists(), "dropping a server removes its dir");
}

#[test]
fn key_slot_follows_the_cluster_spec() {
    // Reference values from the Redis Cluster specification.
    assert_eq!(key_slot(b"123456789"), 0x31C3);
    assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
    assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
    assert_ne!(
        key_slot(b"foo{}{bar}"),
        key_slot(b"bar"),
        "an empty tag hashes the whole key"
    );
    assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
}

#[test]
fn cluster_of_three_masters_serves_commands() {
    let started = Instant::now();
    let mut cluster = RedisCluster::start(3);
    eprintln!("cluster of 3 ready in {:?}", started.elapsed());
    assert_eq!(cluster.nodes().len(), 3);
    assert_eq!(cluster.seed_urls().len(), 3);

    let mut conn = redis::cluster::ClusterClient::new(cluster.seed_urls())
        .unwrap()
        .get_connection()
        .unwrap();
    redis::cmd("SET")
        .arg("{t}a")
        .arg(1)
        .query::<()>(&mut conn)
        .unwrap();
    let value: i64 = redis::cmd("GET").arg("{t}a").query(&mut conn).unwrap();
    assert_eq!(value, 1);

    for node in cluster.nodes() {
        let info: String = redis::cmd("CLUSTER")
            .arg("INFO")
            .query(&mut node.connection())
            .unwrap();
        assert!(
            info.contains("cluster_state:ok"),
            "node {}: {info}",
            node.port()
        );
    }

    // The direct connection for a key reaches its owner, which holds it without redirects.
    let mut owner = cluster.connection_for_key("{t}a");
    for key in [
        "{t}a",
        "a",
        "foo",
        "caracal:{bulkhead:x}:leases",
        "foo{}{bar}",
        "x{}y{z}",
        "{{a}}",
    ] {
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut owner)
            .unwrap();
        assert_eq!(key_slot(key.as_bytes()), slot, "slot of {key:?}");
    }
    let value: i64 = redis::cmd("GET").arg("{t}a").query(&mut owner).unwrap();
    assert_eq!(value, 1);
    let others = cluster
        .nodes()
        .iter()
        .filter(|n| n.port() != cluster.node_for_key("{t}a").port());
    for node in others {
        let moved = redis::cmd("GET")
            .arg("{t}a")
            .query::<i64>(&mut node.connection());
        assert!(moved.is_err(), "node {} must redirect", node.port());
    }

    // A crashed master comes back empty, with its slots, and the cluster heals.
    let owner_index = cluster
        .nodes()
        .iter()
        .position(|n| n.port() == cluster.node_for_key("{t}a").port())
        .unwrap();
    cluster.nodes_mut()[owner_index].stop();
    cluster.nodes_mut()[owner_index].restart();
    let started = Instant::now();
    cluster.wait_healthy();
    eprintln!("cluster healed in {:?}", started.elapsed());
    let mut conn = cluster.client().get_connection().unwrap();
    let value: Option<i64> = redis::cmd("GET").arg("{t}a").query(&mut conn).unwrap();
    assert_eq!(value, None, "a restarted master comes back empty");

    let before = CommandStats::read_cluster(&cluster);
    for i in 0..30 {
        redis::cmd("SET")
            .arg(format!("k{i}"))
            .arg(i)
            .query::<()>(&mut conn)
            .unwrap();
    }
    let delta = CommandStats::read_cluster(&cluster).delta(&before);
    assert_eq!(delta.calls("set"), 30, "{delta:?}");
}

#[test]
fn proxy_passes_through_and_counts_connections() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    assert_eq!(proxy.mode(), ProxyMode::PassThrough);
    assert_eq!(proxy.upstream(), server.addr());
    assert_eq!(proxy.url(), format!("redis://{}", proxy.addr()));
    let mut a = short_connection(&proxy.url(), Duration::from_secs(2)).unwrap();
    let mut b = short_connection(&proxy.url(), Duration::from_secs(2)).unwrap();
    assert_eq!(ping(&mut a).unwrap(), "PONG");
    assert_eq!(ping(&mut b).unwrap(), "PONG");
    redis::cmd("SET")
        .arg("x")
        .arg("1")
        .query::<()>(&mut a)
        .unwrap();
    let value: String = redis::cmd("GET").arg("x").query(&mut b).unwrap();
    assert_eq!(value, "1");
    assert_eq!(proxy.connections(), 2);
    drop(a);
    wait_until(PATIENCE, "the proxy to see a close", || {
        proxy.connections() == 1
    });

    // A large value survives chunking in both directions.
    let big = "z".repeat(1 << 20);
    redis::cmd("SET")
        .arg("big")
        .arg(&big)
        .query::<()>(&mut b)
        .unwrap();
    let back: String = redis::cmd("GET").arg("big").query(&mut b).unwrap();
    assert_eq!(back.len(), big.len());
}

#[test]
fn proxy_cut_closes_connections_and_restore_admits_new_ones() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let mut conn = short_connection(&proxy.url(), Duration::from_secs(5)).unwrap();
    assert_eq!(ping(&mut conn).unwrap(), "PONG");

    // Both fail on the cut itself (EOF, reset), not by running into their 5 s timeouts.
    proxy.cut();
    assert_eq!(proxy.connections(), 0);
    let err = ping(&mut conn).expect_err("PING over a cut connection must fail");
    assert!(
        !err.is_timeout(),
        "the cut must close the connection: {err:?}"
    );

    let err = short_connection(&proxy.url(), Duration::from_secs(5))
        .and_then(|mut c| ping(&mut c))
        .expect_err("a new connection must fail while cut");
    assert!(
        !err.is_timeout(),
        "a new connection must be closed: {err:?}"
    );

    proxy.restore();
    let mut conn = short_connection(&proxy.url(), Duration::from_secs(2)).unwrap();
    assert_eq!(ping(&mut conn).unwrap(), "PONG");
}

#[test]
fn proxy_blackhole_times_out_and_restore_resumes() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let mut conn = short_connection(&proxy.url(), Duration::from_millis(300)).unwrap();
    assert_eq!(ping(&mut conn).unwrap(), "PONG");
    let mut raw = TcpStream::connect(proxy.addr()).unwrap();
    raw.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();

    proxy.blackhole();
    let err = ping(&mut conn).expect_err("PING must time out while blackholed");
    assert!(err.is_timeout(), "expected a timeout, got {err:?}");

    // A surviving connection holds its data; a new one is accepted but not served.
    raw.write_all(b"PING\r\n").unwrap();
    let mut buf = [0u8; 64];
    assert!(
        raw.read(&mut buf).is_err(),
        "nothing may come back while blackholed"
    );
    let mut late = TcpStream::connect(proxy.addr()).unwrap();
    late.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    late.write_all(b"PING\r\n").unwrap();
    assert!(
        late.read(&mut buf).is_err(),
        "a new connection is not served while blackholed"
    );
    wait_until(PATIENCE, "3 held connections", || proxy.connections() == 3);

    proxy.restore();
    let mut pong = [0u8; 7];
    raw.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    raw.read_exact(&mut pong).unwrap();
    assert_eq!(&pong, b"+PONG\r\n", "held data flows once restored");
    late.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    late.read_exact(&mut pong).unwrap();
    assert_eq!(
        &pong, b"+PONG\r\n",
        "the late connection is served once restored"
    );
    let mut conn = short_connection(&proxy.url(), Duration::from_secs(2)).unwrap();
    assert_eq!(ping(&mut conn).unwrap(), "PONG");
}

#[test]
fn proxy_delay_adds_latency_and_restore_lifts_it() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let mut conn = short_connection(&proxy.url(), PATIENCE).unwrap();
    // Each way waits at least the delay: a lower bound, which load can only lengthen.
    proxy.delay(Duration::from_millis(100));
    let started = Instant::now();
    assert_eq!(ping(&mut conn).unwrap(), "PONG");
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(200),
        "round trip took {elapsed:?}"
    );

    // A request delayed by a minute goes through as soon as the delay is lifted.
    proxy.delay(Duration::from_secs(60));
    let before = proxy.requests();
    let pinging = std::thread::spawn(move || ping(&mut conn));
    wait_until(PATIENCE, "the delayed request to reach the proxy", || {
        proxy.requests() > before
    });
    proxy.restore();
    assert_eq!(pinging.join().unwrap().unwrap(), "PONG");
}

#[test]
fn proxy_holds_replies_until_released_in_order() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let mut raw = TcpStream::connect(proxy.addr()).unwrap();
    raw.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    raw.write_all(b"PING\r\n").unwrap();
    let mut pong = [0u8; 7];
    raw.read_exact(&mut pong).unwrap();
    assert_eq!((proxy.requests(), proxy.replies()), (1, 1));
    assert_eq!(
        proxy.held_replies(),
        0,
        "nothing is held while passing through"
    );

    proxy.hold_replies();
    assert_eq!(proxy.mode(), ProxyMode::HoldReplies);
    // Three pipelined requests in one write, answered by the server, held by the proxy.
    raw.write_all(b"*2\r\n$4\r\nECHO\r\n$1\r\na\r\n*2\r\n$4\r\nECHO\r\n$1\r\nb\r\n*2\r\n$4\r\nECHO\r\n$1\r\nc\r\n")
        .unwrap();
    wait_until(PATIENCE, "3 held replies", || proxy.held_replies() == 3);
    assert_eq!((proxy.requests(), proxy.replies()), (4, 4));
    assert_eq!(proxy.in_flight(), 0, "the server answered them all");
    let mut buf = [0u8; 64];
    assert!(raw.read(&mut buf).is_err(), "a held reply came through");

    proxy.release_replies(2);
    let mut two = [0u8; 14];
    raw.set_read_timeout(Some(PATIENCE)).unwrap();
    raw.read_exact(&mut two).unwrap();
    assert_eq!(&two, b"$1\r\na\r\n$1\r\nb\r\n", "released in order");
    assert_eq!(proxy.held_replies(), 1);
    raw.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    assert!(raw.read(&mut buf).is_err(), "only two were released");

    // Released credit covers a reply still to come.
    proxy.release_replies(2);
    raw.write_all(b"PING\r\n").unwrap();
    let mut rest = [0u8; 14];
    raw.set_read_timeout(Some(PATIENCE)).unwrap();
    raw.read_exact(&mut rest).unwrap();
    assert_eq!(&rest, b"$1\r\nc\r\n+PONG\r\n");

    // Restoring lets everything through.
    raw.write_all(b"PING\r\n").unwrap();
    wait_until(PATIENCE, "a held reply", || proxy.held_replies() == 1);
    proxy.restore();
    assert_eq!(proxy.held_replies(), 0);
    raw.read_exact(&mut pong).unwrap();
    assert_eq!(&pong, b"+PONG\r\n");
}

#[test]
fn proxy_counts_frames_whatever_the_chunking() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let mut conn = short_connection(&proxy.url(), PATIENCE).unwrap();
    let before = (proxy.requests(), proxy.replies());
    // A value much larger than one read, and a pipeline of nested replies.
    let big = "z".repeat(1 << 20);
    redis::cmd("SET")
        .arg("big")
        .arg(&big)
        .query::<()>(&mut conn)
        .unwrap();
    let back: String = redis::cmd("GET").arg("big").query(&mut conn).unwrap();
    assert_eq!(back.len(), big.len());
    let (value, nested): (String, Vec<Vec<String>>) = redis::pipe()
        .cmd("RPUSH")
        .arg("list")
        .arg("x")
        .ignore()
        .cmd("SET")
        .arg("k")
        .arg("v")
        .ignore()
        .cmd("GET")
        .arg("k")
        .cmd("EVAL")
        .arg("return {{'a'}, {'b', 'c'}}")
        .arg(0)
        .query(&mut conn)
        .unwrap();
    assert_eq!(value, "v");
    assert_eq!(nested, [vec!["a"], vec!["b", "c"]]);
    wait_until(PATIENCE, "the last reply to be counted", || {
        proxy.replies() == before.1 + 6
    });
    assert_eq!(proxy.requests(), before.0 + 6);
    assert_eq!(proxy.in_flight(), 0);
}

#[test]
fn proxy_tells_unanswered_requests_from_pubsub_messages() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let mut conn = short_connection(&proxy.url(), PATIENCE).unwrap();
    assert_eq!(ping(&mut conn).unwrap(), "PONG");
    assert_eq!(proxy.in_flight(), 0);

    // While blackholed, a request reaches the proxy but no answer can come.
    proxy.blackhole();
    let pinging = std::thread::spawn(move || ping(&mut conn));
    wait_until(PATIENCE, "the request in flight", || proxy.in_flight() == 1);
    proxy.restore();
    assert_eq!(pinging.join().unwrap().unwrap(), "PONG");
    wait_until(PATIENCE, "the answer", || proxy.in_flight() == 0);

    // A subscriber gets messages it never asked for: they are replies, but not answers.
    let mut subscriber = short_connection(&proxy.url(), PATIENCE).unwrap();
    let mut pubsub = subscriber.as_pubsub();
    pubsub.subscribe("channel").unwrap();
    let replies = proxy.replies();
    redis::cmd("PUBLISH")
        .arg("channel")
        .arg("hello")
        .query::<i64>(&mut server.connection())
        .unwrap();
    let message = pubsub.get_message().unwrap();
    assert_eq!(message.get_payload::<String>().unwrap(), "hello");
    assert_eq!(proxy.replies(), replies + 1);
    assert_eq!(proxy.in_flight(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_counts_the_replies_a_call_awaits() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let client = redis::Client::open(proxy.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    // Replies are held on purpose here: longer than the client's own 500 ms default.
    conn.set_response_timeout(PATIENCE);
    let ping_twice = || {
        let mut conn = conn.clone();
        async move {
            for _ in 0..2 {
                let _: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
            }
            "pinged twice"
        }
    };
    // How long a call may stay pending with nothing held before it counts as stuck.
    let patience = Duration::from_secs(2);

    // Nothing awaited: completes with every reply held.
    let nothing = proxy.awaited_replies(async { "done" }, 0, patience).await;
    assert_eq!(nothing, Some(("done", 0)));
    // Two sequential round trips: two replies, one at a time.
    assert_eq!(
        proxy.awaited_replies(ping_twice(), 2, patience).await,
        Some(("pinged twice", 2))
    );
    assert_eq!(proxy.mode(), ProxyMode::PassThrough, "restored afterwards");
    // One reply short: stuck, and dropped.
    assert_eq!(proxy.awaited_replies(ping_twice(), 1, patience).await, None);
    assert_eq!(proxy.mode(), ProxyMode::PassThrough, "restored afterwards");
    proxy.wait_idle(PATIENCE).await;

    // A command sent but not waited for costs the caller nothing.
    let requests = proxy.requests();
    let mut background = None;
    let fire_and_forget = async {
        let mut conn = conn.clone();
        background = Some(tokio::spawn(async move {
            let _: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
        }));
        "sent"
    };
    assert_eq!(
        proxy.awaited_replies(fire_and_forget, 1, patience).await,
        Some(("sent", 0))
    );
    background.expect("spawned").await.unwrap();
    assert_eq!(proxy.requests(), requests + 1, "it was sent all the same");
}

#[test]
fn proxy_handles_many_connections_and_drops_cleanly() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let url = proxy.url();
    let mut conns: Vec<redis::Connection> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..50)
            .map(|_| s.spawn(|| short_connection(&url, Duration::from_secs(5)).unwrap()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for conn in &mut conns {
        assert_eq!(ping(conn).unwrap(), "PONG");
    }
    assert_eq!(proxy.connections(), 50);
    proxy.blackhole();
    // With connections open and held, the drop must still finish.
    let (dropped, done) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(proxy);
        let _ = dropped.send(());
    });
    done.recv_timeout(PATIENCE)
        .expect("dropping the proxy hung");
    assert!(
        ping(&mut conns[0]).is_err(),
        "connections close with the proxy"
    );
}

#[test]
fn commandstats_delta_counts_exactly_what_was_sent() {
    let server = RedisServer::start();
    let mut conn = server.connection();
    let before = CommandStats::read(&mut conn);
    for i in 0..3 {
        redis::cmd("SET")
            .arg(format!("k{i}"))
            .arg(i)
            .query::<()>(&mut conn)
            .unwrap();
    }
    redis::cmd("GET").arg("k0").query::<i64>(&mut conn).unwrap();
    redis::cmd("ZREM")
        .arg("z")
        .arg("m")
        .query::<i64>(&mut conn)
        .unwrap();
    let delta = CommandStats::read(&mut conn).delta(&before);
    let expected = [("get", 1), ("info", 1), ("set", 3), ("zrem", 1)]
        .map(|(k, v)| (k.to_owned(), v))
        .into();
    assert_eq!(delta.calls_map(), expected, "the first INFO counts too");
    assert_eq!(delta.calls("SET"), 3);
    assert_eq!(delta.calls("evalsha"), 0);
    assert_eq!(delta.without(&["info"]).total_calls(), 5);

    stats::reset(&mut conn);
    let after_reset = CommandStats::read(&mut conn);
    assert_eq!(after_reset.calls("set"), 0);
}

#[test]
fn thread_default_capture_sees_caracal_events_only() {
    let (log, _guard) = EventLog::capture_thread_default();
    tracing::info!(target: "caracal", event = "x.y", n = 3, ok = true, label = "a b");
    tracing::warn!(target: "other", event = "x.y");
    tracing::debug!(target: "caracal", event = "x.z", "with {}", "message");
    assert_eq!(log.count("x.y"), 1);
    assert_eq!(log.len(), 2);
    let event = log.wait_for("x.y", Duration::from_millis(10));
    assert_eq!(event.level, tracing::Level::INFO);
    assert_eq!(event.event(), Some("x.y"));
    assert_eq!(event.field("n"), Some("3"));
    assert_eq!(event.field("ok"), Some("true"));
    assert_eq!(event.field("label"), Some("a b"));
    let debug = &log.snapshot()[1];
    assert_eq!(debug.level, tracing::Level::DEBUG);
    assert_eq!(debug.field("message"), Some("with message"));
    log.clear();
    assert!(log.is_empty());
}

#[test]
fn global_capture_sees_events_from_other_threads() {
    let log = EventLog::global();
    let name = format!("harness-{}", std::process::id());
    let emitter = {
        let name = name.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            for n in 0..3 {
                tracing::info!(target: "caracal", event = "x.y", name = name.as_str(), n);
            }
        })
    };
    let first = log.wait_for_where("x.y", Duration::from_secs(5), |f| {
        f.get("name") == Some(&name)
    });
    assert_eq!(first.field("n"), Some("0"));
    emitter.join().unwrap();
    assert_eq!(log.count_where("x.y", |f| f.get("name") == Some(&name)), 3);
}

#[test]
#[should_panic(expected = "no matching `never.emitted` event within")]
fn wait_for_panics_with_what_it_expected() {
    let (log, _guard) = EventLog::capture_thread_default();
    tracing::info!(target: "caracal", event = "x.y");
    log.wait_for("never.emitted", Duration::from_millis(50));
}

#[test]
fn witness_records_violations() {
    let server = RedisServer::start();
    let witness = Witness::new(&server.url(), "w", 2);
    assert_eq!(witness.enter(), 1);
    assert_eq!(witness.enter(), 2);
    assert_eq!(witness.violations(), 0);
    assert_eq!(witness.enter(), 3);
    assert_eq!(witness.violations(), 1);
    assert_eq!(witness.max_seen(), 3);
    assert_eq!(witness.report().violation_values, vec![3]);
    for left in [2, 1, 0] {
        assert_eq!(witness.exit(), left);
    }
    assert_eq!(witness.current(), 0);
    assert_eq!(witness.max_seen(), 3, "the max stays");
    witness.reset();
    assert_eq!(witness.report(), Default::default());
}

#[tokio::test]
async fn async_witness_records_violations() {
    let server = RedisServer::start();
    let witness = AsyncWitness::connect(&server.url(), "w", 2).await;
    let entered = futures_join(&witness).await;
    assert_eq!(entered, vec![1, 2, 3, 4]);
    let report = witness.report().await;
    assert_eq!(report.max_seen, 4);
    assert_eq!(report.violations, 2);
    assert_eq!(report.violation_values, vec![3, 4]);
    assert_eq!(witness.exit().await, 3);

    // The sync witness reads what the async one wrote.
    assert_eq!(Witness::new(&server.url(), "w", 2).max_seen(), 4);
}

async fn futures_join(witness: &AsyncWitness) -> Vec<u64> {
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let witness = witness.clone();
        tasks.push(tokio::spawn(async move { witness.enter().await }));
    }
    let mut entered = Vec::new();
    for task in tasks {
        entered.push(task.await.unwrap());
    }
    entered.sort_unstable();
    entered
}

/// A cancelled body has left the ledger by the time its guard's drop returns, not whenever a
/// task of its own gets to say so: the process may end right after (a holder cancelled as its
/// lease was lost, then exiting), and the next holder's entry must not find it still in. On a
/// runtime, as a body is: a task spawned there would not have run yet.
#[tokio::test]
async fn a_dropped_bodys_exit_is_in_the_ledger_when_its_drop_returns() {
    let server = RedisServer::start();
    let name = crate::common::unique("ledger-drop");
    let ledger = AsyncLedger::connect(&server.url(), &name, 1);
    let mut orchestrator = Ledger::new(&server.url(), &name);
    let entered = ledger.enter("1-0");
    assert_eq!(orchestrator.open(), 1, "entered");
    drop(entered);
    assert_eq!(orchestrator.open(), 0, "still in after its drop returned");
    ledger.enter("1-1").leave();
    assert_eq!(orchestrator.violations(), [], "one body at a time");
}
