//! The chaos soak: worker processes share one distributed bulkhead (limit 3, lease 1 s)
//! through a fault proxy while the orchestrator kills them (SIGKILL), freezes them past their
//! lease (SIGSTOP), partitions them from Redis and restarts Redis without persistence. A
//! ledger on a separate Redis records, on its own clock, which bodies were running at once.
//! The last task of each worker calls a second bulkhead, the same but keeping leases (`keep =
//! "5ms"`: a finished body's lease serves the next call of the process without a round trip),
//! with a ledger of its own: a kept lease must count in the fleet as a running body's does,
//! through every fault. One such task per worker, four for three slots, backing off for a
//! while after a refusal: a refusal anywhere returns every kept lease of the identity and
//! keeps none for 100 ms, so a crowd retrying at once would keep nothing at all; this way the
//! fleet is contended now and then and keeps and hands on leases in between.
//!
//! ```text
//! caracal-soak [SECONDS] [--workers N] [--tasks N]
//! ```
//!
//! It prints what it saw and exits non-zero on any violation the library must prevent:
//! more than `limit` bodies at once unless one of them belonged to a process frozen past its
//! lease (the inherent limit of leases, which fencing tokens cover), a call that hung, a lease
//! left behind after every worker exited, an error a caller should never see.
//!
//! The same binary is the worker (`caracal-soak worker …`), so the soak is one build.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use caracal::bulkhead;
use caracal::metrics::BULKHEAD_KEPT_LEASES_TOTAL;
use caracal_tests::ledger::{AsyncLedger, Ledger, LongBody, Violation, pid_of};
use caracal_tests::metrics::MetricsLog;
use caracal_tests::{FaultProxy, RedisServer};

/// The bulkhead under test, as the soak's workers share it.
const LIMIT: u64 = 3;
const LEASE: Duration = Duration::from_secs(1);
/// A call that has not ended after this long is hung: an admission ends within the command
/// timeout, a body within its hold, a lost lease within the lease; a freeze (SIGSTOP) lasts
/// [`FREEZE`].
const HUNG_AFTER: Duration = Duration::from_secs(10);
/// How long a frozen worker stays frozen: past the lease, so another holder takes its slot.
const FREEZE: Duration = Duration::from_millis(1_800);
/// How long a partition lasts: past the lease, so partitioned holders must give up.
const PARTITION: Duration = Duration::from_secs(2);
/// The calm after each fault, so the next one starts from a recovered fleet.
const CALM: Duration = Duration::from_millis(2_500);
const COMMAND_TIMEOUT: &str = "250ms";
/// How long a thawed process may take to notice its lease is gone and drop its body: until
/// then, its body still counts as frozen.
const THAW_GRACE: Duration = Duration::from_millis(200);

#[derive(Debug)]
enum SoakError {
    Caracal(caracal::Error),
}

impl From<caracal::Error> for SoakError {
    fn from(error: caracal::Error) -> Self {
        SoakError::Caracal(error)
    }
}

/// The name of the bulkhead that keeps leases, as its metrics label it.
const KEPT: &str = "soak-kept";

/// A guarded body: it enters the ledger, works for `hold`, and leaves (cancelled by a lost
/// lease, it leaves when dropped).
async fn work(ledger: &AsyncLedger, id: &str, hold: Duration) -> Result<(), SoakError> {
    let entered = ledger.enter(id);
    tokio::time::sleep(hold).await;
    entered.leave();
    Ok(())
}

/// [`work`] on a lease of its own per body.
#[bulkhead(name = "soak", limit = 3, lease = "1s", scope = scope)]
async fn body(
    scope: &str,
    ledger: &AsyncLedger,
    id: &str,
    hold: Duration,
) -> Result<(), SoakError> {
    work(ledger, id, hold).await
}

/// [`work`] on a lease the process may have kept from an earlier body ([`KEPT`]).
#[bulkhead(name = "soak-kept", limit = 3, lease = "1s", keep = "5ms", scope = scope)]
async fn kept_body(
    scope: &str,
    ledger: &AsyncLedger,
    id: &str,
    hold: Duration,
) -> Result<(), SoakError> {
    work(ledger, id, hold).await
}

/// Outcomes counted by a worker.
#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    full: AtomicU64,
    lease_lost: AtomicU64,
    unavailable: AtomicU64,
    other: AtomicU64,
    hung: AtomicU64,
    in_flight: AtomicU64,
}

