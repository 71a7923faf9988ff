//! A fleet on one Redis, then on a three-master Redis Cluster: K worker processes × 64 tasks
//! calling guarded functions as fast as they can, one JSON line per figure.
//!
//! ```text
//! cargo run --release -p caracal-examples --example fleet_bench                # K = 2, 5 s a phase
//! cargo run --release -p caracal-examples --example fleet_bench -- --workers 4 --seconds 10
//! cargo run --release -p caracal-examples --example fleet_bench -- --no-cluster
//! CARACAL_REDIS_URL=redis://host:port cargo run --release -p caracal-examples --example fleet_bench
//! ```
//!
//! The process starts K copies of itself (`fleet_bench worker …`). Each installs a Redis
//! coordinator and runs 64 tasks, task `t` calling with scope `t % 16`, so 16 scopes share the
//! load (on the cluster they hash to the three shards). A phase lasts `--seconds`: first a
//! `#[bulkhead]` (limit 64 per scope), then the same with `keep = "5ms"` (a finished body's
//! lease serves the process's next call of the scope without a round trip), then a
//! `#[circuit_breaker]` over a `#[bulkhead]`, each around a body that only yields. Every worker
//! reports its admitted and rejected calls; the parent reads `INFO cpu` and `INFO
//! commandstats` of every Redis node before and after each phase.
//!
//! Figures, for `standalone` (the Redis at `CARACAL_REDIS_URL`, default 127.0.0.1:6379) and
//! then `cluster` (three masters the example starts on free ports, in a temp dir, from the
//! `redis-server` binary), per phase:
//!
//! - `calls_per_s`: admitted calls per second, summed over the workers; `rejected`: calls that
//!   were not (a full bulkhead or a coordinator failure; expected 0, the first is on stderr);
//! - `redis_cpu_s_per_million_calls`: `used_cpu_sys + used_cpu_user` of the Redis servers
//!   (summed over the nodes) per million guarded calls. Numerically the CPU µs one call costs
//!   Redis, everything included: network I/O, parsing, scripts, the coordinators' background
//!   traffic (feed, lease renewals, the cluster's primary checks);
//! - `redis_script_us_per_call`: `INFO commandstats` time of `EVALSHA` and the other script
//!   commands, which includes the commands the scripts run; `redis_other_command_us_per_call`:
//!   the time of every other command line, both those sent directly (a bulkhead's release)
//!   and those scripts ran (Redis counts them on their own line too, so this is an upper bound
//!   for the direct ones, and the two are not summed); `scripts_per_call`. Redis times a
//!   command by the clock, not by CPU: when the machine has more runnable threads than cores
//!   a command's time includes waits for a core, and can exceed the CPU figure;
//! - `redis_cores_busy`: Redis CPU seconds per second of the phase (1 = one core saturated);
//! - on `bulkhead_keep`, `calls_ratio_to_plain` and `cpu_ratio_to_plain`: its calls/s and its
//!   Redis CPU per million calls ÷ the plain `bulkhead` phase's, same fleet, same run;
//! - on the cluster, `ratio_to_standalone` (calls/s, cluster ÷ standalone, same run) and
//!   `cpu_ratio_to_standalone`, then one `…_shard` line per node: its CPU seconds, its share
//!   of the cluster's CPU and of its script calls (whether the scopes spread the load).
//!
//! A `setup` line first (workers, tasks, scopes, limit, seconds, `cores`) and a `summary` line
//! last. When `redis-server` or `redis-cli` cannot be run, or with `--no-cluster`, a
//! `cluster_skipped` line says so and the cluster figures are `null`.
//!
//! Caveats: the workers, their connections and every Redis share this machine's `cores`. On a
//! small machine the fleet is CPU-bound: three shards cannot run faster than one when the
//! cores they would use are already busy with the clients, so a cluster ratio near or below 1
//! there says nothing about a cluster on separate hosts. `INFO` counts every client of a
//! server: the standalone figures are only this fleet's on a Redis nothing else uses. Above 16
//! workers the 4 × K tasks on a scope exceed its limit of 64 and calls are rejected. The
//! standalone Redis keeps the run's keys (in a namespace of its own); the cluster is killed and
//! its directory removed at exit, on an error too (not when the process itself is killed).

