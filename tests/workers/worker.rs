//! A worker process for the multi-process suites: one OS process of a "fleet", configured by
//! `CARACAL_REDIS_URL` / `CARACAL_NAMESPACE` like a real service, running one scenario and
//! printing one `result key=value …` line.
//!
//! ```text
//! caracal-worker <scenario> key=value …
//! ```
//!
//! Concurrency is witnessed outside the process: bodies enter and leave an [`AsyncWitness`] on
//! a separate Redis (`witness=<url>` and `witness_key=<key>`).

use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use caracal::{bulkhead, circuit_breaker, rate_limit};
use caracal_tests::AsyncWitness;

#[derive(Debug)]
enum WorkerError {
    Caracal(caracal::Error),
    Downstream,
}

impl From<caracal::Error> for WorkerError {
    fn from(error: caracal::Error) -> Self {
        WorkerError::Caracal(error)
    }
}

/// Holds a witnessed section open for `hold`.
async fn witnessed(witness: &AsyncWitness, hold: Duration) {
    witness.enter().await;
    tokio::time::sleep(hold).await;
    witness.exit().await;
}

#[bulkhead(name = "mp-load", limit = 3, lease = "2s", scope = scope)]
async fn bulkhead_load(
    scope: &str,
    witness: &AsyncWitness,
    hold: Duration,
) -> Result<(), WorkerError> {
    witnessed(witness, hold).await;
    Ok(())
}

#[bulkhead(name = "mp-hold", limit = 1, lease = "1s", scope = scope)]
async fn bulkhead_hold(scope: &str) -> Result<(), WorkerError> {
    say("admitted");
    std::future::pending::<()>().await;
    Ok(())
}

/// The downstream behind the breakers: counts the call, holds a witnessed section if asked,
/// then succeeds or fails.
async fn downstream(
    fail: bool,
    witness: Option<&AsyncWitness>,
    ran: &AtomicU64,
) -> Result<(), WorkerError> {
    ran.fetch_add(1, Ordering::SeqCst);
    if let Some(witness) = witness {
        witnessed(witness, Duration::from_millis(100)).await;
    }
    if fail {
        Err(WorkerError::Downstream)
    } else {
        Ok(())
    }
}

#[circuit_breaker(name = "mp-breaker", scope = scope, minimum_throughput = 5, failure_threshold = 0.5,
                  open = "1s", half_open_probes = 2, half_open_successes = 3)]
async fn breaker_call(
    scope: &str,
    fail: bool,
    witness: Option<&AsyncWitness>,
    ran: &AtomicU64,
) -> Result<(), WorkerError> {
    downstream(fail, witness, ran).await
}

/// `breaker_call`'s breaker, watched: its outcomes are never recorded (they would dilute the
/// window another process fills with failures), only its admissions matter.
#[circuit_breaker(name = "mp-breaker", scope = scope, minimum_throughput = 5, failure_threshold = 0.5,
                  open = "1s", half_open_probes = 2, half_open_successes = 3, classify = unrecorded)]
async fn watch_call(scope: &str) -> Result<(), WorkerError> {
    Ok(())
}

fn unrecorded(_: &Result<(), WorkerError>) -> caracal::Outcome {
    caracal::Outcome::Ignored
}

/// Like `breaker_call`, but recovery needs more successes than a test window holds: while it
/// is half-open, every body that runs is a probe.
#[circuit_breaker(name = "mp-probes", scope = scope, minimum_throughput = 5, failure_threshold = 0.5,
                  open = "1s", half_open_probes = 2, half_open_successes = 10000)]
async fn probe_only(
    scope: &str,
    fail: bool,
    witness: Option<&AsyncWitness>,
    ran: &AtomicU64,
) -> Result<(), WorkerError> {
    downstream(fail, witness, ran).await
}

#[rate_limit(name = "mp-rate-50", rate = 50, burst = 5, scope = scope)]
async fn rate_50(scope: &str) -> Result<(), WorkerError> {
    Ok(())
}

#[rate_limit(name = "mp-rate-700", rate = 700, burst = 5, scope = scope)]
async fn rate_700(scope: &str) -> Result<(), WorkerError> {
    Ok(())
}

/// Prints one line to stdout right away (the parent reads lines as they come).
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// Counts of how calls ended.
#[derive(Default)]
struct Tally {
    admitted: AtomicU64,
    rejected: AtomicU64,
    errors: AtomicU64,
}

impl Tally {
    fn count(&self, result: &Result<(), WorkerError>) {
        let counter = match result {
            Ok(()) | Err(WorkerError::Downstream) => &self.admitted,
            Err(WorkerError::Caracal(
                caracal::Error::BulkheadFull { .. }
                | caracal::Error::CircuitOpen { .. }
                | caracal::Error::RateLimited { .. },
            )) => &self.rejected,
            Err(WorkerError::Caracal(other)) => {
                eprintln!("worker: unexpected error: {other}");
                &self.errors
            }
        };
        counter.fetch_add(1, Ordering::SeqCst);
    }

    fn report(&self, extra: &str) {
        say(&format!(
            "result admitted={} rejected={} errors={}{extra}",
            self.admitted.load(Ordering::SeqCst),
            self.rejected.load(Ordering::SeqCst),
            self.errors.load(Ordering::SeqCst),
        ));
    }
}

