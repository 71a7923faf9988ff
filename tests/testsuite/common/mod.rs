//! What several suites share: coordinators for each backend, unique scopes, an error type, and
//! the bounded waits that stand in for timing assertions.
//!
//! No suite asserts how long something took (a loaded two-core CI machine makes any such bound
//! flaky). A promise like "within the command timeout" or "within a second" is checked as a
//! liveness check with [`PATIENCE`], together with what tells *why* it ended (the decision, the
//! failure kind); "awaits one round trip" is counted at the fault proxy; "freed by the release,
//! not by the lease's expiry" uses leases far longer than [`PATIENCE`].

pub(crate) mod worker;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use caracal::{Coordinator, FailureKind};
use caracal_tests::{FaultProxy, RedisCluster, RedisServer};
use tokio::sync::Semaphore;

/// The generous deadline of every liveness check: far longer than any promise it checks (a
/// command timeout of 300 ms, recovery within a second), far shorter than the 30 s leases
/// whose expiry it must rule out.
pub(crate) const PATIENCE: Duration = Duration::from_secs(10);

/// The error type of the guarded functions in the suites.
#[derive(Debug)]
pub(crate) enum TestError {
    Caracal(caracal::Error),
    Body(&'static str),
}

impl From<caracal::Error> for TestError {
    fn from(error: caracal::Error) -> Self {
        TestError::Caracal(error)
    }
}

/// The code of a result's caracal error, `"ok"` for success, `"body"` for the body's own.
pub(crate) fn code<T>(result: &Result<T, TestError>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(TestError::Caracal(error)) => error.code(),
        Err(TestError::Body(_)) => "body",
    }
}

/// Why the coordinator could not answer, when the result is `CoordinatorUnavailable`.
pub(crate) fn failure_kind<T>(result: &Result<T, TestError>) -> Option<FailureKind> {
    match result {
        Err(TestError::Caracal(caracal::Error::CoordinatorUnavailable { cause, .. })) => {
            Some(cause.kind())
        }
        _ => None,
    }
}

/// Bodies report that they are in, then wait here until the test lets them go.
#[derive(Clone)]
pub(crate) struct Gate {
    open: Arc<Semaphore>,
    entered: Arc<Semaphore>,
}

impl Gate {
    pub(crate) fn closed() -> Self {
        Gate {
            open: Arc::new(Semaphore::new(0)),
            entered: Arc::new(Semaphore::new(0)),
        }
    }

    pub(crate) async fn pass(&self) {
        self.entered.add_permits(1);
        self.open.acquire().await.expect("gate").forget();
    }

    pub(crate) fn open(&self, bodies: usize) {
        self.open.add_permits(bodies);
    }

    /// Waits until `bodies` bodies are inside.
    pub(crate) async fn entered(&self, bodies: u32) {
        self.entered
            .acquire_many(bodies)
            .await
            .expect("gate")
            .forget();
    }
}

/// A network fault between a coordinator and its Redis, made at a [`FaultProxy`].
#[derive(Debug, Clone, Copy)]
pub(crate) enum Fault {
    /// Connections closed, new ones refused.
    Cut,
    /// Connections open, nothing answered.
    Blackhole,
}

impl Fault {
    pub(crate) fn apply(self, proxy: &FaultProxy) {
        match self {
            Fault::Cut => proxy.cut(),
            Fault::Blackhole => proxy.blackhole(),
        }
    }

    /// Checks the failure kinds (as in events: `FailureKind::as_str`) of the calls made one
    /// after another under this fault. A cut is seen at once (`disconnected`). A blackhole
    /// shows as the command timeout firing (`timeout`), until the pool gives up on its silent
    /// connections and reports itself reconnecting (`disconnected`).
    pub(crate) fn check(self, kinds: &[Option<&str>]) {
        let timeout = Some(FailureKind::Timeout.as_str());
        let disconnected = Some(FailureKind::Disconnected.as_str());
        let (first, allowed) = match self {
            Fault::Cut => (disconnected, vec![disconnected]),
            Fault::Blackhole => (timeout, vec![timeout, disconnected]),
        };
        assert!(
            kinds.first() == Some(&first) && kinds.iter().all(|kind| allowed.contains(kind)),
            "failure kinds under {self:?}: {kinds:?}"
        );
    }
}

