//! Side-by-side measurements, one JSON line per figure. Every figure that makes a claim comes
//! with the baseline it is compared to, measured in the same run: absolute times on a shared
//! machine mean little, ratios do.
//!
//! ```text
//! cargo run --release -p caracal-examples --example bench              # Redis at 127.0.0.1:6379
//! CARACAL_REDIS_URL=redis://host:port cargo run --release -p caracal-examples --example bench
//! cargo run --release -p caracal-examples --example bench -- local     # in-process figures only
//! cargo run --release -p caracal-examples --example bench -- retry-budget
//! cargo run --release -p caracal-examples --example bench -- registry
//! cargo run --release -p caracal-examples --example bench -- keep      # `keep` on against off
//! ```
//!
//! Figures: the wire's floor (one `EVALSHA` of the lease script written by hand on a blocking
//! socket: no client library, no runtime) and the same call through redis-rs; guarded calls through the distributed bulkhead, the closed circuit breaker, and both, at 1
//! and 64 tasks; what Redis spends per guarded call (`INFO commandstats`) against the cost of
//! an empty script; breaker observations at `window_size` 10 000 against 100; the local
//! bulkhead and breaker against a bare `tokio::sync::Semaphore`, tower's `ConcurrencyLimit`
//! and failsafe's breaker; a first attempt under `#[retry_budget]` against a bare `#[retry]`,
//! with what Redis spends per call; the longest registry script at 100 000 scopes in use and
//! `status` at the registry's cap (`registry`, alone).
//!
//! The local figures run one after another on the thread that `block_on`s, each body an empty
//! `async` returning `Ok(())`, so a policy and its baseline do the same work around the same
//! body on the same runtime. Each is printed as soon as it is measured, so a profiler can tell
//! them apart: `valgrind --tool=callgrind --dump-before=caracal_examples::emit` on `bench local`
//! leaves one dump per figure (the semaphore, tower, the local bulkhead, failsafe, the local
//! breaker), whose instruction counts divided by the calls made (1.1 million, warm-up
//! included) compare per call, whatever else the machine runs.

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use caracal::{bulkhead, circuit_breaker};
use caracal_examples::{commandstats, emit, redis_url};
use floor::SocketFloor;
use redis::aio::MultiplexedConnection;
use tower::{Service, ServiceExt};

#[path = "bench/floor.rs"]
mod floor;
#[path = "bench/keep.rs"]
mod keep;
#[path = "bench/registry.rs"]
mod registry;
#[path = "bench/retry_budget.rs"]
mod retry_budget;

const SEQUENTIAL_CALLS: usize = 4000;
const CONCURRENT_TASKS: usize = 64;
const CONCURRENT_RUN: Duration = Duration::from_secs(3);
const LOCAL_CALLS: u32 = 1_000_000;
const LEASE_SCRIPT: &str = include_str!("../caracal/src/policy/bulkhead/kernel/lease.lua");
/// The raw baseline's leases last 1 ms and its limit is 64: the set stays small and is pruned
/// as it fills, like a real bulkhead's, though the baseline never releases.
const RAW_LEASE_MS: u64 = 1;
const RAW_LIMIT: u32 = 64;
/// As the coordinator sends it: after the breaker scripts' prelude.
const OBSERVE_SCRIPT: &str = concat!(
    include_str!("../caracal/src/policy/breaker/kernel/prelude.lua"),
    include_str!("../caracal/src/policy/breaker/kernel/observe.lua")
);

#[derive(Debug)]
struct BenchError(#[allow(dead_code)] caracal::Error);

impl From<caracal::Error> for BenchError {
    fn from(error: caracal::Error) -> Self {
        BenchError(error)
    }
}

#[bulkhead(name = "bench", limit = 1000000)]
async fn guarded() -> Result<(), BenchError> {
    Ok(())
}

#[circuit_breaker(name = "bench-breaker")]
async fn breaker_closed() -> Result<(), BenchError> {
    Ok(())
}

#[circuit_breaker(name = "bench-both")]
#[bulkhead(name = "bench-both", limit = 1000000)]
async fn breaker_and_bulkhead() -> Result<(), BenchError> {
    Ok(())
}

#[bulkhead(name = "bench-local", limit = 1000000, local)]
async fn local_bulkhead() -> Result<(), BenchError> {
    Ok(())
}

#[circuit_breaker(name = "bench-local", local)]
async fn local_breaker() -> Result<(), BenchError> {
    Ok(())
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index].as_secs_f64() * 1e6
}

