//! A worker process for the multi-process suites: one OS process of a "fleet", configured by
//! `CARACAL_REDIS_URL` / `CARACAL_NAMESPACE` like a real service, running one scenario and
//! printing one `result key=value …` line.
//!
//! ```text
//! caracal-worker <scenario> key=value …
//! ```
//!
//! With `start=on-go` the worker connects, says `ready`, and waits for a line on stdin before
//! running its scenario.
//!
//! Concurrency is witnessed outside the process: bodies enter and leave an [`AsyncWitness`] on
//! a separate Redis (`witness=<url>` and `witness_key=<key>`).
//!
//! With `events=<name>,…` the worker prints caracal's events of those names as they happen,
//! one `event <name> key=value …` line each, and keeps track of the fleet overrides it has
//! applied (`config.applied`).
//! The `*-gauge` scenarios install a [`MetricsLog`] as the process's recorder and print a
//! gauge's value each time it changes, as `gauge value=N`: what an exporter in this process
//! would report. The `scrapes` scenario installs one too, and prints its series on request.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use caracal::{bulkhead, circuit_breaker, rate_limit, retry, retry_budget};
use caracal_tests::fenced;
use caracal_tests::ledger::AsyncLedger;
use caracal_tests::{AsyncWitness, MetricsLog};

mod fair;

#[derive(Debug)]
enum WorkerError {
    Caracal(caracal::Error),
    Downstream,
}

impl From<caracal::Error> for WorkerError {
    fn from(error: caracal::Error) -> Self {
        WorkerError::Caracal(error)
    }
}

/// Holds a witnessed section open for `hold`.
async fn witnessed(witness: &AsyncWitness, hold: Duration) {
    witness.enter().await;
    tokio::time::sleep(hold).await;
    witness.exit().await;
}

#[bulkhead(name = "mp-load", limit = 3, lease = "2s", scope = scope)]
async fn bulkhead_load(
    scope: &str,
    witness: &AsyncWitness,
    hold: Duration,
) -> Result<(), WorkerError> {
    witnessed(witness, hold).await;
    Ok(())
}

#[bulkhead(name = "mp-hold", limit = 1, lease = "2s", scope = scope)]
async fn bulkhead_hold(scope: &str) -> Result<(), WorkerError> {
    say("admitted");
    std::future::pending::<()>().await;
    Ok(())
}

/// The bulkhead of the cluster failover test (`cluster_faults`): lease 1 s, so the wait of
/// admissions after a loss of data (the grace, or the lease if shorter) is short beside what
/// the test waits for.
#[bulkhead(name = "cluster-promoted", limit = 1000, lease = "1s", scope = scope)]
async fn promoted(scope: &str) -> Result<(), WorkerError> {
    tokio::time::sleep(Duration::from_millis(1)).await;
    Ok(())
}

/// How calls on each of several scopes end, as it changes: `flip scope=<index> ok=<0|1>
/// ms=<wall clock> kind=<failure kind, or the error's code>`.
struct Flips {
    /// Per scope: whether its last call succeeded (`None` before its first call ended). A
    /// flip is printed under the lock, so the lines of one scope come in the order its calls
    /// ended.
    states: Vec<std::sync::Mutex<Option<bool>>>,
}

impl Flips {
    fn new(scopes: usize) -> Self {
        Flips {
            states: (0..scopes).map(|_| std::sync::Mutex::new(None)).collect(),
        }
    }

    /// Records how a call on scope `index` ended, printing a flip if that changed.
    fn record(&self, index: usize, result: &Result<(), WorkerError>) {
        let mut state = self.states[index].lock().expect("flip state");
        if *state == Some(result.is_ok()) {
            return;
        }
        *state = Some(result.is_ok());
        let kind = match result {
            Err(WorkerError::Caracal(caracal::Error::CoordinatorUnavailable { cause, .. })) => {
                cause.kind().as_str()
            }
            other => code(other),
        };
        say(&format!(
            "flip scope={index} ok={} ms={} kind={kind}",
            u8::from(result.is_ok()),
            now_ms()
        ));
    }
}

/// A holder recorded in a ledger, for the restart test: lease 1 s.
#[bulkhead(name = "mp-ledgered", limit = 1, lease = "1s", scope = scope)]
async fn ledgered(
    scope: &str,
    ledger: &AsyncLedger,
    id: &str,
    hold: Duration,
) -> Result<(), WorkerError> {
    let entered = ledger.enter(id);
    say("entered");
    tokio::time::sleep(hold).await;
    entered.leave();
    Ok(())
}

/// [`ledgered`] with the default 30 s lease: a test that sees callers admitted again within a
/// few seconds of a loss shows the grace at work, not the lease's expiry.
#[bulkhead(name = "mp-ledgered-long", limit = 1, scope = scope)]
async fn ledgered_long(
    scope: &str,
    ledger: &AsyncLedger,
    id: &str,
    hold: Duration,
) -> Result<(), WorkerError> {
    let entered = ledger.enter(id);
    say("entered");
    tokio::time::sleep(hold).await;
    entered.leave();
    Ok(())
}

/// Many tasks of a fleet on a bulkhead of 5, for the flush test: 30 s leases (no expiry
/// helps), waiting up to 200 ms for a slot.
#[bulkhead(name = "mp-ledger-loop", limit = 5, max_wait = "200ms", scope = scope)]
async fn ledgered_loop(scope: &str, ledger: &AsyncLedger, id: &str) -> Result<(), WorkerError> {
    let entered = ledger.enter(id);
    tokio::time::sleep(Duration::from_millis(20)).await;
    entered.leave();
    Ok(())
}