/// A scope (or namespace, or key) no other test uses.
pub(crate) fn unique(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A coordinator on `url` (a server or a fault proxy) in a namespace of its own.
pub(crate) async fn connect(url: &str, command_timeout: Duration) -> Coordinator {
    Coordinator::redis(url)
        .namespace(unique("ns"))
        .command_timeout(command_timeout)
        .connect()
        .await
        .expect("connect to the test server")
}

/// A coordinator on a standalone server, with a command timeout short enough for fault tests.
pub(crate) async fn redis(url: &str) -> Coordinator {
    connect(url, Duration::from_millis(500)).await
}

/// A coordinator on a cluster, like [`redis`].
pub(crate) async fn cluster(seeds: Vec<String>) -> Coordinator {
    cluster_in(seeds, &unique("ns")).await
}

/// [`cluster`] in `namespace`: coordinators in one namespace share their policies' state.
pub(crate) async fn cluster_in(seeds: Vec<String>, namespace: &str) -> Coordinator {
    Coordinator::redis_cluster(seeds)
        .namespace(namespace)
        .command_timeout(Duration::from_millis(500))
        .connect()
        .await
        .expect("connect to the test cluster")
}

/// Awaits `future`, which must end within [`PATIENCE`]: the check that nothing hangs.
pub(crate) async fn ends<F: Future>(what: &str, future: F) -> F::Output {
    tokio::time::timeout(PATIENCE, future)
        .await
        .unwrap_or_else(|_| panic!("{what} did not end within {PATIENCE:?}"))
}

/// Calls `call` every 10 ms until its result has code `expected`, and returns the results
/// before that one.
///
/// # Panics
/// After [`PATIENCE`], with the last result.
pub(crate) async fn until_code<T, F, Fut>(expected: &str, mut call: F) -> Vec<Result<T, TestError>>
where
    T: std::fmt::Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, TestError>>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut before = Vec::new();
    loop {
        let result = call().await;
        if code(&result) == expected {
            return before;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no `{expected}` within {PATIENCE:?}; the last call gave {result:?}"
        );
        before.push(result);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// [`until_code`] for `"ok"`.
pub(crate) async fn until_ok<T, F, Fut>(call: F) -> Vec<Result<T, TestError>>
where
    T: std::fmt::Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, TestError>>,
{
    until_code("ok", call).await
}

/// Checks `condition` every 10 ms until it holds.
///
/// # Panics
/// After [`PATIENCE`], naming `what` was awaited.
pub(crate) async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {PATIENCE:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The live bulkhead leases on a server or a cluster: members of every `caracal:v1:*:leases`
/// set whose deadline is still ahead in server time.
pub(crate) struct Leases {
    nodes: Vec<redis::Connection>,
}

impl Leases {
    /// Watches the leases on `server`.
    pub(crate) fn on(server: &RedisServer) -> Self {
        Leases {
            nodes: vec![server.connection()],
        }
    }

    /// Watches the leases on every node of `cluster`.
    pub(crate) fn on_cluster(cluster: &RedisCluster) -> Self {
        Leases {
            nodes: cluster
                .nodes()
                .iter()
                .map(RedisServer::connection)
                .collect(),
        }
    }

    /// How many leases are live right now.
    pub(crate) fn live(&mut self) -> u64 {
        self.nodes.iter_mut().map(live_leases).sum()
    }
}

fn live_leases(conn: &mut redis::Connection) -> u64 {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("caracal:v1:*:leases")
        .query(conn)
        .expect("KEYS");
    let now = server_time_ms(conn);
    keys.iter()
        .map(|key| {
            redis::cmd("ZCOUNT")
                .arg(key)
                .arg(format!("({now}"))
                .arg("+inf")
                .query::<u64>(conn)
                .expect("ZCOUNT")
        })
        .sum()
}

/// The key base `caracal:v1:{<sha256 hex>}:` of the identity (namespace, `kind`, name,
/// operation, scope), derived as caracal and @gkoos/caracal derive it (for ASCII parts, where
/// `serde_json` writes strings as JavaScript does).
pub(crate) fn key_base(namespace: &str, kind: &str, name: &str, scope: &str) -> String {
    let json = serde_json::json!([namespace, format!("{kind}:{name}"), name, scope]);
    hashed(&json.to_string())
}

/// The key base of a namespace's own keys (registry, overrides, marker).
pub(crate) fn namespace_key_base(namespace: &str) -> String {
    hashed(&serde_json::json!(["namespace", namespace]).to_string())
}

/// The registry hash of `namespace` that holds the identity tagged `tag` (64 hex digits): one
/// of 256, named by the tag's first two digits (`lua/registry_prelude.lua`).
pub(crate) fn registry_hash(namespace: &str, tag: &str) -> String {
    format!("{}entries:{}", namespace_key_base(namespace), &tag[..2])
}

/// The registry's expiry set of `namespace` (`lua/registry_prelude.lua`).
pub(crate) fn registry_expiry(namespace: &str) -> String {
    format!("{}entries:expiry", namespace_key_base(namespace))
}

/// An identity's head in the registry (`lua/registry_prelude.lua`): `description`, reported
/// last at `reported_ms` by `reporter` with `values`, its map holding `processes` processes,
/// no drift, the fleet's overrides at version 0, no sources.
pub(crate) fn registry_head(
    description: &str,
    (reported_ms, reporter): (u64, &str),
    values: &str,
    processes: usize,
) -> String {
    format!(
        "{reported_ms} 0 0 {processes} {} {} 0 {reporter}{values}{description}",
        reporter.len(),
        values.len()
    )
}

fn hashed(json: &str) -> String {
    use sha2::{Digest, Sha256};
    let hex: String = Sha256::digest(json.as_bytes())
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    format!("caracal:v1:{{{hex}}}:")
}

/// The server's clock (`TIME`) in whole milliseconds, the unit of lease deadlines.
pub(crate) fn server_time_ms(conn: &mut redis::Connection) -> u64 {
    let (seconds, micros): (u64, u64) = redis::cmd("TIME").query(conn).expect("TIME");
    seconds * 1000 + micros / 1000
}

/// How many attempts [`awaited_replies`] makes before it gives up.
const ATTEMPTS: usize = 5;
/// How long a call held at the proxy may stay pending before an attempt counts as stuck.
const STUCK_AFTER: Duration = Duration::from_secs(2);

/// Counts the round trips a call waits for, at the fault proxy: runs `refresh` with replies
/// flowing (to warm a cached view, say), waits until the traffic has settled
/// ([`FaultProxy::wait_idle`]), then runs `call`
/// with replies held and let through one at a time, at most `budget`
/// ([`FaultProxy::awaited_replies`]). Returns the output and count of the first attempt that
/// completes.
///
/// An attempt can come out stuck without any fault of the code under test: a reply to
/// background work may take the place of the one the call waits for, or the machine may be so
/// slow that a view refreshed just before went stale. So up to [`ATTEMPTS`] are made. A call
/// that needs more than `budget` replies is stuck in every one.
///
/// # Panics
/// When no attempt completes.
pub(crate) async fn awaited_replies<R, RFut, C, CFut>(
    proxy: &FaultProxy,
    budget: u64,
    mut refresh: R,
    mut call: C,
) -> (CFut::Output, u64)
where
    R: FnMut() -> RFut,
    RFut: Future,
    C: FnMut() -> CFut,
    CFut: Future,
{
    for _ in 0..ATTEMPTS {
        refresh().await;
        proxy.wait_idle(PATIENCE).await;
        if let Some(done) = proxy.awaited_replies(call(), budget, STUCK_AFTER).await {
            return done;
        }
    }
    panic!(
        "in {ATTEMPTS} attempts the call never completed with at most {budget} replies let through"
    );
}
