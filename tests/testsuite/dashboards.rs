//! The Grafana dashboard and the Prometheus alert rules under `dashboards/` query only series
//! caracal exports: the metrics example (`examples/metrics.rs`) runs against a real Redis,
//! under the load it makes itself, and its `/metrics` is scraped until every series a panel or
//! a rule names is there (`promtool check rules`, in `scripts/test`, checks the rules' syntax).
//! And the rules run on series recorded from caracal's own metrics through incidents, by
//! Prometheus's engine (`promtool test rules`, which `scripts/test` installs): a breaker's and
//! a bulkhead's from this process, and the coordinator's from a fleet of worker processes,
//! scraped one by one.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use caracal::admin::{BreakerCommand, BreakerId};
use caracal::{Coordinator, bulkhead, circuit_breaker};
use caracal_tests::{FaultProxy, MetricsLog, RedisServer};
use tokio::sync::watch;

use crate::common::worker::Worker;
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

/// One series of a recorder's dump (`name{labels} value`) as Prometheus stores it once
/// scraped from `instance`: with the `job` and `instance` labels it adds.
fn as_scraped(line: &str, instance: &str) -> Option<(String, String)> {
    let (series, value) = line.rsplit_once(' ')?;
    let series = series.strip_suffix('}')?;
    let comma = if series.ends_with('{') { "" } else { "," };
    Some((
        format!("{series}{comma}job=\"rules\",instance=\"{instance}\"}}"),
        value.to_owned(),
    ))
}

/// What this run's policies exported, read from the recorder as a scrape would read it.
fn scrape_recorded() -> BTreeMap<String, String> {
    MetricsLog::global()
        .dump()
        .lines()
        .filter(|line| line.contains("name=\"rules-") && !line.ends_with(" samples"))
        .filter_map(|line| as_scraped(line, "recorded:9000"))
        .collect()
}

