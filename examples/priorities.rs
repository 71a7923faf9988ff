//! Priorities under overload: three worker processes offer a fleet-wide bulkhead (limit 30) and
//! a fleet-wide rate limit three times what they admit, 20 % `Critical`, 50 % `Normal`, 30 %
//! `Sheddable` calls, and count each class's successes: first with no thresholds (today's
//! behaviour, every class refused alike), then with per-class thresholds, in the same run.
//!
//! ```text
//! cargo run --release -p caracal-examples --example priorities                   # 60 s a phase
//! cargo run --release -p caracal-examples --example priorities -- --seconds 10
//! CARACAL_REDIS_URL=redis://host:port cargo run --release -p caracal-examples --example priorities
//! ```
//!
//! Each worker installs a Redis coordinator and, for a phase, starts calls at a steady rate
//! (`OFFERED_PER_S` a worker, spread over the millisecond ticks), each call's class drawn from
//! a seeded generator (the same sequence in every phase) and set with `caracal::with_priority`.
//! A bulkhead call's body holds its slot `BODY` (50 ms), so the fleet's bulkhead admits at most
//! 30 / 0.05 s = 600 calls a second against 1 800 offered; the rate limit admits 600 a second
//! (burst 30) against the same offer. A phase answers, per class, the calls offered, admitted
//! and refused (`BulkheadFull`, `RateLimited`) and any other error (expected 0).
//!
//! One JSON line per phase and class: `success` = admitted ÷ offered; then the Redis time per
//! call of the phase (`INFO commandstats`: scripts, `usec` ÷ guarded calls), which the
//! thresholds must not change (they travel in the one script call a decision already makes).
//! Redis is the one at `CARACAL_REDIS_URL` (default 127.0.0.1:6379); the run keeps its keys in
//! a namespace of its own.

use std::error::Error;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use caracal::{Priority, bulkhead, rate_limit, with_priority};
use caracal_examples::{Worker, commandstats, emit_labelled, redis_url};

type Result<T, E = Box<dyn Error>> = std::result::Result<T, E>;

const WORKERS: usize = 3;
const DEFAULT_SECONDS: u64 = 60;
/// Each worker's offer: with three workers, three times what the limits admit.
const OFFERED_PER_S: u64 = 600;
const BODY: Duration = Duration::from_millis(50);
/// The class mix, in percent: `Critical`, `Normal`, the rest `Sheddable`.
const CRITICAL_PERCENT: u64 = 20;
const NORMAL_PERCENT: u64 = 50;

#[bulkhead(name = "priorities-bulkhead", limit = 30)]
async fn bulkhead_alike() -> Result<(), caracal::Error> {
    tokio::time::sleep(BODY).await;
    Ok(())
}

#[bulkhead(
    name = "priorities-bulkhead-classes",
    limit = 30,
    thresholds(normal = 0.8, sheddable = 0.5)
)]
async fn bulkhead_classes() -> Result<(), caracal::Error> {
    tokio::time::sleep(BODY).await;
    Ok(())
}

#[bulkhead(
    name = "priorities-bulkhead-reserved",
    limit = 30,
    thresholds(normal = 0.6, sheddable = 0.3)
)]
async fn bulkhead_reserved() -> Result<(), caracal::Error> {
    tokio::time::sleep(BODY).await;
    Ok(())
}

#[rate_limit(name = "priorities-rate", rate = 600, burst = 30)]
async fn rate_alike() -> Result<(), caracal::Error> {
    Ok(())
}

#[rate_limit(
    name = "priorities-rate-classes",
    rate = 600,
    burst = 30,
    thresholds(normal = 0.8, sheddable = 0.5)
)]
async fn rate_classes() -> Result<(), caracal::Error> {
    Ok(())
}

/// The phases, in the order they run: each policy without thresholds first.
const PHASES: [(&str, &str); 5] = [
    ("bulkhead", "none"),
    ("bulkhead", "normal=0.8,sheddable=0.5"),
    ("bulkhead", "normal=0.6,sheddable=0.3"),
    ("rate_limit", "none"),
    ("rate_limit", "normal=0.8,sheddable=0.5"),
];

async fn call(phase: usize) -> Result<(), caracal::Error> {
    match phase {
        0 => bulkhead_alike().await,
        1 => bulkhead_classes().await,
        2 => bulkhead_reserved().await,
        3 => rate_alike().await,
        _ => rate_classes().await,
    }
}

/// Per class (in `Priority::ALL` order): offered, admitted, refused, other errors.
type Counts = [[AtomicU64; 4]; 3];

fn class_index(priority: Priority) -> usize {
    Priority::ALL
        .iter()
        .position(|class| *class == priority)
        .expect("a class")
}

/// splitmix64: the same classes, in the same order, in every phase and every run.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn class(state: &mut u64) -> Priority {
    match next(state) % 100 {
        n if n < CRITICAL_PERCENT => Priority::Critical,
        n if n < CRITICAL_PERCENT + NORMAL_PERCENT => Priority::Normal,
        _ => Priority::Sheddable,
    }
}

// ---------------------------------------------------------------------------------------------
// The worker process.

