//! A retry storm, counted at the downstream: 3 processes × 32 tasks calling a downstream that
//! fails every call, under `#[retry(max_attempts = 4)]`, without a budget, with a local
//! `tower::retry::budget::TpsBudget` in each process, and with the fleet's `#[retry_budget]`.
//!
//! ```text
//! cargo run --release -p caracal-examples --example retry_storm                 # 30 s a run
//! cargo run --release -p caracal-examples --example retry_storm -- --seconds 5
//! CARACAL_REDIS_URL=redis://host:port cargo run --release -p caracal-examples --example retry_storm
//! ```
//!
//! The process starts three copies of itself (`retry_storm worker …`), each connected to the
//! Redis at `CARACAL_REDIS_URL` (default 127.0.0.1:6379). Every budget has the same settings:
//! 20 % of the first attempts plus 10 retries/s, over a 10 s window. Each attempt takes the
//! downstream 1 ms; the downstream counts the attempts it sees, and which of them are a call's
//! first (the caller tags each call, as a request id would): caracal counts nothing here.
//!
//! Three regimes, each run for `--seconds` with each budget:
//!
//! - `high`: every task calls again as soon as its call ends;
//! - `low`: each process makes 5 first attempts per second (its tasks take turns);
//! - `uneven`: the first process as `high`, the other two as `low`.
//!
//! One JSON line per regime and budget (`{regime}_{budget}`): `first` and `total` attempts the
//! downstream saw (summed over the processes), `retries` (their difference), `total_per_first`,
//! the first process's share of the first attempts, and `bound`, what the fleet's budget allows:
//! `1.2 × first + 10/s × 10 s × ⌈seconds / 10 s⌉` (for the default 30 s: `1.2 × first + 10/s ×
//! 30 s`; a window of 10 s allows its 100 retries of floor however short the run). The fleet
//! line adds `staleness_allowance`, the overshoot the module docs of `retry_budget` bound
//! (`S × Σ_j (r_j + 20 % × d_j)` per window, S = 0.2 s, with each process's attempt and first
//! attempt rates as upper bounds of `r_j` and `d_j`), and `within_bound` (1 or 0) against
//! both. A `summary` line per regime gives `local_to_fleet_retries`.
//!
//! What to expect: without a budget the downstream sees 4 attempts per call. With the
//! percentage doing the work (`high`), three local budgets and the fleet's are close: each
//! process's 20 % of its own first attempts sums to 20 % of the fleet's. When the floor does
//! the work (`low`), three local budgets allow 3 × 10 retries/s where the fleet's allows 10.
//! `uneven`: the busy process's local budget holds it to 20 % of its calls, and each quiet one
//! still has a floor of its own; the fleet's shares one floor among all three.
//!
//! tower 0.5.3's `TpsBudget` holds less than its `ttl`: each time its slots roll over it clears
//! one slot more than the time elapsed, so a budget in steady use forgets a withdrawal after
//! about half its `ttl` and its floor lets about twice `min_per_sec` through; at `low` the three
//! local budgets then refuse nothing.
//!
//! Caveats: the three processes share this machine's cores with Redis; the runs leave their
//! keys in a namespace of their own on that Redis.

use std::error::Error;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use caracal::{retry, retry_budget};
use caracal_examples::{Worker, emit, redis_url};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::time::{Instant, MissedTickBehavior};
use tower::retry::budget::{Budget, TpsBudget};

type Result<T, E = Box<dyn Error>> = std::result::Result<T, E>;

const PROCESSES: usize = 3;
const TASKS: usize = 32;
const MAX_ATTEMPTS: u32 = 4;
const PERCENT: f64 = 0.2;
const MIN_PER_SECOND: u32 = 10;
const WINDOW: Duration = Duration::from_secs(10);
/// First attempts per second of a process at low traffic.
const LOW_RATE: f64 = 5.0;
/// How long the downstream takes to fail an attempt.
const ATTEMPT: Duration = Duration::from_millis(1);
/// How far a view of the fleet's budget can be behind it (`retry_budget`'s module docs).
const STALENESS: f64 = 0.2;
const DEFAULT_SECONDS: u64 = 30;
const USAGE: &str = "usage: retry_storm [--seconds N]";

