//! A fleet of OS processes sharing one bulkhead and one rate limit through Redis.
//!
//! ```text
//! CARACAL_REDIS_URL=redis://127.0.0.1:6379 cargo run --example fleet
//! ```
//!
//! The example starts 4 copies of itself; each runs 8 tasks for 3 seconds against a bulkhead
//! of 5 and a rate of 100 per second (burst 10). Every body records itself in Redis, so the
//! parent can show what the fleet did as a whole: never more than 5 bodies at once, never more
//! than the rate allows.

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use caracal::{bulkhead, rate_limit};
use tokio::io::{AsyncBufReadExt, BufReader};

const PROCESSES: usize = 4;
const TASKS: usize = 8;
const RUN: Duration = Duration::from_secs(3);
const LIMIT: u32 = 5;
const RATE: f64 = 100.0;
const BURST: u32 = 10;

#[derive(Debug)]
struct FleetError(#[allow(dead_code)] caracal::Error);

impl From<caracal::Error> for FleetError {
    fn from(error: caracal::Error) -> Self {
        FleetError(error)
    }
}

/// Counts the bodies running fleet-wide in Redis and keeps the highest count seen.
const ENTER: &str = "local n = redis.call('INCR', KEYS[1]) \
    if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end \
    return n";

#[bulkhead(name = "fleet-db", limit = 5)]
async fn query(
    redis: &mut redis::aio::MultiplexedConnection,
    keys: &[String; 2],
) -> Result<(), FleetError> {
    let _: i64 = redis::Script::new(ENTER)
        .key(&keys[0])
        .key(&keys[1])
        .invoke_async(redis)
        .await
        .expect("witness enter");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let _: i64 = redis::cmd("DECR")
        .arg(&keys[0])
        .query_async(redis)
        .await
        .expect("witness exit");
    Ok(())
}

#[rate_limit(name = "fleet-api", rate = 100, burst = 10)]
async fn notify() -> Result<(), FleetError> {
    Ok(())
}

async fn worker(index: usize, url: &str, run_id: &str) -> Result<(), caracal::Error> {
    let coordinator = caracal::Coordinator::from_env().await?;
    caracal::install(coordinator.clone())?;
    let client = redis::Client::open(url).expect("CARACAL_REDIS_URL");
    let keys = Arc::new([
        format!("fleet-example:{run_id}:running"),
        format!("fleet-example:{run_id}:max"),
    ]);
    let counts = Arc::new([
        AtomicU64::new(0),
        AtomicU64::new(0),
        AtomicU64::new(0),
        AtomicU64::new(0),
    ]);
    let until = Instant::now() + RUN;
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let (keys, counts) = (Arc::clone(&keys), Arc::clone(&counts));
        let mut redis = client
            .get_multiplexed_async_connection()
            .await
            .expect("witness connection");
        tasks.push(tokio::spawn(async move {
            while Instant::now() < until {
                let admitted = query(&mut redis, &keys).await.is_ok();
                counts[usize::from(!admitted)].fetch_add(1, Ordering::Relaxed);
                match notify().await {
                    Ok(()) => counts[2].fetch_add(1, Ordering::Relaxed),
                    Err(_) => counts[3].fetch_add(1, Ordering::Relaxed),
                };
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    coordinator.shutdown().await;
    let [admitted, rejected, sent, limited] = counts
        .as_ref()
        .each_ref()
        .map(|c| c.load(Ordering::Relaxed));
    println!(
        "{sent} process {index}: bulkhead admitted {admitted}, rejected {rejected}; rate admitted {sent}, limited {limited}"
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Ok(url) = std::env::var("CARACAL_REDIS_URL") else {
        eprintln!(
            "the fleet shares state through Redis: set CARACAL_REDIS_URL, e.g.\n  CARACAL_REDIS_URL=redis://127.0.0.1:6379 cargo run --example fleet"
        );
        std::process::exit(2);
    };
    let url = url.split(',').next().unwrap_or_default().to_owned();
    let mut args = std::env::args().skip(1);
    if args.next().as_deref() == Some("--worker") {
        let index = args.next().and_then(|i| i.parse().ok()).unwrap_or(0);
        let run_id = args.next().unwrap_or_default();
        worker(index, &url, &run_id).await?;
        return Ok(());
    }

    let run_id = std::process::id().to_string();
    println!(
        "{PROCESSES} processes x {TASKS} tasks for {RUN:?}: bulkhead limit {LIMIT}, rate {RATE}/s burst {BURST}"
    );
    let started = Instant::now();
    let mut children = Vec::new();
    for index in 0..PROCESSES {
        let child = tokio::process::Command::new(std::env::current_exe()?)
            .args(["--worker", &index.to_string(), &run_id])
            .env("CARACAL_NAMESPACE", format!("fleet-example:{run_id}"))
            .stdout(Stdio::piped())
            .spawn()?;
        children.push(child);
    }
    let mut rate_admitted = 0;
    for mut child in children {
        let stdout = child.stdout.take().expect("piped stdout");
        let mut lines = BufReader::new(stdout).lines();
        while let Some(line) = lines.next_line().await? {
            let (sent, report) = line.split_once(' ').unwrap_or(("0", &line));
            rate_admitted += sent.parse::<u64>().unwrap_or(0);
            println!("  {report}");
        }
        child.wait().await?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let mut redis = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let max: u32 = redis::cmd("GET")
        .arg(format!("fleet-example:{run_id}:max"))
        .query_async::<Option<u32>>(&mut redis)
        .await?
        .unwrap_or(0);
    let _: () = redis::cmd("DEL")
        .arg(format!("fleet-example:{run_id}:running"))
        .arg(format!("fleet-example:{run_id}:max"))
        .query_async(&mut redis)
        .await?;
    println!("highest fleet-wide concurrency: {max} (bulkhead limit {LIMIT})");
    println!(
        "rate-limited calls admitted fleet-wide: {rate_admitted} in at most {elapsed:.1} s (limit {} = {BURST} burst + {RATE}/s)",
        f64::from(BURST) + RATE * RUN.as_secs_f64()
    );
    Ok(())
}
