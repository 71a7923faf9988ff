//! `caracal doctor` and `Admin::doctor`: one check per thing caracal relies on, each server
//! shape a test — standalone, cluster, Sentinel, a replica, admin commands renamed away, an ACL
//! user missing a command, an evicting server, and the in-memory coordinator.

use caracal::admin::Check;
use caracal::{Coordinator, RedisBuilder};
use caracal_tests::server::RedisServer;
use caracal_tests::{RedisCluster, RedisSentinel};

use crate::cli::{caracal, run};
use crate::common::unique;
use crate::connect::{acl_user, as_user};

/// Every check caracal's doctor makes of a standalone server or a Sentinel's master, in order.
const STANDALONE: [&str; 12] = [
    "connect",
    "server",
    "role",
    "eviction",
    "persistence",
    "acl",
    "scripts_atomic",
    "script_time",
    "pexpiretime",
    "pubsub",
    "admin_commands",
    "round_trip",
];

/// The doctor's checks of what `builder` reaches, each given [`PATIENT`]: the suites run many
/// servers at once on two cores, and a check that times out fails.
async fn doctor(builder: RedisBuilder) -> Vec<Check> {
    builder.command_timeout(PATIENT).doctor().await
}

const PATIENT: std::time::Duration = std::time::Duration::from_secs(5);

fn names(checks: &[Check]) -> Vec<&str> {
    checks.iter().map(|check| check.check).collect()
}

fn failed(checks: &[Check]) -> Vec<&str> {
    checks.iter().filter(|c| !c.ok).map(|c| c.check).collect()
}

fn detail<'a>(checks: &'a [Check], name: &str) -> &'a str {
    checks.iter().find(|check| check.check == name).map_or_else(
        || panic!("no `{name}` check in {checks:?}"),
        |c| c.detail.as_str(),
    )
}

#[tokio::test]
async fn a_healthy_server_passes_every_check_and_the_command_exits_0() {
    let server = RedisServer::start();
    let checks = doctor(Coordinator::redis(server.url())).await;
    assert_eq!(names(&checks), STANDALONE, "{checks:?}");
    assert_eq!(failed(&checks), Vec::<&str>::new(), "{checks:?}");
    assert!(detail(&checks, "round_trip").contains("p99"), "{checks:?}");

    let namespace = unique("doctor");
    let json = caracal(&server.url(), &namespace, &["doctor", "--json"]).ok();
    let lines: Vec<serde_json::Value> = json
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON object per line"))
        .collect();
    assert_eq!(lines.len(), STANDALONE.len(), "{json}");
    for (line, name) in lines.iter().zip(STANDALONE) {
        assert_eq!(line["check"], name, "{json}");
        assert_eq!(line["ok"], true, "{json}");
        assert!(line["detail"].is_string(), "{json}");
    }
    let text = caracal(&server.url(), &namespace, &["doctor"]).ok();
    assert!(
        text.lines().skip(1).all(|line| line.starts_with("ok ")),
        "{text}"
    );
}

#[tokio::test]
async fn the_in_memory_coordinator_has_nothing_to_check() {
    let checks = Coordinator::in_memory().admin().doctor().await;
    assert_eq!(names(&checks), ["server"]);
    assert!(
        checks[0].ok && checks[0].detail.contains("in-memory"),
        "{checks:?}"
    );
}

#[tokio::test]
async fn a_connected_coordinator_checks_its_own_server() {
    let server = RedisServer::start();
    let coordinator = Coordinator::redis(server.url())
        .command_timeout(PATIENT)
        .connect()
        .await
        .expect("connect");
    let checks = coordinator.admin().doctor().await;
    // Everything but `connect`, which the coordinator has done.
    assert_eq!(names(&checks), STANDALONE[1..], "{checks:?}");
    assert_eq!(failed(&checks), Vec::<&str>::new(), "{checks:?}");
    coordinator.shutdown().await;
}

