//! Hedging a heavy tail, and hedging an overload, counted at the downstream: 3 processes × 32
//! tasks, each process making 100 calls a second, without a hedge, with `#[hedge(delay = p95)]`
//! spending a fleet-wide retry budget, with a fixed-delay hedge spending it, and with a
//! fixed-delay hedge that has no budget.
//!
//! ```text
//! cargo run --release -p caracal-examples --example hedge                 # 20 s a run
//! cargo run --release -p caracal-examples --example hedge -- --seconds 5
//! CARACAL_REDIS_URL=redis://host:port cargo run --release -p caracal-examples --example hedge
//! ```
//!
//! The process starts three copies of itself (`hedge worker …`), each connected to the Redis at
//! `CARACAL_REDIS_URL` (default 127.0.0.1:6379). The downstream is simulated in each process and
//! counts the attempts it sees, and which of them are a call's first (the caller tags each call,
//! as a request id would): caracal counts nothing here. Two regimes:
//!
//! - `tail`: one attempt in a hundred takes 500 ms, the others 5 ms;
//! - `overload`: every attempt takes 500 ms (a downstream slowed whole).
//!
//! The hedges: `p95_budget` is `#[hedge(delay = p95, max_delay = "100ms", budget = …)]`
//! under a `#[retry_budget(percent = 10, min_per_second = 1)]` of the same name (over a
//! `#[retry]` that never retries: the downstream never fails; the budget sits above the hedge
//! because the hedge finds its budget at its first call, before a budget below it was used);
//! `fixed_budget` the same with `delay = "20ms"`; `fixed` is `delay = "20ms"` with no budget.
//! Each run has its own scope, so a percentile starts unknown (`max_delay`) in each.
//!
//! One JSON line per regime and hedge: the callers' `p50_ms`, `p99_ms`, `p999_ms` and their
//! ratios to p50 (over every call of the three processes; exactly 1 % of the attempts are slow,
//! so p99 sits at the edge of the slow ones and p99.9 inside them), the `first` attempts and `total` attempts the
//! downstream saw, `load_per_first` (their ratio: 1 without hedges, at most 1 + 10 % plus the
//! budget's floor with one, 2 with one extra attempt for every call), and `caracal_errors`.

use std::error::Error;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use caracal::{hedge, retry, retry_budget};
use caracal_examples::{Fleet, emit, parse_seconds, redis_url, serve_fleet};
use tokio::time::{Instant, MissedTickBehavior};

type Result<T, E = Box<dyn Error>> = std::result::Result<T, E>;

const PROCESSES: usize = 3;
const TASKS: usize = 32;
/// Calls per second of one process.
const RATE: f64 = 100.0;
const FAST: Duration = Duration::from_millis(5);
const SLOW: Duration = Duration::from_millis(500);
/// One attempt in this many is slow in the `tail` regime.
const SLOW_EVERY: u64 = 100;
const PERCENT: f64 = 0.1;
const DEFAULT_SECONDS: u64 = 20;
const USAGE: &str = "usage: hedge [--seconds N]";

/// The simulated downstream: counts what it sees.
struct Downstream {
    overloaded: bool,
    first: AtomicU64,
    total: AtomicU64,
}

impl Downstream {
    /// One attempt of the call `call` tags (its attempts so far).
    async fn attempt(&self, call: &AtomicU64) -> Result<(), caracal::Error> {
        if call.fetch_add(1, Ordering::Relaxed) == 0 {
            self.first.fetch_add(1, Ordering::Relaxed);
        }
        let seen = self.total.fetch_add(1, Ordering::Relaxed);
        let slow = self.overloaded || seen % SLOW_EVERY == SLOW_EVERY - 1;
        tokio::time::sleep(if slow { SLOW } else { FAST }).await;
        Ok(())
    }
}

async fn unhedged(_: &str, down: &Downstream, call: &AtomicU64) -> Result<(), caracal::Error> {
    down.attempt(call).await
}

#[retry_budget(name = "hedge-bench", percent = 10, min_per_second = 1, scope = scope)]
#[retry(max_attempts = 2)]
#[hedge(delay = p95, max_delay = "100ms", budget = "hedge-bench", scope = scope)]
async fn p95_budget(
    scope: &str,
    down: &Downstream,
    call: &AtomicU64,
) -> Result<(), caracal::Error> {
    down.attempt(call).await
}

#[retry_budget(name = "hedge-bench", percent = 10, min_per_second = 1, scope = scope)]
#[retry(max_attempts = 2)]
#[hedge(delay = "20ms", budget = "hedge-bench", scope = scope)]
async fn fixed_budget(
    scope: &str,
    down: &Downstream,
    call: &AtomicU64,
) -> Result<(), caracal::Error> {
    down.attempt(call).await
}

#[hedge(delay = "20ms", scope = scope)]
async fn fixed(scope: &str, down: &Downstream, call: &AtomicU64) -> Result<(), caracal::Error> {
    down.attempt(call).await
}

/// Whether this process said how caracal failed a call (once is enough).
static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

const HEDGES: [&str; 4] = ["none", "p95_budget", "fixed_budget", "fixed"];
const REGIMES: [&str; 2] = ["tail", "overload"];

// ---------------------------------------------------------------------------------------------
// The worker process.

