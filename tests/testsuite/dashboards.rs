//! The Grafana dashboard and the Prometheus alert rules under `dashboards/` query only series
//! caracal exports: the metrics example (`examples/metrics.rs`) runs against a real Redis,
//! under the load it makes itself, and its `/metrics` is scraped until every series a panel or
//! a rule names is there (`promtool check rules`, in `scripts/test`, checks the rules' syntax).
//! And the rules run on series recorded from caracal's own metrics through incidents, by
//! Prometheus's engine (`promtool test rules`, which `scripts/test` installs).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use caracal::admin::{BreakerCommand, BreakerId};
use caracal::{Coordinator, bulkhead, circuit_breaker};
use caracal_tests::{MetricsLog, RedisServer};
use tokio::sync::watch;

use crate::common::{PATIENCE, TestError, code, eventually, unique};

/// The repository's root.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is in the repository")
}

/// Every `caracal_…` series name in `text`.
fn series_in(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("caracal_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        names.insert(name);
    }
    names
}

/// The series the dashboard's panels and variables query.
fn dashboard_series() -> BTreeSet<String> {
    let text = std::fs::read_to_string(root().join("dashboards/caracal.json"))
        .expect("dashboards/caracal.json");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("each panel queries") {
            queries.push(target["expr"].as_str().expect("a PromQL expr").to_owned());
        }
    }
    for variable in dashboard["templating"]["list"]
        .as_array()
        .expect("variables")
    {
        if let Some(query) = variable["query"]["query"].as_str() {
            queries.push(query.to_owned());
        }
    }
    queries.iter().flat_map(|query| series_in(query)).collect()
}

/// The series the alert rules query (their `expr`s, and the queries their annotations suggest).
fn rule_series() -> BTreeSet<String> {
    let text = std::fs::read_to_string(root().join("dashboards/alerts.yml"))
        .expect("dashboards/alerts.yml");
    let names = series_in(&text);
    assert!(text.matches("- alert:").count() >= 3, "{text}");
    names
}

/// The metrics example's binary, brought up to date with its source (a no-op after `cargo test
/// --workspace`, which builds the examples with the tests).
fn example() -> PathBuf {
    let deps = std::env::current_exe().expect("the test binary");
    let profile = deps
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/");
    let status = Command::new(env!("CARGO"))
        .args([
            "build",
            "-p",
            "caracal-examples-metrics",
            "--example",
            "metrics",
        ])
        .current_dir(root())
        .status()
        .expect("run cargo");
    assert!(status.success(), "cargo build --example metrics");
    profile.join("examples").join("metrics")
}

/// The example, killed when dropped.
struct Example(Child);

impl Drop for Example {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One `GET /metrics` of the example at `addr`: the body, or `None` while it is not listening.
fn scrape(addr: &str) -> Option<String> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(PATIENCE)).ok()?;
    write!(stream, "GET /metrics HTTP/1.1\r\nhost: {addr}\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_owned())
}