/// The downstream: fails every attempt, and counts what it sees.
#[derive(Default)]
struct Downstream {
    first: AtomicU64,
    total: AtomicU64,
}

impl Downstream {
    /// One attempt of the call `call` tags (its attempts so far).
    async fn attempt(&self, call: &AtomicU64) -> Result<(), Failure> {
        if call.fetch_add(1, Ordering::Relaxed) == 0 {
            self.first.fetch_add(1, Ordering::Relaxed);
        }
        self.total.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(ATTEMPT).await;
        Err(Failure::Downstream)
    }
}

/// How a call ended: the downstream's failure, or caracal's own error (reported on stderr).
#[derive(Debug)]
enum Failure {
    Downstream,
    Caracal(#[allow(dead_code)] caracal::Error),
}

impl From<caracal::Error> for Failure {
    fn from(error: caracal::Error) -> Self {
        Failure::Caracal(error)
    }
}

#[retry(max_attempts = MAX_ATTEMPTS)]
async fn unbudgeted(down: &Downstream, call: &AtomicU64) -> Result<(), Failure> {
    down.attempt(call).await
}

#[retry_budget(name = "retry-storm", percent = 20, min_per_second = 10, window = "10s",
               scope = scope)]
#[retry(max_attempts = MAX_ATTEMPTS)]
async fn fleet_budgeted(scope: &str, down: &Downstream, call: &AtomicU64) -> Result<(), Failure> {
    down.attempt(call).await
}

/// `#[retry(max_attempts = 4)]` (no backoff, as its default) with a tower budget in front of
/// every retry, as `tower::retry::Retry` would consult it.
async fn locally_budgeted(
    budget: &TpsBudget,
    down: &Downstream,
    call: &AtomicU64,
) -> Result<(), Failure> {
    budget.deposit();
    let mut result = down.attempt(call).await;
    for _ in 1..MAX_ATTEMPTS {
        if result.is_ok() || !budget.withdraw() {
            break;
        }
        result = down.attempt(call).await;
    }
    result
}

#[derive(Clone, Copy, PartialEq)]
enum Guard {
    None,
    Local,
    Fleet,
}

const GUARDS: [Guard; 3] = [Guard::None, Guard::Local, Guard::Fleet];

impl Guard {
    fn name(self) -> &'static str {
        match self {
            Guard::None => "no_budget",
            Guard::Local => "local_budgets",
            Guard::Fleet => "fleet_budget",
        }
    }
}

/// A regime: each process's first attempts per second (`None`: as fast as its tasks go).
const REGIMES: [(&str, [Option<f64>; PROCESSES]); 3] = [
    ("high", [None; PROCESSES]),
    ("low", [Some(LOW_RATE); PROCESSES]),
    ("uneven", [None, Some(LOW_RATE), Some(LOW_RATE)]),
];

// ---------------------------------------------------------------------------------------------
// The worker process.

