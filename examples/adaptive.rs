//! The adaptive fleet-wide limit against a real downstream (issue 20): does
//! `#[bulkhead(limit = adaptive(…))]` find the downstream's capacity for the whole fleet, and
//! follow it when it changes? Side by side, in the same run: a local Gradient2 limiter in each
//! process, and the best static fleet-wide limit chosen in hindsight.
//!
//! ```text
//! cargo run --release -p caracal-examples --example adaptive -- --seconds 40    # the default
//! cargo run --release -p caracal-examples --example adaptive -- --seconds 9     # a smoke check
//! cargo run --release -p caracal-examples --example adaptive -- --only local    # or fleet, static
//! cargo run --release -p caracal-examples --example adaptive -- --shape busy     # see Shape
//! CARACAL_REDIS_URL=redis://host:port cargo run --release -p caracal-examples --example adaptive
//! ```
//!
//! The downstream is a TCP server in this process (`adaptive/downstream.rs`): it serves C = 20
//! requests at once, each in S = 20 ms, and queues the rest first come, first served, so it
//! answers at most C / S = 1000 requests per second and a queued request waits its turn. It
//! counts, each second, the requests inside it (served and queued: the most at once and the
//! time-weighted mean), the requests it answered (the goodput: it fails none) and their p99
//! latency from arrival to reply.
//!
//! Each run starts three copies of this program (`adaptive worker …`) of 16 tasks each, every
//! task calling the downstream over a connection of its own in a closed loop, without think
//! time: 48 calls in flight would keep 2.4 C busy. A call the limiter refuses is counted, and
//! its task backs off 1 to 5 ms. C halves after a third of the run and doubles back after two
//! thirds. (`--shape unsaturated` is the exception: a partner with room for 400 requests at
//! once, each in 100 ms, on a busy host, never saturated and never changed; its convergence
//! and band figures are `null` and 0, and it is read by the summary's `offered_reached_s`,
//! the first second whose limit reached the calls the processes' tasks offer, and
//! `then_refused` and `then_limit_per_offered_min`, the calls refused after it and the
//! lowest limit over those offered.) The limiters:
//!
//! - `fleet`: `#[bulkhead(limit = adaptive(min = 2, initial = 20, max = 400))]` through the
//!   Redis at `CARACAL_REDIS_URL` (default 127.0.0.1:6379). Halfway through, a fourth process
//!   joins: is the downstream still within 1.3 C in its first seconds?
//! - `local`: Netflix's Gradient2 in each process, independently (`adaptive/gradient2.rs` says
//!   how, with which constants).
//! - `static`: a distributed `#[bulkhead]` with a fixed limit for the fleet, one run for each of
//!   10, 15, 20, 25, 30 and 40; the best in hindsight is the one with the most goodput whose p99
//!   stays within 2 S over its whole run.
//!
//! Every second of every run is an `adaptive_second` line: `capacity`, `limit` (fleet: the
//! limit `caracal status` shows; local: the sum of the processes' limits; static: the limit),
//! `downstream_concurrency_max` and `_mean`, `goodput` (answers in that second), `p99_ms`,
//! `rejected`, `processes`, `slots_held` (the slots the workers' admitted calls held on
//! average, from each acquire's send to the call's return: Little's law) and
//! `slots_held_first` (the same of the first worker, the slow one in `slow-process`); the
//! fleet's also `latency_ms` and `base_latency_ms`, what its
//! limit was last computed from (`caracal status`' `latency_us`, `base_latency_us`). Each run ends with an `adaptive_summary` line, in two sets of
//! figures: `all_` seconds, and `steady_` ones (without the first 5 s, nor the 10 s after each
//! change of capacity): `overshoot_max` and `overshoot_mean` (the downstream's concurrency over
//! C), `within` (the fraction of seconds whose mean concurrency is within [0.8 C, 1.3 C]),
//! `p99_per_s` (p99 latency over S), `goodput_per_cs` (goodput over C / S; S is the shape's
//! mean service, 24.5 ms in `bimodal`, whose classes take 5 and 200 ms) and `service_ms`,
//! the mean time the downstream took to serve a request, and `redis_usec_per_call`, what Redis
//! spent on `EVALSHA` and `ZREM` over the run per call answered (the adaptive limit's reports
//! included: against a static limit's, the cost of adapting). Then convergence:
//! `converge_half_limit_s`, the seconds from the halving until the limit is within
//! [0.8 C/2, 1.3 C/2] and stays there until C doubles back (`null`: it is not there at the
//! end), `converge_restore_limit_s` the same after C doubles back, and `_concurrency_s` both
//! of the downstream's mean concurrency. The fleet's run adds `joiner_max_per_c`, the most
//! requests inside the downstream in the 3 s after the fourth process joined, over C, and
//! `joiner_max_per_limit`, the same over the fleet's limit (the higher of those at the start
//! and the end of each second: 1 or less is inside the fleet's limit). An
//! `adaptive_table` line puts the three side by side (the static one: the best limit's run,
//! `static_limit`; each static run's summary names its `limit`).
//!
//! What to read it against (the issue's bounds): in steady state the downstream's concurrency
//! within [0.8 C, 1.3 C], p99 ≤ 2 S, goodput ≥ 90 % of C / S; the limit within the band around
//! C/2 ≤ 10 s after the halving, around C ≤ 30 s after the doubling (at the default 40 s a
//! phase lasts 13 s: give `--seconds 90` or more to see the 30 s); the joiner within 1.3 C.
//!
//! Caveats: every process, the downstream and Redis share this machine's cores, so latency
//! here is the downstream's sleep plus scheduling noise (a loaded machine reads as a slower
//! downstream to every latency-driven limiter). tokio's timer fires a 20 ms sleep after 20 to
//! 22 ms (`service_ms` reads about 21), so the downstream answers at most about 95 % of C / S
//! and an unqueued call's latency varies by some 5 % around its minimum. Goodput counts
//! answers, late or not. The static sweep makes this take eight runs of `--seconds` each;
//! the runs leave their keys in namespaces of their own on that Redis.

