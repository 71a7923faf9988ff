//! A cluster whose nodes fail one at a time: a stopped or dead primary takes only its own
//! shard's identities down, a primary restarted without its data is noticed when it comes
//! back, and a failover is noticed as the loss of data it may be.

use std::time::Duration;

use caracal::{Coordinator, FailureKind, bulkhead};
use caracal_tests::{RedisCluster, RedisServer};

use crate::common::{self, PATIENCE, TestError, code, failure_kind, unique};

#[bulkhead(name = "cluster-quick", limit = 50, scope = scope)]
async fn quick(scope: &str) -> Result<(), TestError> {
    Ok(())
}

/// The keys matching `pattern` on every node.
fn keys(cluster: &RedisCluster, pattern: &str) -> Vec<Vec<String>> {
    cluster
        .nodes()
        .iter()
        .map(|node| {
            redis::cmd("KEYS")
                .arg(pattern)
                .query(&mut node.connection())
                .expect("KEYS")
        })
        .collect()
}

/// What `change` answered, and the index of the node on which it added a key matching
/// `pattern`.
async fn node_of<F: Future>(
    cluster: &RedisCluster,
    pattern: &str,
    change: F,
) -> (F::Output, usize) {
    let before = keys(cluster, pattern);
    let output = change.await;
    let after = keys(cluster, pattern);
    let node = (0..after.len())
        .find(|&node| after[node].len() > before[node].len())
        .expect("the change left a key on its node");
    (output, node)
}

/// At least `count` scopes, each called once, with the index of the node its identity lives
/// on: as many more as it takes for every primary to hold one. Which shard a new scope lands
/// on is chance, and 12 scopes miss a given primary about one time in 130.
async fn scopes_by_node(
    cluster: &RedisCluster,
    coordinator: &Coordinator,
    count: usize,
) -> Vec<(String, usize)> {
    let mut scopes: Vec<(String, usize)> = Vec::with_capacity(count);
    while scopes.len() < count
        || (0..PRIMARIES).any(|primary| scopes.iter().all(|&(_, node)| node != primary))
    {
        assert!(
            scopes.len() < count + 200,
            "{} scopes and a primary holds none of them",
            scopes.len()
        );
        let scope = unique("shard");
        // Fencing counters outlive the calls that made them: a new one tells on which node
        // an identity lives.
        let fences = "caracal:v1:*:fence";
        let (result, node) = node_of(cluster, fences, coordinator.scoped(quick(&scope))).await;
        assert_eq!(code(&result), "ok");
        scopes.push((scope, node));
    }
    scopes
}

/// Calls every scope at once; which succeeded.
async fn round(coordinator: &Coordinator, scopes: &[(String, usize)]) -> Vec<bool> {
    let calls: Vec<_> = scopes
        .iter()
        .map(|(scope, _)| {
            let (coordinator, scope) = (coordinator.clone(), scope.clone());
            tokio::spawn(async move { code(&coordinator.scoped(quick(&scope)).await) == "ok" })
        })
        .collect();
    let mut oks = Vec::with_capacity(calls.len());
    for call in calls {
        oks.push(call.await.expect("call"));
    }
    oks
}

/// A cluster whose healthy primaries serve on while one is down. By default
/// (`cluster-require-full-coverage yes`) every node refuses every command once they have
/// agreed that a primary failed (after the node timeout): no client can help that, and it is
/// not what these tests are about.
/// Primaries of the suite's clusters.
const PRIMARIES: usize = 3;

fn cluster() -> RedisCluster {
    RedisCluster::start_with_args(PRIMARIES, &["--cluster-require-full-coverage", "no"])
}

/// Rounds in a row that must serve every call on a healthy shard: the first round can come
/// before the failed node's errors have had any effect.
const SERVED_ROUNDS: usize = 3;

/// Stops primary 0 with `fault`, then calls every scope in rounds until [`SERVED_ROUNDS`]
/// rounds in a row have served every call on the other primaries.
async fn others_keep_serving(
    cluster: &mut RedisCluster,
    coordinator: &Coordinator,
    scopes: &[(String, usize)],
    fault: impl FnOnce(&mut RedisServer),
) {
    let healthy: Vec<bool> = scopes.iter().map(|&(_, node)| node != 0).collect();
    assert!(healthy.iter().any(|&h| h) && healthy.iter().any(|&h| !h));
    fault(&mut cluster.nodes_mut()[0]);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut served = Vec::new();
    while served.len() < SERVED_ROUNDS
        || !served[served.len() - SERVED_ROUNDS..]
            .iter()
            .all(|&(ok, calls)| ok == calls)
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the healthy shards did not keep serving in {} rounds; (successes, calls) on them \
             in the last ones: {:?}",
            served.len(),
            &served[served.len().saturating_sub(5)..]
        );
        let oks = round(coordinator, scopes).await;
        let on_healthy = oks.iter().zip(&healthy).filter(|&(_, &h)| h);
        served.push((
            on_healthy.clone().filter(|&(&ok, _)| ok).count(),
            on_healthy.count(),
        ));
    }
}