/// The series names of a scrape (`name{labels} value` lines; `# HELP`/`# TYPE` left out).
fn scraped(body: &str) -> BTreeSet<String> {
    body.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split(['{', ' ']).next())
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_series_the_dashboard_and_rules_query_is_exported() {
    let wanted: BTreeSet<String> = dashboard_series().union(&rule_series()).cloned().collect();
    for family in [
        "caracal_bulkhead_in_flight",
        "caracal_bulkhead_limit",
        "caracal_decisions_total",
        "caracal_circuit_breaker_state",
        "caracal_circuit_breaker_failure_rate",
        "caracal_coordinator_seconds_bucket",
        "caracal_coordinator_up",
    ] {
        assert!(
            wanted.contains(family),
            "nothing shows {family}: {wanted:?}"
        );
    }

    let server = RedisServer::start();
    let addr = {
        let free = TcpListener::bind("127.0.0.1:0").expect("a free port");
        free.local_addr().expect("its address").to_string()
    };
    let _example = Example(
        Command::new(example())
            .env("CARACAL_REDIS_URL", server.url())
            .env("CARACAL_NAMESPACE", unique("dashboards"))
            .env("METRICS_ADDR", &addr)
            .stdout(Stdio::null())
            .spawn()
            .expect("start the metrics example"),
    );

    let deadline = Instant::now() + PATIENCE * 3;
    let body = loop {
        let body = scrape(&addr).unwrap_or_default();
        let exported = scraped(&body);
        let missing: Vec<_> = wanted.difference(&exported).collect();
        if missing.is_empty() {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "series queried but never exported: {missing:?}\n{body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    // Timings are histograms, which add up across replicas, not per-process summaries.
    for histogram in ["caracal_admission_seconds", "caracal_coordinator_seconds"] {
        assert!(
            body.contains(&format!("# TYPE {histogram} histogram")),
            "{histogram} is a histogram:\n{body}"
        );
    }
}

#[circuit_breaker(name = "rules-partner", scope = scope, minimum_throughput = 4, window_size = 8,
                  failure_threshold = 0.5, open = "1h")]
async fn rules_partner(scope: &str, fail: bool) -> Result<(), TestError> {
    if fail {
        Err(TestError::Body("the partner failed"))
    } else {
        Ok(())
    }
}

#[bulkhead(name = "rules-db", limit = 2, scope = scope)]
async fn rules_db(scope: &str, gate: Option<watch::Receiver<bool>>) -> Result<(), TestError> {
    if let Some(mut gate) = gate {
        let _ = gate.wait_for(|open| *open).await;
    }
    Ok(())
}

/// What this run's policies exported, read from the recorder as a scrape would read it:
/// `series{labels}` → value, with the labels Prometheus adds to what it scrapes.
fn scrape_recorded() -> BTreeMap<String, String> {
    MetricsLog::global()
        .dump()
        .lines()
        .filter(|line| line.contains("name=\"rules-") && !line.ends_with(" samples"))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let series = series.strip_suffix('}')?;
            Some((
                format!("{series},job=\"rules\",instance=\"recorded:9000\"}}"),
                value.to_owned(),
            ))
        })
        .collect()
}