/// What a frozen holder would do: count a side effect once the parent has set `<key>:go`
/// (over a blocking connection, so the step is taken within the poll that finds the word), or
/// write to a fenced downstream, say `sent` after the pause and then hold on for the given time
/// (the write, once sent, is in the network's hands: its task is kept here so the process lives
/// until the write has landed, whatever became of the body).
enum Step {
    SideEffect(std::sync::Mutex<redis::Connection>, String),
    FencedWrite {
        conn: redis::aio::MultiplexedConnection,
        store: String,
        pause: Duration,
        hold: Duration,
        write: std::sync::Mutex<Option<tokio::task::JoinHandle<bool>>>,
    },
}

/// A holder that takes one step, for the frozen-holder and fencing tests: lease 300 ms, so a
/// freeze of a second outlives it.
#[bulkhead(name = "mp-frozen", limit = 1, lease = "300ms", scope = scope)]
async fn frozen_step(scope: &str, step: &Step) -> Result<(), WorkerError> {
    let fence = caracal::fencing_token().unwrap_or(0);
    say(&format!("admitted fence={fence}"));
    match step {
        Step::SideEffect(side, key) => {
            // The step waits for the parent's word, not for a time (a pause could end before a
            // loaded machine had delivered the parent's `SIGSTOP`, and the step was then taken
            // on a lease still held), and looks for it between short sleeps: the parent gives
            // it while the process is frozen, so as the process thaws the sleep is overdue
            // with the lease's timers, and the one poll they wake finds the word and steps.
            let go = format!("{key}:go");
            loop {
                tokio::time::sleep(Duration::from_millis(10)).await;
                let mut side = side.lock().expect("side connection");
                let said: bool = redis::cmd("EXISTS")
                    .arg(&go)
                    .query(&mut *side)
                    .expect("the parent's word");
                if said {
                    let _: u64 = redis::cmd("INCR")
                        .arg(key)
                        .query(&mut *side)
                        .expect("side effect");
                    break;
                }
            }
            say("stepped");
        }
        Step::FencedWrite {
            conn,
            store,
            pause,
            hold,
            write,
        } => {
            // Once the parent holds the link, the write leaves; the process is frozen while it
            // waits there.
            tokio::task::spawn_blocking(wait_for_go)
                .await
                .expect("wait for go");
            let sent = tokio::spawn({
                let (mut conn, store) = (conn.clone(), store.clone());
                async move { fenced::write(&mut conn, &store, fence).await }
            });
            *write.lock().expect("write slot") = Some(sent);
            tokio::time::sleep(*pause).await;
            say("sent");
            // Still running when the parent's `SIGSTOP` lands, however late a loaded machine
            // delivers it: a body that ended a pause after `sent` had often returned `Ok` by
            // then, its lease still held. Frozen past its lease, it ends when it thaws.
            tokio::time::sleep(*hold).await;
        }
    }
    Ok(())
}

/// Waits for the parent's `go` line on stdin.
fn wait_for_go() {
    read_line();
}

/// The next line on stdin, its line break included; empty once stdin is closed.
fn read_line() -> String {
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .expect("read a line from stdin");
    line
}

/// The code of a caracal error, `ok`, or `downstream`.
fn code(result: &Result<(), WorkerError>) -> &'static str {
    match result {
        Ok(()) => "ok",
        Err(WorkerError::Caracal(error)) => error.code(),
        Err(WorkerError::Downstream) => "downstream",
    }
}

/// A connection to `url` for a worker's own bookkeeping (not through the coordinator), patient
/// enough for a deliberately slow link.
async fn side_connection(url: &str) -> redis::aio::MultiplexedConnection {
    let config =
        redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(60)));
    redis::Client::open(url)
        .expect("side url")
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .expect("side connection")
}

/// The downstream behind the breakers: counts the call, holds a witnessed section if asked,
/// then succeeds or fails.
async fn downstream(
    fail: bool,
    witness: Option<&AsyncWitness>,
    ran: &AtomicU64,
) -> Result<(), WorkerError> {
    ran.fetch_add(1, Ordering::SeqCst);
    if let Some(witness) = witness {
        witnessed(witness, Duration::from_millis(100)).await;
    }
    if fail {
        Err(WorkerError::Downstream)
    } else {
        Ok(())
    }
}

#[circuit_breaker(name = "mp-breaker", scope = scope, minimum_throughput = 5, failure_threshold = 0.5,
                  open = "1s", half_open_probes = 2, half_open_successes = 3)]
async fn breaker_call(
    scope: &str,
    fail: bool,
    witness: Option<&AsyncWitness>,
    ran: &AtomicU64,
) -> Result<(), WorkerError> {
    downstream(fail, witness, ran).await
}

/// `breaker_call`'s breaker, watched: its outcomes are never recorded (they would dilute the
/// window another process fills with failures), only its admissions matter.
#[circuit_breaker(name = "mp-breaker", scope = scope, minimum_throughput = 5, failure_threshold = 0.5,
                  open = "1s", half_open_probes = 2, half_open_successes = 3, classify = unrecorded)]
async fn watch_call(scope: &str) -> Result<(), WorkerError> {
    Ok(())
}

fn unrecorded(_: &Result<(), WorkerError>) -> caracal::Outcome {
    caracal::Outcome::Ignored
}

