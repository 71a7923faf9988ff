//! Operating a fleet with the `caracal` command: worker processes follow a breaker forced open,
//! reset, or forced open for a while; a limit set and unset fleet-wide; `status` lists what
//! they use, drift included.
//!
//! Nothing here asserts how long anything took. "Within 250 ms" is checked against the clock
//! the processes share: every call a worker started 250 ms or more after the command had
//! exited must have been rejected without running its body (the library never trusts a closed
//! view longer than that after confirming it). Everything else is awaited with [`PATIENCE`].

use std::collections::BTreeMap;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use caracal_tests::wait::wait_until;
use caracal_tests::{RedisServer, Witness};
use serde_json::Value;

use crate::cli::{caracal, generation};
use crate::common::worker::Worker;
use crate::common::{PATIENCE, unique};

/// CLOCK_REALTIME in µs, as the workers stamp their calls.
fn now_us() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is past 1970");
    u64::try_from(since.as_micros()).expect("µs fit in u64")
}

/// The longest a process may trust a closed view of a breaker after confirming it.
const STALE_US: u64 = 250_000;

/// One call a `cli-breaker` worker made.
#[derive(Debug, Clone)]
struct Call {
    start_us: u64,
    code: String,
    ran: bool,
}

/// A worker and every line it printed so far, read as they come.
pub(crate) struct Stream {
    worker: Worker,
    calls: Vec<Call>,
    events: Vec<BTreeMap<String, String>>,
    lines: Vec<String>,
}