use std::error::Error;
use std::net::TcpListener;
use std::num::NonZero;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use caracal::{bulkhead, circuit_breaker};
use caracal_examples::{commandstats, emit, emit_text, redis_url};
use redis::aio::MultiplexedConnection;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

type Result<T, E = Box<dyn Error>> = std::result::Result<T, E>;

const TASKS: usize = 64;
const SCOPES: usize = 16;
const LIMIT: u32 = 64;
const DEFAULT_WORKERS: usize = 2;
const DEFAULT_SECONDS: u64 = 5;
const MASTERS: usize = 3;
/// How long the cluster's nodes get to start and agree on a healthy cluster.
const CLUSTER_START: Duration = Duration::from_secs(30);
const SCRIPT_COMMANDS: [&str; 6] = [
    "eval",
    "evalsha",
    "eval_ro",
    "evalsha_ro",
    "fcall",
    "fcall_ro",
];
const USAGE: &str = "usage: fleet_bench [--workers K] [--seconds N] [--no-cluster]";

#[bulkhead(name = "fleet-bench", limit = LIMIT, scope = scope)]
async fn bulkhead_only(scope: usize) -> Result<(), caracal::Error> {
    tokio::task::yield_now().await;
    Ok(())
}

#[bulkhead(name = "fleet-bench-keep", limit = LIMIT, scope = scope, keep = "5ms")]
async fn bulkhead_kept(scope: usize) -> Result<(), caracal::Error> {
    tokio::task::yield_now().await;
    Ok(())
}

#[circuit_breaker(name = "fleet-bench-both", scope = scope)]
#[bulkhead(name = "fleet-bench-both", limit = LIMIT, scope = scope)]
async fn breaker_and_bulkhead(scope: usize) -> Result<(), caracal::Error> {
    tokio::task::yield_now().await;
    Ok(())
}

#[derive(Clone, Copy)]
enum Phase {
    Bulkhead,
    BulkheadKeep,
    BreakerAndBulkhead,
}

const PHASES: [Phase; 3] = [
    Phase::Bulkhead,
    Phase::BulkheadKeep,
    Phase::BreakerAndBulkhead,
];

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Bulkhead => "bulkhead",
            Phase::BulkheadKeep => "bulkhead_keep",
            Phase::BreakerAndBulkhead => "breaker_and_bulkhead",
        }
    }

    async fn call(self, scope: usize) -> Result<(), caracal::Error> {
        match self {
            Phase::Bulkhead => bulkhead_only(scope).await,
            Phase::BulkheadKeep => bulkhead_kept(scope).await,
            Phase::BreakerAndBulkhead => breaker_and_bulkhead(scope).await,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The worker process.

/// `fleet_bench worker <standalone|cluster> <url or comma-separated seeds> <namespace> <secs>`:
/// connects, warms every scope up, says `ready`, then runs each phase named on stdin and
/// answers `<admitted> <rejected> <elapsed seconds>`, until stdin closes.
async fn worker(args: &[String]) -> Result<()> {
    let [kind, address, namespace, seconds] = args else {
        return Err(format!("worker arguments: {args:?}").into());
    };
    let builder = match kind.as_str() {
        "cluster" => caracal::Coordinator::redis_cluster(address.split(',')),
        _ => caracal::Coordinator::redis(address.as_str()),
    };
    let coordinator = builder.namespace(namespace.as_str()).connect().await?;
    caracal::install(coordinator.clone())?;
    let run = Duration::from_secs(seconds.parse()?);
    for scope in 0..SCOPES {
        for phase in PHASES {
            phase.call(scope).await?;
        }
    }
    println!("ready");
    let mut commands = BufReader::new(tokio::io::stdin()).lines();
    while let Some(name) = commands.next_line().await? {
        let phase = PHASES
            .into_iter()
            .find(|phase| phase.name() == name)
            .ok_or_else(|| format!("unknown phase {name:?}"))?;
        let (admitted, rejected, elapsed) = run_phase(phase, run).await;
        println!("{admitted} {rejected} {elapsed}");
    }
    coordinator.shutdown().await;
    Ok(())
}

/// Runs `TASKS` tasks calling `phase` for `run`; returns the admitted and rejected calls and
/// the seconds until the last task finished.
async fn run_phase(phase: Phase, run: Duration) -> (u64, u64, f64) {
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let stop = Arc::clone(&stop);
            tokio::spawn(async move {
                let (mut admitted, mut rejected, mut first_error) = (0, 0, None);
                while !stop.load(Ordering::Relaxed) {
                    match phase.call(task % SCOPES).await {
                        Ok(()) => admitted += 1,
                        Err(error) => {
                            rejected += 1;
                            first_error.get_or_insert(error);
                        }
                    }
                }
                (admitted, rejected, first_error)
            })
        })
        .collect();
    tokio::time::sleep(run).await;
    stop.store(true, Ordering::Relaxed);
    let (mut admitted, mut rejected, mut first_error) = (0, 0, None);
    for task in tasks {
        let (a, r, error) = task.await.expect("a calling task panicked");
        admitted += a;
        rejected += r;
        first_error = first_error.or(error);
    }
    if let Some(error) = first_error {
        eprintln!(
            "fleet_bench worker {}: {rejected} calls rejected in {}, the first: {error}",
            std::process::id(),
            phase.name()
        );
    }
    (admitted, rejected, start.elapsed().as_secs_f64())
}

