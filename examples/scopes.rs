//! Memory per identity under a scope per user: a steady stream of new scopes through a circuit
//! breaker, a rate limit and a bulkhead (the `metrics` feature on, a Prometheus recorder
//! installed with an idle timeout), printing one JSON line per figure:
//!
//! - `scopes_rss` every five seconds while scopes stream in, then while they are idle: RSS,
//!   scopes made so far, and the per-scope series the exporter still renders (a render of
//!   several hundred thousand series is itself heavy: every second, it slowed the stream);
//! - `scopes_first_call`: a call on a scope never seen before against a call on a reused
//!   scope, measured in turns in the same run, as a ratio.
//!
//! ```text
//! # long form: 1 000 000 scopes at 2 000 a second, then 90 s idle
//! cargo run --release -p caracal-examples-metrics --example scopes
//! # short form: 40 000 scopes, the same rate
//! cargo run --release -p caracal-examples-metrics --example scopes -- short
//! # caracal's memory alone: no metrics recorder installed
//! cargo run --release -p caracal-examples-metrics --example scopes -- no-recorder
//! # through Redis rather than the in-memory coordinator
//! CARACAL_REDIS_URL=redis://127.0.0.1:6379 cargo run --release -p caracal-examples-metrics --example scopes -- short
//! # with an allocator that gives freed pages back to the system (glibc's keeps them)
//! LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 MALLOC_CONF=background_thread:true \
//!   cargo run --release -p caracal-examples-metrics --example scopes -- short
//! ```
//!
//! The coordinator forgets an identity idle for [`caracal::FORGET_IDLE_AFTER`]; the exporter
//! is told to drop a gauge untouched for a little longer (see `metrics.md`), so once the
//! stream stops both RSS and the series exported fall back.

use std::time::{Duration, Instant};

use caracal::{bulkhead, circuit_breaker, rate_limit};
use metrics_exporter_prometheus::PrometheusBuilder;
use metrics_util::MetricKindMask;

/// Scopes made in the long form, and in the short one.
const LONG_SCOPES: u64 = 1_000_000;
const SHORT_SCOPES: u64 = 40_000;
/// New scopes a second: a steady stream, well below what one task can call.
const RATE: u64 = 2_000;
/// How often the stream is fed: `RATE / TICKS_PER_SECOND` scopes each tick.
const TICKS_PER_SECOND: u64 = 100;
/// Calls of each kind timed for the first-call ratio, in turns of [`TURN`].
const TIMED_CALLS: u32 = 4_000;
const TURN: u32 = 100;
/// How often RSS and the series exported are printed.
const REPORT_EVERY: Duration = Duration::from_secs(5);

#[derive(Debug)]
struct BenchError(#[allow(dead_code)] caracal::Error);

impl From<caracal::Error> for BenchError {
    fn from(error: caracal::Error) -> Self {
        BenchError(error)
    }
}

// Limits far above what the bench calls: the reused scope of the first-call ratio must never
// wait for the rate limit.
#[circuit_breaker(name = "bench-scopes", scope = user)]
#[rate_limit(name = "bench-scopes", rate = 1000000, burst = 10000, scope = user)]
#[bulkhead(name = "bench-scopes", limit = 100, scope = user)]
async fn per_user(user: &str) -> Result<(), BenchError> {
    Ok(())
}

/// This process's resident set, in MB.
fn rss_mb() -> f64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: f64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|resident| resident.parse().ok())
        .unwrap_or(f64::NAN);
    pages * 4096.0 / 1e6
}

/// Series with a `scope` label in a scrape.
fn scoped_series(scrape: &str) -> usize {
    scrape
        .lines()
        .filter(|line| line.starts_with("caracal_") && line.contains("scope=\""))
        .count()
}

fn emit(figure: &str, fields: &[(&str, f64)]) {
    let fields: Vec<String> = fields
        .iter()
        .map(|(name, value)| format!("\"{name}\":{value:.3}"))
        .collect();
    println!("{{\"figure\":\"{figure}\",{}}}", fields.join(","));
}