/// `key=value` fields of a line.
fn fields(line: &str) -> BTreeMap<String, String> {
    line.split_whitespace()
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

impl Stream {
    /// The worker's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.worker.child.id()
    }

    pub(crate) fn spawn(url: &str, namespace: &str, scenario: &str, args: &[String]) -> Self {
        Stream::spawn_with_env(url, namespace, scenario, args, &[])
    }

    /// [`spawn`](Self::spawn), with `env` added to the worker's environment.
    pub(crate) fn spawn_with_env(
        url: &str,
        namespace: &str,
        scenario: &str,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Self {
        Stream {
            worker: Worker::spawn_with_env(url, namespace, scenario, args, env),
            calls: Vec::new(),
            events: Vec::new(),
            lines: Vec::new(),
        }
    }

    /// Reads lines until `done` holds.
    ///
    /// # Panics
    /// After [`PATIENCE`] (or when the worker goes silent that long), naming `what`.
    pub(crate) fn until(&mut self, what: &str, done: impl Fn(&Stream) -> bool) {
        let deadline = Instant::now() + PATIENCE;
        while !done(self) {
            assert!(
                Instant::now() < deadline,
                "waited {PATIENCE:?} for {what}; last lines: {:?}",
                &self.lines[self.lines.len().saturating_sub(5)..]
            );
            let line = self.worker.expect_line("", PATIENCE);
            if let Some(rest) = line.strip_prefix("call ") {
                let f = fields(rest);
                self.calls.push(Call {
                    start_us: f["start_us"].parse().expect("start_us"),
                    code: f["code"].clone(),
                    ran: f["ran"] == "1",
                });
            } else if let Some(rest) = line.strip_prefix("event ") {
                let mut f = fields(rest);
                let name = rest.split_whitespace().next().unwrap_or_default();
                f.insert("event".to_owned(), name.to_owned());
                self.events.push(f);
                self.lines.push(line);
            } else {
                assert!(!line.starts_with("error"), "the worker failed: {line}");
                self.lines.push(line);
            }
        }
    }

    /// The events named `name` whose fields include every pair of `with`.
    pub(crate) fn events(
        &self,
        name: &str,
        with: &[(&str, &str)],
    ) -> Vec<&BTreeMap<String, String>> {
        self.events
            .iter()
            .filter(|e| {
                e["event"] == name
                    && with
                        .iter()
                        .all(|(k, v)| e.get(*k).map(String::as_str) == Some(v))
            })
            .collect()
    }

    pub(crate) fn has_line(&self, line: &str) -> bool {
        self.lines.iter().any(|l| l == line)
    }
}

fn event_generation(event: &BTreeMap<String, String>) -> u64 {
    event["generation"].parse().expect("generation")
}

/// A breaker is forced open with `caracal breaker open`: in every worker process, each call
/// started 250 ms or more after the command exited is rejected with `circuit_open` and runs
/// no body. `reset` admits calls again. `--for 1s` ends by itself: half-open at the next call,
/// closed after the probes.
#[test]
fn breaker_open_reaches_every_process_and_reset_or_for_ends_it() {
    let server = RedisServer::start();
    let (url, namespace, scope) = (server.url(), unique("ops-breaker"), unique("scope"));
    let args = [
        format!("scope={scope}"),
        "events=circuit_breaker.state_changed".to_owned(),
    ];
    let mut workers: Vec<Stream> = (0..3)
        .map(|_| Stream::spawn(&url, &namespace, "cli-breaker", &args))
        .collect();
    for worker in &mut workers {
        worker.until("an admitted call", |w| {
            w.calls.iter().any(|c| c.code == "ok" && c.ran)
        });
    }
    let caracal = |args: &[&str]| caracal(&url, &namespace, args);

    // Open, until a reset.
    let opened = caracal(&[
        "breaker",
        "open",
        "cli-breaker",
        "--scope",
        &scope,
        "--reason",
        "incident 4711",
        "--who",
        "alice@ops",
    ])
    .ok();
    let opened_at = now_us();
    assert_eq!(
        opened,
        format!(
            "cli-breaker (scope {scope}): closed → forced_open (generation {})\n",
            generation(&opened)
        )
    );
    let bound = opened_at + STALE_US;
    // Half a second of calls past the bound, in every process.
    for worker in &mut workers {
        worker.until("calls well past the bound", |w| {
            w.calls.iter().any(|c| c.start_us >= bound + 500_000)
        });
        // Every process announces the change, naming who made it and why (whether the feed's
        // message or the reply to one of its own calls told it first).
        let open_generation = generation(&opened).to_string();
        worker.until("the operator's open, announced", |w| {
            !w.events(
                "circuit_breaker.state_changed",
                &[
                    ("to", "forced_open"),
                    ("generation", &open_generation),
                    ("origin", "operator"),
                    ("who", "alice@ops"),
                    ("reason", "incident_4711"),
                ],
            )
            .is_empty()
        });
    }
    let reset_at = now_us();
    let reset = caracal(&["breaker", "reset", "cli-breaker", "--scope", &scope]).ok();
    let reset_done = now_us();
    assert!(
        reset.starts_with(&format!(
            "cli-breaker (scope {scope}): forced_open → closed"
        )),
        "{reset}"
    );
    for (n, worker) in workers.iter().enumerate() {
        let after: Vec<&Call> = worker
            .calls
            .iter()
            .filter(|c| c.start_us >= bound && c.start_us < reset_at)
            .collect();
        assert!(!after.is_empty(), "worker {n} made no call past the bound");
        let admitted: Vec<_> = after
            .iter()
            .filter(|c| c.code != "circuit_open" || c.ran)
            .collect();
        assert!(
            admitted.is_empty(),
            "worker {n}: calls started ≥ 250 ms after `breaker open` exited (at {opened_at} µs) \
             that were not rejected, or ran: {admitted:?}"
        );
    }

    // Reset: admitted again, everywhere.
    for worker in &mut workers {
        worker.until("an admitted call after the reset", |w| {
            w.calls
                .iter()
                .any(|c| c.start_us >= reset_done && c.code == "ok" && c.ran)
        });
    }

    // Open for a second: it ends by itself, through half-open, in every process.
    let for_at = now_us();
    let opened = caracal(&[
        "breaker",
        "open",
        "cli-breaker",
        "--scope",
        &scope,
        "--for",
        "1s",
    ])
    .ok();
    assert!(
        opened.starts_with(&format!(
            "cli-breaker (scope {scope}): closed → forced_open for 1s (generation "
        )),
        "{opened}"
    );
    let forced = generation(&opened);
    for worker in &mut workers {
        worker.until("the forced open, then closed again by probes", |w| {
            let after = |to: &str| {
                w.events("circuit_breaker.state_changed", &[("to", to)])
                    .into_iter()
                    .any(|e| event_generation(e) > forced)
            };
            !w.events(
                "circuit_breaker.state_changed",
                &[("to", "forced_open"), ("generation", &forced.to_string())],
            )
            .is_empty()
                && after("closed")
        });
        worker.until("an admitted call after the second", |w| {
            w.calls
                .iter()
                .any(|c| c.start_us >= for_at + 1_000_000 && c.code == "ok" && c.ran)
        });
    }
    // Some process admitted the probes (each learns of half-open from the feed, or makes
    // the transition itself).
    assert!(
        workers.iter().any(|w| {
            w.events(
                "circuit_breaker.state_changed",
                &[("from", "forced_open"), ("to", "half_open")],
            )
            .into_iter()
            .any(|e| event_generation(e) >= forced)
        }),
        "no process saw the breaker half-open (forced open in generation {forced}): {:?}",
        workers.iter().map(|w| &w.events).collect::<Vec<_>>()
    );
    let status = caracal(&["status", "--json"]).ok();
    let breaker: Value = serde_json::from_str(status.trim()).expect("one JSON line");
    assert_eq!(breaker["state"], "closed", "{status}");
    assert!(breaker["generation"].as_u64() > Some(forced), "{status}");
}

/// `config set bulkhead.cli-config.limit 1` while 3 processes run `limit = 3`: once every
/// process has applied it and every body admitted before has ended, at most 1 body runs at a
/// time. `unset`: back to 3, never more.
#[test]
fn config_set_limit_reaches_every_process_and_unset_restores_it() {
    let server = RedisServer::start();
    let witness_server = RedisServer::start();
    let (url, namespace) = (server.url(), unique("ops-config"));
    let witness_base = unique("ops-config-witness");
    let args = [
        format!("scope={}", unique("scope")),
        "tasks=2".to_owned(),
        "hold_ms=10".to_owned(),
        format!("witness_url={}", witness_server.url()),
        format!("witness_base={witness_base}"),
        "events=config.applied".to_owned(),
    ];
    let mut workers: Vec<Stream> = (0..3)
        .map(|_| Stream::spawn(&url, &namespace, "cli-config-load", &args))
        .collect();
    let witness = |version: u64| {
        Witness::new(
            &witness_server.url(),
            &format!("{witness_base}:v{version}"),
            3,
        )
    };
    let caracal = |args: &[&str]| caracal(&url, &namespace, args);

    // Under the attribute's limit, 6 tasks use all 3 slots.
    for worker in &mut workers {
        worker.until("the overrides applied at start", |w| {
            !w.events("config.applied", &[]).is_empty()
        });
    }
    let initial = first_applied_version(&workers[0]);
    wait_until(PATIENCE, "3 bodies at once under limit = 3", || {
        witness(initial).max_seen() == 3
    });

    // Limit 1.
    assert_eq!(
        caracal(&["config", "set", "bulkhead.cli-config.limit", "1"]).ok(),
        "bulkhead.cli-config.limit = 1 (fleet): every process applies it within a second\n"
    );
    let limited = settle(&mut workers, "1", initial);
    for worker in &mut workers {
        admissions(worker, limited, 10);
    }
    let report = witness(limited).report();
    assert_eq!(
        report.max_seen, 1,
        "bodies at once after limit 1 settled: {report:?}"
    );
    let got = caracal(&["config", "get", "bulkhead.cli-config.limit"]).ok();
    assert!(
        got.lines()
            .all(|l| l.starts_with("bulkhead.cli-config.limit = 1 (fleet) by "))
            && !got.is_empty(),
        "{got}"
    );
    // The processes reported the old limit and the new one side by side while the change
    // spread: that was the change being applied, not drift.
    let mut listed = Vec::new();
    wait_until(PATIENCE, "the registry to list the new limit", || {
        listed = status_json(&url, &namespace);
        identity(&listed, "bulkhead", "cli-config").is_some_and(|b| b["limit"] == 1)
    });
    let limited_bulkhead = identity(&listed, "bulkhead", "cli-config").expect("cli-config");
    assert_eq!(limited_bulkhead["drift"], false, "{limited_bulkhead}");

    // Back to the attribute's 3.
    assert_eq!(
        caracal(&["config", "unset", "bulkhead.cli-config.limit"]).ok(),
        "bulkhead.cli-config.limit: fleet override removed\n"
    );
    let restored = settle(&mut workers, "0", limited);
    wait_until(PATIENCE, "3 bodies at once again after unset", || {
        witness(restored).max_seen() == 3
    });
    for worker in &mut workers {
        admissions(worker, restored, 10);
    }
    let report = witness(restored).report();
    assert_eq!(report.max_seen, 3, "never more than 3: {report:?}");
    assert_eq!(report.violations, 0, "never more than 3: {report:?}");
}

/// The version of `worker`'s first `config.applied` event.
fn first_applied_version(worker: &Stream) -> u64 {
    worker.events("config.applied", &[])[0]["version"]
        .parse()
        .expect("a version")
}

/// Waits until every worker has applied a version newer than `after` (with `overrides` of
/// them), the same in all, and then until every call started before it has ended; returns it.
fn settle(workers: &mut [Stream], overrides: &str, after: u64) -> u64 {
    let newer = |w: &Stream| {
        w.events("config.applied", &[("overrides", overrides)])
            .into_iter()
            .map(|e| e["version"].parse::<u64>().expect("version"))
            .find(|v| *v > after)
    };
    for worker in workers.iter_mut() {
        worker.until("the new overrides applied", |w| newer(w).is_some());
    }
    let version = newer(&workers[0]).expect("applied");
    for worker in workers.iter_mut() {
        assert_eq!(newer(worker), Some(version), "one version for the fleet");
        let line = format!("settled version={version}");
        worker.until("every call started before it ended", |w| w.has_line(&line));
    }
    version
}

/// Waits until `worker` has admitted at least `count` calls under `version`.
fn admissions(worker: &mut Stream, version: u64, count: u64) {
    let prefix = format!("progress version={version} ");
    worker.until("admissions under the new version", |w| {
        w.lines.iter().any(|line| {
            line.strip_prefix(&prefix)
                .and_then(|rest| rest.strip_prefix("admitted="))
                .and_then(|n| n.parse::<u64>().ok())
                .is_some_and(|n| n >= count)
        })
    });
}

/// `caracal status --json`, a JSON object per identity.
pub(crate) fn status_json(url: &str, namespace: &str) -> Vec<Value> {
    json_lines(&caracal(url, namespace, &["status", "--json"]).ok())
}

/// The objects of a `--json` output, one a line.
fn json_lines(output: &str) -> Vec<Value> {
    output
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON object per line"))
        .collect()
}

/// The object of `kind`/`name` in `status --json` output.
pub(crate) fn identity<'a>(lines: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    lines
        .iter()
        .find(|line| line["kind"] == kind && line["name"] == name)
}