/// Like `breaker_call`, but recovery needs more successes than a test window holds: while it
/// is half-open, every body that runs is a probe.
#[circuit_breaker(name = "mp-probes", scope = scope, minimum_throughput = 5, failure_threshold = 0.5,
                  open = "1s", half_open_probes = 2, half_open_successes = 10000)]
async fn probe_only(
    scope: &str,
    fail: bool,
    witness: Option<&AsyncWitness>,
    ran: &AtomicU64,
) -> Result<(), WorkerError> {
    downstream(fail, witness, ran).await
}

/// The attempts the retry-budget storm's downstream saw, per 100 ms of the host's clock (which
/// every process of the fleet reads alike): first attempts and retries.
#[derive(Default)]
struct Slots(Mutex<BTreeMap<u128, [u64; 2]>>);

impl Slots {
    fn count(&self, retry: bool) {
        let mut slots = self.0.lock().expect("slots");
        slots.entry(now_ms() / 100).or_default()[usize::from(retry)] += 1;
    }

    /// `slot:first:retries` for every slot, space-separated.
    fn report(&self) -> String {
        let slots = self.0.lock().expect("slots");
        slots
            .iter()
            .map(|(slot, [first, retries])| format!("{slot}:{first}:{retries}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// The downstream of the retry-budget storm: every attempt is counted here (what the
/// downstream sees), and fails unless it is one of the `ok_per_20` in 20 that succeed.
#[retry_budget(name = "mp-budget", percent = 20, min_per_second = 10, window = "2s",
               scope = scope)]
#[retry(max_attempts = 4)]
async fn budget_storm(
    scope: &str,
    ok_per_20: u64,
    seen: &AtomicU64,
    this_call: &AtomicU64,
    slots: &Slots,
) -> Result<(), WorkerError> {
    let attempt = seen.fetch_add(1, Ordering::SeqCst);
    slots.count(this_call.fetch_add(1, Ordering::SeqCst) > 0);
    tokio::time::sleep(Duration::from_millis(1)).await;
    if attempt % 20 < ok_per_20 {
        Ok(())
    } else {
        Err(WorkerError::Downstream)
    }
}

/// The bulkhead whose series the `scrapes` scenario prints (the dashboards suite runs the alert
/// rules on them).
#[bulkhead(name = "rules-fleet-db", limit = 4, scope = scope)]
async fn rules_fleet_db(scope: &str) -> Result<(), WorkerError> {
    Ok(())
}

#[rate_limit(name = "mp-rate-50", rate = 50, burst = 5, scope = scope)]
async fn rate_50(scope: &str) -> Result<(), WorkerError> {
    Ok(())
}

#[rate_limit(name = "mp-rate-700", rate = 700, burst = 5, scope = scope)]
async fn rate_700(scope: &str) -> Result<(), WorkerError> {
    Ok(())
}

#[rate_limit(name = "mp-rate-700-prefetch", rate = 700, burst = 5, prefetch = 4, scope = scope)]
async fn rate_700_prefetch(scope: &str) -> Result<(), WorkerError> {
    Ok(())
}

/// The breaker `caracal breaker` steers in the CLI suite: its body always succeeds and says it
/// ran.
#[circuit_breaker(name = "cli-breaker", scope = scope, open = "1s", half_open_probes = 2,
                  half_open_successes = 2)]
async fn cli_breaker(scope: &str, ran: &AtomicBool) -> Result<(), WorkerError> {
    ran.store(true, Ordering::SeqCst);
    Ok(())
}

/// The bulkhead whose limit `caracal config set` changes in the CLI suite.
#[bulkhead(name = "cli-config", limit = 3, lease = "2s", scope = scope)]
async fn cli_config(
    scope: &str,
    witness: &AsyncWitness,
    hold: Duration,
) -> Result<(), WorkerError> {
    witnessed(witness, hold).await;
    Ok(())
}

/// `top`'s load: a bulkhead every call passes, and a rate limit that turns most away.
#[bulkhead(name = "top-load", limit = 1000, scope = scope)]
async fn top_load(scope: &str) -> Result<(), WorkerError> {
    Ok(())
}

#[rate_limit(name = "top-limited", rate = 10, burst = 1, scope = scope)]
async fn top_limited(scope: &str) -> Result<(), WorkerError> {
    Ok(())
}

/// `top-limited` in shadow mode: what it would turn away runs, counted as `would_reject`.
#[rate_limit(name = "top-shadow", rate = 10, burst = 1, scope = scope, shadow = true)]
async fn top_shadow(scope: &str) -> Result<(), WorkerError> {
    Ok(())
}

/// One bulkhead used with two limits (a worker argument picks which): drift.
#[bulkhead(name = "cli-status", limit = 2, scope = scope)]
async fn cli_status_2(scope: &str) -> Result<(), WorkerError> {
    Ok(())
}

#[bulkhead(name = "cli-status", limit = 4, scope = scope)]
async fn cli_status_4(scope: &str) -> Result<(), WorkerError> {
    Ok(())
}

/// A slot held for as long as the worker lives: occupancy to see.
#[bulkhead(name = "cli-status-held", limit = 5, lease = "2s", scope = scope)]
async fn cli_status_held(scope: &str) -> Result<(), WorkerError> {
    say("holding");
    std::future::pending::<()>().await;
    Ok(())
}

#[circuit_breaker(name = "cli-status-breaker", scope = scope)]
async fn cli_status_breaker(scope: &str) -> Result<(), WorkerError> {
    Ok(())
}