use std::error::Error;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use caracal::admin::{Admin, StatusValue};
use caracal::{PolicyKind, bulkhead};
use caracal_examples::{Worker, commandstats, emit, emit_labelled, redis_url};
use downstream::Downstream;
use gradient2::Gradient2;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::time::Instant;

#[path = "adaptive/downstream.rs"]
mod downstream;
#[path = "adaptive/gradient2.rs"]
mod gradient2;

type Result<T, E = Box<dyn Error>> = std::result::Result<T, E>;
/// Named figures, in the order they are printed.
type Figures = Vec<(String, f64)>;

const PROCESSES: usize = 3;
const TASKS: usize = 16;
/// The downstream's capacity: requests served at once, and how long each takes.
const CAPACITY: usize = 20;
const SERVICE: Duration = Duration::from_millis(20);
/// The `unsaturated` shape's downstream: room for more than any fleet here offers, at the
/// latency of a partner across a network.
const ROOMY_CAPACITY: usize = 400;
const ROOMY_SERVICE: Duration = Duration::from_millis(100);
const STATIC_LIMITS: [u32; 6] = [10, 15, 20, 25, 30, 40];
/// Seconds left out of the steady state: at the start, and after each change of capacity.
const WARMUP: u64 = 5;
const SETTLING: u64 = 10;
/// The band around the capacity the downstream's concurrency and the limit should keep to.
const BAND: (f64, f64) = (0.8, 1.3);
/// Seconds watched after the fourth process joins.
const JOIN_WATCH: u64 = 3;
const FLEET_NAME: &str = "adaptive-bench";
const STATIC_NAME: &str = "adaptive-static";
const DEFAULT_SECONDS: u64 = 40;
/// The fewest seconds with a halving, a doubling back and a joiner each a second apart or more.
const MIN_SECONDS: u64 = 6;
const USAGE: &str = "usage: adaptive [--seconds N] [--only fleet|local|static] \
                     [--shape clean|busy|slow-process|bimodal|fail-fast|unsaturated]";

/// What a worker's calls go through.
#[derive(Clone, Copy, PartialEq)]
enum Limiter {
    Fleet,
    Local,
    Static(u32),
}

impl Limiter {
    /// Its regime's name in the JSON lines.
    fn regime(self) -> &'static str {
        match self {
            Limiter::Fleet => "fleet",
            Limiter::Local => "local",
            Limiter::Static(_) => "static",
        }
    }

    /// As a worker's command line gives it: `fleet`, `local` or the static limit.
    fn arg(self) -> String {
        match self {
            Limiter::Static(limit) => limit.to_string(),
            other => other.regime().to_owned(),
        }
    }

    fn parse(arg: &str) -> Result<Limiter> {
        match arg {
            "fleet" => Ok(Limiter::Fleet),
            "local" => Ok(Limiter::Local),
            limit => Ok(Limiter::Static(limit.parse()?)),
        }
    }
}

