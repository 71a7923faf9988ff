//! Side-by-side measurements, one JSON line per figure. Every figure that makes a claim comes
//! with the baseline it is compared to, measured in the same run: absolute times on a shared
//! machine mean little, ratios do.
//!
//! ```text
//! cargo run --release --example bench                      # Redis at 127.0.0.1:6379
//! CARACAL_REDIS_URL=redis://host:port cargo run --release --example bench
//! ```

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use caracal::bulkhead;
use redis::aio::MultiplexedConnection;

const SEQUENTIAL_CALLS: usize = 4000;
const CONCURRENT_TASKS: usize = 64;
const CONCURRENT_RUN: Duration = Duration::from_secs(3);
const LOCAL_CALLS: u32 = 1_000_000;
const LEASE_SCRIPT: &str = include_str!("../lua/bulkhead_lease.lua");

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

#[bulkhead(name = "bench-local", limit = 1000000, local)]
async fn guarded_local() -> Result<(), BenchError> {
    Ok(())
}

/// One JSON line: a figure name and its numeric fields.
fn emit(figure: &str, fields: &[(&str, f64)]) {
    let fields: Vec<String> = fields
        .iter()
        .map(|(name, value)| format!("\"{name}\":{value:.3}"))
        .collect();
    println!("{{\"figure\":\"{figure}\",{}}}", fields.join(","));
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index].as_secs_f64() * 1e6
}

/// Median and p99 in microseconds of `n` sequential runs of `call`.
async fn latencies<F, Fut>(n: usize, mut call: F) -> (f64, f64)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for _ in 0..n / 10 {
        call().await;
    }
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        call().await;
        samples.push(start.elapsed());
    }
    samples.sort();
    (percentile(&samples, 0.5), percentile(&samples, 0.99))
}

/// Calls per second with `tasks` tasks each running `call` in a loop for `CONCURRENT_RUN`.
async fn throughput<F, Fut>(tasks: usize, call: F) -> f64
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let call = Arc::new(call);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..tasks)
        .map(|_| {
            let (call, stop, done) = (Arc::clone(&call), Arc::clone(&stop), Arc::clone(&done));
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    call().await;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    tokio::time::sleep(CONCURRENT_RUN / 5).await;
    let start = (done.load(Ordering::Relaxed), Instant::now());
    tokio::time::sleep(CONCURRENT_RUN).await;
    let calls = done.load(Ordering::Relaxed) - start.0;
    let rate = calls as f64 / start.1.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        let _ = worker.await;
    }
    rate
}

/// `(calls, usec)` of one command from `INFO commandstats`.
async fn command_stats(conn: &mut MultiplexedConnection, command: &str) -> (f64, f64) {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO commandstats");
    let prefix = format!("cmdstat_{command}:");
    let Some(line) = info.lines().find(|l| l.starts_with(&prefix)) else {
        return (0.0, 0.0);
    };
    let field = |name: &str| {
        line[prefix.len()..]
            .split(',')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (field("calls"), field("usec"))
}

async fn raw_acquire(conn: &mut MultiplexedConnection, sha: &str, key: &str) {
    let token = uuid_like();
    let _: redis::Value = redis::cmd("EVALSHA")
        .arg(sha)
        .arg(1)
        .arg(key)
        .arg("acquire")
        .arg(token)
        .arg(30_000)
        .arg(1_000_000_000)
        .query_async(conn)
        .await
        .expect("raw EVALSHA");
}

/// A unique token, as the policy uses, without pulling a UUID crate into the example.
fn uuid_like() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("bench-{:032x}", NEXT.fetch_add(1, Ordering::Relaxed))
}