// ---------------------------------------------------------------------------------------------
// The parent: the fleet of workers, the Redis nodes it measures, the cluster it starts.

struct Options {
    workers: usize,
    seconds: u64,
    cluster: bool,
}

impl Options {
    fn parse(args: &[String]) -> Result<Options> {
        let mut options = Options {
            workers: DEFAULT_WORKERS,
            seconds: DEFAULT_SECONDS,
            cluster: true,
        };
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            let mut number = || -> Result<u64> {
                let value = args.next().ok_or(format!("{arg} needs a value"))?;
                match value.parse() {
                    Ok(n) if n > 0 => Ok(n),
                    _ => Err(format!("{arg} {value}: want a positive whole number").into()),
                }
            };
            match arg.as_str() {
                "--workers" => options.workers = usize::try_from(number()?)?,
                "--seconds" => options.seconds = number()?,
                "--no-cluster" => options.cluster = false,
                _ => return Err(format!("unknown argument {arg:?}").into()),
            }
        }
        Ok(options)
    }
}

/// The worker processes of one measurement, talking over their stdin and stdout.
struct Fleet {
    workers: Vec<(Child, ChildStdin, Lines<BufReader<ChildStdout>>)>,
}

impl Fleet {
    /// Starts `count` workers and waits until every one has connected and warmed up.
    async fn start(count: usize, args: [&str; 4]) -> Result<Fleet> {
        let exe = std::env::current_exe()?;
        let mut workers = Vec::with_capacity(count);
        for _ in 0..count {
            let mut child = tokio::process::Command::new(&exe)
                .arg("worker")
                .args(args)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .kill_on_drop(true)
                .spawn()?;
            let stdin = child.stdin.take().expect("piped stdin");
            let stdout = child.stdout.take().expect("piped stdout");
            workers.push((child, stdin, BufReader::new(stdout).lines()));
        }
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
        for (child, _, stdout) in &mut self.workers {
            match stdout.next_line().await? {
                Some(line) => lines.push(line),
                None => return Err(format!("a worker exited: {}", child.wait().await?).into()),
            }
        }
        Ok(lines)
    }

    /// Runs `phase` in every worker at once; returns admitted calls per second (summed over
    /// the workers) and every call made, rejected ones included.
    async fn run(&mut self, phase: Phase) -> Result<(f64, f64, f64)> {
        for (_, stdin, _) in &mut self.workers {
            stdin
                .write_all(format!("{}\n", phase.name()).as_bytes())
                .await?;
            stdin.flush().await?;
        }
        let (mut rate, mut calls, mut rejected) = (0.0, 0.0, 0.0);
        for line in self.answers().await? {
            let numbers: Vec<f64> = line.split(' ').filter_map(|n| n.parse().ok()).collect();
            let &[admitted, refused, elapsed] = numbers.as_slice() else {
                return Err(format!("a worker answered {line:?}").into());
            };
            rate += admitted / elapsed;
            calls += admitted + refused;
            rejected += refused;
        }
        Ok((rate, calls, rejected))
    }