/// `retry_storm worker <namespace>`: connects, says `ready`, then runs each
/// `<guard> <rate, 0 for unpaced> <seconds> <scope>` line read on stdin and answers
/// `<first> <total> <errors>`, until stdin closes.
async fn worker(args: &[String]) -> Result<()> {
    let [namespace] = args else {
        return Err(format!("worker arguments: {args:?}").into());
    };
    let coordinator = caracal::Coordinator::redis(redis_url())
        .namespace(namespace.as_str())
        .connect()
        .await?;
    caracal::install(coordinator.clone())?;
    println!("ready");
    let mut commands = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = commands.next_line().await? {
        let [guard, rate, seconds, scope] = line.split(' ').collect::<Vec<_>>()[..] else {
            return Err(format!("unknown command {line:?}").into());
        };
        let guard = GUARDS
            .into_iter()
            .find(|g| g.name() == guard)
            .ok_or_else(|| format!("unknown budget {guard:?}"))?;
        let rate = Some(rate.parse::<f64>()?).filter(|&rate| rate > 0.0);
        let run = Duration::from_secs(seconds.parse()?);
        let (down, errors) = storm(guard, rate, run, scope).await;
        println!(
            "{} {} {errors}",
            down.first.load(Ordering::Relaxed),
            down.total.load(Ordering::Relaxed)
        );
    }
    coordinator.shutdown().await;
    Ok(())
}

/// `TASKS` tasks calling through `guard` for `run`, at `rate` calls per second in all (taking
/// turns) or as fast as they go; returns the downstream and the calls caracal failed.
async fn storm(
    guard: Guard,
    rate: Option<f64>,
    run: Duration,
    scope: &str,
) -> (Arc<Downstream>, u64) {
    let down = Arc::new(Downstream::default());
    let budget = Arc::new(TpsBudget::new(WINDOW, MIN_PER_SECOND, PERCENT as f32));
    let scope: Arc<str> = scope.into();
    let start = Instant::now();
    let deadline = start + run;
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let (down, budget, scope) =
                (Arc::clone(&down), Arc::clone(&budget), Arc::clone(&scope));
            let mut pace = rate.map(|rate| {
                let period = Duration::from_secs_f64(TASKS as f64 / rate);
                let mut pace =
                    tokio::time::interval_at(start + period / TASKS as u32 * task as u32, period);
                pace.set_missed_tick_behavior(MissedTickBehavior::Delay);
                pace
            });
            tokio::spawn(async move {
                let mut errors = (0, None);
                loop {
                    if let Some(pace) = &mut pace {
                        pace.tick().await;
                    }
                    if Instant::now() >= deadline {
                        return errors;
                    }
                    let call = AtomicU64::new(0);
                    let result = match guard {
                        Guard::None => unbudgeted(&down, &call).await,
                        Guard::Local => locally_budgeted(&budget, &down, &call).await,
                        Guard::Fleet => fleet_budgeted(&scope, &down, &call).await,
                    };
                    if let Err(Failure::Caracal(error)) = result {
                        errors.0 += 1;
                        errors.1.get_or_insert(error);
                    }
                }
            })
        })
        .collect();
    let mut errors = 0;
    for task in tasks {
        let (count, first) = task.await.expect("a calling task panicked");
        if let Some(error) = first.filter(|_| errors == 0) {
            eprintln!(
                "retry_storm worker {}: caracal failed a call: {error}",
                std::process::id()
            );
        }
        errors += count;
    }
    (down, errors)
}

// ---------------------------------------------------------------------------------------------
// The parent: the three processes, the figures.

/// The worker processes, talking over their stdin and stdout.
struct Fleet {
    workers: Vec<Worker>,
}

impl Fleet {
    /// Starts `PROCESSES` workers and waits until every one has connected.
    async fn start(namespace: &str) -> Result<Fleet> {
        let workers = (0..PROCESSES)
            .map(|_| Worker::start(["worker", namespace]))
            .collect::<Result<_, _>>()?;
        let mut fleet = Fleet { workers };
        for line in fleet.answers().await? {
            if line != "ready" {
                return Err(format!("a worker said {line:?} instead of ready").into());
            }
        }
        Ok(fleet)
    }

    /// One line from every worker, in order.
    async fn answers(&mut self) -> Result<Vec<String>> {
        let mut lines = Vec::with_capacity(self.workers.len());
        for worker in &mut self.workers {
            lines.push(worker.line().await?);
        }
        Ok(lines)
    }

