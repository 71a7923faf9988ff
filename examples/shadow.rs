//! Shadow against enforcing, measured: the same seeded load (same seed, same arrivals, bodies
//! and failures) through an enforcing and a shadow bulkhead, circuit breaker and rate limit,
//! side by side (each arrival spawns one call of each, so a late loop delays both alike); then
//! a fleet's switch from shadow to enforcing.
//!
//! ```text
//! cargo run --release -p caracal-examples-metrics --example shadow            # in memory
//! CARACAL_REDIS_URL=redis://127.0.0.1:6379 cargo run --release -p caracal-examples-metrics --example shadow
//! ```
//!
//! One JSON line per policy (`shadow_vs_enforcing`): the enforcing run's `rejected` calls, the
//! shadow run's `would_reject` (from `caracal_decisions_total`, the metric an operator reads),
//! their `ratio`, and `refused`, the shadow run's calls that did not run (must be 0). The load:
//! 3 000 calls, 0 to 4 ms apart (500 a second), bodies of 4.5 to 16.5 ms (5 in flight on
//! average), failing 80 % of the time in every other stretch of 100 calls and 5 % otherwise;
//! in front of a bulkhead of 4, a breaker (10 observations, a window of 20, open 100 ms) and a
//! rate limit of 300/s (burst 5). The runs are on the wall clock: a body's timer that fires a
//! little late in one run and not in the other moves a decision, so the ratio is near 1, not
//! exactly 1 (`tests/testsuite/shadow.rs` makes the same comparison one run after the other on
//! a paused clock, where it is exact).
//!
//! Then `shadow_switch` (needs a Redis, `CARACAL_REDIS_URL` or 127.0.0.1:6379; skipped with the
//! reason when there is none): two coordinators (two processes of a fleet) each run 8 tasks of
//! 20 ms calls through a shadow bulkhead of 2; an operator sets
//! `bulkhead.shadow-bench-switch.shadow false` through the admin API; each process notes the
//! server's `TIME` at its first refusal. `switch_ms`: from the server's time before the set to
//! the last process's first refusal, and per process.

use std::time::Duration;

use caracal::{Coordinator, bulkhead, circuit_breaker, rate_limit};
use caracal_examples_metrics::{Planned, seeded};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

const SEED: u64 = 31;
const CALLS: u64 = 3_000;
/// The switch's load: processes, tasks in each, and how long each call holds its slot.
const PROCESSES: usize = 2;
const TASKS: usize = 8;
const HOLD: Duration = Duration::from_millis(20);
/// How long the switch may take before the run gives up on it.
const SWITCH_PATIENCE: Duration = Duration::from_secs(30);