    /// Closes every worker's stdin and waits for it to shut down cleanly.
    async fn finish(self) -> Result<()> {
        for (mut child, stdin, _) in self.workers {
            drop(stdin);
            let status = child.wait().await?;
            if !status.success() {
                return Err(format!("a worker exited: {status}").into());
            }
        }
        Ok(())
    }
}

/// What one Redis node had spent, as read from `INFO cpu` and `INFO commandstats`.
#[derive(Clone, Copy, Default)]
struct Spent {
    cpu: f64,
    script_calls: f64,
    script_usec: f64,
    other_usec: f64,
}

impl Spent {
    async fn read(conn: &mut MultiplexedConnection) -> Result<Spent> {
        let info: String = redis::cmd("INFO")
            .arg("cpu")
            .arg("commandstats")
            .query_async(conn)
            .await?;
        let cpu = |name: &str| {
            info.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|value| value.trim().parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        let mut spent = Spent {
            cpu: cpu("used_cpu_sys") + cpu("used_cpu_user"),
            ..Spent::default()
        };
        for (command, calls, usec) in commandstats(&info) {
            if SCRIPT_COMMANDS.contains(&command) {
                spent.script_calls += calls;
                spent.script_usec += usec;
            } else {
                spent.other_usec += usec;
            }
        }
        Ok(spent)
    }

    fn since(self, before: Spent) -> Spent {
        Spent {
            cpu: self.cpu - before.cpu,
            script_calls: self.script_calls - before.script_calls,
            script_usec: self.script_usec - before.script_usec,
            other_usec: self.other_usec - before.other_usec,
        }
    }

    fn plus(self, other: Spent) -> Spent {
        Spent {
            cpu: self.cpu + other.cpu,
            script_calls: self.script_calls + other.script_calls,
            script_usec: self.script_usec + other.script_usec,
            other_usec: self.other_usec + other.other_usec,
        }
    }
}

/// What one phase measured: admitted calls per second, Redis CPU seconds per million calls.
#[derive(Clone, Copy)]
struct Measured {
    rate: f64,
    cpu_per_million: f64,
}

/// A phase not run: its figures print as `null`.
const UNMEASURED: Measured = Measured {
    rate: f64::NAN,
    cpu_per_million: f64::NAN,
};

/// Where a fleet runs: `standalone` or `cluster`, what its workers connect to, and a direct
/// connection to every node (for `INFO`).
struct Target {
    kind: &'static str,
    address: String,
    nodes: Vec<MultiplexedConnection>,
}

impl Target {
    async fn spent(&mut self) -> Result<Vec<Spent>> {
        let mut spent = Vec::with_capacity(self.nodes.len());
        for conn in &mut self.nodes {
            spent.push(Spent::read(conn).await?);
        }
        Ok(spent)
    }