#[tokio::main]
async fn main() -> Result<(), caracal::Error> {
    let url = std::env::var("CARACAL_REDIS_URL")
        .unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let namespace = format!("bench:{}", std::process::id());
    let coordinator = caracal::Coordinator::redis(url.clone())
        .namespace(namespace)
        .connect()
        .await?;
    caracal::install(coordinator.clone())?;

    let client = redis::Client::open(url.as_str()).expect("Redis URL");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect for the baseline");
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(LEASE_SCRIPT)
        .query_async(&mut conn)
        .await
        .expect("SCRIPT LOAD");
    let raw_key = format!("caracal:bench:{}:raw", std::process::id());

    // 1. Latency: one raw EVALSHA round trip vs one guarded call (acquire awaited, release not).
    let (raw_median, raw_p99) = latencies(SEQUENTIAL_CALLS, || {
        let (mut conn, sha, key) = (conn.clone(), sha.clone(), raw_key.clone());
        async move { raw_acquire(&mut conn, &sha, &key).await }
    })
    .await;
    let _: () = redis::cmd("DEL").arg(&raw_key).query_async(&mut conn).await.expect("DEL");
    emit("raw_evalsha_rtt_us", &[("median", raw_median), ("p99", raw_p99)]);
    let (guarded_median, guarded_p99) = latencies(SEQUENTIAL_CALLS, || async {
        guarded().await.expect("admitted");
    })
    .await;
    emit(
        "guarded_call_1_task_us",
        &[
            ("median", guarded_median),
            ("p99", guarded_p99),
            ("ratio_to_raw_evalsha", guarded_median / raw_median),
            ("added_median", guarded_median - raw_median),
        ],
    );

    // 2. Throughput at 64 tasks, and what Redis spends per guarded call.
    let raw_rate = {
        let (conn, sha, key) = (conn.clone(), sha.clone(), raw_key.clone());
        throughput(CONCURRENT_TASKS, move || {
            let (mut conn, sha, key) = (conn.clone(), sha.clone(), key.clone());
            async move { raw_acquire(&mut conn, &sha, &key).await }
        })
        .await
    };
    let _: () = redis::cmd("DEL").arg(&raw_key).query_async(&mut conn).await.expect("DEL");
    emit("raw_evalsha_64_tasks_per_s", &[("rate", raw_rate)]);
    let before = (
        command_stats(&mut conn, "evalsha").await,
        command_stats(&mut conn, "zrem").await,
    );
    let guarded_rate = throughput(CONCURRENT_TASKS, || async {
        guarded().await.expect("admitted");
    })
    .await;
    coordinator.shutdown().await;
    let after = (
        command_stats(&mut conn, "evalsha").await,
        command_stats(&mut conn, "zrem").await,
    );
    let (evalsha_calls, evalsha_usec) = (after.0.0 - before.0.0, after.0.1 - before.0.1);
    let (zrem_calls, zrem_usec) = (after.1.0 - before.1.0, after.1.1 - before.1.1);
    emit(
        "guarded_call_64_tasks_per_s",
        &[
            ("rate", guarded_rate),
            ("ratio_to_raw_evalsha", guarded_rate / raw_rate),
        ],
    );
    emit(
        "redis_usec_per_guarded_call",
        &[
            ("total", (evalsha_usec + zrem_usec) / evalsha_calls.max(1.0)),
            ("acquire_evalsha", evalsha_usec / evalsha_calls.max(1.0)),
            ("release_zrem", zrem_usec / zrem_calls.max(1.0)),
            ("calls_per_guarded_call", (evalsha_calls + zrem_calls) / evalsha_calls.max(1.0)),
        ],
    );

    // 3. The local bulkhead against a bare tokio semaphore, uncontended.
    let semaphore = tokio::sync::Semaphore::new(1_000_000);
    let start = Instant::now();
    for _ in 0..LOCAL_CALLS {
        let permit = semaphore.try_acquire().expect("permit");
        black_box(&permit);
    }
    let semaphore_ns = start.elapsed().as_secs_f64() * 1e9 / f64::from(LOCAL_CALLS);
    let start = Instant::now();
    for _ in 0..LOCAL_CALLS {
        black_box(guarded_local().await).expect("admitted");
    }
    let local_ns = start.elapsed().as_secs_f64() * 1e9 / f64::from(LOCAL_CALLS);
    emit("tokio_semaphore_ns", &[("per_call", semaphore_ns)]);
    emit(
        "local_bulkhead_ns",
        &[
            ("per_call", local_ns),
            ("ratio_to_semaphore", local_ns / semaphore_ns),
        ],
    );
    Ok(())
}
