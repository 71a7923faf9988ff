//! The Grafana dashboard and the Prometheus alert rules under `dashboards/` query only series
//! caracal exports: the metrics example (`examples/metrics.rs`) runs against a real Redis,
//! under the load it makes itself, and its `/metrics` is scraped until every series a panel or
//! a rule names is there (`promtool check rules`, in `scripts/test`, checks the rules' syntax).

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use caracal_tests::RedisServer;

use crate::common::{PATIENCE, unique};

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
