//! A retry storm, counted at the downstream: 3 processes × 32 tasks calling a downstream that
//! fails every call, under `#[retry(max_attempts = 4)]`, without a budget, with a local
//! `tower::retry::budget::TpsBudget` in each process, and with the fleet's `#[retry_budget]`.
//!
//! ```text
//! cargo run --release -p caracal-examples --example retry_storm                 # 30 s a run
//! cargo run --release -p caracal-examples --example retry_storm -- --seconds 5
//! CARACAL_REDIS_URL=redis://host:port cargo run --release -p caracal-examples --example retry_storm
//! cargo run --release -p caracal-examples --example retry_storm -- --outage stop   # or blackhole, restart
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
//! **Outages** (`--outage stop|blackhole|restart`): the fleet's budget alone, at `high`, for
//! 60 s, through a Redis the bench starts itself (a free port, no persistence) behind a TCP
//! fault proxy (the test harness's `FaultProxy`): 15 s into the run the Redis is stopped for
//! 15 s and started again empty (`stop`), the proxy forwards nothing for 15 s (`blackhole`),
//! or the Redis restarts at once, its data lost (`restart`). One line per second (`{outage}_second`)
//! gives the fleet's first attempts and retries in that second, and over the 10 s window ending
//! with it, its retries ÷ the budget (`20 % × first + 10/s × 10 s`, all counted at the
//! downstream). The `{outage}` line gives the worst window before the outage
//! (`steady_worst_window_ratio`, against `1.1 + staleness_allowance ÷ budget`) and over the
//! whole run (`worst_window_ratio`, against the documented outage bound, 1.3 × the budget:
//! `within_outage_bound`).
//!
//! Caveats: the three processes share this machine's cores with Redis; the runs leave their
//! keys in a namespace of their own on that Redis.

use std::error::Error;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use caracal::{retry, retry_budget};
use caracal_examples::{Fleet, emit, emit_labelled, parse_seconds, redis_url, serve_fleet};
use caracal_harness::{FaultProxy, RedisServer};
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
const USAGE: &str = "usage: retry_storm [--seconds N] | --outage stop|blackhole|restart";
/// An outage run: how long before the outage, how long Redis is lost, how long after.
const BEFORE_OUTAGE: Duration = Duration::from_secs(15);
const OUTAGE: Duration = Duration::from_secs(15);
const AFTER_OUTAGE: Duration = Duration::from_secs(30);
/// The most any window may hold through an outage, as a multiple of the budget
/// (`retry_budget`'s module docs, "The outage bound").
const OUTAGE_BOUND: f64 = 1.3;
/// What a steady state's worst window may hold, as a multiple of the budget, before the
/// staleness allowance.
const STEADY_BOUND: f64 = 1.1;

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

/// `retry_storm worker <namespace> [<redis url>]`: connects, says `ready`, then runs each
/// `<guard> <rate, 0 for unpaced> <seconds> <scope>` line read on stdin and answers
/// `<first> <total> <errors>` followed by both counts at the end of each second of the run,
/// until stdin closes.
async fn worker(args: &[String]) -> Result<()> {
    let (namespace, url) = match args {
        [namespace] => (namespace, redis_url()),
        [namespace, url] => (namespace, url.clone()),
        _ => return Err(format!("worker arguments: {args:?}").into()),
    };
    let (coordinator, mut commands) = serve_fleet(url, namespace).await?;
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
        let (down, errors, seconds) = storm(guard, rate, run, scope).await;
        let seconds: String = seconds
            .iter()
            .map(|(first, total)| format!(" {first} {total}"))
            .collect();
        println!(
            "{} {} {errors}{seconds}",
            down.first.load(Ordering::Relaxed),
            down.total.load(Ordering::Relaxed)
        );
    }
    coordinator.shutdown().await;
    Ok(())
}

/// The downstream's first attempts and attempts so far at the end of each second.
type Seconds = Vec<(u64, u64)>;

/// `TASKS` tasks calling through `guard` for `run`, at `rate` calls per second in all (taking
/// turns) or as fast as they go; returns the downstream, the calls caracal failed and the
/// downstream's counts at the end of each second.
async fn storm(
    guard: Guard,
    rate: Option<f64>,
    run: Duration,
    scope: &str,
) -> (Arc<Downstream>, u64, Seconds) {
    let down = Arc::new(Downstream::default());
    let budget = Arc::new(TpsBudget::new(WINDOW, MIN_PER_SECOND, PERCENT as f32));
    let scope: Arc<str> = scope.into();
    let start = Instant::now();
    let deadline = start + run;
    let seconds = Arc::new(Mutex::new(Seconds::new()));
    let sampler = {
        let (down, seconds) = (Arc::clone(&down), Arc::clone(&seconds));
        let second = Duration::from_secs(1);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(start + second, second);
            for _ in 0..run.as_secs() {
                tick.tick().await;
                let counts = (
                    down.first.load(Ordering::Relaxed),
                    down.total.load(Ordering::Relaxed),
                );
                seconds.lock().expect("the sampler").push(counts);
            }
        })
    };
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
    sampler.await.expect("the sampler panicked");
    let seconds = std::mem::take(&mut *seconds.lock().expect("the sampler"));
    (down, errors, seconds)
}