impl Tally {
    fn line(&self, kind: &str) -> String {
        let get = |counter: &AtomicU64| counter.load(Ordering::SeqCst);
        // What the keeping bulkhead did with its leases, as its metrics count it: the soak
        // shows that kept leases were handed on, not only that nothing overlapped.
        let leases = |outcome| {
            MetricsLog::global().counter(
                BULKHEAD_KEPT_LEASES_TOTAL,
                &[("name", KEPT), ("outcome", outcome)],
            )
        };
        format!(
            "{kind} ok={} bulkhead_full={} lease_lost={} coordinator_unavailable={} other={} \
             hung={} in_flight={} kept={} reused={} returned={}",
            get(&self.ok),
            get(&self.full),
            get(&self.lease_lost),
            get(&self.unavailable),
            get(&self.other),
            get(&self.hung),
            get(&self.in_flight),
            leases("kept"),
            leases("reused"),
            leases("returned"),
        )
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// One worker process: `tasks` tasks calling the bulkhead until stdin closes, a status line
/// every 200 ms and a final one at the end.
async fn worker(options: &HashMap<String, String>) {
    let get = |key: &str| {
        options
            .get(key)
            .cloned()
            .unwrap_or_else(|| panic!("{key}="))
    };
    let tasks: usize = get("tasks").parse().expect("tasks");
    // Installed before the first call, so every kept lease is counted.
    MetricsLog::global();
    // The server may be restarting when a worker is (re)spawned: keep trying.
    let coordinator = loop {
        match caracal::Coordinator::from_env().await {
            Ok(coordinator) => break coordinator,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    let ledger_name = get("ledger_name");
    let ledger =
        AsyncLedger::connect_logging_longer_than(&get("ledger"), &ledger_name, LIMIT, LEASE);
    let kept_ledger = AsyncLedger::connect_logging_longer_than(
        &get("ledger"),
        &kept_ledger_name(&ledger_name),
        LIMIT,
        LEASE,
    );
    let scope = get("scope");
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(tokio::sync::Notify::new());
    let stopping = Arc::new(std::sync::atomic::AtomicBool::new(false));
    std::thread::spawn({
        let (stop, stopping) = (Arc::clone(&stop), Arc::clone(&stopping));
        move || {
            let mut sink = String::new();
            while std::io::stdin().read_line(&mut sink).is_ok_and(|n| n > 0) {}
            stopping.store(true, Ordering::SeqCst);
            stop.notify_waiters();
        }
    });
    let pid = std::process::id();
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let (coordinator, scope) = (coordinator.clone(), scope.clone());
            let keeps = task + 1 == tasks;
            let ledger = if keeps { &kept_ledger } else { &ledger }.clone();
            let (tally, stopping) = (Arc::clone(&tally), Arc::clone(&stopping));
            tokio::spawn(coordinator.scoped(async move {
                let mut seq = 0u64;
                while !stopping.load(Ordering::SeqCst) {
                    seq += 1;
                    let id = format!("{pid}-{task}-{seq}");
                    // Mostly short bodies; some long enough to need renewals and to be caught
                    // by a fault.
                    let hold = if rand::random_range(0..100) < 15 {
                        Duration::from_millis(rand::random_range(1_500..3_000))
                    } else {
                        Duration::from_millis(rand::random_range(5..40))
                    };
                    tally.in_flight.fetch_add(1, Ordering::SeqCst);
                    let started = Instant::now();
                    let result = if keeps {
                        kept_body(&scope, &ledger, &id, hold).await
                    } else {
                        body(&scope, &ledger, &id, hold).await
                    };
                    tally.in_flight.fetch_sub(1, Ordering::SeqCst);
                    if started.elapsed() > HUNG_AFTER {
                        tally.hung.fetch_add(1, Ordering::SeqCst);
                    }
                    let counter = match &result {
                        Ok(()) => &tally.ok,
                        Err(SoakError::Caracal(caracal::Error::BulkheadFull { .. })) => &tally.full,
                        Err(SoakError::Caracal(caracal::Error::LeaseLost { .. })) => {
                            &tally.lease_lost
                        }
                        Err(SoakError::Caracal(caracal::Error::CoordinatorUnavailable {
                            ..
                        })) => &tally.unavailable,
                        Err(SoakError::Caracal(other)) => {
                            eprintln!("soak worker {pid}: unexpected error: {other}");
                            &tally.other
                        }
                    };
                    counter.fetch_add(1, Ordering::SeqCst);
                    if result.is_err() {
                        // Past the 100 ms a refusal stops the fleet keeping (see the top).
                        let pause = if keeps { 100..300 } else { 0..20 };
                        tokio::time::sleep(Duration::from_millis(rand::random_range(pause))).await;
                    }
                }
            }))
        })
        .collect();
    say("ready");
    let status = {
        let tally = Arc::clone(&tally);
        tokio::spawn(async move {
            loop {
                say(&tally.line("status"));
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    stop.notified().await;
    let finished = tokio::time::timeout(HUNG_AFTER, futures_join(handles)).await;
    status.abort();
    coordinator.shutdown().await;
    if finished.is_err() {
        tally
            .hung
            .fetch_add(tally.in_flight.load(Ordering::SeqCst), Ordering::SeqCst);
    }
    say(&tally.line("final"));
}

/// The ledger of the bulkhead that keeps leases, beside the plain one's `name`.
fn kept_ledger_name(name: &str) -> String {
    format!("{name}-kept")
}

async fn futures_join(handles: Vec<tokio::task::JoinHandle<()>>) {
    for handle in handles {
        let _ = handle.await;
    }
}

/// A worker process as the orchestrator sees it.
/// What runs a worker: this binary. On Linux, as the running file itself, so that a rebuild
/// during a long soak (which replaces the file at its path) neither fails nor changes the
/// workers respawned after it.
fn own_binary() -> std::path::PathBuf {
    if cfg!(target_os = "linux") {
        std::path::PathBuf::from("/proc/self/exe")
    } else {
        std::env::current_exe().expect("own path")
    }
}

struct Worker {
    child: Child,
    /// Its latest status (or final) line.
    last: Arc<Mutex<String>>,
}

impl Worker {
    fn spawn(redis_url: &str, args: &[String]) -> Self {
        let mut child = Command::new(own_binary())
            .arg("worker")
            .args(args)
            .env("CARACAL_REDIS_URL", redis_url)
            .env("CARACAL_COMMAND_TIMEOUT", COMMAND_TIMEOUT)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn a soak worker");
        let stdout = child.stdout.take().expect("worker stdout");
        let last = Arc::new(Mutex::new(String::new()));
        std::thread::spawn({
            let last = Arc::clone(&last);
            move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    *last.lock().unwrap_or_else(|e| e.into_inner()) = line;
                }
            }
        });
        Worker { child, last }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {}", self.pid());
    }

    fn counts(&self) -> HashMap<String, u64> {
        let line = self.last.lock().unwrap_or_else(|e| e.into_inner()).clone();
        line.split_whitespace()
            .filter_map(|field| {
                let (key, value) = field.split_once('=')?;
                Some((key.to_owned(), value.parse().ok()?))
            })
            .collect()
    }
}

/// When a process was frozen, on the ledger's clock.
struct Freeze {
    pid: u32,
    from_us: u64,
    to_us: u64,
}

/// How many of `violation`'s open bodies were running, not frozen: a body whose process was
/// frozen at that moment (or had just thawed, and had not yet dropped it) is inside its body but
/// takes no step — the inherent limit of leases, which only fencing covers. More than the limit
/// of *running* bodies is an overlap the library must prevent.
fn running(violation: &Violation, freezes: &[Freeze]) -> usize {
    let grace = THAW_GRACE.as_micros() as u64;
    let frozen = |(id, _): &(String, u64)| {
        freezes.iter().any(|freeze| {
            Some(freeze.pid) == pid_of(id)
                && freeze.from_us <= violation.at_us
                && violation.at_us <= freeze.to_us + grace
        })
    };
    violation.open.iter().filter(|body| !frozen(body)).count()
}

/// The bodies that completed though their process was frozen past their lease while they ran:
/// after the freeze they took a step with a lease they no longer had.
fn stepped_after_a_freeze(long: &[LongBody], freezes: &[Freeze]) -> Vec<LongBody> {
    let lease = LEASE.as_micros() as u64;
    long.iter()
        .filter(|body| {
            freezes.iter().any(|freeze| {
                Some(freeze.pid) == pid_of(&body.id)
                    && freeze.to_us - freeze.from_us > lease
                    && body.entered_us < freeze.from_us
                    && freeze.to_us < body.completed_us
            })
        })
        .cloned()
        .collect()
}

/// Live leases in every lease set of the server.
fn live_leases(conn: &mut redis::Connection) -> u64 {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("caracal:v1:*:leases")
        .query(conn)
        .expect("KEYS");
    let (seconds, _): (u64, u64) = redis::cmd("TIME").query(conn).expect("TIME");
    keys.iter()
        .map(|key| {
            redis::cmd("ZCOUNT")
                .arg(key)
                .arg(format!("({}", seconds * 1000))
                .arg("+inf")
                .query::<u64>(conn)
                .expect("ZCOUNT")
        })
        .sum()
}

/// Reads `ledger` (of the bulkhead `name`) and says what it saw: the most bodies at once,
/// every overlap the library must prevent, every body a holder frozen past its lease still
/// finished. Whether there was any of the last two.
fn overlaps(name: &str, ledger: &mut Ledger, freezes: &[Freeze]) -> bool {
    let violations = ledger.violations();
    let (real, inherent): (Vec<_>, Vec<_>) = violations
        .into_iter()
        .partition(|violation| running(violation, freezes) > LIMIT as usize);
    let max_open = ledger.max_open() as usize;
    // Outside the violations, at most the limit ran; within them, what was not frozen.
    let max_running = real
        .iter()
        .chain(&inherent)
        .map(|violation| running(violation, freezes))
        .fold(max_open.min(LIMIT as usize), usize::max);
    println!(
        "concurrency ({name}): max witnessed={} (limit {LIMIT}); max running, not counting \
         holders frozen past their lease={}; over the limit {} times only with a frozen holder \
         (inherent), {} times otherwise",
        max_open,
        max_running,
        inherent.len(),
        real.len(),
    );
    for violation in &real {
        println!(
            "  violation at {} µs: {:?}",
            violation.at_us, violation.open
        );
    }
    let stepped = stepped_after_a_freeze(&ledger.long_bodies(), freezes);
    println!(
        "holders frozen past their lease that still finished their body ({name}): {}",
        stepped.len()
    );
    for body in &stepped {
        println!("  {body:?}");
    }
    !real.is_empty() || !stepped.is_empty()
}

/// How long a soak runs before it must have handed on a kept lease (the short form in
/// `scripts/test` hands on about one a second).
const KEEPING_TESTED_AFTER_SECONDS: u64 = 60;

fn orchestrate(seconds: u64, workers: usize, tasks: usize) -> ExitCode {
    let mut server = RedisServer::start();
    let ledger_server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    // The plain bulkhead's first: it places the freezes on the ledgers' clock.
    let mut ledgers = ["soak".to_owned(), kept_ledger_name("soak")]
        .map(|name| (Ledger::new(&ledger_server.url(), &name), name));
    let args = [
        format!("tasks={tasks}"),
        format!("ledger={}", ledger_server.url()),
        "ledger_name=soak".to_owned(),
        format!("scope=soak-{}", std::process::id()),
    ];
    let mut fleet: Vec<Worker> = (0..workers)
        .map(|_| Worker::spawn(&proxy.url(), &args))
        .collect();
    let mut finished: Vec<HashMap<String, u64>> = Vec::new();
    let mut freezes = Vec::new();
    let mut faults: HashMap<&str, u64> = HashMap::new();
    println!(
        "soak: {seconds} s, {workers} workers x {tasks} tasks (the last keeping leases for \
         5 ms), limit {LIMIT}, lease {LEASE:?}, command timeout {COMMAND_TIMEOUT}"
    );
    let end = Instant::now() + Duration::from_secs(seconds);
    let plan = ["sigkill", "sigstop", "partition", "restart"];
    let mut round = 0usize;
    std::thread::sleep(CALM.min(Duration::from_secs(seconds)));
    while Instant::now() + CALM < end {
        let fault = plan[round % plan.len()];
        let target = round % fleet.len();
        round += 1;
        *faults.entry(fault).or_default() += 1;
        match fault {
            "sigkill" => {
                let victim = &mut fleet[target];
                victim.signal("KILL");
                let _ = victim.child.wait();
                for (ledger, _) in &mut ledgers {
                    ledger.close_process(victim.pid());
                }
                finished.push(victim.counts());
                fleet[target] = Worker::spawn(&proxy.url(), &args);
            }
            "sigstop" => {
                let victim = &fleet[target];
                let from_us = ledgers[0].0.now_us();
                victim.signal("STOP");
                std::thread::sleep(FREEZE);
                victim.signal("CONT");
                freezes.push(Freeze {
                    pid: victim.pid(),
                    from_us,
                    to_us: ledgers[0].0.now_us(),
                });
            }
            "partition" => {
                proxy.blackhole();
                std::thread::sleep(PARTITION);
                proxy.restore();
            }
            _ => server.restart(),
        }
        println!("soak: {fault}");
        std::thread::sleep(CALM);
    }
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(100));
    }

    // A clean stop: every worker finishes its calls, flushes its releases, reports.
    for worker in &mut fleet {
        drop(worker.child.stdin.take());
    }
    let mut unfinished = 0;
    for worker in &mut fleet {
        let deadline = Instant::now() + HUNG_AFTER * 2;
        while worker.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        if worker.child.try_wait().ok().flatten().is_none() {
            unfinished += 1;
            let _ = worker.child.kill();
            let _ = worker.child.wait();
        }
        // The final line comes after the process flushed it; let the reader thread catch up.
        std::thread::sleep(Duration::from_millis(50));
        finished.push(worker.counts());
    }
    // Every lease a killed worker left behind has expired by now; clean exits released theirs.
    std::thread::sleep(LEASE + Duration::from_millis(200));
    let leaked = live_leases(&mut server.connection());

    let mut totals: HashMap<String, u64> = HashMap::new();
    for counts in &finished {
        for (key, value) in counts {
            *totals.entry(key.clone()).or_default() += value;
        }
    }
    let total = |key: &str| totals.get(key).copied().unwrap_or(0);
    println!(
        "faults: sigkill={} sigstop={} partition={} restart={}",
        faults.get("sigkill").unwrap_or(&0),
        faults.get("sigstop").unwrap_or(&0),
        faults.get("partition").unwrap_or(&0),
        faults.get("restart").unwrap_or(&0),
    );
    println!(
        "calls: ok={} bulkhead_full={} lease_lost={} coordinator_unavailable={} other={}",
        total("ok"),
        total("bulkhead_full"),
        total("lease_lost"),
        total("coordinator_unavailable"),
        total("other"),
    );
    println!(
        "kept leases ({KEPT}): kept={} reused={} returned={}",
        total("kept"),
        total("reused"),
        total("returned"),
    );
    let mut overlapped = false;
    for (ledger, name) in &mut ledgers {
        overlapped |= overlaps(name, ledger, &freezes);
    }
    let hung = total("hung") + unfinished;
    println!("leaked leases: {leaked}; hung calls: {hung}");
    // A soak that handed on no kept lease did not test keeping. A short one may hand on only a
    // few (six in a 20 s run on Valkey): only a run of a minute or more is held to it.
    let untested = seconds >= KEEPING_TESTED_AFTER_SECONDS && total("reused") == 0;
    let failed =
        overlapped || leaked > 0 || hung > 0 || total("other") > 0 || total("ok") == 0 || untested;
    println!("soak: {}", if failed { "FAIL" } else { "PASS" });
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|a| a == "worker") {
        let options: HashMap<String, String> = args[1..]
            .iter()
            .filter_map(|arg| {
                let (key, value) = arg.split_once('=')?;
                Some((key.to_owned(), value.to_owned()))
            })
            .collect();
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(worker(&options));
        return ExitCode::SUCCESS;
    }
    let mut seconds = 60;
    let (mut workers, mut tasks) = (4, 8);
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let mut number = |name: &str| -> u64 {
            args.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{name} takes a number"))
        };
        match arg.as_str() {
            "--workers" => workers = number("--workers") as usize,
            "--tasks" => tasks = number("--tasks") as usize,
            other => {
                seconds = other.parse().unwrap_or_else(|_| {
                    panic!("usage: caracal-soak [SECONDS] [--workers N] [--tasks N]")
                })
            }
        }
    }
    orchestrate(seconds, workers, tasks)
}