/// The rules of `dashboards/alerts.yml` evaluated by Prometheus's own engine (`promtool test
/// rules`) on series recorded from caracal's own metrics, not written by hand: a scoped
/// breaker and a scoped bulkhead run in this process, through a stretch at rest, a partner
/// failing in one region, one region's bulkhead held full, and a breaker forced open with no
/// end, one scrape (15 s of rule time) per step. Which alerts fire at each checkpoint, and
/// none at rest.
#[tokio::test(flavor = "current_thread")]
async fn the_rules_fire_on_series_recorded_from_caracals_metrics() {
    /// Steps of 15 s of rule time.
    const STEPS: usize = 420;
    MetricsLog::global();
    let coordinator = Coordinator::in_memory();
    let admin = coordinator.admin();
    let (eu, us) = ("region:eu", "region:us");
    let (gate, held) = watch::channel(false);
    let mut scrapes: Vec<BTreeMap<String, String>> = Vec::new();
    let mut holding = Vec::new();
    coordinator
        .scoped(async {
            for step in 0..STEPS {
                // The partner fails in eu from 10:00; an operator resets its breaker at 15:00.
                let failing = (40..60).contains(&step);
                if step == 60 {
                    let breaker = BreakerId::new("rules-partner").scope(eu);
                    admin
                        .breaker(&breaker, BreakerCommand::Reset)
                        .await
                        .expect("reset");
                }
                // eu's bulkhead held full from 15:00 to 35:00.
                if step == 60 {
                    for _ in 0..2 {
                        let body = coordinator.scoped(rules_db(eu, Some(held.clone())));
                        holding.push(tokio::spawn(body));
                    }
                    eventually("eu's bulkhead full", || {
                        MetricsLog::global().gauge(
                            caracal::metrics::BULKHEAD_IN_FLIGHT,
                            &[("name", "rules-db"), ("scope", eu)],
                        ) == Some(2.0)
                    })
                    .await;
                }
                if step == 140 {
                    gate.send_replace(true);
                    for body in holding.drain(..) {
                        assert_eq!(code(&body.await.expect("no panic")), "ok");
                    }
                }
                // Forced open in us with no end from 37:30, and left so.
                if step == 150 {
                    let breaker = BreakerId::new("rules-partner").scope(us);
                    let command = BreakerCommand::Open { lasts: None };
                    admin.breaker(&breaker, command).await.expect("forced");
                }
                for _ in 0..8 {
                    let _ = rules_partner(eu, failing).await;
                    let _ = rules_partner(us, false).await;
                    let _ = rules_db(eu, None).await;
                    let _ = rules_db(us, None).await;
                }
                if step == 40 {
                    eventually("eu's breaker open", || {
                        MetricsLog::global().gauge(
                            caracal::metrics::CIRCUIT_BREAKER_STATE,
                            &[("name", "rules-partner"), ("scope", eu)],
                        ) == Some(1.0)
                    })
                    .await;
                }
                scrapes.push(scrape_recorded());
            }
        })
        .await;
    coordinator.shutdown().await;

    // Every series, as the scrapes saw it (`_`: not exported yet).
    let names: BTreeSet<&String> = scrapes.iter().flat_map(BTreeMap::keys).collect();
    let mut file = format!(
        "rule_files: [{:?}]\nevaluation_interval: 15s\n\
         group_eval_order: [caracal-records, caracal]\ntests:\n  - interval: 15s\n    input_series:\n",
        root().join("dashboards/alerts.yml")
    );
    for name in names {
        let values: Vec<&str> = scrapes
            .iter()
            .map(|scrape| scrape.get(name).map_or("_", String::as_str))
            .collect();
        file.push_str(&format!(
            "      - series: '{name}'\n        values: '{}'\n",
            values.join(" ")
        ));
    }
    file.push_str("    promql_expr_test:\n");
    // The alerts firing at each checkpoint, each a few evaluations away from a change: at
    // rest, none; the breaker open in eu pages before the refusals it makes do (5 minutes of
    // them, with no day of history to compare with); the full bulkhead turns half of the
    // calls away, then saturates; the breaker forced open is shown at once and pages an hour
    // after, its refusals paging all along.
    let rejecting = ("CaracalRejectionRateHigh", 1);
    let forced = ("CaracalCircuitBreakerForcedOpen", 1);
    let checkpoints: &[(&str, &[(&str, u32)])] = &[
        ("9m45s", &[]),
        ("12m30s", &[("CaracalCircuitBreakerOpen", 1)]),
        ("25m", &[rejecting]),
        ("32m30s", &[("CaracalBulkheadSaturated", 1), rejecting]),
        ("95m", &[forced, rejecting]),
        (
            "104m",
            &[
                forced,
                ("CaracalCircuitBreakerForcedWithoutEnd", 1),
                rejecting,
            ],
        ),
    ];
    for (at, firing) in checkpoints {
        file.push_str(&format!(
            "      - expr: 'count by (alertname) (ALERTS{{alertstate=\"firing\"}})'\n        eval_time: {at}\n        exp_samples:\n"
        ));
        for (alert, count) in *firing {
            file.push_str(&format!(
                "          - labels: '{{alertname=\"{alert}\"}}'\n            value: {count}\n"
            ));
        }
        if firing.is_empty() {
            file.push_str("          []\n");
        }
    }
    let path = std::env::temp_dir().join(format!("{}.yml", unique("alerts-recorded")));
    std::fs::write(&path, &file).expect("write the rule test");
    let output = Command::new("promtool")
        .args(["test", "rules"])
        .arg(&path)
        .output()
        .expect("run promtool (scripts/test installs it)");
    assert!(
        output.status.success(),
        "promtool test rules {}:\n{}{}",
        path.display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let _ = std::fs::remove_file(&path);
}