/// Why a call failed.
#[derive(Debug)]
enum CallError {
    /// The local limiter had no place for it.
    Refused,
    Caracal(#[allow(dead_code)] caracal::Error),
    Downstream(#[allow(dead_code)] std::io::Error),
    /// The downstream refused it (`--shape fail-fast`).
    Overloaded,
}

impl From<caracal::Error> for CallError {
    fn from(error: caracal::Error) -> Self {
        CallError::Caracal(error)
    }
}

impl From<std::io::Error> for CallError {
    fn from(error: std::io::Error) -> Self {
        CallError::Downstream(error)
    }
}

// ---------------------------------------------------------------------------------------------
// The worker process.

/// One call under the fleet's adaptive limit.
#[bulkhead(name = "adaptive-bench", limit = adaptive(min = 2, initial = 20, max = 400))]
async fn fleet_call(
    connection: &mut Option<TcpStream>,
    downstream: SocketAddr,
    slow: bool,
) -> Result<(), CallError> {
    body(connection, downstream, slow).await
}

/// One call under a static limit for the fleet: each run's workers override this one with
/// the run's (`Limiter::Static`).
#[bulkhead(name = "adaptive-static", limit = 20)]
async fn static_call(
    connection: &mut Option<TcpStream>,
    downstream: SocketAddr,
    slow: bool,
) -> Result<(), CallError> {
    body(connection, downstream, slow).await
}

/// One call under this process's Gradient2 limiter.
async fn local_call(
    limiter: &Arc<Gradient2>,
    connection: &mut Option<TcpStream>,
    downstream: SocketAddr,
    slow: bool,
) -> Result<(), CallError> {
    let permit = limiter.try_acquire().ok_or(CallError::Refused)?;
    body(connection, downstream, slow).await?;
    permit.sample();
    Ok(())
}

/// What every limiter guards: one request and, in a `slow` process, its thread kept 8 ms after
/// the reply (a starved or pausing replica), the same under each limiter.
async fn body(
    connection: &mut Option<TcpStream>,
    downstream: SocketAddr,
    slow: bool,
) -> Result<(), CallError> {
    request(connection, downstream).await?;
    if slow {
        std::thread::sleep(Duration::from_millis(8));
    }
    Ok(())
}

/// One request to the downstream, over `connection` (opened if there is none).
async fn request(
    connection: &mut Option<TcpStream>,
    downstream: SocketAddr,
) -> Result<(), CallError> {
    // Taken out, and put back only after a whole exchange: a call cut short (a lost lease
    // cancels the body) would leave its reply to be read as the next call's.
    let mut stream = match connection.take() {
        Some(stream) => stream,
        None => {
            let stream = TcpStream::connect(downstream).await?;
            stream.set_nodelay(true)?;
            stream
        }
    };
    stream.write_all(b"?").await?;
    let mut reply = [0];
    stream.read_exact(&mut reply).await?;
    *connection = Some(stream);
    match &reply {
        b"!" => Err(CallError::Overloaded),
        _ => Ok(()),
    }
}

/// A worker's counts, over its whole run.
#[derive(Default)]
struct Counts {
    rejected: AtomicU64,
    errors: AtomicU64,
    /// How long its calls that were admitted held their slots, from the acquire's send to the
    /// call's return, in µs (Little's law: over a second, the slots it held on average).
    held_us: AtomicU64,
}

/// `adaptive worker <fleet|local|static limit> <namespace> <downstream port> <slow|normal>`:
/// connects, says
/// `ready`, starts calling on `go`, answers each `report` with `<rejected> <errors> <held µs>`
/// (and, for `local`, ` <limit>`), and stops when its stdin closes.
async fn worker(args: &[String]) -> Result<()> {
    let [limiter, namespace, port, pace] = args else {
        return Err(format!("worker arguments: {args:?}").into());
    };
    let slow = pace == "slow";
    let limiter = Limiter::parse(limiter)?;
    let downstream = SocketAddr::from(([127, 0, 0, 1], port.parse()?));
    let coordinator = match limiter {
        Limiter::Local => None,
        Limiter::Fleet | Limiter::Static(_) => {
            let coordinator = caracal::Coordinator::redis(redis_url())
                .namespace(namespace.as_str())
                .connect()
                .await?;
            caracal::install(coordinator.clone())?;
            Some(coordinator)
        }
    };
    if let (Limiter::Static(limit), Some(coordinator)) = (limiter, &coordinator) {
        let config = format!("[bulkhead.{STATIC_NAME}]\nlimit = {limit}");
        coordinator.set_config(caracal::Config::from_toml_str(&config)?);
    }
    println!("ready");
    let mut commands = BufReader::new(tokio::io::stdin()).lines();
    if commands.next_line().await?.as_deref() != Some("go") {
        return Err("a worker was not told to go".into());
    }
    let counts = Arc::new(Counts::default());
    let local = Gradient2::new();
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let (counts, local) = (Arc::clone(&counts), Arc::clone(&local));
            tokio::spawn(
                async move { calls(limiter, slow, task, downstream, &counts, &local).await },
            )
        })
        .collect();
    while let Some(command) = commands.next_line().await? {
        if command != "report" {
            return Err(format!("unknown command {command:?}").into());
        }
        let rejected = counts.rejected.load(Ordering::Relaxed);
        let errors = counts.errors.load(Ordering::Relaxed);
        let held = counts.held_us.load(Ordering::Relaxed);
        match limiter {
            Limiter::Local => println!("{rejected} {errors} {held} {}", local.limit()),
            Limiter::Fleet | Limiter::Static(_) => println!("{rejected} {errors} {held}"),
        }
    }
    for task in &tasks {
        task.abort();
    }
    for task in tasks {
        // Cancelled, as asked: the calls it had in flight released what they held.
        let _ = task.await;
    }
    if let Some(coordinator) = coordinator {
        coordinator.shutdown().await;
    }
    Ok(())
}