/// `priorities worker <url> <namespace> <seconds> <seed>`: connects, says `ready`, then runs each
/// phase named (by index) on its stdin and answers its counts as 12 numbers, until stdin closes.
async fn worker(args: &[String]) -> Result<()> {
    let [url, namespace, seconds, seed] = args else {
        return Err(format!("worker arguments: {args:?}").into());
    };
    let coordinator = caracal::Coordinator::redis(url.as_str())
        .namespace(namespace.as_str())
        .connect()
        .await?;
    caracal::install(coordinator.clone())?;
    let run = Duration::from_secs(seconds.parse()?);
    let seed: u64 = seed.parse()?;
    println!("ready");
    let mut lines =
        tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(tokio::io::stdin()));
    while let Some(line) = lines.next_line().await? {
        let phase: usize = line.parse()?;
        let counts = offer(phase, run, seed).await;
        let numbers: Vec<String> = counts
            .iter()
            .flatten()
            .map(|count| count.load(Ordering::Relaxed).to_string())
            .collect();
        println!("{}", numbers.join(" "));
    }
    coordinator.shutdown().await;
    Ok(())
}

/// Offers `OFFERED_PER_S` calls a second to `phase` for `run`, and waits for them all.
async fn offer(phase: usize, run: Duration, seed: u64) -> Arc<Counts> {
    let counts: Arc<Counts> = Arc::new(Default::default());
    let mut state = seed;
    let mut ticks = tokio::time::interval(Duration::from_millis(1));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let total = OFFERED_PER_S * run.as_secs();
    let mut calls = Vec::with_capacity(usize::try_from(total).unwrap_or(0));
    let mut started = 0;
    let mut elapsed_ms = 0;
    while started < total {
        ticks.tick().await;
        elapsed_ms += 1;
        // Spread evenly: by the end of millisecond m, m × rate ÷ 1000 calls have started.
        let due = (elapsed_ms * OFFERED_PER_S / 1000).min(total);
        while started < due {
            started += 1;
            let priority = class(&mut state);
            let counts = Arc::clone(&counts);
            calls.push(tokio::spawn(with_priority(priority, async move {
                let class = &counts[class_index(priority)];
                class[0].fetch_add(1, Ordering::Relaxed);
                let slot = match call(phase).await {
                    Ok(()) => 1,
                    Err(
                        caracal::Error::BulkheadFull { .. } | caracal::Error::RateLimited { .. },
                    ) => 2,
                    Err(error) => {
                        eprintln!("priorities worker {}: {error}", std::process::id());
                        3
                    }
                };
                class[slot].fetch_add(1, Ordering::Relaxed);
            })));
        }
    }
    for call in calls {
        call.await.expect("a call's task panicked");
    }
    counts
}

// ---------------------------------------------------------------------------------------------
// The parent.

fn seconds(args: &[String]) -> Result<u64> {
    match args {
        [] => Ok(DEFAULT_SECONDS),
        [flag, value] if flag == "--seconds" => match value.parse() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("--seconds {value}: want a positive whole number").into()),
        },
        _ => Err("usage: priorities [--seconds N]".into()),
    }
}

/// Redis's script time so far, in µs.
async fn script_usec(conn: &mut redis::aio::MultiplexedConnection) -> Result<f64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await?;
    Ok(commandstats(&info)
        .filter(|(command, _, _)| command.starts_with("eval"))
        .map(|(_, _, usec)| usec)
        .sum())
}

async fn parent(seconds: u64) -> Result<()> {
    let url = redis_url();
    let namespace = format!("priorities-{}", std::process::id());
    let mut conn = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let mut workers = Vec::with_capacity(WORKERS);
    for seed in 0..WORKERS {
        let args = [
            "worker",
            &url,
            &namespace,
            &seconds.to_string(),
            &seed.to_string(),
        ];
        workers.push(Worker::start(args)?);
    }
    for worker in &mut workers {
        let line = worker.line().await?;
        if line != "ready" {
            return Err(format!("a worker said {line:?} instead of ready").into());
        }
    }
    for (index, (policy, thresholds)) in PHASES.iter().enumerate() {
        let before = script_usec(&mut conn).await?;
        for worker in &mut workers {
            worker.send(&index.to_string()).await?;
        }
        let mut totals = [[0u64; 4]; 3];
        for worker in &mut workers {
            let line = worker.line().await?;
            let numbers: Vec<u64> = line.split(' ').filter_map(|n| n.parse().ok()).collect();
            if numbers.len() != 12 {
                return Err(format!("a worker answered {line:?}").into());
            }
            for (slot, number) in totals.iter_mut().flatten().zip(numbers) {
                *slot += number;
            }
        }
        let spent = script_usec(&mut conn).await? - before;
        let mut admitted_all = 0;
        for (priority, [offered, admitted, refused, errors]) in
            Priority::ALL.iter().zip(totals).rev()
        {
            admitted_all += admitted;
            emit_labelled(
                "class",
                &[
                    ("policy", policy),
                    ("thresholds", thresholds),
                    ("class", priority.as_str()),
                ],
                &[
                    ("offered", offered as f64),
                    ("admitted", admitted as f64),
                    ("refused", refused as f64),
                    ("errors", errors as f64),
                    ("success", admitted as f64 / (offered as f64).max(1.0)),
                ],
            );
        }
        let offered_all: u64 = totals.iter().map(|class| class[0]).sum();
        emit_labelled(
            "phase",
            &[("policy", policy), ("thresholds", thresholds)],
            &[
                ("offered", offered_all as f64),
                ("admitted", admitted_all as f64),
                (
                    "redis_script_us_per_call",
                    spent / (offered_all as f64).max(1.0),
                ),
            ],
        );
    }
    for worker in workers {
        worker.finish().await?;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.split_first() {
        Some((mode, rest)) if mode == "worker" => worker(rest).await,
        _ => parent(seconds(&args)?).await,
    }
}
