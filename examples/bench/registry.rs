//! The identity registry at scale: one process uses 100 000 scopes (the registry keeps 10 000
//! of them, its bound, and turns over as the process reports the rest); the longest registry
//! script the server ran while the process uses and reports them, from its slow log (set to log every command of 100 µs or more, so
//! the commands scripts run inside, each far quicker, are not logged and add nothing); then
//! the time `Admin::status` takes to list the registry at its cap.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use caracal::bulkhead;
use caracal_examples::{emit, emit_labelled};
use redis::aio::MultiplexedConnection;

use super::{BenchError, CONCURRENT_TASKS};

/// The scopes used, each once.
const SCOPES: usize = 100_000;
/// What the slow log keeps: every command that ran this long or longer.
const LOGGED_FROM_US: u64 = 100;
/// What the latency monitor keeps: every event (fork, expiry cycle, eviction…) of 1 ms or
/// more.
const MONITORED_FROM_MS: u64 = 1;
/// Long enough for the process's reports to go round its uses twice (every 5 s).
const REPORTS_SETTLE: Duration = Duration::from_secs(12);
/// How long reading the whole slow log may take.
const SLOW_LOG_READ: Duration = Duration::from_secs(60);
/// `Admin::status` runs timed.
const STATUS_RUNS: u32 = 3;

#[bulkhead(name = "bench-registry", limit = 1000000, scope = scope)]
async fn scoped(scope: &str) -> Result<(), BenchError> {
    Ok(())
}

