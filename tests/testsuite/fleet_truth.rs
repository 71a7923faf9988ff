//! The `caracal` command tells the operator the truth about a real fleet: a command on a
//! name or scope no process uses, or a value the sites would reject, exits 3 naming what is
//! in use (`--force` does it anyway); a site that meets an override it cannot apply ignores
//! that key alone, says so with `config.ignored`, and keeps the identity's other overrides.

use caracal_tests::RedisServer;
use caracal_tests::wait::wait_until;

use crate::cli::{caracal, settings};
use crate::common::{PATIENCE, unique};
use crate::fleet_ops::{Stream, identity, status_json};

#[test]
fn what_no_process_uses_is_refused_naming_what_is_and_forced_overrides_are_ignored_alone() {
    let server = RedisServer::start();
    let (url, namespace, scope) = (server.url(), unique("truth"), unique("scope"));
    let args = [
        format!("scope={scope}"),
        "drift_limit=2".to_owned(),
        "events=config.ignored,config.applied".to_owned(),
    ];
    let mut worker = Stream::spawn(&url, &namespace, "cli-status", &args);
    worker.until("every policy in use", |w| w.has_line("using"));
    let caracal = |args: &[&str]| caracal(&url, &namespace, args);

    // A scope nobody uses: the scopes in use for the name are named.
    let line = caracal(&[
        "breaker",
        "open",
        "cli-status-breaker",
        "--scope",
        "eu",
        "--for",
        "2m",
    ])
    .failed(3);
    assert!(
        line.contains("no process uses circuit breaker cli-status-breaker (scope eu)")
            && line.contains(&format!("in use: cli-status-breaker (scope {scope})")),
        "{line}"
    );
    // A name nobody uses: the names in use for the kind.
    let line = caracal(&["breaker", "open", "cli-status-breakr", "--scope", &scope]).failed(3);
    assert!(
        line.contains("named `cli-status-breakr` (in use: cli-status-breaker;"),
        "{line}"
    );
    let line = caracal(&["config", "set", "bulkhead.cli-status-hed.limit", "7"]).failed(3);
    assert!(
        line.contains("named `cli-status-hed` (in use: cli-status, cli-status-held;"),
        "{line}"
    );
    // A value the site would reject: the site and why.
    let line = caracal(&[
        "config",
        "set",
        "circuit_breaker.cli-status-breaker.minimum_throughput",
        "500",
    ])
    .failed(3);
    assert!(
        line.contains(&format!(
            "would be ignored by circuit breaker cli-status-breaker (scope {scope})"
        )) && line.contains("`window_size` (100)"),
        "{line}"
    );
    // Nothing changed.
    assert_eq!(
        settings(&caracal(&["config", "get", "bulkhead.cli-status-hed"]).ok()),
        ""
    );
    let lines = status_json(&url, &namespace);
    let breaker = identity(&lines, "circuit_breaker", "cli-status-breaker").expect("breaker");
    assert_eq!(breaker["state"], "closed", "{breaker}");

    // Forced, the rejected value is stored; then another override of the same identity.
    caracal(&[
        "config",
        "set",
        "circuit_breaker.cli-status-breaker.minimum_throughput",
        "500",
        "--force",
    ])
    .ok();
    caracal(&[
        "config",
        "set",
        "circuit_breaker.cli-status-breaker.open",
        "3s",
    ])
    .ok();
    // The site applies `open` (were every override of the identity dropped, it would go on
    // reporting the attribute's `open` beside the fleet's).
    wait_until(
        PATIENCE,
        "the site to apply `open` and nothing else",
        || {
            let open = settings(
                &caracal(&["config", "get", "circuit_breaker.cli-status-breaker.open"]).ok(),
            );
            let minimum = caracal(&[
                "config",
                "get",
                "circuit_breaker.cli-status-breaker.minimum_throughput",
            ])
            .ok();
            open == "circuit_breaker.cli-status-breaker.open = 3s (fleet)\n"
                && minimum.contains("minimum_throughput = 20 (attribute)")
        },
    );
    worker.until("the site to say it ignores the key", |w| {
        !w.events(
            "config.ignored",
            &[
                ("name", "cli-status-breaker"),
                ("key", "minimum_throughput"),
            ],
        )
        .is_empty()
    });
    // `config get` marks the override ignored by the one process.
    wait_until(
        PATIENCE,
        "config get to count the process ignoring it",
        || {
            caracal(&[
                "config",
                "get",
                "circuit_breaker.cli-status-breaker.minimum_throughput",
            ])
            .ok()
            .contains("minimum_throughput = 500 (fleet, ignored by 1 process)")
        },
    );
    let json = caracal(&[
        "--json",
        "config",
        "get",
        "circuit_breaker.cli-status-breaker.minimum_throughput",
    ])
    .ok();
    let fleet: Vec<serde_json::Value> = json
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .filter(|value: &serde_json::Value| value["source"] == "fleet")
        .collect();
    assert_eq!(fleet.len(), 1, "{json}");
    assert_eq!(fleet[0]["ignored_by"], 1, "{json}");
    let ignored = worker.events("config.ignored", &[]);
    for event in &ignored {
        assert_eq!(
            (event["policy"].as_str(), event["value"].as_str()),
            ("circuit_breaker", "500"),
            "{event:?}"
        );
    }
    // Once per change of the overrides, not once per call.
    let applied = worker.events("config.applied", &[]).len();
    assert!(
        ignored.len() <= applied,
        "{ignored:?} after {applied} changes"
    );
}