/// One task's closed loop of calls, until it is aborted.
async fn calls(
    limiter: Limiter,
    slow: bool,
    task: usize,
    downstream: SocketAddr,
    counts: &Counts,
    local: &Arc<Gradient2>,
) {
    let mut connection = None;
    let mut failures = 0;
    loop {
        let began = Instant::now();
        let result = match limiter {
            Limiter::Fleet => fleet_call(&mut connection, downstream, slow).await,
            Limiter::Local => local_call(local, &mut connection, downstream, slow).await,
            Limiter::Static(_) => static_call(&mut connection, downstream, slow).await,
        };
        // Admitted unless refused, or failed in caracal before its body.
        if !matches!(result, Err(CallError::Refused | CallError::Caracal(_))) {
            let held = u64::try_from(began.elapsed().as_micros()).unwrap_or(u64::MAX);
            counts.held_us.fetch_add(held, Ordering::Relaxed);
        }
        let Err(error) = result else {
            continue;
        };
        match error {
            CallError::Refused | CallError::Caracal(caracal::Error::BulkheadFull { .. }) => {
                counts.rejected.fetch_add(1, Ordering::Relaxed);
            }
            CallError::Overloaded => {
                counts.errors.fetch_add(1, Ordering::Relaxed);
            }
            error => {
                if counts.errors.fetch_add(1, Ordering::Relaxed) == 0 {
                    eprintln!(
                        "adaptive worker {}: a call failed: {error:?}",
                        std::process::id()
                    );
                }
            }
        }
        failures += 1;
        // Back off 1 to 5 ms, the tasks out of step, rather than spin on a full limit.
        let backoff = 1 + (task + failures) % 5;
        tokio::time::sleep(Duration::from_millis(backoff as u64)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// The parent: the downstream, the runs, the figures.

/// The downstream a run meets and when, in whole seconds from the start of the run, its
/// capacity changes and the joiner joins.
struct Schedule {
    seconds: u64,
    /// Requests served at once, while not halved.
    capacity: usize,
    /// How long each takes, unqueued.
    service: Duration,
    /// Whether the capacity halves and doubles back.
    changes: bool,
}

impl Schedule {
    /// C halves at the end of this second.
    fn halved_after(&self) -> u64 {
        self.seconds / 3
    }

    /// C doubles back at the end of this second.
    fn restored_after(&self) -> u64 {
        self.seconds * 2 / 3
    }

    /// The fleet's fourth process starts at the end of this second.
    fn joins_after(&self) -> u64 {
        self.seconds / 2
    }

    /// The capacity during second `t` (from `t - 1` to `t`).
    fn capacity(&self, t: u64) -> usize {
        if self.changes && self.halved_after() < t && t <= self.restored_after() {
            self.capacity / 2
        } else {
            self.capacity
        }
    }

    /// Whether second `t` counts as steady state.
    fn steady(&self, t: u64) -> bool {
        let settling = |after: u64| after < t && t <= after + SETTLING;
        t > WARMUP && !settling(self.halved_after()) && !settling(self.restored_after())
    }
}

/// What one second of a run saw.
struct Second {
    t: u64,
    capacity: f64,
    limit: f64,
    max: f64,
    mean: f64,
    latencies: Vec<Duration>,
    served: Duration,
    /// The fleet's: the mean and base latency its limit was computed from (ms).
    fleet_latency: Option<[f64; 2]>,
    /// The slots the workers' admitted calls held on average: all of them, and the first
    /// worker's (the slow one's, in `slow-process`).
    held: [f64; 2],
    /// The calls the workers' limiter refused.
    rejected: f64,
    /// The workers running.
    processes: usize,
}

impl Second {
    /// The calls the processes' tasks offer at once.
    fn offered(&self) -> f64 {
        (self.processes * TASKS) as f64
    }

    /// Its `adaptive_second` line.
    fn emit(&self, limiter: Limiter) {
        let mut fields = vec![
            ("t", self.t as f64),
            ("capacity", self.capacity),
            ("limit", self.limit),
            ("downstream_concurrency_max", self.max),
            ("downstream_concurrency_mean", self.mean),
            ("goodput", self.latencies.len() as f64),
            ("p99_ms", p99_ms(self.latencies.clone())),
            ("rejected", self.rejected),
            ("processes", self.processes as f64),
            ("slots_held", self.held[0]),
            ("slots_held_first", self.held[1]),
        ];
        if let Some([latency, base]) = self.fleet_latency {
            fields.extend([("latency_ms", latency), ("base_latency_ms", base)]);
        }
        emit_labelled("adaptive_second", &[("regime", limiter.regime())], &fields);
    }
}

/// One run's seconds, and when the joiner joined (the fleet's run).
struct Run {
    limiter: Limiter,
    seconds: Vec<Second>,
    joined_after: Option<u64>,
    rejected: f64,
    errors: f64,
    /// What Redis spent on lease commands (`EVALSHA`, the release's `ZREM`) in the run, in µs.
    redis_usec: f64,
}

/// Server microseconds spent on `EVALSHA` and `ZREM` so far (`INFO commandstats`): every
/// script call (leases, the adaptive limit's reports) and every release.
async fn redis_usec(conn: &mut redis::aio::MultiplexedConnection) -> Result<f64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await?;
    Ok(commandstats(&info)
        .filter(|&(command, _, _)| command == "evalsha" || command == "zrem")
        .map(|(_, _, usec)| usec)
        .sum())
}

/// Runs `limiter` for the schedule: the downstream, the workers, a line per second.
async fn run(limiter: Limiter, shape: Shape, schedule: &Schedule, namespace: &str) -> Result<Run> {
    let downstream =
        Downstream::start(schedule.capacity, schedule.service, shape.behaviour()).await?;
    let port = downstream.address().port().to_string();
    let args = ["worker", &limiter.arg(), namespace, &port, "normal"];
    let slow_args = ["worker", &limiter.arg(), namespace, &port, "slow"];
    let _hog = matches!(shape, Shape::Busy | Shape::Unsaturated).then(CpuHog::start);
    // The parent reads the fleet's limit as the `caracal` command would.
    let observer = match limiter {
        Limiter::Fleet => Some(
            caracal::Coordinator::redis(redis_url())
                .namespace(namespace)
                .connect()
                .await?,
        ),
        Limiter::Local | Limiter::Static(_) => None,
    };
    let admin = observer.as_ref().map(caracal::Coordinator::admin);
    let mut stats = redis::Client::open(redis_url())?
        .get_multiplexed_async_connection()
        .await?;
    let usec_before = redis_usec(&mut stats).await?;
    let mut workers = Vec::with_capacity(PROCESSES + 1);
    for process in 0..PROCESSES {
        let slow = shape == Shape::SlowProcess && process == 0;
        workers.push(ready(if slow { slow_args } else { args }).await?);
    }
    // Told only once all are ready, so that they start together.
    for worker in &mut workers {
        worker.send("go").await?;
    }
    let start = Instant::now();
    downstream.interval();
    let mut ticks =
        tokio::time::interval_at(start + Duration::from_secs(1), Duration::from_secs(1));
    let mut seconds = Vec::with_capacity(schedule.seconds as usize);
    let mut joined_after = None;
    let mut rejected = 0.0;
    let mut held_us: Vec<f64> = Vec::new();
    for t in 1..=schedule.seconds {
        ticks.tick().await;
        let seen = downstream.interval();
        let reports = reports(&mut workers).await?;
        let (limit, fleet_latency) = match limiter {
            Limiter::Fleet => {
                let [limit, latency, base] =
                    fleet_limit(admin.as_ref().expect("connected")).await?;
                (limit, Some([latency, base]))
            }
            Limiter::Local => (reports.iter().map(|report| report[3]).sum(), None),
            Limiter::Static(limit) => (f64::from(limit), None),
        };
        let rejected_now: f64 = reports.iter().map(|report| report[0]).sum();
        let held_now: Vec<f64> = reports.iter().map(|report| report[2]).collect();
        // Each worker's since the last second (a joiner's since it started): µs per second.
        let held: Vec<f64> = held_now
            .iter()
            .enumerate()
            .map(|(i, now)| (now - held_us.get(i).unwrap_or(&0.0)) / 1e6)
            .collect();
        held_us = held_now;
        let second = Second {
            t,
            capacity: schedule.capacity(t) as f64,
            limit,
            max: seen.max as f64,
            mean: seen.mean,
            latencies: seen.latencies,
            served: seen.served,
            fleet_latency,
            held: [held.iter().sum(), held.first().copied().unwrap_or(0.0)],
            rejected: rejected_now - rejected,
            processes: workers.len(),
        };
        second.emit(limiter);
        rejected = rejected_now;
        seconds.push(second);
        if t == schedule.halved_after() || t == schedule.restored_after() {
            downstream.set_capacity(schedule.capacity(t + 1));
        }
        if limiter == Limiter::Fleet && t == schedule.joins_after() {
            let mut joiner = ready(args).await?;
            joiner.send("go").await?;
            workers.push(joiner);
            joined_after = Some(t);
        }
    }
    let reports = reports(&mut workers).await?;
    for worker in workers {
        worker.finish().await?;
    }
    let redis_usec = redis_usec(&mut stats).await? - usec_before;
    if let Some(observer) = observer {
        observer.shutdown().await;
    }
    Ok(Run {
        limiter,
        seconds,
        joined_after,
        rejected: reports.iter().map(|report| report[0]).sum(),
        errors: reports.iter().map(|report| report[1]).sum(),
        redis_usec,
    })
}

/// A worker started with `args`, once it says it is ready.
async fn ready(args: [&str; 5]) -> Result<Worker> {
    let mut worker = Worker::start(args)?;
    match worker.line().await? {
        line if line == "ready" => Ok(worker),
        line => Err(format!("a worker said {line:?} instead of ready").into()),
    }
}

/// Every worker's report: its numbers, in order.
async fn reports(workers: &mut [Worker]) -> Result<Vec<Vec<f64>>> {
    let mut reports = Vec::with_capacity(workers.len());
    for worker in workers.iter_mut() {
        worker.send("report").await?;
        let line = worker.line().await?;
        let numbers = line.split(' ').map(str::parse).collect::<Result<_, _>>();
        reports.push(numbers.map_err(|_| format!("a worker reported {line:?}"))?);
    }
    Ok(reports)
}

/// The fleet's adaptive limit, as `caracal status` shows it (`NaN` before any process used it).
/// The fleet's adaptive limit as `caracal status` shows it, with the mean and the base
/// latency it was computed from (ms); `NaN` for what it does not show (before any process
/// used the limit).
async fn fleet_limit(admin: &Admin) -> Result<[f64; 3]> {
    let status = admin.status().await?;
    let identity = status
        .iter()
        .find(|identity| identity.kind == PolicyKind::Bulkhead && identity.name == FLEET_NAME);
    let figure = |name| match identity.and_then(|identity| identity.state.get(name)) {
        Some(StatusValue::Count(n)) => *n as f64,
        _ => f64::NAN,
    };
    Ok([
        figure("limit"),
        figure("latency_us") / 1e3,
        figure("base_latency_us") / 1e3,
    ])
}

/// The 99th percentile of `latencies`, in milliseconds (`NaN` for none).
fn p99_ms(mut latencies: Vec<Duration>) -> f64 {
    latencies.sort_unstable();
    let at = (latencies.len() * 99).div_ceil(100);
    match at.checked_sub(1) {
        Some(at) => latencies[at].as_secs_f64() * 1e3,
        None => f64::NAN,
    }
}

fn in_band(value: f64, capacity: f64) -> bool {
    BAND.0 * capacity <= value && value <= BAND.1 * capacity
}

/// The figures of a set of seconds, each name after `prefix`.
fn figures(prefix: &str, seconds: &[&Second], service: Duration) -> Figures {
    let count = seconds.len() as f64;
    let mean =
        |value: &dyn Fn(&Second) -> f64| seconds.iter().map(|s| value(s)).sum::<f64>() / count;
    let latencies = seconds
        .iter()
        .flat_map(|s| s.latencies.iter().copied())
        .collect();
    let answered: f64 = seconds.iter().map(|s| s.latencies.len() as f64).sum();
    let served: Duration = seconds.iter().map(|s| s.served).sum();
    let servable: f64 = seconds
        .iter()
        .map(|s| s.capacity / service.as_secs_f64())
        .sum();
    let overshoot_max = seconds
        .iter()
        .map(|s| s.max / s.capacity)
        .fold(f64::NAN, f64::max);
    [
        ("seconds", count),
        ("overshoot_max", overshoot_max),
        ("overshoot_mean", mean(&|s| s.mean / s.capacity)),
        (
            "within",
            mean(&|s| f64::from(u8::from(in_band(s.mean, s.capacity)))),
        ),
        (
            "p99_per_s",
            p99_ms(latencies) / (service.as_secs_f64() * 1e3),
        ),
        ("goodput_per_cs", answered / servable),
        ("service_ms", served.as_secs_f64() * 1e3 / answered),
    ]
    .into_iter()
    .map(|(name, value)| (format!("{prefix}{name}"), value))
    .collect()
}

/// Seconds from the change at the end of second `after` until `value` is within the band
/// around the capacity and stays there until the end of second `until` (`NaN`: it is not
/// there at the end).
fn convergence(run: &Run, after: u64, until: u64, value: fn(&Second) -> f64) -> f64 {
    let mut settled = None;
    for second in run.seconds.iter().rev() {
        if second.t > until {
            continue;
        }
        if second.t <= after || !in_band(value(second), second.capacity) {
            break;
        }
        settled = Some(second.t);
    }
    settled.map_or(f64::NAN, |t| (t - after) as f64)
}

/// A run's `adaptive_summary` figures.
fn summary(run: &Run, schedule: &Schedule) -> Figures {
    let all: Vec<&Second> = run.seconds.iter().collect();
    let steady: Vec<&Second> = run
        .seconds
        .iter()
        .filter(|s| schedule.steady(s.t))
        .collect();
    let (halved, restored) = (schedule.halved_after(), schedule.restored_after());
    let limit = |s: &Second| s.limit;
    let concurrency = |s: &Second| s.mean;
    // From the first second whose limit reached what the processes' tasks offer.
    let reached = run.seconds.iter().find(|s| s.limit >= s.offered());
    let then = run
        .seconds
        .iter()
        .filter(|s| reached.is_some_and(|reached| s.t > reached.t));
    let mut fields = figures("all_", &all, schedule.service);
    fields.extend(figures("steady_", &steady, schedule.service));
    fields.extend([
        (
            "converge_half_limit_s".to_owned(),
            convergence(run, halved, restored, limit),
        ),
        (
            "converge_restore_limit_s".to_owned(),
            convergence(run, restored, schedule.seconds, limit),
        ),
        (
            "converge_half_concurrency_s".to_owned(),
            convergence(run, halved, restored, concurrency),
        ),
        (
            "converge_restore_concurrency_s".to_owned(),
            convergence(run, restored, schedule.seconds, concurrency),
        ),
        (
            "rejected_per_s".to_owned(),
            run.rejected / schedule.seconds as f64,
        ),
        ("errors".to_owned(), run.errors),
        (
            "offered_reached_s".to_owned(),
            reached.map_or(f64::NAN, |s| s.t as f64),
        ),
        (
            "then_refused".to_owned(),
            then.clone().map(|s| s.rejected).sum(),
        ),
        (
            "then_limit_per_offered_min".to_owned(),
            then.map(|s| s.limit / s.offered()).fold(f64::NAN, f64::min),
        ),
        (
            "redis_usec_per_call".to_owned(),
            run.redis_usec / run.seconds.iter().map(|s| s.latencies.len()).sum::<usize>() as f64,
        ),
    ]);
    if let Limiter::Static(limit) = run.limiter {
        fields.push(("limit".to_owned(), f64::from(limit)));
    }
    if let Some(joined) = run.joined_after {
        // Each watched second with the one before: the limit at its start and at its end.
        let watched = run
            .seconds
            .windows(2)
            .filter(|pair| joined < pair[1].t && pair[1].t <= joined + JOIN_WATCH);
        let (mut per_c, mut per_limit) = (f64::NAN, f64::NAN);
        for [before, second] in watched.map(|pair| [&pair[0], &pair[1]]) {
            per_c = per_c.max(second.max / second.capacity);
            per_limit = per_limit.max(second.max / second.limit.max(before.limit));
        }
        fields.extend([
            ("joiner_max_per_c".to_owned(), per_c),
            ("joiner_max_per_limit".to_owned(), per_limit),
            (
                "joiner_within".to_owned(),
                f64::from(u8::from(per_c <= BAND.1)),
            ),
        ]);
    }
    fields
}

/// The figure `name` of `fields`, if it has one.
fn find(fields: &Figures, name: &str) -> Option<f64> {
    fields
        .iter()
        .find(|(field, _)| field == name)
        .map(|&(_, value)| value)
}

/// Prints a set of named figures as one line.
fn emit_fields(figure: &str, labels: &[(&str, &str)], fields: &Figures) {
    let fields: Vec<(&str, f64)> = fields
        .iter()
        .map(|(name, value)| (name.as_str(), *value))
        .collect();
    emit_labelled(figure, labels, &fields);
}

/// The best static run in hindsight: the most goodput among those whose p99 stayed within 2 S
/// over the whole run, else the one with the lowest p99.
fn best_static(runs: Vec<Figures>) -> Option<Figures> {
    let figure = |fields: &Figures, name| find(fields, name).unwrap_or(f64::NAN);
    let goodput = |fields: &Figures| figure(fields, "all_goodput_per_cs");
    let p99 = |fields: &Figures| figure(fields, "all_p99_per_s");
    let (fit, unfit): (Vec<_>, Vec<_>) = runs.into_iter().partition(|fields| p99(fields) <= 2.0);
    if fit.is_empty() {
        unfit.into_iter().min_by(|a, b| p99(a).total_cmp(&p99(b)))
    } else {
        fit.into_iter()
            .max_by(|a, b| goodput(a).total_cmp(&goodput(b)))
    }
}

/// The `adaptive_table` columns of each regime.
const TABLE: [&str; 14] = [
    "steady_overshoot_max",
    "steady_overshoot_mean",
    "steady_within",
    "steady_p99_per_s",
    "steady_goodput_per_cs",
    "all_overshoot_max",
    "all_within",
    "all_p99_per_s",
    "all_goodput_per_cs",
    "converge_half_limit_s",
    "converge_restore_limit_s",
    "converge_half_concurrency_s",
    "converge_restore_concurrency_s",
    "redis_usec_per_call",
];

/// The `adaptive_table` columns of the regimes that have them.
const TABLE_IF_ANY: [&str; 4] = [
    "limit",
    "joiner_max_per_c",
    "joiner_max_per_limit",
    "joiner_within",
];

/// What the downstream and the processes are like (`--shape`): the issue's shapes that are not
/// congestion, beside the clean one.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    Clean,
    /// A thread spinning beside the processes for the whole run.
    Busy,
    /// One process's bodies keep their thread 8 ms after the reply, whichever limiter it runs.
    SlowProcess,
    /// One request in ten takes 200 ms, the others 5 ms.
    Bimodal,
    /// Past its capacity, the downstream fails in a millisecond instead of queueing.
    FailFast,
    /// A downstream with room for more than the fleet offers ([`ROOMY_CAPACITY`], each request
    /// in [`ROOMY_SERVICE`]), on a busy host: never saturated, its capacity never changes, and
    /// the limit should stay above what the fleet offers and refuse nothing once it is there.
    Unsaturated,
}

impl Shape {
    const ALL: [(&'static str, Shape); 6] = [
        ("clean", Shape::Clean),
        ("busy", Shape::Busy),
        ("slow-process", Shape::SlowProcess),
        ("bimodal", Shape::Bimodal),
        ("fail-fast", Shape::FailFast),
        ("unsaturated", Shape::Unsaturated),
    ];

    fn name(self) -> &'static str {
        Shape::ALL
            .iter()
            .find(|(_, shape)| *shape == self)
            .map_or("clean", |(name, _)| name)
    }

    /// The downstream it runs against, for a run of `seconds`.
    fn schedule(self, seconds: u64) -> Schedule {
        let unsaturated = self == Shape::Unsaturated;
        Schedule {
            seconds,
            capacity: if unsaturated {
                ROOMY_CAPACITY
            } else {
                CAPACITY
            },
            // What C / S is read against: a bimodal downstream's mean service, 24.5 ms, not
            // the other shapes' 20 (against 20, no limiter could pass 0.82 of it).
            service: match self {
                Shape::Unsaturated => ROOMY_SERVICE,
                Shape::Bimodal => downstream::BIMODAL_MEAN,
                _ => SERVICE,
            },
            changes: !unsaturated,
        }
    }

    fn behaviour(self) -> downstream::Behaviour {
        downstream::Behaviour {
            bimodal: self == Shape::Bimodal,
            fail_fast: self == Shape::FailFast,
        }
    }
}

/// A thread spinning on a core until dropped: a busy host.
struct CpuHog(Arc<std::sync::atomic::AtomicBool>);

impl CpuHog {
    fn start() -> CpuHog {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let spinning = Arc::clone(&stop);
        std::thread::spawn(move || {
            while !spinning.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        });
        CpuHog(stop)
    }
}

impl Drop for CpuHog {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// What to run: `--seconds N`, `--only REGIME`, `--shape SHAPE`.
struct Options {
    seconds: u64,
    only: Option<String>,
    shape: Shape,
}

fn parse_options(args: &[String]) -> Result<Options> {
    let mut options = Options {
        seconds: DEFAULT_SECONDS,
        only: None,
        shape: Shape::Clean,
    };
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .ok_or_else(|| format!("{flag}: wants a value"))?;
        match flag.as_str() {
            "--seconds" => match value.parse() {
                Ok(n) if n >= MIN_SECONDS => options.seconds = n,
                _ => return Err(format!("--seconds {value}: want {MIN_SECONDS} or more").into()),
            },
            "--only" if ["fleet", "local", "static"].contains(&value.as_str()) => {
                options.only = Some(value.clone());
            }
            "--shape" => match Shape::ALL.iter().find(|(name, _)| name == value) {
                Some(&(_, shape)) => options.shape = shape,
                None => return Err(format!("--shape {value}: unknown").into()),
            },
            _ => return Err(format!("unknown arguments {flag} {value}").into()),
        }
    }
    Ok(options)
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("worker") {
        return worker(&args[1..]).await;
    }
    let options = match parse_options(&args) {
        Ok(options) => options,
        Err(error) => {
            eprintln!("{error}\n{USAGE}");
            std::process::exit(2);
        }
    };
    let schedule = options.shape.schedule(options.seconds);
    emit(
        "setup",
        &[
            ("processes", PROCESSES as f64),
            ("tasks_per_process", TASKS as f64),
            ("capacity", schedule.capacity as f64),
            ("service_ms", schedule.service.as_secs_f64() * 1e3),
            ("seconds", schedule.seconds as f64),
            ("halved_after_s", schedule.halved_after() as f64),
            ("restored_after_s", schedule.restored_after() as f64),
            ("joins_after_s", schedule.joins_after() as f64),
        ],
    );
    let wanted = |regime: &str| options.only.as_deref().is_none_or(|only| only == regime);
    let namespace = format!("adaptive:{}", std::process::id());
    let mut table = Vec::new();
    for limiter in [Limiter::Fleet, Limiter::Local] {
        if wanted(limiter.regime()) {
            let run = run(limiter, options.shape, &schedule, &namespace).await?;
            let fields = summary(&run, &schedule);
            emit_fields(
                "adaptive_summary",
                &[
                    ("regime", limiter.regime()),
                    ("shape", options.shape.name()),
                ],
                &fields,
            );
            table.push((limiter.regime(), fields));
        }
    }
    if wanted("static") {
        let mut runs = Vec::with_capacity(STATIC_LIMITS.len());
        for limit in STATIC_LIMITS {
            let run = run(
                Limiter::Static(limit),
                options.shape,
                &schedule,
                &format!("{namespace}:static-{limit}"),
            )
            .await?;
            let fields = summary(&run, &schedule);
            emit_fields(
                "adaptive_summary",
                &[("regime", "static"), ("shape", options.shape.name())],
                &fields,
            );
            runs.push(fields);
        }
        table.extend(best_static(runs).map(|fields| ("static", fields)));
    }
    let mut columns = Vec::new();
    for (regime, fields) in &table {
        for name in TABLE.iter().chain(&TABLE_IF_ANY) {
            if let Some(value) = find(fields, name) {
                columns.push((format!("{regime}_{name}"), value));
            }
        }
    }
    emit_fields(
        "adaptive_table",
        &[("shape", options.shape.name())],
        &columns,
    );
    Ok(())
}