#[rate_limit(name = "cli-status-rate", rate = 100, burst = 7, scope = scope)]
async fn cli_status_rate(scope: &str) -> Result<(), WorkerError> {
    Ok(())
}

/// The latest fleet-override version this process has applied (its `config.applied` events).
/// The event comes once the overrides are in force, so a call that reads this version and
/// then starts uses them.
static APPLIED: AtomicU64 = AtomicU64::new(0);

/// Prints caracal's events named in `events=` as they happen, and records `config.applied`.
struct PrintEvents {
    names: Vec<String>,
}

impl PrintEvents {
    fn install(names: &str) {
        use tracing_subscriber::layer::SubscriberExt;
        let names = names.split(',').map(str::to_owned).collect();
        let subscriber = tracing_subscriber::registry().with(PrintEvents { names });
        tracing::subscriber::set_global_default(subscriber).expect("the worker's subscriber");
    }

    /// caracal's events at info and above: every event printed is among them, and the
    /// debug ones a hot loop emits are never built.
    fn wanted(metadata: &tracing::Metadata<'_>) -> bool {
        metadata.target() == "caracal" && *metadata.level() <= tracing::Level::INFO
    }
}

#[derive(Default)]
struct Fields(BTreeMap<String, String>);

impl tracing::field::Visit for Fields {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for PrintEvents {
    fn register_callsite(
        &self,
        metadata: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        if Self::wanted(metadata) {
            tracing::subscriber::Interest::always()
        } else {
            tracing::subscriber::Interest::never()
        }
    }

    fn enabled(
        &self,
        metadata: &tracing::Metadata<'_>,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        Self::wanted(metadata)
    }

    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let Some(name) = fields.0.remove("event") else {
            return;
        };
        if name == "config.applied"
            && let Some(version) = fields.0.get("version").and_then(|v| v.parse().ok())
        {
            APPLIED.fetch_max(version, Ordering::AcqRel);
        }
        if self.names.contains(&name) {
            let pairs: Vec<String> = fields
                .0
                .iter()
                .map(|(key, value)| format!("{key}={}", value.replace(' ', "_")))
                .collect();
            say(&format!("event {name} {}", pairs.join(" ")));
        }
    }
}

fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros())
}

/// Prints one line to stdout right away (the parent reads lines as they come).
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// Counts of how calls ended.
#[derive(Default)]
struct Tally {
    admitted: AtomicU64,
    rejected: AtomicU64,
    errors: AtomicU64,
}

impl Tally {
    fn count(&self, result: &Result<(), WorkerError>) {
        let counter = match result {
            Ok(()) | Err(WorkerError::Downstream) => &self.admitted,
            Err(WorkerError::Caracal(
                caracal::Error::BulkheadFull { .. }
                | caracal::Error::CircuitOpen { .. }
                | caracal::Error::RateLimited { .. },
            )) => &self.rejected,
            Err(WorkerError::Caracal(other)) => {
                eprintln!("worker: unexpected error: {other}");
                &self.errors
            }
        };
        counter.fetch_add(1, Ordering::SeqCst);
    }

    fn report(&self, extra: &str) {
        say(&format!(
            "result admitted={} rejected={} errors={}{extra}",
            self.admitted.load(Ordering::SeqCst),
            self.rejected.load(Ordering::SeqCst),
            self.errors.load(Ordering::SeqCst),
        ));
    }
}