// ---------------------------------------------------------------------------------------------
// The parent: the three processes, the figures.

/// What one worker answered for a run: its downstream's counts, the calls caracal failed,
/// and its counts at the end of each second.
struct Answer {
    first: f64,
    total: f64,
    errors: f64,
    seconds: Vec<(f64, f64)>,
}

impl Answer {
    fn read(line: &str) -> Result<Answer> {
        let numbers = line
            .split(' ')
            .map(str::parse::<f64>)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| format!("a worker answered {line:?}"))?;
        let [first, total, errors, ref seconds @ ..] = numbers[..] else {
            return Err(format!("a worker answered {line:?}").into());
        };
        let seconds = seconds.chunks_exact(2).map(|c| (c[0], c[1])).collect();
        Ok(Answer {
            first,
            total,
            errors,
            seconds,
        })
    }
}

/// Starts `guard` in every worker at once, worker `i` at `rates[i]`.
async fn start_run(
    fleet: &mut Fleet,
    guard: Guard,
    rates: [Option<f64>; PROCESSES],
    seconds: u64,
    scope: &str,
) -> Result<()> {
    let commands =
        rates.map(|rate| format!("{} {} {seconds} {scope}", guard.name(), rate.unwrap_or(0.0)));
    fleet.send_each(commands).await
}

/// Every worker's answer to the run started last.
async fn answers(fleet: &mut Fleet) -> Result<Vec<Answer>> {
    fleet
        .answers()
        .await?
        .iter()
        .map(|line| Answer::read(line))
        .collect()
}

/// How the coordinator is lost in an outage run.
#[derive(Clone, Copy)]
enum Outage {
    /// Redis stopped, then started again without its data.
    Stop,
    /// Nothing forwarded either way, connections kept open.
    Blackhole,
    /// Redis restarted at once, its data lost.
    Restart,
}

impl Outage {
    fn parse(name: &str) -> Result<Outage> {
        match name {
            "stop" => Ok(Outage::Stop),
            "blackhole" => Ok(Outage::Blackhole),
            "restart" => Ok(Outage::Restart),
            _ => Err(format!("--outage {name}: want stop, blackhole or restart").into()),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Outage::Stop => "stop",
            Outage::Blackhole => "blackhole",
            Outage::Restart => "restart",
        }
    }
}