    /// Runs every phase with a fresh fleet of `options.workers` workers and emits its figures,
    /// with ratios to `baseline` (the standalone figures) when given.
    async fn measure(
        &mut self,
        options: &Options,
        namespace: &str,
        baseline: Option<&[Measured; PHASES.len()]>,
    ) -> Result<[Measured; PHASES.len()]> {
        let seconds = options.seconds.to_string();
        let mut fleet = Fleet::start(
            options.workers,
            [self.kind, &self.address, namespace, &seconds],
        )
        .await?;
        let mut measured = [UNMEASURED; PHASES.len()];
        for (index, phase) in PHASES.into_iter().enumerate() {
            let before = self.spent().await?;
            let started = Instant::now();
            let (rate, calls, rejected) = fleet.run(phase).await?;
            let wall = started.elapsed().as_secs_f64();
            let per_node: Vec<Spent> = self
                .spent()
                .await?
                .into_iter()
                .zip(before)
                .map(|(after, before)| after.since(before))
                .collect();
            let total = per_node
                .iter()
                .fold(Spent::default(), |sum, s| sum.plus(*s));
            measured[index] = Measured {
                rate,
                cpu_per_million: total.cpu / calls * 1e6,
            };
            let mut fields = vec![
                ("calls_per_s", rate),
                ("rejected", rejected),
                ("redis_cpu_s_per_million_calls", total.cpu / calls * 1e6),
                ("redis_script_us_per_call", total.script_usec / calls),
                ("redis_other_command_us_per_call", total.other_usec / calls),
                ("scripts_per_call", total.script_calls / calls),
                ("redis_cores_busy", total.cpu / wall),
            ];
            if matches!(phase, Phase::BulkheadKeep) {
                // PHASES lists the phases in the order they are declared.
                let plain = measured[Phase::Bulkhead as usize];
                fields.push(("calls_ratio_to_plain", rate / plain.rate));
                fields.push((
                    "cpu_ratio_to_plain",
                    measured[index].cpu_per_million / plain.cpu_per_million,
                ));
            }
            if let Some(baseline) = baseline {
                fields.push(("ratio_to_standalone", rate / baseline[index].rate));
                fields.push((
                    "cpu_ratio_to_standalone",
                    measured[index].cpu_per_million / baseline[index].cpu_per_million,
                ));
            }
            let figure = format!("{}_{}", self.kind, phase.name());
            emit(&figure, &fields);
            if per_node.len() > 1 {
                for (shard, spent) in per_node.iter().enumerate() {
                    emit(
                        &format!("{figure}_shard"),
                        &[
                            ("shard", shard as f64),
                            ("cpu_s", spent.cpu),
                            ("cpu_share", spent.cpu / total.cpu),
                            ("script_share", spent.script_calls / total.script_calls),
                        ],
                    );
                }
            }
        }
        fleet.finish().await?;
        Ok(measured)
    }
}

async fn connect(url: &str) -> Result<MultiplexedConnection> {
    let client = redis::Client::open(url).map_err(|error| format!("{url}: {error}"))?;
    Ok(client
        .get_multiplexed_async_connection()
        .await
        .map_err(|error| format!("{url}: {error}"))?)
}

/// Three `redis-server` masters on free ports in a directory of their own, joined by
/// `redis-cli --cluster create`. Dropping it kills them and removes the directory.
struct Cluster {
    dir: PathBuf,
    nodes: Vec<(u16, std::process::Child)>,
}

impl Cluster {
    /// Why the cluster cannot be started here, if `redis-server` or `redis-cli` cannot run.
    fn unavailable() -> Option<String> {
        ["redis-server", "redis-cli"]
            .into_iter()
            .find_map(|tool| {
                match std::process::Command::new(tool)
                    .arg("--version")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                {
                    Ok(status) if status.success() => None,
                    Ok(status) => Some(format!("`{tool} --version` exited with {status}")),
                    Err(error) => Some(format!("cannot run {tool}: {error}")),
                }
            })
    }

