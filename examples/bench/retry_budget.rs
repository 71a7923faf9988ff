//! The cost of `#[retry_budget]` on the hot path: a guarded first attempt (it deposits, and
//! the call succeeds, so nothing withdraws) against a bare `#[retry]`, at 1 task, and what
//! Redis spends per guarded call at 64 tasks (the batched updates are its only traffic).

use std::time::{Duration, Instant};

use caracal::{retry, retry_budget};
use caracal_examples::emit;
use redis::aio::MultiplexedConnection;

use super::{BenchError, CONCURRENT_TASKS, server_cost, throughput};

/// Calls per timed batch, and batches of each kind, taken in turns so that a busy moment of
/// the machine falls on both alike.
const BATCH: u32 = 10_000;
const ROUNDS: u32 = 20;

#[retry(max_attempts = 4)]
async fn bare_retry() -> Result<(), BenchError> {
    Ok(())
}

#[retry_budget(name = "bench-budget")]
#[retry(max_attempts = 4)]
async fn budgeted_retry() -> Result<(), BenchError> {
    Ok(())
}

/// Time of `BATCH` calls of `call`, one after the other.
async fn batch<F, Fut>(call: F) -> Duration
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<(), BenchError>>,
{
    let start = Instant::now();
    for _ in 0..BATCH {
        call().await.expect("a call that succeeds");
    }
    start.elapsed()
}

/// The figures below alone, through a coordinator of their own.
pub(super) async fn alone(url: &str) -> Result<(), caracal::Error> {
    let (coordinator, mut conn) = super::installed(url, "bench").await?;
    figures(&mut conn).await;
    coordinator.shutdown().await;
    Ok(())
}

/// Emits `retry_budget_1_task_ns` (ratio to a bare `#[retry]`, goal ≤ 1.2) and
/// `retry_budget_64_tasks` (Redis µs per call, goal ≤ 0.2), through the installed Redis
/// coordinator; `conn` reads `INFO commandstats`.
pub(super) async fn figures(conn: &mut MultiplexedConnection) {
    // The first round warms both up (and registers the budget's identity).
    let (mut bare, mut budgeted) = (Duration::ZERO, Duration::ZERO);
    for round in 0..=ROUNDS {
        let times = (batch(bare_retry).await, batch(budgeted_retry).await);
        if round > 0 {
            bare += times.0;
            budgeted += times.1;
        }
    }
    let per_call = |total: Duration| total.as_secs_f64() * 1e9 / f64::from(BATCH * ROUNDS);
    emit(
        "retry_budget_1_task_ns",
        &[
            ("per_call", per_call(budgeted)),
            ("bare_retry_per_call", per_call(bare)),
            ("added_per_call", per_call(budgeted) - per_call(bare)),
            (
                "ratio_to_bare_retry",
                budgeted.as_secs_f64() / bare.as_secs_f64(),
            ),
        ],
    );
    let (run, [scripts, script_usec, _, _]) = server_cost(
        conn,
        throughput(CONCURRENT_TASKS, || async {
            budgeted_retry().await.expect("a call that succeeds")
        }),
    )
    .await;
    let bare_run = throughput(CONCURRENT_TASKS, || async {
        bare_retry().await.expect("a call that succeeds")
    })
    .await;
    emit(
        "retry_budget_64_tasks",
        &[
            ("rate", run.rate),
            ("bare_retry_rate", bare_run.rate),
            ("ratio_to_bare_retry", run.rate / bare_run.rate),
            ("redis_usec_per_call", script_usec / run.calls),
            ("scripts_per_call", scripts / run.calls),
        ],
    );
}