/// A scope whose identity lives on node `node`.
fn on_node(scopes: &[(String, usize)], node: usize) -> &str {
    let (scope, _) = scopes
        .iter()
        .find(|&&(_, n)| n == node)
        .expect("a scope on the node");
    scope
}

/// A namespace whose own keys (fleet overrides, registry) live on node `node`: a process
/// reads its overrides when it connects.
async fn namespace_on_node(cluster: &RedisCluster, node: usize) -> String {
    loop {
        let namespace = unique("ns");
        let coordinator = common::cluster_in(cluster.seed_urls(), &namespace).await;
        let admin = coordinator.admin();
        let set = admin.set_override("bulkhead.cluster-quick.limit", "50");
        let (set, on) = node_of(cluster, "caracal:v1:*", set).await;
        set.expect("set an override");
        if on == node {
            return namespace;
        }
    }
}

/// One primary of three stops answering (SIGSTOP, no failover). Two timeouts on it took a
/// whole cluster connection down, whose reconnection then waited for `INFO` from every
/// primary; and no process could connect while it was stopped, nor (later) while it held the
/// namespace's overrides. Now the identities on the other two serve on, a process that
/// connects meanwhile serves them too, and those on the stopped one serve again once it
/// resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_primary_leaves_the_other_shards_serving() {
    let mut cluster = cluster();
    let namespace = namespace_on_node(&cluster, 0).await;
    let coordinator = common::cluster_in(cluster.seed_urls(), &namespace).await;
    let scopes = scopes_by_node(&cluster, &coordinator, 30).await;
    others_keep_serving(&mut cluster, &coordinator, &scopes, RedisServer::pause).await;
    // A process that connects now, while the primary holding the namespace's overrides is
    // stopped, serves the other primaries' identities too.
    let late = common::cluster_in(cluster.seed_urls(), &namespace).await;
    for (scope, _) in scopes.iter().filter(|&&(_, node)| node != 0) {
        let result = late.scoped(quick(scope)).await;
        assert_eq!(code(&result), "ok", "{result:?}");
    }
    cluster.nodes_mut()[0].resume();
    common::until_ok(|| coordinator.scoped(quick(on_node(&scopes, 0)))).await;
}

/// One primary of three dies. Its broken connection used to take the whole cluster connection
/// down; the reconnection then read `INFO` from the two primaries left and took the missing one
/// for a server that had lost its data: every bulkhead of the cluster paused admissions for a
/// lease. Now the other shards serve on; and when the dead primary comes back without its
/// data, that is noticed (admissions pause) before it serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_primary_leaves_the_other_shards_serving_and_its_restart_is_noticed() {
    let mut cluster = cluster();
    let coordinator = common::cluster(cluster.seed_urls()).await;
    let scopes = scopes_by_node(&cluster, &coordinator, 30).await;
    others_keep_serving(&mut cluster, &coordinator, &scopes, RedisServer::stop).await;
    cluster.nodes_mut()[0].restart();
    until_admissions_pause(&coordinator, on_node(&scopes, 0)).await;
}

/// Calls `scope` until admissions pause because the cluster lost data. Until then, calls may
/// be redirected or turned away while the primaries are checked; one that is admitted fails
/// the test: the loss went unnoticed.
async fn until_admissions_pause(coordinator: &Coordinator, scope: &str) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let result = coordinator.scoped(quick(scope)).await;
        match failure_kind(&result) {
            Some(FailureKind::DataLost) => return,
            Some(_) => assert!(
                tokio::time::Instant::now() < deadline,
                "admissions did not pause within {PATIENCE:?}: {result:?}"
            ),
            None => panic!("admitted before the loss was noticed: {result:?}"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Held until `release` fires (or its sender is dropped).
#[bulkhead(name = "cluster-held", limit = 5, scope = scope)]
async fn held(
    scope: &str,
    release: Option<tokio::sync::oneshot::Receiver<()>>,
) -> Result<(), TestError> {
    if let Some(release) = release {
        let _ = release.await;
    }
    Ok(())
}

/// A replica takes over from its primary, which stays up. The coordinator learned the
/// primaries' `run_id`s only when it reconnected, which a failover does not need: holders of
/// leases on the old primary ran on and admissions went on as if nothing had happened. Now
/// the primaries are checked after a redirection and every second anyway: the holder loses
/// its lease and admissions pause, without any other call being made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_ends_the_leases_of_the_old_primary() {
    let mut cluster = cluster();
    let replica = cluster.add_replica(0);
    let coordinator = common::cluster(cluster.seed_urls()).await;
    let scopes = scopes_by_node(&cluster, &coordinator, 12).await;
    let scope = on_node(&scopes, 0).to_owned();
    let (release, released) = tokio::sync::oneshot::channel();
    let holder = tokio::spawn({
        let (coordinator, scope) = (coordinator.clone(), scope.clone());
        async move { coordinator.scoped(held(&scope, Some(released))).await }
    });
    common::until_ok(|| coordinator.scoped(held(&scope, None))).await;

    cluster.fail_over(replica);
    until_admissions_pause(&coordinator, &scope).await;
    let held = common::ends("the holder", holder).await.expect("holder");
    drop(release);
    assert_eq!(code(&held), "lease_lost", "{held:?}");
}
