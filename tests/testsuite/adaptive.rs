//! `#[bulkhead(limit = adaptive(…))]`: the fleet's limit finds a downstream's capacity, follows
//! it when it halves and when it comes back, stays within its bounds, backs off from a
//! downstream that fails fast past its capacity, a process that joins a running fleet admits
//! within the fleet's limit from its first call, not from `initial`, and a process holding
//! every slot is held to its share once others ask.
//!
//! The downstream serves `capacity` calls at once in 20 ms each and queues the rest. The
//! in-process runs use tokio's paused clock, so latencies are exact and nothing depends on how
//! loaded the machine is; the fleets of processes (coordinators) run against a real Redis.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use caracal::admin::StatusValue;
use caracal::metrics::BULKHEAD_LIMIT;
use caracal::{Coordinator, bulkhead};
use caracal_tests::{MetricsLog, RedisServer};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use crate::common::{Gate, TestError, code, unique};

const SERVICE: Duration = Duration::from_millis(20);
/// How long a task pauses after a refusal.
const REFUSED_PAUSE: Duration = Duration::from_millis(5);

/// A downstream of a known capacity, counting the calls inside it (served and queued).
struct Downstream {
    capacity: Semaphore,
    inside: AtomicU32,
    peak: AtomicU32,
    /// Past its capacity, a call fails in a millisecond instead of queueing.
    fail_fast: AtomicBool,
}

impl Downstream {
    fn new(capacity: usize) -> Arc<Self> {
        Arc::new(Downstream {
            capacity: Semaphore::new(capacity),
            inside: AtomicU32::new(0),
            peak: AtomicU32::new(0),
            fail_fast: AtomicBool::new(false),
        })
    }

    async fn serve(&self) -> Result<(), TestError> {
        let inside = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(inside, Ordering::SeqCst);
        let permit = match self.capacity.try_acquire() {
            Ok(permit) => permit,
            Err(_) if self.fail_fast.load(Ordering::SeqCst) => {
                tokio::time::sleep(Duration::from_millis(1)).await;
                self.inside.fetch_sub(1, Ordering::SeqCst);
                return Err(TestError::Body("overloaded"));
            }
            Err(_) => self.capacity.acquire().await.expect("never closed"),
        };
        tokio::time::sleep(SERVICE).await;
        drop(permit);
        self.inside.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }

    /// The highest concurrency since the last look.
    fn take_peak(&self) -> u32 {
        self.peak
            .swap(self.inside.load(Ordering::SeqCst), Ordering::SeqCst)
    }

    async fn halve(&self, by: u32) {
        self.capacity
            .acquire_many(by)
            .await
            .expect("never closed")
            .forget();
    }
}

#[bulkhead(name = "adaptive-follow", limit = adaptive(min = 2, initial = 4, max = 40),
           scope = scope)]
async fn follow(scope: &str, down: &Downstream) -> Result<(), TestError> {
    down.serve().await
}

#[bulkhead(name = "adaptive-bounded", limit = adaptive(min = 3, initial = 5, max = 12),
           scope = scope)]
async fn bounded(scope: &str, down: &Downstream) -> Result<(), TestError> {
    down.serve().await
}

/// `tasks` tasks calling `call` back to back, each pausing `pause` after a refusal.
fn load<F, Fut>(
    coordinator: &Coordinator,
    tasks: usize,
    pause: Duration,
    call: F,
) -> Vec<tokio::task::JoinHandle<()>>
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<(), TestError>> + Send,
{
    (0..tasks)
        .map(|_| {
            let call = call.clone();
            tokio::spawn(coordinator.clone().scoped(async move {
                loop {
                    if let Err(TestError::Caracal(_)) = call().await {
                        tokio::time::sleep(pause).await;
                    }
                }
            }))
        })
        .collect()
}

/// The limit `caracal status` shows for the bulkhead `name`, and the latency it came from.
async fn status_limit(coordinator: &Coordinator, name: &str) -> (Option<u64>, Option<u64>) {
    let statuses = coordinator.admin().status().await.expect("status");
    // Not listed until its first process's first report.
    let Some(status) = statuses.iter().find(|status| status.name == name) else {
        return (None, None);
    };
    let count = |field| match status.state.get(field) {
        Some(StatusValue::Count(n)) => Some(*n),
        _ => None,
    };
    (count("limit"), count("latency_us"))
}

