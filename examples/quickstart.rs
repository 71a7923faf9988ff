//! Many tasks against a small shared concurrency limit.
//!
//! ```text
//! cargo run --example quickstart                                         # in-memory
//! CARACAL_REDIS_URL=redis://127.0.0.1:6379 cargo run --example quickstart # through Redis
//! ```
//!
//! With Redis, run it in two terminals at once: both processes share the one budget of 3.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use caracal::bulkhead;

/// Bodies running right now in this process, and the most ever seen at once.
static RUNNING: AtomicU32 = AtomicU32::new(0);
static PEAK: AtomicU32 = AtomicU32::new(0);

/// The error type of the guarded function: caracal's rejections convert into it.
#[derive(Debug)]
enum AppError {
    Resilience(caracal::Error),
}

impl From<caracal::Error> for AppError {
    fn from(error: caracal::Error) -> Self {
        AppError::Resilience(error)
    }
}

/// At most 3 calls at once per partner, fleet-wide; a caller waits up to 40 ms for a slot.
#[bulkhead(name = "partner-api", limit = 3, max_wait = "40ms", scope = format!("partner:{partner}"))]
async fn call_partner(partner: &str, request: u32) -> Result<u32, AppError> {
    let now = RUNNING.fetch_add(1, Ordering::SeqCst) + 1;
    PEAK.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(15)).await;
    RUNNING.fetch_sub(1, Ordering::SeqCst);
    Ok(request)
}

#[tokio::main]
async fn main() -> Result<(), caracal::Error> {
    let coordinator = caracal::Coordinator::from_env().await?;
    println!(
        "coordinator: {} (namespace {:?})",
        coordinator.backend_name(),
        coordinator.namespace()
    );
    caracal::install(coordinator.clone())?;

    let started = Instant::now();
    let calls: Vec<_> = (0..60)
        .map(|request| tokio::spawn(call_partner("acme", request)))
        .collect();
    let (mut admitted, mut rejected) = (0, 0);
    for call in calls {
        match call.await {
            Ok(Ok(_)) => admitted += 1,
            Ok(Err(AppError::Resilience(caracal::Error::BulkheadFull { .. }))) => rejected += 1,
            Ok(Err(AppError::Resilience(other))) => {
                eprintln!("call failed: {other} ({})", other.code());
                rejected += 1;
            }
            Err(panic) => eprintln!("task failed: {panic}"),
        }
    }
    println!(
        "admitted {admitted}, rejected {rejected}, highest concurrency in this process {} \
         (limit 3), in {:?}",
        PEAK.load(Ordering::SeqCst),
        started.elapsed()
    );
    coordinator.shutdown().await;
    Ok(())
}