/// Prints `gauge value=N` whenever `read` gives a new value (`none` while it has none), every
/// few milliseconds until `until`.
async fn report_gauge(until: Instant, read: impl Fn() -> Option<f64>) {
    let mut last = None;
    while Instant::now() < until {
        let value = read().map_or_else(|| "none".to_owned(), |value| value.to_string());
        if last.as_ref() != Some(&value) {
            say(&format!("gauge value={value}"));
            last = Some(value);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// How long a worker that stops on a count keeps going at most: a liveness bound only (the
/// parent fails when the count was not reached).
const COUNT_CAP: Duration = Duration::from_secs(90);

/// Runs `tasks` tasks calling `call` until `enough` says so or `until` has come.
async fn load<F, Fut>(
    tasks: usize,
    until: Instant,
    enough: impl Fn(&Tally) -> bool + Send + Sync + 'static,
    call: F,
) -> Arc<Tally>
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), WorkerError>> + Send,
{
    let tally = Arc::new(Tally::default());
    let call = Arc::new(call);
    let enough = Arc::new(enough);
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let (tally, call, enough) =
                (Arc::clone(&tally), Arc::clone(&call), Arc::clone(&enough));
            tokio::spawn(async move {
                while Instant::now() < until && !enough(&tally) {
                    tally.count(&call().await);
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    for handle in handles {
        handle.await.expect("worker task");
    }
    tally
}

/// Runs `tasks` tasks until `until`, task `t` calling `call(t)` over and over and pausing a
/// little after a failure (a call turned away fails at once), and waits for them all.
async fn call_until<F, Fut>(tasks: usize, until: Instant, call: F)
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), WorkerError>> + Send,
{
    let call = Arc::new(call);
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let call = Arc::clone(&call);
            tokio::spawn(async move {
                while Instant::now() < until {
                    if call(task).await.is_err() {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            })
        })
        .collect();
    for handle in handles {
        handle.await.expect("worker task");
    }
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let scenario = args
        .next()
        .expect("usage: caracal-worker <scenario> key=value …");
    let options: HashMap<String, String> = args
        .filter_map(|arg| {
            arg.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
        })
        .collect();
    let get = |key: &str| {
        options
            .get(key)
            .cloned()
            .unwrap_or_else(|| panic!("missing {key}="))
    };
    let number = |key: &str| {
        get(key)
            .parse::<u64>()
            .unwrap_or_else(|e| panic!("{key}: {e}"))
    };
    // Load runs for `millis`, or until a count given instead is reached.
    let until = || match options.get("millis") {
        Some(_) => Instant::now() + Duration::from_millis(number("millis")),
        None => Instant::now() + COUNT_CAP,
    };
    let count = |key: &str| options.get(key).map_or(u64::MAX, |_| number(key));

    // Before the coordinator: connecting applies the fleet's overrides (`config.applied`).
    if let Some(names) = options.get("events") {
        PrintEvents::install(names);
    }
    // Before the coordinator is made: what it reports from its start is recorded.
    let metrics = (scenario.ends_with("-gauge") || scenario == "scrapes").then(MetricsLog::global);

    let coordinator = caracal::Coordinator::from_env().await.expect("coordinator");
    caracal::install(coordinator.clone()).expect("install");
    let scope = get("scope");
    let witness = match options.get("witness") {
        Some(url) => Some(Arc::new(
            AsyncWitness::connect(url, &get("witness_key"), number("limit")).await,
        )),
        None => None,
    };
    say("ready");
    // `start=on-go`: started ahead of time, the scenario waits for a line on stdin, so it runs
    // the moment the parent says so rather than a process start later.
    if options.get("start").is_some_and(|s| s == "on-go") {
        wait_for_go();
    }

    match scenario.as_str() {
        "bulkhead-load" => {
            let witness = witness.expect("witness=");
            let admissions = count("admissions");
            let enough = move |tally: &Tally| tally.admitted.load(Ordering::SeqCst) >= admissions;
            let tally = load(number("tasks") as usize, until(), enough, move || {
                let (scope, witness) = (scope.clone(), Arc::clone(&witness));
                async move { bulkhead_load(&scope, &witness, Duration::from_millis(3)).await }
            })
            .await;
            // Flush the releases still in flight before the process exits.
            coordinator.shutdown().await;
            tally.report("");
        }
        "shards-load" => {
            // `scope=` lists the scopes (comma-separated); task `t` calls scope `t % n`.
            let scopes: Arc<Vec<String>> = Arc::new(scope.split(',').map(str::to_owned).collect());
            let flips = Arc::new(Flips::new(scopes.len()));
            call_until(number("tasks") as usize, until(), move |task| {
                let (scopes, flips) = (Arc::clone(&scopes), Arc::clone(&flips));
                async move {
                    let index = task % scopes.len();
                    let result = promoted(&scopes[index]).await;
                    flips.record(index, &result);
                    result
                }
            })
            .await;
            coordinator.shutdown().await;
            say("result");
        }
        "bulkhead-hold" => {
            let _ = bulkhead_hold(&scope).await;
        }
        "bulkhead-fair" => {
            if let Some(limit) = options.get("limit") {
                fair::limit(&coordinator, limit);
            }
            let millis = |key: &str| Duration::from_millis(number(key));
            let shape = fair::Shape {
                tasks: number("tasks") as usize,
                calls: count("calls"),
                hold: millis("hold_ms"),
                gap: millis("gap_ms"),
            };
            fair::run(&get("role"), &scope, shape).await;
            coordinator.shutdown().await;
        }
        "ledger-hold" | "ledger-take" => {
            let ledger = AsyncLedger::connect(&get("ledger"), &get("ledger_name"), 1);
            // A taker stops at `admissions=`, or at the end of `millis=`, whichever comes first.
            let (hold, wanted) = if scenario == "ledger-hold" {
                (Duration::from_millis(number("hold_ms")), 1)
            } else {
                (Duration::from_millis(5), count("admissions"))
            };
            let until = until();
            let long = options.get("lease").is_some_and(|lease| lease == "long");
            let pid = std::process::id();
            let (mut admitted, mut last, mut turned_away) = (0, "none", false);
            for attempt in 0.. {
                if admitted >= wanted || Instant::now() >= until {
                    break;
                }
                let id = format!("{pid}-{attempt}");
                let result = if long {
                    ledgered_long(&scope, &ledger, &id, hold).await
                } else {
                    ledgered(&scope, &ledger, &id, hold).await
                };
                last = code(&result);
                if result.is_ok() {
                    admitted += 1;
                } else if scenario == "ledger-hold" {
                    break;
                } else {
                    // Said once: the test knows the taker is at the door, not still starting.
                    if !turned_away {
                        turned_away = true;
                        say("turned away");
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            // `linger_ms=`: connected a while longer, to show the events that come after.
            if options.contains_key("linger_ms") {
                tokio::time::sleep(Duration::from_millis(number("linger_ms"))).await;
            }
            coordinator.shutdown().await;
            say(&format!("result code={last} admitted={admitted}"));
        }
        "ledger-loop" => {
            let ledger = Arc::new(AsyncLedger::connect(&get("ledger"), &get("ledger_name"), 5));
            let outcomes = Arc::new(Mutex::new(BTreeMap::<&'static str, u64>::new()));
            let next = Arc::new(AtomicU64::new(0));
            let calls = Arc::clone(&outcomes);
            call_until(number("tasks") as usize, until(), move |_| {
                let (scope, ledger) = (scope.clone(), Arc::clone(&ledger));
                let (outcomes, next) = (Arc::clone(&calls), Arc::clone(&next));
                async move {
                    let id = format!(
                        "{}-{}",
                        std::process::id(),
                        next.fetch_add(1, Ordering::Relaxed)
                    );
                    let result = ledgered_loop(&scope, &ledger, &id).await;
                    *outcomes
                        .lock()
                        .expect("outcomes")
                        .entry(code(&result))
                        .or_default() += 1;
                    result
                }
            })
            .await;
            coordinator.shutdown().await;
            let outcomes = outcomes.lock().expect("outcomes");
            let counts: Vec<String> = outcomes
                .iter()
                .map(|(code, n)| format!("{code}={n}"))
                .collect();
            say(&format!("result {}", counts.join(" ")));
        }
        "frozen-step" | "fenced-write" => {
            let step = if scenario == "frozen-step" {
                let side = redis::Client::open(get("side"))
                    .and_then(|client| client.get_connection())
                    .expect("side connection");
                Step::SideEffect(std::sync::Mutex::new(side), get("side_key"))
            } else {
                Step::FencedWrite {
                    conn: side_connection(&get("side")).await,
                    store: get("store"),
                    pause: Duration::from_millis(number("pause_ms")),
                    hold: Duration::from_millis(number("hold_ms")),
                    write: std::sync::Mutex::default(),
                }
            };
            let result = frozen_step(&scope, &step).await;
            coordinator.shutdown().await;
            say(&format!("result code={}", code(&result)));
            if let Step::FencedWrite { write, .. } = step {
                let sent = write.lock().expect("write slot").take();
                if let Some(sent) = sent {
                    let accepted = sent.await.expect("fenced write");
                    say(&format!("written accepted={}", u8::from(accepted)));
                }
            }
        }
        "breaker-fail" => {
            let tally = Tally::default();
            let ran = AtomicU64::new(0);
            let probes = options.get("breaker").is_some_and(|b| b == "probes");
            for _ in 0..number("calls") {
                let result = if probes {
                    probe_only(&scope, true, None, &ran).await
                } else {
                    breaker_call(&scope, true, None, &ran).await
                };
                tally.count(&result);
            }
            coordinator.shutdown().await;
            tally.report(&format!(" ran={}", ran.load(Ordering::SeqCst)));
        }
        "breaker-once" => {
            let tally = Tally::default();
            let ran = AtomicU64::new(0);
            let fail = options.get("fail").is_some_and(|v| v == "true");
            tally.count(&breaker_call(&scope, fail, None, &ran).await);
            coordinator.shutdown().await;
            tally.report(&format!(" ran={}", ran.load(Ordering::SeqCst)));
        }
        "breaker-probes" => {
            let fail = options.get("fail").is_some_and(|v| v == "true");
            let probes = options.get("breaker").is_some_and(|b| b == "probes");
            let ran = Arc::new(AtomicU64::new(0));
            let counted = Arc::clone(&ran);
            let runs = count("runs");
            let enough = {
                let ran = Arc::clone(&ran);
                move |_: &Tally| ran.load(Ordering::SeqCst) >= runs
            };
            let tally = load(number("tasks") as usize, until(), enough, move || {
                let (scope, witness, ran) = (scope.clone(), witness.clone(), Arc::clone(&ran));
                async move {
                    if probes {
                        probe_only(&scope, fail, witness.as_deref(), &ran).await
                    } else {
                        breaker_call(&scope, fail, witness.as_deref(), &ran).await
                    }
                }
            })
            .await;
            coordinator.shutdown().await;
            tally.report(&format!(" ran={}", counted.load(Ordering::SeqCst)));
        }
        "breaker-watch" => {
            // Calls every few ms until the first rejection. Says `watching` once admitted (its
            // view of the breaker is then fresh and closed), and reports when the last
            // admitted call started (wall-clock ms, comparable with the server's `TIME` on
            // this machine).
            let until = until();
            let (mut last_admitted, mut rejected) = (None, false);
            while Instant::now() < until {
                let started = now_ms();
                match watch_call(&scope).await {
                    Ok(()) => {
                        if last_admitted.is_none() {
                            say("watching");
                        }
                        last_admitted = Some(started);
                    }
                    Err(WorkerError::Caracal(caracal::Error::CircuitOpen { .. })) => {
                        rejected = true;
                        break;
                    }
                    Err(other) => panic!("watch call: {other:?}"),
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            say(&format!(
                "result rejected={} last_admitted_start_ms={}",
                u64::from(rejected),
                last_admitted.unwrap_or(0)
            ));
        }
        "rate-load" => {
            // Every process of the fleet starts at the same moment, then calls as a client
            // would: again right away when admitted, after the hinted wait when not.
            let start_at = UNIX_EPOCH + Duration::from_millis(number("start_at_ms"));
            if let Ok(wait) = start_at.duration_since(SystemTime::now()) {
                tokio::time::sleep(wait).await;
            }
            let first = now_ms();
            let rate = get("rate");
            let longest_hint = Arc::new(AtomicU64::new(0));
            let longest = Arc::clone(&longest_hint);
            let tally = load(
                number("tasks") as usize,
                until(),
                |_| false,
                move || {
                    let (scope, rate) = (scope.clone(), rate.clone());
                    let longest = Arc::clone(&longest);
                    async move {
                        let result = match rate.as_str() {
                            "50" => rate_50(&scope).await,
                            "700" => rate_700(&scope).await,
                            "700-prefetch" => rate_700_prefetch(&scope).await,
                            other => panic!("no rate-limited function for rate {other}"),
                        };
                        if let Err(WorkerError::Caracal(caracal::Error::RateLimited {
                            retry_after,
                            ..
                        })) = &result
                        {
                            let nanos = u64::try_from(retry_after.as_nanos()).unwrap_or(u64::MAX);
                            longest.fetch_max(nanos, Ordering::SeqCst);
                            tokio::time::sleep(*retry_after).await;
                        }
                        result
                    }
                },
            )
            .await;
            tally.report(&format!(
                " first_ms={first} last_ms={} longest_retry_after_ns={}",
                now_ms(),
                longest_hint.load(Ordering::SeqCst)
            ));
        }
        "budget-storm" => {
            // Every process starts at the same moment; each task calls again as soon as a call
            // ends. Reported: calls (first attempts), attempts the downstream saw, and calls
            // that ended in an error before their 4 attempts (a retry refused); then, on a line
            // of its own, the attempts per 100 ms. With `pace_ms`, each task starts a call
            // every `pace_ms` instead.
            let pace = options
                .get("pace_ms")
                .map(|_| Duration::from_millis(number("pace_ms")));
            let slots = Arc::new(Slots::default());
            let start_at = UNIX_EPOCH + Duration::from_millis(number("start_at_ms"));
            if let Ok(wait) = start_at.duration_since(SystemTime::now()) {
                tokio::time::sleep(wait).await;
            }
            let ok_per_20 = number("ok_per_20");
            let deadline = until();
            let seen = Arc::new(AtomicU64::new(0));
            let calls = Arc::new(AtomicU64::new(0));
            let refused = Arc::new(AtomicU64::new(0));
            let first = now_ms();
            let tasks: Vec<_> = (0..number("tasks"))
                .map(|_| {
                    let (scope, seen) = (scope.clone(), Arc::clone(&seen));
                    let (calls, refused) = (Arc::clone(&calls), Arc::clone(&refused));
                    let slots = Arc::clone(&slots);
                    tokio::spawn(async move {
                        let mut next = tokio::time::Instant::now();
                        while Instant::now() < deadline {
                            if let Some(pace) = pace {
                                tokio::time::sleep_until(next).await;
                                next += pace;
                            }
                            let this_call = AtomicU64::new(0);
                            let result =
                                budget_storm(&scope, ok_per_20, &seen, &this_call, &slots).await;
                            calls.fetch_add(1, Ordering::SeqCst);
                            if result.is_err() && this_call.load(Ordering::SeqCst) < 4 {
                                refused.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await.expect("a storm task");
            }
            say(&format!("slots {}", slots.report()));
            say(&format!(
                "result calls={} attempts={} refused={} first_ms={first} last_ms={}",
                calls.load(Ordering::SeqCst),
                seen.load(Ordering::SeqCst),
                refused.load(Ordering::SeqCst),
                now_ms()
            ));
        }
        "cli-breaker" => {
            // Calls every few ms, for as long as it lives, printing each call: when it
            // started (CLOCK_REALTIME µs, taken before calling), how it ended, whether the
            // body ran.
            loop {
                let started = now_us();
                let ran = AtomicBool::new(false);
                let result = cli_breaker(&scope, &ran).await;
                say(&format!(
                    "call start_us={started} code={} ran={}",
                    code(&result),
                    u8::from(ran.load(Ordering::SeqCst))
                ));
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        "cli-config-load" => {
            // `tasks` tasks call `cli_config` in a loop. Each call is labelled with the
            // override version applied when it started, and its body enters the witness of
            // that version (`<witness_base>:v<version>`). Prints `settled version=N` once
            // every call started under an older version has ended, and `progress version=N
            // admitted=K` every 10 admissions of version N.
            let hold = Duration::from_millis(number("hold_ms"));
            let (witness_url, witness_base) = (get("witness_url"), get("witness_base"));
            let witnesses: Arc<tokio::sync::Mutex<HashMap<u64, AsyncWitness>>> = Arc::default();
            let outstanding: Arc<std::sync::Mutex<BTreeMap<u64, u64>>> = Arc::default();
            let admitted: Arc<std::sync::Mutex<BTreeMap<u64, u64>>> = Arc::default();
            let watcher = {
                let outstanding = Arc::clone(&outstanding);
                tokio::spawn(async move {
                    let mut settled = None;
                    loop {
                        let ready = {
                            let outstanding = outstanding.lock().expect("outstanding");
                            let version = APPLIED.load(Ordering::Acquire);
                            let older = outstanding.range(..version).map(|(_, n)| n).sum::<u64>();
                            (settled != Some(version) && older == 0).then_some(version)
                        };
                        if let Some(version) = ready {
                            say(&format!("settled version={version}"));
                            settled = Some(version);
                        }
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                })
            };
            let tasks: Vec<_> = (0..number("tasks"))
                .map(|_| {
                    let (scope, witness_url, witness_base) =
                        (scope.clone(), witness_url.clone(), witness_base.clone());
                    let (witnesses, outstanding, admitted) = (
                        Arc::clone(&witnesses),
                        Arc::clone(&outstanding),
                        Arc::clone(&admitted),
                    );
                    tokio::spawn(async move {
                        loop {
                            // Read and counted at once: the watcher never misses a call
                            // that read an older version.
                            let version = {
                                let mut outstanding = outstanding.lock().expect("outstanding");
                                let version = APPLIED.load(Ordering::Acquire);
                                *outstanding.entry(version).or_default() += 1;
                                version
                            };
                            let witness = {
                                let mut witnesses = witnesses.lock().await;
                                match witnesses.get(&version) {
                                    Some(witness) => witness.clone(),
                                    None => {
                                        let key = format!("{witness_base}:v{version}");
                                        let witness =
                                            AsyncWitness::connect(&witness_url, &key, 3).await;
                                        witnesses.insert(version, witness.clone());
                                        witness
                                    }
                                }
                            };
                            let result = cli_config(&scope, &witness, hold).await;
                            *outstanding
                                .lock()
                                .expect("outstanding")
                                .entry(version)
                                .or_default() -= 1;
                            match code(&result) {
                                "ok" => {
                                    let count = {
                                        let mut admitted = admitted.lock().expect("admitted");
                                        let count = admitted.entry(version).or_default();
                                        *count += 1;
                                        *count
                                    };
                                    if count % 10 == 0 {
                                        say(&format!(
                                            "progress version={version} admitted={count}"
                                        ));
                                    }
                                }
                                "bulkhead_full" => {
                                    tokio::time::sleep(Duration::from_millis(1)).await;
                                }
                                other => {
                                    say(&format!("error code={other}"));
                                    tokio::time::sleep(Duration::from_millis(10)).await;
                                }
                            }
                        }
                    })
                })
                .collect();
            // Runs until the parent kills it.
            let _running = (watcher, tasks);
            std::future::pending::<()>().await;
        }
        "top-load" => {
            // 50 calls a second to each of `top-load`, `top-limited` (which admits 10 of
            // them) and `top-shadow` (which would), for as long as it lives. Says `using`
            // after the first.
            let mut ticks = tokio::time::interval(Duration::from_millis(20));
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut first = true;
            loop {
                ticks.tick().await;
                let _ = top_load(&scope).await;
                let _ = top_limited(&scope).await;
                let _ = top_shadow(&scope).await;
                if first {
                    say("using");
                    first = false;
                }
            }
        }
        "cli-status" => {
            // Uses one identity of each kind (and `cli-status` with the limit `drift_limit`
            // picks) every 50 ms, for as long as it lives, and holds one slot of
            // `cli-status-held`. Says `using` after the first round.
            tokio::spawn({
                let scope = scope.clone();
                async move { cli_status_held(&scope).await }
            });
            let large = get("drift_limit") == "4";
            let mut first = true;
            loop {
                let results = [
                    if large {
                        cli_status_4(&scope).await
                    } else {
                        cli_status_2(&scope).await
                    },
                    cli_status_breaker(&scope).await,
                    cli_status_rate(&scope).await,
                ];
                for result in &results {
                    if result.is_err() {
                        say(&format!("error code={}", code(result)));
                    }
                }
                if first {
                    say("using");
                    first = false;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        "breaker-gauge" => {
            // One call makes this process a user of the breaker; from then on it only listens.
            if let Err(error) = watch_call(&scope).await {
                panic!("the first call: {error:?}");
            }
            let metrics = metrics.expect("a recorder");
            let labels = [
                ("name", "mp-breaker"),
                ("operation", "mp-breaker"),
                ("scope", scope.as_str()),
            ];
            report_gauge(until(), || {
                metrics.gauge(caracal::metrics::CIRCUIT_BREAKER_STATE, &labels)
            })
            .await;
        }
        "coordinator-gauge" => {
            // Calls keep the connections in use, so a cut is noticed and recovered from.
            let metrics = metrics.expect("a recorder");
            let calls = tokio::spawn(async move {
                loop {
                    let _ = rate_700(&scope).await;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            });
            report_gauge(until(), || {
                metrics.gauge(caracal::metrics::COORDINATOR_UP, &[])
            })
            .await;
            calls.abort();
        }
        "scrapes" => {
            // One command a line on stdin, for the parent to make each step of an incident
            // one scrape. `step N`: N calls of `rules-fleet-db`, then this process's series of
            // it and `caracal_coordinator_up` as a scrape would read them, one `series …` line
            // each, and `scraped`. `up V`: calls of another policy (kept out of the series, so
            // that waiting adds no decision to them; calls make a cut noticed, and the
            // connections made again) until the up gauge reads V, then `up V`.
            let metrics = metrics.expect("a recorder");
            loop {
                let command = tokio::task::spawn_blocking(read_line)
                    .await
                    .expect("read a command");
                if command.is_empty() {
                    break;
                }
                let (verb, value) = command.trim_end().split_once(' ').expect("`verb value`");
                match verb {
                    "step" => {
                        for _ in 0..value.parse::<u64>().expect("a number of calls") {
                            let _ = rules_fleet_db(&scope).await;
                        }
                        for line in metrics.dump().lines() {
                            let up = line.starts_with(caracal::metrics::COORDINATOR_UP);
                            if (up || line.contains("name=\"rules-fleet-db\""))
                                && !line.ends_with(" samples")
                            {
                                say(&format!("series {line}"));
                            }
                        }
                        say("scraped");
                    }
                    "up" => {
                        let want: f64 = value.parse().expect("0 or 1");
                        while metrics.gauge(caracal::metrics::COORDINATOR_UP, &[]) != Some(want) {
                            let _ = rate_700(&scope).await;
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        say(&format!("up {value}"));
                    }
                    other => panic!("unknown command {other}"),
                }
            }
        }
        other => panic!("unknown scenario {other}"),
    }
}