/// The fleet's budget at `high` through `outage`, on a Redis of its own behind a fault proxy:
/// a line per second and the worst windows.
async fn outage_run(outage: Outage) -> Result<()> {
    let mut server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let namespace = format!("retry-storm:{}", std::process::id());
    let url = proxy.url();
    let mut fleet = Fleet::start(PROCESSES, &["worker", namespace.as_str(), url.as_str()]).await?;
    let run = BEFORE_OUTAGE + OUTAGE + AFTER_OUTAGE;
    let scope = format!("outage-{}", outage.name());
    start_run(
        &mut fleet,
        Guard::Fleet,
        [None; PROCESSES],
        run.as_secs(),
        &scope,
    )
    .await?;
    tokio::time::sleep(BEFORE_OUTAGE).await;
    // The server's stop and start wait for the process: off the runtime's workers.
    match outage {
        Outage::Stop => tokio::task::block_in_place(|| server.stop()),
        Outage::Blackhole => proxy.blackhole(),
        Outage::Restart => tokio::task::block_in_place(|| server.restart()),
    }
    tokio::time::sleep(OUTAGE).await;
    match outage {
        Outage::Stop => tokio::task::block_in_place(|| server.restart()),
        Outage::Blackhole => proxy.restore(),
        Outage::Restart => {}
    }
    let answers = answers(&mut fleet).await?;
    fleet.finish().await?;
    // The fleet's counts at the end of each second, then in each second.
    let seconds = answers.iter().map(|a| a.seconds.len()).min().unwrap_or(0);
    let cumulative: Vec<(f64, f64)> = (0..seconds)
        .map(|at| {
            answers.iter().fold((0.0, 0.0), |(first, total), answer| {
                (first + answer.seconds[at].0, total + answer.seconds[at].1)
            })
        })
        .collect();
    let per_second: Vec<(f64, f64)> = cumulative
        .iter()
        .scan((0.0, 0.0), |last, &now| {
            let second = (now.0 - last.0, now.1 - last.1 - (now.0 - last.0));
            *last = now;
            Some(second)
        })
        .collect();
    let window = WINDOW.as_secs() as usize;
    let floor = f64::from(MIN_PER_SECOND) * WINDOW.as_secs_f64();
    let label = [("outage", outage.name())];
    let (mut worst, mut worst_end, mut steady, mut steady_allowance) = (0.0_f64, 0, 0.0_f64, 0.0);
    for (at, &(first, retries)) in per_second.iter().enumerate() {
        let from = (at + 1).saturating_sub(window);
        let (window_first, window_retries) = per_second[from..=at]
            .iter()
            .fold((0.0, 0.0), |sum, s| (sum.0 + s.0, sum.1 + s.1));
        let budget = PERCENT * window_first + floor;
        let ratio = window_retries / budget;
        let full = at + 1 >= window;
        emit_labelled(
            &format!("{}_second", outage.name()),
            &label,
            &[
                ("second", (at + 1) as f64),
                ("first", first),
                ("retries", retries),
                ("window_first", window_first),
                ("window_retries", window_retries),
                ("window_per_budget", if full { ratio } else { f64::NAN }),
            ],
        );
        if !full {
            continue;
        }
        if ratio > worst {
            (worst, worst_end) = (ratio, at + 1);
        }
        if at < BEFORE_OUTAGE.as_secs() as usize && ratio > steady {
            steady = ratio;
            // The overshoot the module docs bound, per window, at the rates of that window.
            let attempts = window_first + window_retries;
            steady_allowance =
                STALENESS * (attempts + PERCENT * window_first) / WINDOW.as_secs_f64() / budget;
        }
    }
    let errors = answers.iter().map(|a| a.errors).sum::<f64>();
    let (first, total) = answers
        .iter()
        .fold((0.0, 0.0), |sum, a| (sum.0 + a.first, sum.1 + a.total));
    emit_labelled(
        outage.name(),
        &label,
        &[
            ("first", first),
            ("retries", total - first),
            ("steady_worst_window_ratio", steady),
            ("steady_bound", STEADY_BOUND + steady_allowance),
            ("worst_window_ratio", worst),
            ("worst_window_end_s", worst_end as f64),
            ("outage_bound", OUTAGE_BOUND),
            (
                "within_outage_bound",
                f64::from(u8::from(worst <= OUTAGE_BOUND)),
            ),
            ("caracal_errors", errors),
        ],
    );
    Ok(())
}

/// `--outage NAME`, taken out of `args`.
fn take_outage(args: &mut Vec<String>) -> Result<Option<Outage>> {
    let Some(at) = args.iter().position(|arg| arg == "--outage") else {
        return Ok(None);
    };
    let name = args
        .get(at + 1)
        .ok_or("--outage: want stop, blackhole or restart")?;
    let outage = Outage::parse(name)?;
    args.drain(at..at + 2);
    Ok(Some(outage))
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("worker") {
        return worker(&args[1..]).await;
    }
    let outage_run_s = (BEFORE_OUTAGE + OUTAGE + AFTER_OUTAGE).as_secs();
    let parsed = take_outage(&mut args).and_then(|outage| match outage {
        Some(outage) if args.is_empty() => Ok((Some(outage), outage_run_s)),
        Some(_) => {
            Err(format!("an outage runs {outage_run_s} s: unknown arguments {args:?}").into())
        }
        None => Ok((None, parse_seconds(&args, DEFAULT_SECONDS)?)),
    });
    let (outage, seconds) = match parsed {
        Ok(parsed) => parsed,
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
    if let Some(outage) = outage {
        return outage_run(outage).await;
    }
    let namespace = format!("retry-storm:{}", std::process::id());
    let mut fleet = Fleet::start(PROCESSES, &["worker", namespace.as_str()]).await?;
    for (regime, rates) in REGIMES {
        let mut retries = [0.0; 3];
        for (index, guard) in GUARDS.into_iter().enumerate() {
            start_run(&mut fleet, guard, rates, seconds, regime).await?;
            let counts = answers(&mut fleet).await?;
            let (first, total, errors) = counts.iter().fold((0.0, 0.0, 0.0), |sum, c| {
                (sum.0 + c.first, sum.1 + c.total, sum.2 + c.errors)
            });
            retries[index] = total - first;
            let bound = (1.0 + PERCENT) * first + floor;
            let mut fields = vec![
                ("first", first),
                ("total", total),
                ("retries", total - first),
                ("total_per_first", total / first),
                ("first_process_share", counts[0].first / first),
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