/// `hedge worker <namespace>`: connects, says `ready`, then runs each `<hedge> <regime>
/// <seconds> <scope>` line read on stdin and answers `<first> <total> <errors> <latency µs>…`,
/// until stdin closes.
async fn worker(args: &[String]) -> Result<()> {
    let [namespace] = args else {
        return Err(format!("worker arguments: {args:?}").into());
    };
    let (coordinator, mut commands) = serve_fleet(redis_url(), namespace).await?;
    while let Some(line) = commands.next_line().await? {
        let [hedge, regime, seconds, scope] = line.split(' ').collect::<Vec<_>>()[..] else {
            return Err(format!("unknown command {line:?}").into());
        };
        let down = Arc::new(Downstream {
            overloaded: regime == "overload",
            first: AtomicU64::new(0),
            total: AtomicU64::new(0),
        });
        let run = Duration::from_secs(seconds.parse()?);
        let (latencies, errors) = calls(hedge, &down, run, scope).await?;
        let latencies: Vec<String> = latencies.iter().map(u64::to_string).collect();
        println!(
            "{} {} {errors} {}",
            down.first.load(Ordering::Relaxed),
            down.total.load(Ordering::Relaxed),
            latencies.join(" ")
        );
    }
    coordinator.shutdown().await;
    Ok(())
}

/// `TASKS` tasks taking turns to call through `hedge` at `RATE` calls per second in all, for
/// `run`; returns every call's latency (µs) and the calls caracal failed.
async fn calls(
    hedge: &str,
    down: &Arc<Downstream>,
    run: Duration,
    scope: &str,
) -> Result<(Vec<u64>, u64)> {
    let hedge = HEDGES
        .into_iter()
        .position(|h| h == hedge)
        .ok_or_else(|| format!("unknown hedge {hedge:?}"))?;
    let scope: Arc<str> = scope.into();
    let start = Instant::now();
    let deadline = start + run;
    let period = Duration::from_secs_f64(TASKS as f64 / RATE);
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let (down, scope) = (Arc::clone(down), Arc::clone(&scope));
            let mut pace =
                tokio::time::interval_at(start + period / TASKS as u32 * task as u32, period);
            pace.set_missed_tick_behavior(MissedTickBehavior::Delay);
            tokio::spawn(async move {
                let (mut latencies, mut errors) = (Vec::new(), 0u64);
                loop {
                    pace.tick().await;
                    if Instant::now() >= deadline {
                        return (latencies, errors);
                    }
                    let call = AtomicU64::new(0);
                    let began = Instant::now();
                    let result = match hedge {
                        0 => unhedged(&scope, &down, &call).await,
                        1 => p95_budget(&scope, &down, &call).await,
                        2 => fixed_budget(&scope, &down, &call).await,
                        _ => fixed(&scope, &down, &call).await,
                    };
                    latencies.push(u64::try_from(began.elapsed().as_micros()).unwrap_or(u64::MAX));
                    if let Err(error) = result {
                        if !SAID.swap(true, Ordering::Relaxed) {
                            eprintln!(
                                "hedge worker {}: caracal failed a call: {error}",
                                std::process::id()
                            );
                        }
                        errors += 1;
                    }
                }
            })
        })
        .collect();
    let (mut latencies, mut errors) = (Vec::new(), 0);
    for task in tasks {
        let (mine, failed) = task.await?;
        latencies.extend(mine);
        errors += failed;
    }
    Ok((latencies, errors))
}

// ---------------------------------------------------------------------------------------------
// The parent: the three processes, the figures.

/// The `q` quantile of `sorted` (µs), in milliseconds.
fn quantile_ms(sorted: &[u64], q: f64) -> f64 {
    let rank = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len().max(1));
    sorted
        .get(rank - 1)
        .map_or(f64::NAN, |&us| us as f64 / 1000.0)
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("worker") {
        return worker(&args[1..]).await;
    }
    let seconds = match parse_seconds(&args, DEFAULT_SECONDS) {
        Ok(seconds) => seconds,
        Err(error) => {
            eprintln!("{error}\n{USAGE}");
            std::process::exit(2);
        }
    };
    emit(
        "setup",
        &[
            ("processes", PROCESSES as f64),
            ("tasks_per_process", TASKS as f64),
            ("calls_per_second_per_process", RATE),
            ("budget_percent", PERCENT * 100.0),
            ("seconds", seconds as f64),
        ],
    );
    let namespace = format!("hedge-bench:{}", std::process::id());
    let mut fleet = Fleet::start(PROCESSES, &["worker", namespace.as_str()]).await?;
    for regime in REGIMES {
        for hedge in HEDGES {
            let scope = format!("{regime}-{hedge}");
            fleet
                .send_all(&format!("{hedge} {regime} {seconds} {scope}"))
                .await?;
            let (mut first, mut total, mut errors, mut latencies) = (0.0, 0.0, 0.0, Vec::new());
            for line in fleet.answers().await? {
                let mut numbers = line.split(' ').map(str::parse::<u64>);
                let mut next = || -> Result<u64> { Ok(numbers.next().ok_or("a short answer")??) };
                first += next()? as f64;
                total += next()? as f64;
                errors += next()? as f64;
                latencies.extend(numbers.collect::<Result<Vec<_>, _>>()?);
            }
            latencies.sort_unstable();
            let p50 = quantile_ms(&latencies, 0.5);
            let p99 = quantile_ms(&latencies, 0.99);
            let p999 = quantile_ms(&latencies, 0.999);
            emit(
                &format!("{regime}_{hedge}"),
                &[
                    ("calls", latencies.len() as f64),
                    ("p50_ms", p50),
                    ("p99_ms", p99),
                    ("p99_per_p50", p99 / p50),
                    ("p999_ms", p999),
                    ("p999_per_p50", p999 / p50),
                    ("first", first),
                    ("total", total),
                    ("load_per_first", total / first),
                    ("caracal_errors", errors),
                ],
            );
        }
    }
    fleet.finish().await
}