/// Runs `tasks` tasks calling `call` until `millis` have passed.
async fn load<F, Fut>(tasks: usize, millis: u64, call: F) -> Arc<Tally>
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), WorkerError>> + Send,
{
    let tally = Arc::new(Tally::default());
    let call = Arc::new(call);
    let until = Instant::now() + Duration::from_millis(millis);
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let (tally, call) = (Arc::clone(&tally), Arc::clone(&call));
            tokio::spawn(async move {
                while Instant::now() < until {
                    tally.count(&call().await);
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    for handle in handles {
        handle.await.expect("worker task");
    }
    tally
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let scenario = args
        .next()
        .expect("usage: caracal-worker <scenario> key=value …");
    let options: HashMap<String, String> = args
        .filter_map(|arg| {
            arg.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
        })
        .collect();
    let get = |key: &str| {
        options
            .get(key)
            .cloned()
            .unwrap_or_else(|| panic!("missing {key}="))
    };
    let number = |key: &str| {
        get(key)
            .parse::<u64>()
            .unwrap_or_else(|e| panic!("{key}: {e}"))
    };

    let coordinator = caracal::Coordinator::from_env().await.expect("coordinator");
    caracal::install(coordinator.clone()).expect("install");
    let scope = get("scope");
    let witness = match options.get("witness") {
        Some(url) => Some(Arc::new(
            AsyncWitness::connect(url, &get("witness_key"), number("limit")).await,
        )),
        None => None,
    };
    say("ready");

    match scenario.as_str() {
        "bulkhead-load" => {
            let witness = witness.expect("witness=");
            let tally = load(number("tasks") as usize, number("millis"), move || {
                let (scope, witness) = (scope.clone(), Arc::clone(&witness));
                async move { bulkhead_load(&scope, &witness, Duration::from_millis(3)).await }
            })
            .await;
            // Flush the releases still in flight before the process exits.
            coordinator.shutdown().await;
            tally.report("");
        }
        "bulkhead-hold" => {
            let _ = bulkhead_hold(&scope).await;
        }
        "breaker-fail" => {
            let tally = Tally::default();
            let ran = AtomicU64::new(0);
            let probes = options.get("breaker").is_some_and(|b| b == "probes");
            for _ in 0..number("calls") {
                let result = if probes {
                    probe_only(&scope, true, None, &ran).await
                } else {
                    breaker_call(&scope, true, None, &ran).await
                };
                tally.count(&result);
            }
            coordinator.shutdown().await;
            tally.report(&format!(" ran={}", ran.load(Ordering::SeqCst)));
        }
        "breaker-once" => {
            let tally = Tally::default();
            let ran = AtomicU64::new(0);
            let fail = options.get("fail").is_some_and(|v| v == "true");
            tally.count(&breaker_call(&scope, fail, None, &ran).await);
            coordinator.shutdown().await;
            tally.report(&format!(" ran={}", ran.load(Ordering::SeqCst)));
        }
        "breaker-probes" => {
            let fail = options.get("fail").is_some_and(|v| v == "true");
            let probes = options.get("breaker").is_some_and(|b| b == "probes");
            let ran = Arc::new(AtomicU64::new(0));
            let counted = Arc::clone(&ran);
            let tally = load(number("tasks") as usize, number("millis"), move || {
                let (scope, witness, ran) = (scope.clone(), witness.clone(), Arc::clone(&ran));
                async move {
                    if probes {
                        probe_only(&scope, fail, witness.as_deref(), &ran).await
                    } else {
                        breaker_call(&scope, fail, witness.as_deref(), &ran).await
                    }
                }
            })
            .await;
            coordinator.shutdown().await;
            tally.report(&format!(" ran={}", counted.load(Ordering::SeqCst)));
        }
        "breaker-watch" => {
            // Calls every few ms until the first rejection; reports when it came.
            let until = Instant::now() + Duration::from_millis(number("millis"));
            let mut first_rejection = None;
            while Instant::now() < until {
                if let Err(WorkerError::Caracal(caracal::Error::CircuitOpen { .. })) =
                    watch_call(&scope).await
                {
                    first_rejection = Some(now_ms());
                    break;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            say(&format!(
                "result rejected_at_ms={}",
                first_rejection.map_or(0, |t| t)
            ));
        }
        "rate-load" => {
            // Every process of the fleet starts at the same moment, then calls as a client
            // would: again right away when admitted, after the hinted wait when not.
            let start_at = UNIX_EPOCH + Duration::from_millis(number("start_at_ms"));
            if let Ok(wait) = start_at.duration_since(SystemTime::now()) {
                tokio::time::sleep(wait).await;
            }
            let first = now_ms();
            let rate = get("rate");
            let tally = load(number("tasks") as usize, number("millis"), move || {
                let (scope, rate) = (scope.clone(), rate.clone());
                async move {
                    let result = match rate.as_str() {
                        "50" => rate_50(&scope).await,
                        "700" => rate_700(&scope).await,
                        other => panic!("no rate-limited function for rate {other}"),
                    };
                    if let Err(WorkerError::Caracal(caracal::Error::RateLimited {
                        retry_after,
                        ..
                    })) = &result
                    {
                        tokio::time::sleep(*retry_after).await;
                    }
                    result
                }
            })
            .await;
            tally.report(&format!(" first_ms={first} last_ms={}", now_ms()));
        }
        other => panic!("unknown scenario {other}"),
    }
}