/// Seconds of load: the limit status shows and the downstream's peak concurrency, each second.
async fn seconds(
    coordinator: &Coordinator,
    name: &str,
    down: &Downstream,
    n: u32,
) -> Vec<(u64, u32)> {
    let mut seen = Vec::new();
    for _ in 0..n {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (limit, _) = status_limit(coordinator, name).await;
        seen.push((limit.unwrap_or(0), down.take_peak()));
    }
    seen
}

fn within(seen: &[(u64, u32)], low: u64, high: u64) -> bool {
    seen.iter()
        .all(|&(limit, peak)| (low..=high).contains(&limit) && u64::from(peak) <= high)
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_limit_finds_the_capacity_and_follows_it_down_and_back() {
    let coordinator = Coordinator::in_memory();
    let down = Downstream::new(10);
    let scope = unique("follow");
    let tasks = {
        let (down, scope) = (Arc::clone(&down), scope.clone());
        load(&coordinator, 40, REFUSED_PAUSE, move || {
            let (down, scope) = (Arc::clone(&down), scope.clone());
            async move { follow(&scope, &down).await }
        })
    };
    // From `initial = 4` up to the capacity of 10: within [0.8, 1.3] × 10 by 30 s, and stays.
    let warming = seconds(&coordinator, "adaptive-follow", &down, 30).await;
    let steady = seconds(&coordinator, "adaptive-follow", &down, 20).await;
    assert!(
        within(&steady, 8, 13),
        "warming {warming:?}, steady {steady:?}"
    );
    let (_, latency) = status_limit(&coordinator, "adaptive-follow").await;
    assert!(
        latency.is_some_and(|us| us >= 20_000),
        "status shows the latency the limit came from: {latency:?}"
    );

    // The capacity halves: within [0.8, 1.3] × 5 in 10 s.
    down.halve(5).await;
    let following = seconds(&coordinator, "adaptive-follow", &down, 10).await;
    let halved = seconds(&coordinator, "adaptive-follow", &down, 10).await;
    assert!(
        within(&halved, 4, 6),
        "following {following:?}, halved {halved:?}"
    );

    // And back: within [0.8, 1.3] × 10 in 30 s.
    down.capacity.add_permits(5);
    let recovering = seconds(&coordinator, "adaptive-follow", &down, 30).await;
    let recovered = seconds(&coordinator, "adaptive-follow", &down, 10).await;
    assert!(
        within(&recovered, 8, 13),
        "recovering {recovering:?}, recovered {recovered:?}"
    );
    for task in tasks {
        task.abort();
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_limit_stays_within_its_bounds_and_backs_off_from_failures() {
    MetricsLog::global();
    let coordinator = Coordinator::in_memory();
    // Room for 40: the limit grows to its `max` of 12 and no further.
    let down = Downstream::new(40);
    let scope = unique("bounded");
    let tasks = {
        let (down, scope) = (Arc::clone(&down), scope.clone());
        load(&coordinator, 30, REFUSED_PAUSE, move || {
            let (down, scope) = (Arc::clone(&down), scope.clone());
            async move { bounded(&scope, &down).await }
        })
    };
    let growing = seconds(&coordinator, "adaptive-bounded", &down, 30).await;
    assert!(within(&growing, 3, 12), "{growing:?}");
    assert_eq!(
        growing.last().map(|&(limit, _)| limit),
        Some(12),
        "{growing:?}"
    );
    let gauge = || {
        MetricsLog::global().gauge(
            BULKHEAD_LIMIT,
            &[
                ("name", "adaptive-bounded"),
                ("operation", "adaptive-bounded"),
            ],
        )
    };
    assert_eq!(
        gauge(),
        Some(12.0),
        "caracal_bulkhead_limit follows the adaptive limit"
    );

    // An operator pins it; unset, it is adaptive again, from where it was.
    let admin = coordinator.admin();
    admin
        .set_override("bulkhead.adaptive-bounded.limit", "4")
        .await
        .expect("pinned");
    let pinned = seconds(&coordinator, "adaptive-bounded", &down, 10).await;
    assert!(within(&pinned[2..], 4, 4), "{pinned:?}");
    assert_eq!(gauge(), Some(4.0));
    admin
        .unset_override("bulkhead.adaptive-bounded.limit")
        .await
        .expect("unpinned");
    let unpinned = seconds(&coordinator, "adaptive-bounded", &down, 10).await;
    assert!(within(&unpinned[2..], 12, 12), "{unpinned:?}");

    // The downstream now serves 6 at once and fails fast past that: congestion told by the
    // drops (a slot held by a failure is one it did not serve in), down to about 6 and not
    // to `min`, though no call's latency ever grows.
    down.halve(34).await;
    down.fail_fast.store(true, Ordering::SeqCst);
    let failing = seconds(&coordinator, "adaptive-bounded", &down, 30).await;
    assert!(within(&failing, 3, 12), "{failing:?}");
    let settled = seconds(&coordinator, "adaptive-bounded", &down, 20).await;
    assert!(
        settled.iter().all(|&(limit, _)| (5..=8).contains(&limit)),
        "failing {failing:?}, settled {settled:?}"
    );
    for task in tasks {
        task.abort();
    }
}

/// Processes of one fleet: coordinators on one Redis, in one namespace, calling in one scope.
/// Each coordinator is a process to the fleet: it reports and counts on its own, as a separate
/// replica would.
struct Fleet {
    server: RedisServer,
    namespace: String,
    scope: String,
}

impl Fleet {
    fn start(name: &str) -> Self {
        Fleet {
            server: RedisServer::start(),
            namespace: unique(name),
            scope: unique(name),
        }
    }

    /// A new process of the fleet.
    async fn join(&self) -> Coordinator {
        Coordinator::redis(self.server.url())
            .namespace(self.namespace.clone())
            .connect()
            .await
            .expect("connect")
    }
}

#[bulkhead(name = "adaptive-join", limit = adaptive(min = 2, initial = 30, max = 60),
           scope = scope)]
async fn join(scope: &str, down: &Downstream) -> Result<(), TestError> {
    down.serve().await
}

#[bulkhead(name = "adaptive-join", limit = adaptive(min = 2, initial = 30, max = 60),
           scope = scope)]
