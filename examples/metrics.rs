//! caracal's metrics, served to Prometheus: a bulkhead, a circuit breaker, a rate limit and a
//! fallback over a timeout over a retry guard calls in a loop, and `/metrics` shows what they
//! decide. `dashboards/` holds a Grafana dashboard and Prometheus alert rules for these series.
//!
//! ```text
//! cargo run --example metrics                                          # in-memory
//! CARACAL_REDIS_URL=redis://127.0.0.1:6379 cargo run --example metrics # through Redis
//! curl -s localhost:9184/metrics | grep caracal_
//! ```
//!
//! `METRICS_ADDR` changes where it listens (default `127.0.0.1:9184`). With Redis, run two at
//! once (the second with another `METRICS_ADDR`): each reports the breaker's state as it
//! learns it, whichever process opened it.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use caracal::{bulkhead, circuit_breaker, fallback, rate_limit, retry, timeout};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// The error type of the guarded functions: caracal's rejections convert into it.
#[derive(Debug)]
enum AppError {
    Resilience(caracal::Error),
    Downstream,
}

impl From<caracal::Error> for AppError {
    fn from(error: caracal::Error) -> Self {
        AppError::Resilience(error)
    }
}

/// At most 4 at once per region; more concurrent callers than that are turned away.
#[bulkhead(name = "partner-api", limit = 4, scope = format!("region:{region}"))]
async fn call_partner(region: &str) -> Result<(), AppError> {
    tokio::time::sleep(Duration::from_millis(20)).await;
    Ok(())
}

/// When the example started: the inventory service's outages follow the clock.
static STARTED: OnceLock<Instant> = OnceLock::new();

/// Opens when half of 10 calls fail, probes after 2 s.
#[circuit_breaker(
    name = "inventory",
    minimum_throughput = 10,
    open = "2s",
    half_open_successes = 2
)]
async fn check_inventory() -> Result<(), AppError> {
    // Down for 4 s in every 15: the breaker opens, probes while it is down, closes after.
    let elapsed = STARTED.get_or_init(Instant::now).elapsed().as_secs();
    if elapsed % 15 >= 11 {
        Err(AppError::Downstream)
    } else {
        Ok(())
    }
}

/// A dependency taken out of service now and then by an operator (see [`drill`]).
#[circuit_breaker(name = "recommendations")]
async fn recommend() -> Result<(), AppError> {
    Ok(())
}

/// An operator's drill, as `caracal breaker open recommendations --for 10s` would run it every
/// 30 s: the breaker's state shows `forced_open` and `caracal_circuit_breaker_forced_until_seconds`
/// the end the operator gave, back to 0 once it lapsed.
async fn drill(admin: caracal::admin::Admin) {
    let breaker = caracal::admin::BreakerId::new("recommendations");
    loop {
        let command = caracal::admin::BreakerCommand::Open {
            lasts: Some(Duration::from_secs(10)),
        };
        if let Err(error) = admin.breaker(&breaker, command).await {
            eprintln!("drill: {error}");
        }
        tokio::time::sleep(Duration::from_secs(30)).await;
    }
}

/// 20 searches a second, bursts of 5.
#[rate_limit(name = "search", rate = 20, burst = 5)]
async fn search() -> Result<(), AppError> {
    Ok(())
}

/// Attempts made of [`fetch_quote`], which decide how each one goes.
static QUOTE_ATTEMPTS: AtomicU64 = AtomicU64::new(0);

/// A quote from a partner that fails now and then (retried once) and sometimes hangs (cut at
/// 30 ms, answered from the cache).
#[fallback(cached_quote)]
#[timeout("30ms")]
#[retry(max_attempts = 2, backoff = "1ms")]
async fn fetch_quote() -> Result<u64, AppError> {
    let attempt = QUOTE_ATTEMPTS.fetch_add(1, Ordering::Relaxed);
    match attempt % 10 {
        // Fails, and so does its retry: the retries are exhausted.
        3 | 4 => Err(AppError::Downstream),
        // Fails once; the retry succeeds.
        7 => Err(AppError::Downstream),
        9 => {
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok(attempt)
        }
        _ => Ok(attempt),
    }
}