/// Emits `registry_scripts_us` (the longest registry report and read at 100 000 scopes in use,
/// goal ≤ 1000 µs each) and `status_at_cap_ms` (goal ≤ 1000 ms in a release build), through a
/// coordinator of its own on `url`.
pub(super) async fn alone(url: &str) -> Result<(), caracal::Error> {
    let (coordinator, mut conn) = super::installed(url, "bench-registry").await?;
    let kept: Vec<(String, u64)> = redis::pipe()
        .cmd("CONFIG")
        .arg("GET")
        .arg("slowlog-log-slower-than")
        .cmd("CONFIG")
        .arg("GET")
        .arg("slowlog-max-len")
        .cmd("CONFIG")
        .arg("GET")
        .arg("latency-monitor-threshold")
        .query_async::<Vec<(String, u64)>>(&mut conn)
        .await
        .expect("slow log settings");
    let kept = [kept[0].1, kept[1].1, kept[2].1];
    // Logged from the first call: the process reports its uses (10 000 a round, the
    // registry's bound) while it makes them and after, however long that takes.
    configure(&mut conn, [LOGGED_FROM_US, 100_000, MONITORED_FROM_MS]).await;
    let control = redis::Script::new(CONTROL);
    let matched = redis::Script::new(MATCHED);
    let matched_work = matched_work(&mut conn, &matched).await;
    let done = Arc::new(AtomicBool::new(false));
    let (sent, matched_sent) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let controls = tokio::spawn(controlled(
        conn.clone(),
        (control.clone(), 0),
        CONTROL_EVERY,
        Arc::clone(&done),
        Arc::clone(&sent),
    ));
    let matched_controls = tokio::spawn(controlled(
        conn.clone(),
        (matched.clone(), matched_work),
        MATCHED_EVERY,
        Arc::clone(&done),
        Arc::clone(&matched_sent),
    ));
    let next = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..CONCURRENT_TASKS)
        .map(|_| {
            let next = Arc::clone(&next);
            tokio::spawn(async move {
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= SCOPES {
                        return;
                    }
                    scoped(&format!("user-{n}")).await.expect("admitted");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a calling task");
    }
    tokio::time::sleep(REPORTS_SETTLE).await;
    done.store(true, Ordering::Relaxed);
    controls.await.expect("the control task");
    matched_controls.await.expect("the matched control task");
    let admin = coordinator.admin();
    let mut status_ms = Vec::new();
    let mut rows = 0;
    for _ in 0..STATUS_RUNS {
        let start = Instant::now();
        rows = admin.status().await?.len();
        status_ms.push(start.elapsed().as_secs_f64() * 1e3);
    }
    // The events first: reading a slow log of ~13 000 entries is itself a command of 30–70 ms,
    // which the latency monitor would report as the run's.
    let events = latency_events(&mut conn).await;
    let logged = slow_log(&mut conn).await;
    configure(&mut conn, kept).await;
    let sha_of = |body: &str| redis::Script::new(body).get_hash().to_owned();
    let (report, read) = (sha_of(REGISTRY_REPORT), sha_of(REGISTRY_READ));
    let of = |sha: &str| -> Vec<u64> {
        logged
            .iter()
            .filter(|(_, args)| args.get(1).map(String::as_str) == Some(sha))
            .map(|(us, _)| *us)
            .collect()
    };
    let (reports, reads) = (of(&report), of(&read));
    let matched_us = of(matched.get_hash());
    let longest = |us: &[u64]| us.iter().copied().max().unwrap_or(0) as f64;
    let median = |us: &[u64]| {
        let mut us = us.to_vec();
        us.sort_unstable();
        us.get(us.len() / 2).copied().unwrap_or(0) as f64
    };
    let over_1ms = |us: &[u64]| us.iter().filter(|&&us| us > 1_000).count() as f64;
    // The baseline of the same run: how often a script that does nothing passed 1 ms. Where
    // the server waited for its core (or the machine for its host), every command did alike,
    // and no script's work can be shorter than this one's.
    let controls = of(control.get_hash());
    let sent = sent.load(Ordering::Relaxed) as f64;
    emit(
        "control_script_us",
        &[
            ("sent", sent),
            ("longest", longest(&controls)),
            ("over_1ms", over_1ms(&controls)),
            (
                "over_1ms_per_million",
                over_1ms(&controls) / sent.max(1.0) * 1e6,
            ),
            (
                "reports_over_1ms_per_million_logged",
                over_1ms(&reports) / (reports.len().max(1) as f64) * 1e6,
            ),
        ],
    );
    // The baseline a report is fairly held to: a script that works (without touching
    // data) about as long as a report, so a pause of the server's core (the machine's other
    // work, its host) lands in it as often as in a report. A report passes 1 ms about as
    // often as this one where the pauses, not its own work, take it there.
    let matched_sent = matched_sent.load(Ordering::Relaxed) as f64;
    emit(
        "matched_control_script_us",
        &[
            ("work_us", MATCHED_US as f64),
            ("calls", matched_work as f64),
            ("sent", matched_sent),
            ("median", median(&matched_us)),
            ("longest", longest(&matched_us)),
            ("over_1ms", over_1ms(&matched_us)),
            (
                "over_1ms_per_million",
                over_1ms(&matched_us) / matched_sent.max(1.0) * 1e6,
            ),
        ],
    );
    // The bar: every report and read at 100 000 identities within 1 ms.
    emit(
        "registry_verdict",
        &[
            ("bar_us", 1_000.0),
            ("longest_report_us", longest(&reports)),
            ("longest_read_us", longest(&reads)),
            ("median_logged_report_us", median(&reports)),
            (
                "within_bar",
                f64::from(u8::from(longest(&reports).max(longest(&reads)) <= 1_000.0)),
            ),
        ],
    );
    emit(
        "registry_scripts_us",
        &[
            ("scopes", SCOPES as f64),
            ("logged_from_us", LOGGED_FROM_US as f64),
            ("longest_report", longest(&reports)),
            ("reports_logged", reports.len() as f64),
            ("reports_over_1ms", over_1ms(&reports)),
            ("longest_read", longest(&reads)),
            ("reads_logged", reads.len() as f64),
            ("reads_over_1ms", over_1ms(&reads)),
        ],
    );
    // The bar is on every command, whichever it is: the longest, named, and how many passed it.
    let slowest = logged.iter().max_by_key(|(us, _)| *us);
    let (command, what) = slowest.map_or((String::new(), String::new()), |(_, args)| named(args));
    emit_labelled(
        "longest_command_us",
        &[("command", &command), ("what", &what)],
        &[
            ("us", slowest.map_or(0.0, |(us, _)| *us as f64)),
            ("logged", logged.len() as f64),
            (
                "over_1ms",
                logged.iter().filter(|(us, _)| *us > 1_000).count() as f64,
            ),
        ],
    );
    // Per command and script (a key by its kind, whichever identity's): which passed the
    // bar, how often, and by how much.
    let mut by_name: std::collections::BTreeMap<(String, String), Vec<u64>> = Default::default();
    for (us, args) in &logged {
        let (command, what) = named(args);
        let what = match what.split_once('{').zip(what.split_once('}')) {
            Some(((before, _), (_, after))) => format!("{before}{{…}}{after}"),
            None => what,
        };
        // The registry's 256 hashes as one.
        let what = match what.rsplit_once(':') {
            Some((head, tail))
                if tail.len() == 2 && tail.bytes().all(|b| b.is_ascii_hexdigit()) =>
            {
                format!("{head}:<two hex digits>")
            }
            _ => what,
        };
        by_name.entry((command, what)).or_default().push(*us);
    }
    for ((command, what), us) in &by_name {
        emit_labelled(
            "command_us",
            &[("command", command), ("what", what)],
            &[
                ("longest", longest(us)),
                ("logged", us.len() as f64),
                ("over_1ms", over_1ms(us)),
            ],
        );
    }
    // What the server itself noticed beside commands (a fork, an expiry cycle, an eviction,
    // a defragmentation pass...), at 1 ms or more.
    for (event, latest_ms, max_ms) in events {
        emit_labelled(
            "latency_event_ms",
            &[("event", &event)],
            &[("latest", latest_ms as f64), ("max", max_ms as f64)],
        );
    }
    let mut fields = vec![("rows", rows as f64)];
    let names = ["first", "second", "third"];
    fields.extend(names.iter().copied().zip(status_ms.iter().copied()));
    emit("status_at_cap_ms", &fields);
    coordinator.shutdown().await;
    Ok(())
}

/// A script that does nothing: the run's baseline.
const CONTROL: &str = "return 1";
/// How often the baseline runs while the registry is used.
const CONTROL_EVERY: Duration = Duration::from_millis(2);

/// A script that asks the server's time `ARGV[1]` times (work like a report's commands,
/// on no data) and answers how long that took, in µs.
const MATCHED: &str = "local function us() local t = redis.call('TIME') \
    return tonumber(t[1]) * 1000000 + tonumber(t[2]) end \
    local start = us() for _ = 1, tonumber(ARGV[1]) do redis.call('TIME') end \
    return us() - start";
/// How long the matched baseline works: about a report's median on a real-time-priority
/// server on this machine.
const MATCHED_US: u64 = 300;
/// How often it runs: about as many as the reports the slow log keeps in a run.
const MATCHED_EVERY: Duration = Duration::from_millis(10);
/// Calls of the matched baseline's loop timed to find its length.
const MATCHED_PROBE: u64 = 2_000;

/// How many `TIME` calls make the matched baseline work [`MATCHED_US`]: from the quickest of
/// a few probes (the server's work, with the fewest pauses in it).
async fn matched_work(conn: &mut MultiplexedConnection, matched: &redis::Script) -> u64 {
    let mut quickest = u64::MAX;
    for _ in 0..5 {
        let us: u64 = matched
            .arg(MATCHED_PROBE)
            .invoke_async(conn)
            .await
            .expect("the matched control's probe");
        quickest = quickest.min(us.max(1));
    }
    (MATCHED_US * MATCHED_PROBE / quickest).max(1)
}

/// Runs a baseline (a script and its argument) `every` until `done`, counting in `sent` the
/// calls answered: one the client gave up on (the bench's own process starved on a loaded
/// machine) is not counted, and the next goes on time.
async fn controlled(
    mut conn: MultiplexedConnection,
    (control, arg): (redis::Script, u64),
    every: Duration,
    done: Arc<AtomicBool>,
    sent: Arc<AtomicUsize>,
) {
    let mut every = tokio::time::interval(every);
    while !done.load(Ordering::Relaxed) {
        every.tick().await;
        let answered: Result<i64, _> = control.arg(arg).invoke_async(&mut conn).await;
        if answered.is_ok() {
            sent.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Sets the slow log's threshold (µs) and length and the latency monitor's threshold (ms),
/// and empties both.
async fn configure(conn: &mut MultiplexedConnection, [slower_than, max_len, monitor_ms]: [u64; 3]) {
    redis::pipe()
        .cmd("CONFIG")
        .arg("SET")
        .arg("latency-monitor-threshold")
        .arg(monitor_ms)
        .cmd("LATENCY")
        .arg("RESET")
        .cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-log-slower-than")
        .arg(slower_than)
        .cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-max-len")
        .arg(max_len)
        .cmd("SLOWLOG")
        .arg("RESET")
        .exec_async(conn)
        .await
        .expect("slow log settings");
}

/// The server's latency events of the run (`LATENCY LATEST`): name, latest and longest ms.
async fn latency_events(conn: &mut MultiplexedConnection) -> Vec<(String, u64, u64)> {
    let events: Vec<(String, u64, u64, u64)> = redis::cmd("LATENCY")
        .arg("LATEST")
        .query_async(conn)
        .await
        .expect("the latency monitor");
    events
        .into_iter()
        .map(|(event, _, latest, max)| (event, latest, max))
        .collect()
}

/// The scripts a command of this bench may run by name: caracal's own, and the bulkhead's
/// lease (the kernel the bench's calls go through) and status read (`status`'s).
const REGISTRY_REPORT: &str = concat!(
    include_str!("../../caracal/lua/registry_prelude.lua"),
    include_str!("../../caracal/lua/registry_report.lua")
);
const REGISTRY_READ: &str = concat!(
    include_str!("../../caracal/lua/registry_prelude.lua"),
    include_str!("../../caracal/lua/registry_read.lua")
);
const SCRIPTS: [(&str, &str); 10] = [
    ("control (does nothing)", CONTROL),
    ("matched control (works as long as a report)", MATCHED),
    ("registry_report", REGISTRY_REPORT),
    ("registry_read", REGISTRY_READ),
    (
        "registry_hold",
        concat!(
            include_str!("../../caracal/lua/registry_prelude.lua"),
            include_str!("../../caracal/lua/registry_hold.lua")
        ),
    ),
    (
        "processes_read",
        include_str!("../../caracal/lua/processes_read.lua"),
    ),
    (
        "overrides_read",
        include_str!("../../caracal/lua/overrides_read.lua"),
    ),
    (
        "operators_read",
        include_str!("../../caracal/lua/operators_read.lua"),
    ),
    ("bulkhead lease", super::LEASE_SCRIPT),
    (
        "bulkhead status",
        include_str!("../../caracal/src/policy/bulkhead/kernel/status.lua"),
    ),
];

/// A logged command's name and what it worked on: for a script, which one (by its hash), or
/// the key it ran on when the bench does not know its text; else its first argument.
fn named(args: &[String]) -> (String, String) {
    let command = args
        .first()
        .map(|c| c.to_ascii_uppercase())
        .unwrap_or_default();
    let what = match (command.as_str(), args.get(1)) {
        ("EVALSHA", Some(sha)) => SCRIPTS
            .iter()
            .find(|(_, body)| redis::Script::new(body).get_hash() == sha.as_str())
            .map_or_else(
                || format!("a script on {}", args.get(3).map_or("", String::as_str)),
                |(name, _)| (*name).to_owned(),
            ),
        (_, first) => first.cloned().unwrap_or_default(),
    };
    (command, what)
}

/// Every command the slow log kept: its time in µs and its arguments.
async fn slow_log(conn: &mut MultiplexedConnection) -> Vec<(u64, Vec<String>)> {
    // Up to 100 000 entries: a reply of megabytes, longer than a command's usual wait.
    conn.set_response_timeout(SLOW_LOG_READ);
    let entries: Vec<redis::Value> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(-1)
        .query_async(conn)
        .await
        .expect("the slow log");
    entries
        .into_iter()
        .filter_map(|entry| match entry {
            redis::Value::Array(fields) => {
                let mut fields = fields.into_iter().skip(2);
                let us = redis::from_redis_value::<u64>(fields.next()?).ok()?;
                let args = redis::from_redis_value::<Vec<String>>(fields.next()?).ok()?;
                Some((us, args))
            }
            _ => None,
        })
        // The bench's own settings of the log: its reset frees the entries of a run before,
        // tens of ms for a full log, and is no command caracal sends.
        .filter(|(_, args)| {
            let name = args.first().map(|name| name.to_ascii_uppercase());
            !matches!(name.as_deref(), Some("SLOWLOG" | "CONFIG" | "LATENCY"))
        })
        .collect()
}