async fn hold(scope: &str, inside: &AtomicU32, gate: &Gate) -> Result<(), TestError> {
    inside.fetch_add(1, Ordering::SeqCst);
    gate.pass().await;
    Ok(())
}

/// A fleet of one brings the limit of a downstream of capacity 4 down from 30; a second
/// process, started then, holds its first 20 calls at once to the fleet's limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_joins_admits_within_the_fleets_limit_from_its_first_call() {
    let fleet = Fleet::start("join");
    let scope = fleet.scope.clone();
    let first = fleet.join().await;
    let down = Downstream::new(4);
    let tasks = {
        let (down, scope) = (Arc::clone(&down), scope.clone());
        load(&first, 24, REFUSED_PAUSE, move || {
            let (down, scope) = (Arc::clone(&down), scope.clone());
            async move { join(&scope, &down).await }
        })
    };
    // Generous: the limit moves once a second, by at most half the way to its target.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    let learnt = loop {
        let (limit, _) = status_limit(&first, "adaptive-join").await;
        if let Some(limit @ ..=8) = limit {
            break limit;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the limit never came down from 30 towards 4: {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    for task in tasks {
        task.abort();
    }
    // The first process's calls drain (their releases are in flight): wait until no lease is
    // held, so the second's calls meet an empty set.
    let mut conn = fleet.server.connection();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("caracal:v1:*adaptive-join*:leases")
            .query(&mut conn)
            .expect("KEYS");
        if keys.is_empty() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "leases stay held");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let second = fleet.join().await;
    let gate = Gate::closed();
    let inside = Arc::new(AtomicU32::new(0));
    let calls: Vec<_> = (0..20)
        .map(|_| {
            let (gate, inside, scope) = (gate.clone(), Arc::clone(&inside), scope.clone());
            tokio::spawn(second.scoped(async move { hold(&scope, &inside, &gate).await }))
        })
        .collect();
    // The calls admitted hold their slots until every other has been refused.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let refused = calls.iter().filter(|call| call.is_finished()).count();
        let admitted = inside.load(Ordering::SeqCst) as usize;
        if refused + admitted == calls.len() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "calls neither admitted nor refused"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gate.open(20);
    let mut admitted = 0;
    for call in calls {
        let result = call.await.expect("no panic");
        match code(&result) {
            "ok" => admitted += 1,
            "bulkhead_full" => {}
            other => panic!("a call ended {other}"),
        }
    }
    // The limit may have moved a step since it was read: by at most a half, up or down.
    assert!(
        (1..=learnt + learnt / 2 + 1).contains(&admitted),
        "the joining process admitted {admitted} of 20 at once, the fleet's limit was {learnt}"
    );
}