/// Median and p99 in microseconds.
#[derive(Clone, Copy)]
struct Spread {
    p50: f64,
    p99: f64,
}

impl Spread {
    fn of(mut samples: Vec<Duration>) -> Self {
        if samples.is_empty() {
            return Spread {
                p50: f64::NAN,
                p99: f64::NAN,
            };
        }
        samples.sort();
        Spread {
            p50: percentile(&samples, 0.5),
            p99: percentile(&samples, 0.99),
        }
    }
}

/// The spreads of `n` sequential runs of the socket floor (if there is one), of `raw` and of
/// `call`, taken in turns: on a noisy machine a quiet or busy moment then falls on all three
/// alike, and their ratios hold from run to run where separate series would not.
async fn latencies<R, RFut, F, Fut>(
    n: usize,
    mut floor: Option<&mut SocketFloor>,
    mut raw: R,
    mut call: F,
) -> [Spread; 3]
where
    R: FnMut() -> RFut,
    RFut: Future<Output = ()>,
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    for _ in 0..n / 10 {
        if let Some(floor) = floor.as_deref_mut() {
            floor.call();
        }
        raw().await;
        call().await;
    }
    let mut samples = [(); 3].map(|()| Vec::with_capacity(n));
    for _ in 0..n {
        if let Some(floor) = floor.as_deref_mut() {
            let start = Instant::now();
            floor.call();
            samples[0].push(start.elapsed());
        }
        let start = Instant::now();
        raw().await;
        samples[1].push(start.elapsed());
        let start = Instant::now();
        call().await;
        samples[2].push(start.elapsed());
    }
    samples.map(Spread::of)
}

/// What a throughput run measured: calls per second and the latency spread over the measured
/// window, and every call made (warm-up and wind-down included, to divide server counters by).
#[derive(Clone, Copy)]
struct Throughput {
    rate: f64,
    calls: f64,
    latency: Spread,
}