#[derive(Debug)]
struct BenchError(#[allow(dead_code)] Option<caracal::Error>);

impl From<caracal::Error> for BenchError {
    fn from(error: caracal::Error) -> Self {
        BenchError(Some(error))
    }
}

impl BenchError {
    /// Whether a policy refused the call (rather than its body failing).
    fn refused(&self) -> bool {
        self.0.is_some()
    }
}

/// An enforcing policy and its shadow twin, `$kind($($arg)*)` on both.
macro_rules! twins {
    ($enforcing:ident = $e_name:tt, $shadow:ident = $s_name:tt, $kind:ident($($arg:tt)*)) => {
        #[$kind(name = $e_name, $($arg)*)]
        async fn $enforcing(planned: Planned) -> Result<(), BenchError> {
            planned.run(|| BenchError(None)).await
        }

        #[$kind(name = $s_name, shadow = true, $($arg)*)]
        async fn $shadow(planned: Planned) -> Result<(), BenchError> {
            planned.run(|| BenchError(None)).await
        }
    };
}

twins!(
    enforcing_bulkhead = "shadow-bench-bulkhead",
    shadow_bulkhead = "shadow-bench-bulkhead-shadow",
    bulkhead(limit = 4)
);
twins!(
    enforcing_breaker = "shadow-bench-breaker",
    shadow_breaker = "shadow-bench-breaker-shadow",
    circuit_breaker(minimum_throughput = 10, window_size = 20, open = "100ms")
);
twins!(
    enforcing_rate = "shadow-bench-rate",
    shadow_rate = "shadow-bench-rate-shadow",
    rate_limit(rate = 300, burst = 5)
);

/// An enforcing policy's function and its shadow twin's.
type Twins<FutE, FutS> = (fn(Planned) -> FutE, fn(Planned) -> FutS);

/// Runs `plan` through `enforcing` and `shadow` side by side in `coordinator`: at each arrival
/// one call of each is spawned, so that both runs see the same arrivals even when this machine
/// makes the loop late. Returns the calls each run's policy refused.
async fn drive<FutE, FutS>(
    coordinator: &Coordinator,
    plan: &[Planned],
    (enforcing, shadow): Twins<FutE, FutS>,
) -> (u64, u64)
where
    FutE: Future<Output = Result<(), BenchError>> + Send + 'static,
    FutS: Future<Output = Result<(), BenchError>> + Send + 'static,
{
    let start = Instant::now();
    let mut running = Vec::with_capacity(plan.len());
    for planned in plan {
        tokio::time::sleep_until(start + planned.at).await;
        running.push((
            tokio::spawn(coordinator.scoped(enforcing(*planned))),
            tokio::spawn(coordinator.scoped(shadow(*planned))),
        ));
    }
    let refused = |result: Result<Result<(), BenchError>, _>| {
        u64::from(result.expect("a call").is_err_and(|error| error.refused()))
    };
    let mut counts = (0, 0);
    for (enforcing, shadow) in running {
        counts.0 += refused(enforcing.await);
        counts.1 += refused(shadow.await);
    }
    counts
}

/// The sum of `caracal_decisions_total` for `name` and `decision` in a scrape.
fn decisions(scrape: &str, name: &str, decision: &str) -> u64 {
    let (name, decision) = (
        format!("name=\"{name}\""),
        format!("decision=\"{decision}\""),
    );
    scrape
        .lines()
        .filter(|line| {
            line.starts_with("caracal_decisions_total{")
                && line.contains(&name)
                && line.contains(&decision)
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// One line of the table: `kind`'s enforcing run against its shadow run.
async fn compare<FutE, FutS>(
    (coordinator, metrics): (&Coordinator, &PrometheusHandle),
    kind: &str,
    (enforcing, shadow): Twins<FutE, FutS>,
    shadow_name: &str,
) where
    FutE: Future<Output = Result<(), BenchError>> + Send + 'static,
    FutS: Future<Output = Result<(), BenchError>> + Send + 'static,
{
    let before = decisions(&metrics.render(), shadow_name, "would_reject");
    let (rejected, refused) = drive(coordinator, &seeded(SEED, CALLS), (enforcing, shadow)).await;
    let would_reject = decisions(&metrics.render(), shadow_name, "would_reject") - before;
    println!(
        "{{\"figure\":\"shadow_vs_enforcing\",\"policy\":\"{kind}\",\"calls\":{CALLS},\
         \"rejected\":{rejected},\"would_reject\":{would_reject},\"ratio\":{:.4},\
         \"refused\":{refused}}}",
        would_reject as f64 / rejected as f64
    );
}

#[bulkhead(name = "shadow-bench-switch", limit = 2, shadow = true)]
async fn switched() -> Result<(), BenchError> {
    tokio::time::sleep(HOLD).await;
    Ok(())
}

/// The server's clock, in ms.
async fn server_ms(conn: &mut MultiplexedConnection) -> redis::RedisResult<u64> {
    let (seconds, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await?;
    Ok(seconds * 1_000 + micros / 1_000)
}

/// One process of the switch: [`TASKS`] tasks calling [`switched`] until the first refusal;
/// the server's time then.
async fn process(coordinator: Coordinator, mut conn: MultiplexedConnection) -> Option<u64> {
    let (refused, mut first) = tokio::sync::mpsc::channel(1);
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let refused = refused.clone();
            tokio::spawn(coordinator.scoped(async move {
                while switched().await.is_ok() {}
                let _ = refused.try_send(());
            }))
        })
        .collect();
    let seen = tokio::time::timeout(SWITCH_PATIENCE, first.recv()).await;
    let at = match seen {
        Ok(Some(())) => server_ms(&mut conn).await.ok(),
        _ => None,
    };
    tasks.iter().for_each(tokio::task::JoinHandle::abort);
    at
}

/// The fleet's switch from shadow to enforcing, timed on the server's clock.
async fn switch(url: &str) -> Result<(), Box<dyn std::error::Error>> {
    let namespace = format!("shadow-bench:{}", std::process::id());
    let connect = || {
        Coordinator::redis(url)
            .namespace(namespace.clone())
            .connect()
    };
    let client = redis::Client::open(url)?;
    let mut processes = Vec::new();
    for _ in 0..PROCESSES {
        let conn = client.get_multiplexed_async_connection().await?;
        processes.push(tokio::spawn(process(connect().await?, conn)));
    }
    let operator = connect().await?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    // Under load in shadow mode for a while before the switch.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let set_at = server_ms(&mut conn).await?;
    operator
        .admin()
        .set_override("bulkhead.shadow-bench-switch.shadow", "false")
        .await?;
    let mut took = Vec::new();
    for process in processes {
        let at = process.await?.ok_or("a process never refused a call")?;
        took.push(at.saturating_sub(set_at));
    }
    let slowest = took.iter().max().copied().unwrap_or_default();
    println!(
        "{{\"figure\":\"shadow_switch\",\"switch_ms\":{slowest},\"per_process_ms\":{took:?}}}"
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let metrics = PrometheusBuilder::new().install_recorder()?;
    let url = std::env::var("CARACAL_REDIS_URL").ok();
    let coordinator = match &url {
        Some(url) => {
            Coordinator::redis(url.as_str())
                .namespace(format!("shadow-bench:{}", std::process::id()))
                .connect()
                .await?
        }
        None => Coordinator::in_memory(),
    };
    let on = (&coordinator, &metrics);
    compare(
        on,
        "bulkhead",
        (enforcing_bulkhead, shadow_bulkhead),
        "shadow-bench-bulkhead-shadow",
    )
    .await;
    compare(
        on,
        "circuit_breaker",
        (enforcing_breaker, shadow_breaker),
        "shadow-bench-breaker-shadow",
    )
    .await;
    compare(
        on,
        "rate_limit",
        (enforcing_rate, shadow_rate),
        "shadow-bench-rate-shadow",
    )
    .await;
    coordinator.shutdown().await;
    let url = url.unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned());
    if let Err(error) = switch(&url).await {
        println!(
            "{{\"figure\":\"shadow_switch\",\"skipped\":{:?}}}",
            error.to_string()
        );
    }
    Ok(())
}