#[bulkhead(name = "adaptive-hoard", limit = adaptive(min = 12, initial = 12, max = 12),
           scope = scope)]
async fn hoard(scope: &str, bodies: &Bodies, gate: &Gate) -> Result<(), TestError> {
    bodies.inside.fetch_add(1, Ordering::SeqCst);
    gate.pass().await;
    bodies.inside.fetch_sub(1, Ordering::SeqCst);
    bodies.ended.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// One process's bodies of `hoard`: inside now, and ended so far.
#[derive(Default)]
struct Bodies {
    inside: AtomicU32,
    ended: AtomicU32,
}

/// One process of the hoarding test: 16 tasks calling `hoard` back to back, their bodies held
/// at the process's gate, backing off 200 ms after a refusal as a well-behaved client would.
struct Hoarder {
    bodies: Arc<Bodies>,
    gate: Gate,
    tasks: Vec<JoinHandle<()>>,
}

impl Hoarder {
    fn start(coordinator: &Coordinator, scope: &str) -> Self {
        let (bodies, gate) = (Arc::new(Bodies::default()), Gate::closed());
        let (counted, held, scope) = (Arc::clone(&bodies), gate.clone(), scope.to_owned());
        let tasks = load(coordinator, 16, Duration::from_millis(200), move || {
            let (bodies, gate, scope) = (Arc::clone(&counted), held.clone(), scope.clone());
            async move { hoard(&scope, &bodies, &gate).await }
        });
        Hoarder {
            bodies,
            gate,
            tasks,
        }
    }

    fn inside(&self) -> u32 {
        self.bodies.inside.load(Ordering::SeqCst)
    }

    fn ended(&self) -> u32 {
        self.bodies.ended.load(Ordering::SeqCst)
    }
}

impl Drop for Hoarder {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Waits, generously, until `done`.
async fn until(what: &str, done: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// One process's calls take every slot of the fleet's limit before two others start, and each
/// of its tasks asks again as its body ends while the others' back off after a refusal, so it
/// takes back every slot it frees: the others end no calls, and no latency can show it slower
/// than the fleet (the fleet's is its own). Once they ask for slots, refused or not, it is
/// held to its share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_holding_every_slot_is_held_to_its_share_once_others_ask() {
    let fleet = Fleet::start("hoard");
    let first = Hoarder::start(&fleet.join().await, &fleet.scope);
    until("the first process never filled the limit of 12", || {
        first.inside() == 12
    })
    .await;
    let others = [
        Hoarder::start(&fleet.join().await, &fleet.scope),
        Hoarder::start(&fleet.join().await, &fleet.scope),
    ];
    let others_inside = || others.iter().map(Hoarder::inside).sum::<u32>();
    // Their refused calls are counted in the windows that follow, and the first process's
    // bound follows the answer to its next report: a settling time, not a threshold (a bound
    // that comes late leaves the first process more of the releases below to take back).
    tokio::time::sleep(Duration::from_secs(3)).await;
    for _ in 0..24 {
        let ended = first.ended();
        first.gate.open(1);
        until("a slot freed stayed free", || {
            first.ended() > ended && first.inside() + others_inside() == 12
        })
        .await;
    }
    // Its share is 4 of 12: every body of its own that ended past that gave its slot to the
    // others. Unbounded, it took back all it freed; bounded only every other report, it held 7 to 11.
    assert!(
        first.inside() <= 4,
        "the first process holds {} of 12 slots, the others {}",
        first.inside(),
        others_inside()
    );
}