/// A replica is refused by `connect`, and the doctor says why, exit 1.
#[tokio::test]
async fn a_replica_fails_the_connect_and_role_checks() {
    let primary = RedisServer::start();
    let replica =
        RedisServer::start_with_args(&["--replicaof", "127.0.0.1", &primary.port().to_string()]);
    let checks = doctor(Coordinator::redis(replica.url())).await;
    assert_eq!(failed(&checks), ["connect", "role"], "{checks:?}");
    assert!(detail(&checks, "role").contains("replica"), "{checks:?}");
    let ran = run(&["--url", &replica.url(), "doctor"], &[]);
    assert_eq!(ran.status, 1, "{ran:?}");
    assert!(
        ran.stdout
            .lines()
            .any(|l| l.starts_with("FAIL") && l.contains(" role ")),
        "{ran:?}"
    );
    assert!(ran.stderr.contains("connect, role"), "{ran:?}");
}

/// A user missing one command caracal needs: the `acl` check names it and the grant to give.
#[tokio::test]
async fn an_acl_user_missing_a_command_is_named() {
    let server = RedisServer::start();
    acl_user(
        &server,
        "no-zrem",
        &format!("{} -zrem", caracal::REDIS_ACL_RULES),
    );
    let checks = doctor(Coordinator::redis(as_user(&server, "no-zrem"))).await;
    assert_eq!(failed(&checks), ["connect", "acl"], "{checks:?}");
    assert!(detail(&checks, "acl").contains("ZREM"), "{checks:?}");
    acl_user(&server, "minimal", caracal::REDIS_ACL_RULES);
    let checks = doctor(Coordinator::redis(as_user(&server, "minimal"))).await;
    // The minimal grant is enough for everything caracal does; the doctor's own `CONFIG GET`
    // is refused, which it reports without failing.
    assert_eq!(failed(&checks), Vec::<&str>::new(), "{checks:?}");
    assert!(
        detail(&checks, "admin_commands").contains("refused"),
        "{checks:?}"
    );
}

#[tokio::test]
async fn an_evicting_server_fails_the_eviction_check() {
    let server = RedisServer::start_with_args(&["--maxmemory-policy", "allkeys-lru"]);
    let checks = doctor(Coordinator::redis(server.url())).await;
    assert_eq!(failed(&checks), ["eviction"], "{checks:?}");
    assert!(
        detail(&checks, "eviction").contains("allkeys-lru"),
        "{checks:?}"
    );
}

/// `CONFIG` and `DEBUG` renamed away, as managed servers do: caracal needs neither.
#[tokio::test]
async fn admin_commands_renamed_away_fail_nothing() {
    let server = RedisServer::start_with_args(&[
        "--rename-command",
        "CONFIG",
        "",
        "--rename-command",
        "DEBUG",
        "",
    ]);
    let checks = doctor(Coordinator::redis(server.url())).await;
    assert_eq!(failed(&checks), Vec::<&str>::new(), "{checks:?}");
    assert!(
        detail(&checks, "admin_commands").contains("refused"),
        "{checks:?}"
    );
}

#[tokio::test]
async fn a_cluster_is_checked_slot_by_slot_and_primary_by_primary() {
    let cluster = RedisCluster::start(3);
    let checks = doctor(Coordinator::redis_cluster(cluster.seed_urls())).await;
    assert_eq!(failed(&checks), Vec::<&str>::new(), "{checks:?}");
    assert!(
        detail(&checks, "cluster_slots").contains("16384 of 16384 slots served by 3 primaries"),
        "{checks:?}"
    );
    assert!(
        detail(&checks, "role").contains("3 primaries answered"),
        "{checks:?}"
    );
}

#[tokio::test]
async fn a_sentinel_url_is_checked_on_the_master_the_sentinels_name() {
    let sentinel = RedisSentinel::start(1);
    let checks = doctor(Coordinator::redis(sentinel.url())).await;
    assert_eq!(names(&checks), STANDALONE, "{checks:?}");
    assert_eq!(failed(&checks), Vec::<&str>::new(), "{checks:?}");
    let master = format!("127.0.0.1:{}", sentinel.master().port());
    assert!(detail(&checks, "role").contains(&master), "{checks:?}");
}