/// Microseconds per call of `TIMED_CALLS` calls on new scopes and as many on one reused
/// scope, in turns (a busy moment of the machine falls on both alike).
async fn first_call_ratio() -> (f64, f64) {
    per_user("ratio-reused").await.expect("admitted");
    let (mut fresh, mut reused) = (Duration::ZERO, Duration::ZERO);
    for turn in 0..TIMED_CALLS / TURN {
        let start = Instant::now();
        for i in 0..TURN {
            per_user(&format!("ratio-new-{turn}-{i}"))
                .await
                .expect("admitted");
        }
        fresh += start.elapsed();
        let start = Instant::now();
        for _ in 0..TURN {
            per_user("ratio-reused").await.expect("admitted");
        }
        reused += start.elapsed();
    }
    let us = |total: Duration| total.as_secs_f64() * 1e6 / f64::from(TIMED_CALLS);
    (us(fresh), us(reused))
}

#[tokio::main]
async fn main() -> Result<(), caracal::Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let scopes = if args.iter().any(|arg| arg == "short") {
        SHORT_SCOPES
    } else {
        LONG_SCOPES
    };
    let idle = caracal::FORGET_IDLE_AFTER;
    // Without a recorder, what remains is caracal's own memory, not the exporter's.
    let handle = (!args.iter().any(|arg| arg == "no-recorder")).then(|| {
        PrometheusBuilder::new()
            .idle_timeout(MetricKindMask::GAUGE, Some(idle + Duration::from_secs(5)))
            .install_recorder()
            .expect("the Prometheus recorder")
    });
    let series_now = || {
        handle
            .as_ref()
            .map_or(0.0, |handle| scoped_series(&handle.render()) as f64)
    };
    let coordinator = match std::env::var("CARACAL_REDIS_URL") {
        Ok(url) => {
            caracal::Coordinator::redis(url)
                .namespace(format!("bench-scopes:{}", std::process::id()))
                .connect()
                .await?
        }
        Err(_) => caracal::Coordinator::in_memory(),
    };
    caracal::install(coordinator.clone())?;
    emit("scopes_start", &[("rss_mb", rss_mb())]);

    let (fresh_us, reused_us) = first_call_ratio().await;
    emit(
        "scopes_first_call",
        &[
            ("new_scope_us", fresh_us),
            ("reused_scope_us", reused_us),
            ("ratio", fresh_us / reused_us),
        ],
    );

    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs(1) / TICKS_PER_SECOND as u32);
    let mut made = 0;
    let mut next_report = REPORT_EVERY;
    while made < scopes {
        tick.tick().await;
        // A tick's scopes called at once, as many users' requests arrive together.
        let calls: Vec<_> = (made..made + RATE / TICKS_PER_SECOND)
            .map(|n| tokio::spawn(async move { per_user(&format!("user-{n}")).await }))
            .collect();
        for call in calls {
            call.await.expect("a call").expect("admitted");
        }
        made += RATE / TICKS_PER_SECOND;
        if started.elapsed() >= next_report {
            next_report += REPORT_EVERY;
            emit(
                "scopes_rss",
                &[
                    ("t_s", started.elapsed().as_secs_f64()),
                    ("scopes", made as f64),
                    ("rss_mb", rss_mb()),
                    ("scoped_series", series_now()),
                ],
            );
        }
    }
    let stopped = Instant::now();
    // Idle: past the coordinator's idle time and the exporter's, twice over.
    while stopped.elapsed() < 2 * idle + Duration::from_secs(10) {
        tokio::time::sleep(REPORT_EVERY).await;
        emit(
            "scopes_idle",
            &[
                ("idle_s", stopped.elapsed().as_secs_f64()),
                ("rss_mb", rss_mb()),
                ("scoped_series", series_now()),
            ],
        );
    }
    coordinator.shutdown().await;
    Ok(())
}