    /// Runs `guard` in every worker at once, worker `i` at `rates[i]`; returns each worker's
    /// `[first, total, errors]`.
    async fn run(
        &mut self,
        guard: Guard,
        rates: [Option<f64>; PROCESSES],
        seconds: u64,
        scope: &str,
    ) -> Result<Vec<[f64; 3]>> {
        for (worker, rate) in self.workers.iter_mut().zip(rates) {
            let command = format!("{} {} {seconds} {scope}", guard.name(), rate.unwrap_or(0.0));
            worker.send(&command).await?;
        }
        self.answers()
            .await?
            .into_iter()
            .map(|line| {
                let numbers: Vec<f64> = line.split(' ').filter_map(|n| n.parse().ok()).collect();
                <[f64; 3]>::try_from(numbers)
                    .map_err(|_| format!("a worker answered {line:?}").into())
            })
            .collect()
    }

    /// Closes every worker's stdin and waits for it to shut down cleanly.
    async fn finish(self) -> Result<()> {
        for worker in self.workers {
            worker.finish().await?;
        }
        Ok(())
    }
}

fn parse_seconds(args: &[String]) -> Result<u64> {
    match args {
        [] => Ok(DEFAULT_SECONDS),
        [flag, value] if flag == "--seconds" => match value.parse() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("--seconds {value}: want a positive whole number").into()),
        },
        _ => Err(format!("unknown arguments {args:?}").into()),
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("worker") {
        return worker(&args[1..]).await;
    }
    let seconds = match parse_seconds(&args) {
        Ok(seconds) => seconds,
        Err(error) => {
            eprintln!("{error}\n{USAGE}");
            std::process::exit(2);
        }
    };
    let windows = (seconds as f64 / WINDOW.as_secs_f64()).ceil();
    let floor = f64::from(MIN_PER_SECOND) * WINDOW.as_secs_f64() * windows;
    emit(
        "setup",
        &[
            ("processes", PROCESSES as f64),
            ("tasks_per_process", TASKS as f64),
            ("max_attempts", f64::from(MAX_ATTEMPTS)),
            ("percent", PERCENT * 100.0),
            ("min_per_second", f64::from(MIN_PER_SECOND)),
            ("window_s", WINDOW.as_secs_f64()),
            ("low_rate_per_process", LOW_RATE),
            ("seconds", seconds as f64),
        ],
    );
    let namespace = format!("retry-storm:{}", std::process::id());
    let mut fleet = Fleet::start(&namespace).await?;
    for (regime, rates) in REGIMES {
        let mut retries = [0.0; 3];
        for (index, guard) in GUARDS.into_iter().enumerate() {
            let counts = fleet.run(guard, rates, seconds, regime).await?;
            let [first, total, errors] = counts.iter().fold([0.0; 3], |sum, c| {
                [sum[0] + c[0], sum[1] + c[1], sum[2] + c[2]]
            });
            retries[index] = total - first;
            let bound = (1.0 + PERCENT) * first + floor;
            let mut fields = vec![
                ("first", first),
                ("total", total),
                ("retries", total - first),
                ("total_per_first", total / first),
                ("first_process_share", counts[0][0] / first),
                ("bound", bound),
                ("caracal_errors", errors),
            ];
            if guard == Guard::Fleet {
                let staleness = windows * STALENESS * (total + PERCENT * first) / seconds as f64;
                fields.push(("staleness_allowance", staleness));
                fields.push((
                    "within_bound",
                    f64::from(u8::from(total <= bound + staleness)),
                ));
            }
            emit(&format!("{regime}_{}", guard.name()), &fields);
        }
        emit(
            &format!("{regime}_summary"),
            &[
                ("no_budget_retries", retries[0]),
                ("local_budgets_retries", retries[1]),
                ("fleet_budget_retries", retries[2]),
                ("local_to_fleet_retries", retries[1] / retries[2]),
            ],
        );
    }
    fleet.finish().await?;
    Ok(())
}