/// Runs the rules of `dashboards/alerts.yml` with `promtool test rules` on `scrapes` (one per
/// 15 s step, from 0 s), and checks the alerts firing at each checkpoint: `(eval_time, label
/// sets)`, each label set one group of `count by (<by>) (ALERTS{alertstate="firing"})` that
/// counts 1, and no other group.
fn promtool_checks(
    scrapes: &[BTreeMap<String, String>],
    by: &str,
    checkpoints: &[(&str, &[&str])],
) {
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
    for (at, firing) in checkpoints {
        file.push_str(&format!(
            "      - expr: 'count by ({by}) (ALERTS{{alertstate=\"firing\"}})'\n        eval_time: {at}\n        exp_samples:\n"
        ));
        for labels in *firing {
            file.push_str(&format!(
                "          - labels: '{{{labels}}}'\n            value: 1\n"
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

    // The alerts firing at each checkpoint, each a few evaluations away from a change: at
    // rest, none; the breaker open in eu pages, and its refusals do not (its own alert says
    // so), nor once it is reset; the full bulkhead turns half of the calls away (5 minutes
    // of them, with no day of history to compare with), then saturates; the breaker forced
    // open is shown at once and pages an hour after.
    let rejecting = "alertname=\"CaracalRejectionRateHigh\"";
    let forced = "alertname=\"CaracalCircuitBreakerForcedOpen\"";
    promtool_checks(
        &scrapes,
        "alertname",
        &[
            ("9m45s", &[]),
            ("12m30s", &["alertname=\"CaracalCircuitBreakerOpen\""]),
            ("16m", &[]),
            ("25m", &[rejecting]),
            (
                "32m30s",
                &["alertname=\"CaracalBulkheadSaturated\"", rejecting],
            ),
            ("95m", &[forced]),
            (
                "104m",
                &[
                    forced,
                    "alertname=\"CaracalCircuitBreakerForcedWithoutEnd\"",
                ],
            ),
        ],
    );
}

/// One scrape of each worker of a `scrapes` fleet, after each has made `calls` calls: every
/// series of the fleet, each with the `instance` it came from.
fn scrape_fleet(fleet: &mut [(&str, Worker)], calls: u32) -> BTreeMap<String, String> {
    let mut scrape = BTreeMap::new();
    for (instance, worker) in fleet.iter_mut() {
        worker.send(&format!("step {calls}"));
        for line in worker.lines_through("scraped", PATIENCE) {
            if let Some(series) = line.strip_prefix("series ") {
                scrape.extend(as_scraped(series, instance));
            }
        }
    }
    scrape
}

/// Tells each worker of `fleet` to wait until its `caracal_coordinator_up` reads `up`.
fn wait_up(fleet: &mut [(&str, Worker)], up: u8) {
    for (_, worker) in fleet.iter_mut() {
        worker.send(&format!("up {up}"));
    }
    for (_, worker) in fleet.iter() {
        worker.expect_line(&format!("up {up}"), PATIENCE * 3);
    }
}

/// The coordinator's alerts evaluated by `promtool test rules` on series scraped from two
/// worker processes sharing a distributed bulkhead, each through a proxy of its own to one
/// Redis: one process cut off from Redis (a partition), then Redis out of reach of both (the
/// server down, as its clients see it), each 10 minutes, one scrape of both (15 s of rule
/// time) per step. The coordinator pages per process, a minute after its `up` fell; the
/// bulkhead's refusals (degraded, failing closed) page fleet-wide, summed over both processes,
/// 5 minutes after; nothing fires at rest, before, between or after.
#[test]
fn the_coordinator_alerts_fire_on_series_scraped_from_a_fleet() {
    let server = RedisServer::start();
    let proxies = [
        FaultProxy::start(server.addr()),
        FaultProxy::start(server.addr()),
    ];
    let (namespace, scope) = (unique("rules-fleet"), format!("scope={}", unique("region")));
    let mut fleet: Vec<(&str, Worker)> = ["orders-a:9000", "orders-b:9000"]
        .into_iter()
        .zip(&proxies)
        .map(|(instance, proxy)| {
            let worker = Worker::spawn(
                &proxy.url(),
                &namespace,
                "scrapes",
                std::slice::from_ref(&scope),
            );
            worker.expect_line("ready", PATIENCE);
            (instance, worker)
        })
        .collect();
    let mut scrapes = Vec::new();
    for step in 0..240 {
        // orders-a cut off from 10:00 to 20:00; both from 30:00 to 40:00. Each step that
        // follows a change waits for every process to see it, so a step is a scrape taken
        // after the change, whatever the machine's speed.
        let cut = match step {
            40 => 1,
            120 => 2,
            _ => 0,
        };
        if cut > 0 {
            for proxy in &proxies[..cut] {
                proxy.cut();
            }
            wait_up(&mut fleet[..cut], 0);
        }
        if step == 80 || step == 160 {
            for proxy in &proxies {
                proxy.restore();
            }
            wait_up(&mut fleet, 1);
        }
        scrapes.push(scrape_fleet(&mut fleet, 8));
    }

    let down =
        |instance: &str| format!("alertname=\"CaracalCoordinatorDown\",instance=\"{instance}\"");
    let (down_a, down_b) = (down("orders-a:9000"), down("orders-b:9000"));
    let rejecting = "alertname=\"CaracalRejectionRateHigh\"";
    promtool_checks(
        &scrapes,
        "alertname, instance",
        &[
            ("9m45s", &[]),
            // A minute after orders-a's up fell, it alone. Its refusals, half of the fleet's
            // decisions once the 5-minute rates hold only the outage, page 5 minutes after
            // the fleet's share first exceeds 5% (10:30: at 10:15 it is exactly 5%), and
            // until the outage has left the rates' window.
            ("10m45s", &[]),
            ("11m", &[&down_a]),
            ("15m15s", &[&down_a]),
            ("15m30s", &[&down_a, rejecting]),
            ("20m", &[rejecting]),
            ("24m", &[rejecting]),
            ("24m15s", &[]),
            // Both, each by itself; every decision is turned away.
            ("30m45s", &[]),
            ("31m", &[&down_a, &down_b]),
            ("35m", &[&down_a, &down_b]),
            ("35m15s", &[&down_a, &down_b, rejecting]),
            ("40m", &[rejecting]),
            ("44m30s", &[]),
            ("59m45s", &[]),
        ],
    );
}