/// What a quote is when the partner did not answer in time.
async fn cached_quote(_rejection: caracal::Error) -> Result<u64, AppError> {
    Ok(0)
}

/// How a call ended: `ok`, the downstream's failure, or the code of caracal's rejection.
fn outcome(result: &Result<(), AppError>) -> &'static str {
    match result {
        Ok(()) => "ok",
        Err(AppError::Downstream) => "downstream_error",
        Err(AppError::Resilience(error)) => error.code(),
    }
}

/// One round of traffic: 12 concurrent partner calls (6 per region), 10 inventory checks, 10
/// recommendations, 10 searches, 2 quotes; counts how each call ended into `tally`.
async fn round(tally: &mut BTreeMap<&'static str, u64>) {
    let partner: Vec<_> = (0..12)
        .map(|i| tokio::spawn(call_partner(if i % 2 == 0 { "eu" } else { "us" })))
        .collect();
    for _ in 0..10 {
        *tally.entry(outcome(&check_inventory().await)).or_default() += 1;
        *tally.entry(outcome(&recommend().await)).or_default() += 1;
        *tally.entry(outcome(&search().await)).or_default() += 1;
    }
    for _ in 0..2 {
        let quote = fetch_quote().await.map(drop);
        *tally.entry(outcome(&quote)).or_default() += 1;
    }
    for call in partner {
        if let Ok(result) = call.await {
            *tally.entry(outcome(&result)).or_default() += 1;
        }
    }
}

/// Answers every request on `listener` with the current scrape (`/metrics`) or a 404.
async fn serve(listener: TcpListener, handle: PrometheusHandle) {
    loop {
        let Ok((mut socket, _)) = listener.accept().await else {
            continue;
        };
        let handle = handle.clone();
        tokio::spawn(async move {
            let mut request = Vec::new();
            let mut buffer = [0u8; 1024];
            // The request line and headers, up to the blank line (no body is expected).
            while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 16 * 1024 {
                match socket.read(&mut buffer).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => request.extend_from_slice(&buffer[..n]),
                }
            }
            let (status, body) = if request.starts_with(b"GET /metrics ") {
                ("200 OK", handle.render())
            } else {
                ("404 Not Found", "try /metrics\n".to_owned())
            };
            let response = format!(
                "HTTP/1.1 {status}\r\ncontent-type: text/plain; version=0.0.4\r\n\
                 content-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = socket.write_all(response.as_bytes()).await;
        });
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The recorder first: caracal reports into whichever is installed when it decides.
    let handle = PrometheusBuilder::new()
        // Buckets make caracal's timings (admissions, coordinator round trips) Prometheus
        // histograms, which add up across replicas, rather than per-process summaries.
        .set_buckets_for_metric(
            Matcher::Prefix("caracal_".to_owned()),
            &[
                0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05,
                0.1, 0.25, 0.5, 1.0, 2.5,
            ],
        )?
        .install_recorder()?;
    // The exporter's own housekeeping (draining histograms), which a listener would schedule.
    tokio::spawn({
        let handle = handle.clone();
        async move {
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                handle.run_upkeep();
            }
        }
    });

    let coordinator = caracal::Coordinator::from_env().await?;
    caracal::install(coordinator.clone())?;

    let addr = std::env::var("METRICS_ADDR").unwrap_or_else(|_| "127.0.0.1:9184".to_owned());
    let listener = TcpListener::bind(&addr).await?;
    println!(
        "coordinator: {} (namespace {:?}); metrics on http://{}/metrics",
        coordinator.backend_name(),
        coordinator.namespace(),
        listener.local_addr()?
    );
    tokio::spawn(serve(listener, handle));
    tokio::spawn(drill(coordinator.admin()));

    let mut tally = BTreeMap::new();
    for rounds in 1u64.. {
        round(&mut tally).await;
        if rounds % 50 == 0 {
            println!("calls in the last 50 rounds: {tally:?}");
            tally.clear();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}