fn keys(value: &Value) -> Vec<&str> {
    let mut keys: Vec<&str> = value
        .as_object()
        .expect("an object")
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    keys
}

/// Two processes use the bulkhead `cli-status` with the same attribute (limit 2), one under a
/// `Config` file that gives it 3: `config get` lists both values, each with where it came from
/// and the process using it (by the id `caracal processes` lists), and says they drift, as
/// `status` does; `--json` as well.
#[test]
fn config_get_lists_each_value_in_force_with_the_processes_using_it() {
    let server = RedisServer::start();
    let (url, namespace, scope) = (server.url(), unique("ops-config-drift"), unique("scope"));
    let config = std::env::temp_dir().join(format!("{}.toml", unique("caracal-config")));
    std::fs::write(&config, "[bulkhead.cli-status]\nlimit = 3\n").expect("write the Config");
    let config = config.to_str().expect("a UTF-8 path").to_owned();
    let args = [format!("scope={scope}"), "drift_limit=2".to_owned()];
    let mut workers = [
        Stream::spawn(&url, &namespace, "cli-status", &args),
        Stream::spawn_with_env(
            &url,
            &namespace,
            "cli-status",
            &args,
            &[("CARACAL_CONFIG", &config)],
        ),
    ];
    for worker in &mut workers {
        worker.until("its policies in use", |w| w.has_line("using"));
    }
    let caracal = |args: &[&str]| caracal(&url, &namespace, args);
    // Each worker's id, as `caracal processes` lists it, by its pid.
    let mut ids = Vec::new();
    wait_until(PATIENCE, "both workers listed", || {
        let listed = json_lines(&caracal(&["processes", "--json"]).ok());
        ids = workers
            .iter()
            .filter_map(|worker| {
                let listed = listed.iter().find(|p| p["pid"] == worker.pid())?;
                Some(listed["id"].as_str()?.to_owned())
            })
            .collect();
        ids.len() == 2
    });
    let (attribute, configured) = (&ids[0], &ids[1]);

    let setting = "bulkhead.cli-status.limit";
    let expected = format!(
        "{setting} = 2 (attribute; drift, used by {attribute})\n\
         {setting} = 3 (config; drift, used by {configured})\n"
    );
    let mut text = String::new();
    wait_until(
        PATIENCE,
        "config get to show both values and the drift",
        || {
            text = caracal(&["config", "get", setting]).ok();
            text == expected
        },
    );
    let lines = json_lines(&caracal(&["--json", "config", "get", setting]).ok());
    assert_eq!(
        lines,
        [
            serde_json::json!({"setting": setting, "value": "2", "source": "attribute",
                               "processes": [attribute], "drift": true}),
            serde_json::json!({"setting": setting, "value": "3", "source": "config",
                               "processes": [configured], "drift": true}),
        ]
    );
    // The same drift as `status` tells it.
    let status = status_json(&url, &namespace);
    let bulkhead = identity(&status, "bulkhead", "cli-status").expect("cli-status");
    assert_eq!(bulkhead["drift"], true, "{bulkhead}");
    // The settings both agree on: one line each, with both processes, no drift.
    let both = {
        let mut both = vec![attribute.as_str(), configured.as_str()];
        both.sort_unstable();
        serde_json::json!(both)
    };
    let open = "circuit_breaker.cli-status-breaker.open";
    let breaker = json_lines(&caracal(&["--json", "config", "get", open]).ok());
    assert_eq!(breaker.len(), 1, "{breaker:?}");
    assert_eq!(breaker[0]["processes"], both, "{breaker:?}");
    assert_eq!(breaker[0].get("drift"), None, "{breaker:?}");
    let _ = std::fs::remove_file(&config);
}