    async fn start() -> Result<Cluster> {
        let dir = std::env::temp_dir().join(format!("caracal-fleet-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let mut cluster = Cluster {
            dir,
            nodes: Vec::new(),
        };
        // A client port and a cluster-bus port per node, all free at once (so all distinct).
        let listeners = (0..2 * MASTERS)
            .map(|_| TcpListener::bind("127.0.0.1:0"))
            .collect::<Result<Vec<_>, _>>()?;
        let ports = listeners
            .iter()
            .map(|listener| Ok(listener.local_addr()?.port()))
            .collect::<Result<Vec<u16>, std::io::Error>>()?;
        drop(listeners);
        for pair in ports.chunks(2) {
            let (port, bus) = (pair[0].to_string(), pair[1].to_string());
            let child = std::process::Command::new("redis-server")
                .args([
                    "--port",
                    &port,
                    "--cluster-port",
                    &bus,
                    "--bind",
                    "127.0.0.1",
                ])
                .args(["--cluster-enabled", "yes", "--cluster-config-file"])
                .arg(format!("nodes-{port}.conf"))
                .args(["--save", "", "--appendonly", "no", "--dir"])
                .arg(&cluster.dir)
                .arg("--logfile")
                .arg(cluster.dir.join(format!("{port}.log")))
                .stdout(Stdio::null())
                .spawn()?;
            cluster.nodes.push((pair[0], child));
        }
        let deadline = Instant::now() + CLUSTER_START;
        for url in cluster.urls() {
            while connect(&url).await.is_err() {
                if Instant::now() > deadline {
                    return Err(format!("{url} did not answer; see {:?}", cluster.dir).into());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let created = tokio::process::Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(
                cluster
                    .nodes
                    .iter()
                    .map(|(port, _)| format!("127.0.0.1:{port}")),
            )
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .await?;
        if !created.status.success() {
            return Err(format!(
                "redis-cli --cluster create failed ({}): {}{}",
                created.status,
                String::from_utf8_lossy(&created.stdout),
                String::from_utf8_lossy(&created.stderr)
            )
            .into());
        }
        for url in cluster.urls() {
            let mut conn = connect(&url).await?;
            loop {
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query_async(&mut conn)
                    .await?;
                if info.lines().any(|line| line.trim() == "cluster_state:ok") {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(format!("{url} never reached cluster_state:ok:\n{info}").into());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(cluster)
    }

    fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|(port, _)| format!("redis://127.0.0.1:{port}"))
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for (_, child) in &mut self.nodes {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A target of `kind` whose workers connect to `urls`, with a connection to every node (for
/// `INFO`).
async fn target(kind: &'static str, urls: Vec<String>) -> Result<Target> {
    let mut nodes = Vec::with_capacity(urls.len());
    for url in &urls {
        nodes.push(connect(url).await?);
    }
    Ok(Target {
        kind,
        address: urls.join(","),
        nodes,
    })
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("worker") {
        return worker(&args[1..]).await;
    }
    let options = match Options::parse(&args) {
        Ok(options) => options,
        Err(error) => {
            eprintln!("{error}\n{USAGE}");
            std::process::exit(2);
        }
    };
    let cores = std::thread::available_parallelism().map_or(1, NonZero::get);
    emit(
        "setup",
        &[
            ("workers", options.workers as f64),
            ("tasks_per_worker", TASKS as f64),
            ("scopes", SCOPES as f64),
            ("limit", f64::from(LIMIT)),
            ("seconds", options.seconds as f64),
            ("cores", cores as f64),
        ],
    );
    let namespace = format!("fleet-bench:{}", std::process::id());
    let standalone = target("standalone", vec![redis_url()])
        .await?
        .measure(&options, &namespace, None)
        .await?;
    let skipped = if options.cluster {
        Cluster::unavailable()
    } else {
        Some("--no-cluster".to_owned())
    };
    let cluster = match skipped {
        Some(reason) => {
            emit_text("cluster_skipped", &[("reason", &reason)]);
            None
        }
        None => {
            let cluster = Cluster::start().await?;
            let measured = target("cluster", cluster.urls())
                .await?
                .measure(&options, &namespace, Some(&standalone))
                .await?;
            drop(cluster);
            Some(measured)
        }
    };
    let cluster = cluster.unwrap_or([UNMEASURED; PHASES.len()]);
    let mut fields = vec![("workers", options.workers as f64), ("cores", cores as f64)];
    let names: Vec<[String; 3]> = PHASES
        .iter()
        .map(|phase| {
            let name = phase.name();
            [
                format!("standalone_{name}_calls_per_s"),
                format!("cluster_{name}_calls_per_s"),
                format!("cluster_to_standalone_{name}"),
            ]
        })
        .collect();
    for ((names, standalone), cluster) in names.iter().zip(standalone).zip(cluster) {
        fields.push((&names[0], standalone.rate));
        fields.push((&names[1], cluster.rate));
        fields.push((&names[2], cluster.rate / standalone.rate));
    }
    emit("summary", &fields);
    Ok(())
}