/// Calls per second with `tasks` tasks each running `call` in a loop for `CONCURRENT_RUN`.
async fn throughput<F, Fut>(tasks: usize, call: F) -> Throughput
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    const WARMING: u8 = 0;
    const MEASURING: u8 = 1;
    const STOPPED: u8 = 2;
    let call = Arc::new(call);
    let phase = Arc::new(AtomicU8::new(WARMING));
    let done = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..tasks)
        .map(|_| {
            let (call, phase, done) = (Arc::clone(&call), Arc::clone(&phase), Arc::clone(&done));
            tokio::spawn(async move {
                let mut samples = Vec::new();
                loop {
                    let now = phase.load(Ordering::Relaxed);
                    if now == STOPPED {
                        return samples;
                    }
                    let start = Instant::now();
                    call().await;
                    if now == MEASURING {
                        samples.push(start.elapsed());
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                    // Keeps a zero-round-trip call from starving the other tasks.
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    tokio::time::sleep(CONCURRENT_RUN / 5).await;
    phase.store(MEASURING, Ordering::Relaxed);
    let start = (done.load(Ordering::Relaxed), Instant::now());
    tokio::time::sleep(CONCURRENT_RUN).await;
    let calls = done.load(Ordering::Relaxed) - start.0;
    let rate = calls as f64 / start.1.elapsed().as_secs_f64();
    phase.store(STOPPED, Ordering::Relaxed);
    let mut samples = Vec::new();
    for worker in workers {
        samples.extend(worker.await.unwrap_or_default());
    }
    Throughput {
        rate,
        calls: done.load(Ordering::Relaxed) as f64,
        latency: Spread::of(samples),
    }
}

/// Nanoseconds per call of `call`, run `LOCAL_CALLS` times in a row.
async fn nanos_per_call<F, Fut>(mut call: F) -> f64
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    for _ in 0..LOCAL_CALLS / 10 {
        call().await;
    }
    let start = Instant::now();
    for _ in 0..LOCAL_CALLS {
        call().await;
    }
    start.elapsed().as_secs_f64() * 1e9 / f64::from(LOCAL_CALLS)
}

/// `(calls, usec)` of one command from `INFO commandstats`.
async fn command_stats(conn: &mut MultiplexedConnection, command: &str) -> (f64, f64) {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO commandstats");
    commandstats(&info)
        .find(|&(name, _, _)| name == command)
        .map_or((0.0, 0.0), |(_, calls, usec)| (calls, usec))
}

/// Server microseconds per `EVALSHA` (and per `ZREM`) while `work` runs.
async fn server_cost<F: Future>(
    conn: &mut MultiplexedConnection,
    work: F,
) -> (F::Output, [f64; 4]) {
    let evalsha = command_stats(conn, "evalsha").await;
    let zrem = command_stats(conn, "zrem").await;
    let output = work.await;
    let (evalsha_after, zrem_after) = (
        command_stats(conn, "evalsha").await,
        command_stats(conn, "zrem").await,
    );
    let delta = [
        evalsha_after.0 - evalsha.0,
        evalsha_after.1 - evalsha.1,
        zrem_after.0 - zrem.0,
        zrem_after.1 - zrem.1,
    ];
    (output, delta)
}

async fn load_script(conn: &mut MultiplexedConnection, body: &str) -> String {
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(body)
        .query_async(conn)
        .await
        .expect("SCRIPT LOAD")
}

/// A unique token shaped as the policy's (a hyphenated UUID), without pulling a UUID crate
/// into the example.
fn token() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{:08x}-0000-4000-9000-{n:012x}", std::process::id())
}

/// The raw baseline's `EVALSHA` of the lease script, as the coordinator sends a lone acquire:
/// the lease set and its fencing counter, then action, ttl, limit, the live fence known (none)
/// and the token.
pub(crate) fn raw_args(sha: &str, key: &str, token: &str) -> Vec<String> {
    let fence = format!("{key}:fence");
    [sha, "2", key, &fence, "acquire"]
        .map(str::to_owned)
        .into_iter()
        .chain([RAW_LEASE_MS.to_string(), RAW_LIMIT.to_string(), "0".into()])
        // The token, then its share of the limit: the whole of it, as without thresholds.
        .chain([token.to_owned(), "1000".into()])
        .collect()
}

async fn raw_acquire(mut conn: MultiplexedConnection, sha: Arc<str>, key: Arc<str>) {
    let _: redis::Value = redis::cmd("EVALSHA")
        .arg(raw_args(&sha, &key, &token()))
        .query_async(&mut conn)
        .await
        .expect("raw EVALSHA");
}

/// One observation (a success) through the breaker's observation script, with the arguments
/// the coordinator sends (the breaker kernel's `Scripted::encode` for `Observe`).
async fn raw_observe(
    mut conn: MultiplexedConnection,
    sha: Arc<str>,
    tag: Arc<str>,
    window_size: u32,
) {
    let keys =
        ["brk:state", "brk:window", "brk:probes"].map(|s| format!("caracal:v1:{{{tag}}}:{s}"));
    let _: redis::Value = redis::cmd("EVALSHA")
        .arg(&*sha)
        .arg(3)
        .arg(&keys)
        // channel, prefix; minimum_throughput, threshold, slow-call threshold (none),
        // window_size, window ms, open ms, probes, successes, probe lease ms; then generation
        // (a fresh state's), outcomes, mint.
        .arg(("", &*tag))
        .arg((
            1_000_000,
            999,
            0,
            window_size,
            3_600_000,
            30_000,
            3,
            2,
            60_000,
        ))
        .arg((0, "s", 7))
        .query_async(&mut conn)
        .await
        .expect("raw observe");
}

/// What `redis-benchmark` (if installed) reaches with 64 clients sending the same `EVALSHA`:
/// the server's own ceiling for this script, without any client library in the way.
fn redis_benchmark(url: &str, sha: &str, key: &str) -> Option<f64> {
    let info = redis::Client::open(url)
        .ok()?
        .get_connection_info()
        .addr()
        .clone();
    let redis::ConnectionAddr::Tcp(host, port) = info else {
        return None;
    };
    let output = std::process::Command::new("redis-benchmark")
        .args([
            "-h",
            &host,
            "-p",
            &port.to_string(),
            "-c",
            "64",
            "-n",
            "100000",
            "-r",
            "1000000000",
            "-q",
        ])
        .args(["EVALSHA", sha, "2", key, &format!("{key}:fence"), "acquire"])
        .args([RAW_LEASE_MS.to_string(), RAW_LIMIT.to_string(), "0".into()])
        .arg("__rand_int__")
        .output()
        .ok()?;
    let _ = redis::Client::open(url)
        .and_then(|client| client.get_connection())
        .and_then(|mut conn| redis::cmd("DEL").arg(key).exec(&mut conn));
    // The last line reads "EVALSHA …: <rate> requests per second, …".
    let text = String::from_utf8_lossy(&output.stdout);
    let rate = text
        .rsplit(':')
        .next()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    emit(
        "redis_benchmark_evalsha_64_clients_per_s",
        &[("rate", rate)],
    );
    Some(rate)
}

/// A coordinator on `url` in a namespace of this run's (`prefix:pid`), installed, and a plain
/// connection beside it for the baselines and the server's figures.
async fn installed(
    url: &str,
    prefix: &str,
) -> Result<(caracal::Coordinator, MultiplexedConnection), caracal::Error> {
    let coordinator = caracal::Coordinator::redis(url)
        .namespace(format!("{prefix}:{}", std::process::id()))
        .connect()
        .await?;
    caracal::install(coordinator.clone())?;
    let client = redis::Client::open(url).expect("Redis URL");
    let conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("a plain connection");
    Ok((coordinator, conn))
}

async fn redis_figures(url: &str) -> Result<(), caracal::Error> {
    let (coordinator, mut conn) = installed(url, "bench").await?;
    let sha: Arc<str> = load_script(&mut conn, LEASE_SCRIPT).await.into();
    let raw_key: Arc<str> = format!("caracal:bench:{{{}}}:raw", std::process::id()).into();
    let raw = {
        let (conn, sha, key) = (conn.clone(), Arc::clone(&sha), Arc::clone(&raw_key));
        move || raw_acquire(conn.clone(), Arc::clone(&sha), Arc::clone(&key))
    };
    let clear_raw = |mut conn: MultiplexedConnection, key: Arc<str>| async move {
        let _: () = redis::cmd("DEL")
            .arg(&*key)
            .query_async(&mut conn)
            .await
            .expect("DEL");
    };

    // Latency: guarded calls against the socket floor and one raw EVALSHA round trip each, in
    // turns.
    let mut floor = SocketFloor::connect(url, &sha, &raw_key);
    let mut floor_shown = false;
    let mut latency = |figure: &str, [floor, raw, call]: [Spread; 3]| {
        if !std::mem::replace(&mut floor_shown, true) {
            emit(
                "socket_floor_1_task_us",
                &[("median", floor.p50), ("p99", floor.p99)],
            );
            emit(
                "raw_evalsha_1_task_us",
                &[
                    ("median", raw.p50),
                    ("p99", raw.p99),
                    ("ratio_to_socket_floor", raw.p50 / floor.p50),
                ],
            );
        }
        emit(
            figure,
            &[
                ("median", call.p50),
                ("p99", call.p99),
                ("raw_evalsha_median", raw.p50),
                ("ratio_to_raw_evalsha", call.p50 / raw.p50),
                ("added_median", call.p50 - raw.p50),
                ("socket_floor_median", floor.p50),
                ("ratio_to_socket_floor", call.p50 / floor.p50),
            ],
        );
    };
    latency(
        "bulkhead_1_task_us",
        latencies(SEQUENTIAL_CALLS, floor.as_mut(), &raw, || async {
            guarded().await.expect("admitted")
        })
        .await,
    );
    latency(
        "breaker_closed_1_task_us",
        latencies(SEQUENTIAL_CALLS, floor.as_mut(), &raw, || async {
            breaker_closed().await.expect("admitted")
        })
        .await,
    );
    latency(
        "breaker_and_bulkhead_1_task_us",
        latencies(SEQUENTIAL_CALLS, floor.as_mut(), &raw, || async {
            breaker_and_bulkhead().await.expect("admitted")
        })
        .await,
    );
    drop(floor);
    clear_raw(conn.clone(), Arc::clone(&raw_key)).await;

    // Throughput at 64 tasks, with what Redis spends per call.
    let raw_run = throughput(CONCURRENT_TASKS, raw.clone()).await;
    let raw_rate = raw_run.rate;
    clear_raw(conn.clone(), Arc::clone(&raw_key)).await;
    emit(
        "raw_evalsha_64_tasks_per_s",
        &[
            ("rate", raw_rate),
            ("p50_us", raw_run.latency.p50),
            ("p99_us", raw_run.latency.p99),
        ],
    );
    let server_rate = redis_benchmark(url, &sha, &raw_key);
    let (bulkhead, [acquires, acquire_usec, releases, release_usec]) = server_cost(
        &mut conn,
        throughput(CONCURRENT_TASKS, || async {
            guarded().await.expect("admitted")
        }),
    )
    .await;
    emit(
        "bulkhead_64_tasks_per_s",
        &[
            ("rate", bulkhead.rate),
            ("ratio_to_raw_evalsha", bulkhead.rate / raw_rate),
            (
                "ratio_to_redis_benchmark",
                bulkhead.rate / server_rate.unwrap_or(f64::NAN),
            ),
            ("p50_us", bulkhead.latency.p50),
            ("p99_us", bulkhead.latency.p99),
            (
                "p99_ratio_to_raw",
                bulkhead.latency.p99 / raw_run.latency.p99,
            ),
        ],
    );
    let empty: Arc<str> = load_script(&mut conn, "return 1").await.into();
    let empty_call = move |mut conn: MultiplexedConnection, empty: Arc<str>| async move {
        let _: i64 = redis::cmd("EVALSHA")
            .arg(&*empty)
            .arg(0)
            .query_async(&mut conn)
            .await
            .expect("empty");
    };
    // The floor as it has always been taken: one call at a time from a thread outside the
    // runtime's workers (the server idles a little between calls, as this figure's earlier
    // runs had it), so it stays comparable between versions; and at 64 tasks, the server as
    // busy as under the bulkhead, where one script costs it least.
    let (_, [empty_calls, empty_usec, _, _]) = {
        let (conn, empty) = (conn.clone(), Arc::clone(&empty));
        let runtime = tokio::runtime::Handle::current();
        server_cost(
            &mut conn.clone(),
            tokio::task::spawn_blocking(move || {
                runtime.block_on(async {
                    for _ in 0..2000 {
                        empty_call(conn.clone(), Arc::clone(&empty)).await;
                    }
                });
            }),
        )
        .await
    };
    let (_, [busy_calls, busy_usec, _, _]) = {
        let (conn, empty) = (conn.clone(), Arc::clone(&empty));
        server_cost(
            &mut conn.clone(),
            throughput(CONCURRENT_TASKS, move || {
                empty_call(conn.clone(), Arc::clone(&empty))
            }),
        )
        .await
    };
    emit(
        "redis_usec_per_bulkhead_call",
        &[
            ("total", (acquire_usec + release_usec) / bulkhead.calls),
            ("acquire_scripts_per_call", acquires / bulkhead.calls),
            ("release_zrems_per_call", releases / bulkhead.calls),
            ("usec_per_acquire_script", acquire_usec / acquires.max(1.0)),
            ("usec_per_release_zrem", release_usec / releases.max(1.0)),
            ("empty_script_floor", empty_usec / empty_calls.max(1.0)),
            (
                "empty_script_floor_64_tasks",
                busy_usec / busy_calls.max(1.0),
            ),
        ],
    );
    let (breaker, [scripts, script_usec, _, _]) = server_cost(
        &mut conn,
        throughput(CONCURRENT_TASKS, || async {
            breaker_closed().await.expect("admitted")
        }),
    )
    .await;
    emit(
        "breaker_closed_64_tasks_per_s",
        &[
            ("rate", breaker.rate),
            ("ratio_to_raw_evalsha", breaker.rate / raw_rate),
            ("scripts_per_call", scripts / breaker.calls),
            ("redis_usec_per_call", script_usec / breaker.calls),
        ],
    );
    let (both, [scripts, script_usec, _, release_usec]) = server_cost(
        &mut conn,
        throughput(CONCURRENT_TASKS, || async {
            breaker_and_bulkhead().await.expect("admitted")
        }),
    )
    .await;
    emit(
        "breaker_and_bulkhead_64_tasks_per_s",
        &[
            ("rate", both.rate),
            ("ratio_to_raw_evalsha", both.rate / raw_rate),
            (
                "redis_usec_per_call",
                (script_usec + release_usec) / both.calls,
            ),
            ("scripts_per_call", scripts / both.calls),
        ],
    );
    retry_budget::figures(&mut conn).await;
    coordinator.shutdown().await;

    // Observations: the window holds 100 or 10 000 of them; recording one must cost the same.
    let observe: Arc<str> = load_script(&mut conn, OBSERVE_SCRIPT).await.into();
    let mut rates = Vec::new();
    for window_size in [100u32, 10_000] {
        let tag: Arc<str> = format!("bench-{}-{window_size}", std::process::id()).into();
        for _ in 0..window_size + 100 {
            raw_observe(
                conn.clone(),
                Arc::clone(&observe),
                Arc::clone(&tag),
                window_size,
            )
            .await;
        }
        let (conn, observe) = (conn.clone(), Arc::clone(&observe));
        let rate = throughput(CONCURRENT_TASKS, move || {
            raw_observe(
                conn.clone(),
                Arc::clone(&observe),
                Arc::clone(&tag),
                window_size,
            )
        })
        .await
        .rate;
        rates.push(rate);
    }
    emit(
        "observations_per_s",
        &[
            ("window_100", rates[0]),
            ("window_10000", rates[1]),
            ("ratio_10000_to_100", rates[1] / rates[0]),
        ],
    );
    Ok(())
}

async fn local_figures() {
    let semaphore = tokio::sync::Semaphore::new(1_000_000);
    let semaphore_ns = nanos_per_call(|| async {
        drop(black_box(semaphore.try_acquire().expect("permit")));
    })
    .await;
    emit("tokio_semaphore_ns", &[("per_call", semaphore_ns)]);
    let tower_limit = tower::ServiceBuilder::new()
        .concurrency_limit(1_000_000)
        .service_fn(|()| async { Ok::<_, std::convert::Infallible>(()) });
    let tower_ns = nanos_per_call(|| {
        let mut service = tower_limit.clone();
        async move {
            service.ready().await.expect("ready");
            service.call(()).await.expect("call");
        }
    })
    .await;
    emit("tower_concurrency_limit_ns", &[("per_call", tower_ns)]);
    let local_ns =
        nanos_per_call(|| async { black_box(local_bulkhead().await).expect("admitted") }).await;
    emit(
        "local_bulkhead_ns",
        &[
            ("per_call", local_ns),
            ("ratio_to_semaphore", local_ns / semaphore_ns),
            ("ratio_to_tower", local_ns / tower_ns),
        ],
    );

    use failsafe::futures::CircuitBreaker as _;
    let failsafe = failsafe::Config::new().build();
    let failsafe_ns = nanos_per_call(|| async {
        black_box(failsafe.call(async { Ok::<(), ()>(()) }).await).expect("admitted");
    })
    .await;
    emit("failsafe_breaker_ns", &[("per_call", failsafe_ns)]);
    let breaker_ns =
        nanos_per_call(|| async { black_box(local_breaker().await).expect("admitted") }).await;
    emit(
        "local_breaker_ns",
        &[
            ("per_call", breaker_ns),
            ("ratio_to_failsafe", breaker_ns / failsafe_ns),
        ],
    );
}

#[tokio::main]
async fn main() -> Result<(), caracal::Error> {
    let url = redis_url();
    let only = std::env::args().nth(1);
    // `bench retry-budget`: that kind's figures only.
    if only.as_deref() == Some("retry-budget") {
        return retry_budget::alone(&url).await;
    }
    // `bench registry`: the identity registry at 100 000 scopes, and `status` at its cap.
    if only.as_deref() == Some("registry") {
        return registry::alone(&url).await;
    }
    // `bench keep`: the bulkhead with `keep` against it without, in one run.
    if only.as_deref() == Some("keep") {
        return tokio::spawn(async move { keep::alone(&url).await })
            .await
            .expect("the keep figures' task");
    }
    local_figures().await;
    // `bench local`: the in-process figures only (no Redis needed; handy under a profiler).
    if only.as_deref() == Some("local") {
        return Ok(());
    }
    // From a task of the runtime, as a request handler calls: the thread that `block_on`s is
    // none of the runtime's workers, so each command made from there crosses threads twice to
    // reach its connection's task and back, which no handler's call does.
    tokio::spawn(async move { redis_figures(&url).await })
        .await
        .expect("the Redis figures' task")
}