/// Two processes use a bulkhead (with different limits: drift), a bulkhead each holds a slot
/// of, a breaker and a rate limit: `status --json` lists exactly those, with their fields;
/// the table too.
#[test]
fn status_lists_every_identity_of_the_fleet_with_drift() {
    let server = RedisServer::start();
    let (url, namespace, scope) = (server.url(), unique("ops-status"), unique("scope"));
    let mut workers: Vec<Stream> = ["2", "4"]
        .iter()
        .map(|limit| {
            let args = [format!("scope={scope}"), format!("drift_limit={limit}")];
            Stream::spawn(&url, &namespace, "cli-status", &args)
        })
        .collect();
    for worker in &mut workers {
        worker.until("both policies in use", |w| {
            w.has_line("using") && w.has_line("holding")
        });
    }
    let caracal = |args: &[&str]| caracal(&url, &namespace, args);
    let status = || status_json(&url, &namespace);
    let mut last = Vec::new();
    let settled = |lines: &[Value]| {
        // Drift, and both limits counted (each worker has reported at least once).
        let drifted = identity(lines, "bulkhead", "cli-status").is_some_and(|b| {
            b["drift"] == true && b["limits"].as_object().map(|l| l.len()) == Some(2)
        });
        let held =
            identity(lines, "bulkhead", "cli-status-held").is_some_and(|b| b["occupancy"] == 2);
        let observed = identity(lines, "circuit_breaker", "cli-status-breaker")
            .is_some_and(|b| b["window_total"].as_u64() > Some(0));
        lines.len() == 4 && drifted && held && observed
    };
    wait_until(
        PATIENCE,
        "every identity, the drift, the held slots",
        || {
            last = status();
            settled(&last)
        },
    );
    for line in &last {
        assert_eq!(line["scope"], scope.as_str(), "{line}");
        assert_eq!(line["operation"], line["name"], "{line}");
        assert_eq!(line["shadow"], false, "every one enforces: {line}");
    }
    let common = [
        "drift",
        "in_use",
        "kind",
        "name",
        "operation",
        "scope",
        "shadow",
    ];
    let with = |extra: &[&'static str]| {
        let mut keys: Vec<&str> = common.iter().chain(extra).copied().collect();
        keys.sort_unstable();
        keys
    };

    // Under drift: each limit in use with the number of processes using it, and the
    // smallest as the limit (never whichever process reported last).
    let drifted = identity(&last, "bulkhead", "cli-status").expect("cli-status");
    assert_eq!(
        keys(drifted),
        with(&[
            "base_latency_us",
            "latency_us",
            "limit",
            "limits",
            "occupancy"
        ]),
        "{drifted}"
    );
    assert_eq!(drifted["limit"], 2, "{drifted}");
    assert_eq!(
        drifted["limits"],
        serde_json::json!({"2": 1, "4": 1}),
        "{drifted}"
    );
    assert!(drifted["occupancy"].as_u64() <= Some(2), "{drifted}");

    let held = identity(&last, "bulkhead", "cli-status-held").expect("cli-status-held");
    assert_eq!(
        keys(held),
        with(&[
            "base_latency_us",
            "latency_us",
            "limit",
            "limits",
            "occupancy"
        ]),
        "{held}"
    );
    assert_eq!(
        (
            &held["drift"],
            &held["limit"],
            &held["occupancy"],
            &held["limits"]
        ),
        (
            &Value::Bool(false),
            &Value::from(5),
            &Value::from(2),
            &Value::Null
        ),
        "{held}"
    );

    let breaker = identity(&last, "circuit_breaker", "cli-status-breaker").expect("breaker");
    assert_eq!(
        keys(breaker),
        with(&[
            "forced_until_ms",
            "generation",
            "retry_after_ms",
            "state",
            "window_failures",
            "window_slow",
            "window_total"
        ]),
        "{breaker}"
    );
    assert_eq!(
        (
            &breaker["drift"],
            &breaker["state"],
            &breaker["window_failures"],
            &breaker["retry_after_ms"]
        ),
        (
            &Value::Bool(false),
            &Value::from("closed"),
            &Value::from(0),
            &Value::Null
        ),
        "{breaker}"
    );
    assert!(breaker["generation"].is_u64(), "{breaker}");

    let rate = identity(&last, "rate_limit", "cli-status-rate").expect("rate limit");
    assert_eq!(keys(rate), with(&["burst", "rate"]), "{rate}");
    assert_eq!(
        (&rate["drift"], rate["rate"].as_f64(), &rate["burst"]),
        (&Value::Bool(false), Some(100.0), &Value::from(7)),
        "{rate}"
    );

    // The table: a header and a row per identity, columns aligned.
    let table = caracal(&["status"]).ok();
    println!("caracal status:\n{table}");
    println!("caracal status --json:");
    for line in &last {
        println!("{line}");
    }
    let rows: Vec<&str> = table.lines().collect();
    assert_eq!(rows.len(), 5, "{table}");
    assert!(
        rows[0].starts_with("KIND") && rows[0].contains("SCOPE") && rows[0].contains("STATE"),
        "{table}"
    );
    let scope_column = rows[0].find("SCOPE").expect("SCOPE");
    for row in &rows[1..] {
        assert_eq!(row.find(scope.as_str()), Some(scope_column), "{table}");
    }
    let row = |name: &str| {
        rows.iter()
            .find(|row| row.split_whitespace().nth(1) == Some(name))
            .unwrap_or_else(|| panic!("no row for {name}: {table}"))
    };
    assert!(row("cli-status-held").contains("2/5 in use"), "{table}");
    assert!(row("cli-status").contains(" yes "), "{table}");
    assert!(
        row("cli-status").contains("limits in use: 2×1 4×1"),
        "{table}"
    );

    // The two workers, each once, with their pids and this build's version.
    let listed = caracal(&["processes", "--json"]).ok();
    let processes: Vec<Value> = listed
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    let mut pids: Vec<u64> = processes
        .iter()
        .map(|p| p["pid"].as_u64().expect("a pid"))
        .collect();
    pids.sort_unstable();
    let mut expected: Vec<u64> = workers.iter().map(|w| u64::from(w.pid())).collect();
    expected.sort_unstable();
    assert_eq!(pids, expected, "{listed}");
    for process in &processes {
        assert_eq!(process["version"], env!("CARGO_PKG_VERSION"), "{process}");
        assert_eq!(process["identities"], 4, "{process}");
        assert!(
            process["host"].as_str().is_some_and(|h| !h.is_empty()),
            "{process}"
        );
        assert!(process["last_seen_ms"].as_u64() > Some(0), "{process}");
        // By the coordinator's clock; a worker reports every 5 s while it calls.
        assert!(process["age_ms"].as_u64() < Some(15_000), "{process}");
    }
    let table = caracal(&["processes"]).ok();
    println!("caracal processes:\n{table}");
    assert_eq!(
        table.lines().count(),
        3,
        "a header and a row per worker: {table}"
    );
    assert!(table.starts_with("PROCESS"), "{table}");
    assert!(row("cli-status-rate").contains("100/s"), "{table}");
    assert!(row("cli-status-breaker").contains(" closed "), "{table}");

    // Forced open for an hour: the time left is there.
    let opened = caracal(&[
        "breaker",
        "open",
        "cli-status-breaker",
        "--scope",
        &scope,
        "--for",
        "1h",
    ])
    .ok();
    let lines = status();
    let breaker = identity(&lines, "circuit_breaker", "cli-status-breaker").expect("breaker");
    assert_eq!(breaker["state"], "forced_open", "{breaker}");
    assert_eq!(breaker["generation"].as_u64(), Some(generation(&opened)));
    let left = breaker["retry_after_ms"].as_u64().expect("retry_after_ms");
    assert!(left > 0 && left <= 3_600_000, "{breaker}");
    let until = breaker["forced_until_ms"]
        .as_u64()
        .expect("forced_until_ms");
    let now_ms = now_us() / 1000;
    assert!(
        until > now_ms && until <= now_ms + 3_600_000 + PATIENCE.as_millis() as u64,
        "{breaker}"
    );
    let table = caracal(&["status"]).ok();
    assert!(
        row_of(&table, "cli-status-breaker").contains("forced_open"),
        "{table}"
    );
    println!("after `breaker open --for 1h`:\n{table}");
    drop(workers);
}

fn row_of<'a>(table: &'a str, name: &str) -> &'a str {
    table
        .lines()
        .find(|row| row.split_whitespace().nth(1) == Some(name))
        .unwrap_or_else(|| panic!("no row for {name}: {table}"))
}
