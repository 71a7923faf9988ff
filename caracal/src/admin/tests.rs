//! Status rows as each kind builds them, and the table cells they make.

use super::*;
use crate::coordinator::registry::{Registered, Reported};

/// The state `kind` shows for reported `values` and a status read's `figures` at 10s.
fn state(kind: PolicyKind, values: &str, figures: &[i64]) -> PolicyState {
    state_in_use(kind, values, figures, Vec::new())
}

/// The same, with each line of values `uses` holds in use by its number of processes.
fn state_in_use(
    kind: PolicyKind,
    values: &str,
    figures: &[i64],
    uses: Vec<(String, u64)>,
) -> PolicyState {
    let description = format!("[\"{kind}\",\"p\",\"p\",\"global\"]");
    let reported = Registered::read(
        &"0".repeat(64),
        &description,
        (values.into(), String::new()),
        false,
        uses.iter()
            .flat_map(|(values, processes)| (0..*processes).map(move |_| values))
            .enumerate()
            .map(|(process, values)| Reported {
                process: process.to_string(),
                values: values.clone(),
                ..Reported::default()
            })
            .collect(),
    )
    .expect("a readable entry");
    let kind = policy::descriptor(kind);
    let snapshot = Snapshot {
        script: "status",
        now_ms: 10_000,
        figures: figures.to_vec(),
    };
    let values = (kind.status)(&reported, &snapshot).expect("a readable snapshot");
    PolicyState { kind, values }
}

fn fields(state: &PolicyState) -> Vec<(&'static str, String)> {
    state
        .fields()
        .map(|(name, value)| (name, value.to_string()))
        .collect()
}

#[test]
fn a_bulkhead_shows_its_occupancy_of_its_limit() {
    let held = state(PolicyKind::Bulkhead, "limit=5 lease=30s", &[2, 0, 0, 0]);
    assert_eq!(held.summary(), ["2/5 in use".to_owned(), String::new()]);
    assert_eq!(
        fields(&held),
        [
            ("limit", "5".into()),
            ("occupancy", "2".into()),
            ("limits", "?".into()),
            ("latency_us", "?".into()),
            ("base_latency_us", "?".into())
        ]
    );
    let unknown = state(PolicyKind::Bulkhead, "limit=none", &[0, 0, 0, 0]);
    assert_eq!(unknown.get("limit"), Some(&StatusValue::Unset));
    assert_eq!(unknown.summary()[0], "0 in use");
}

/// Under drift the limit is the smallest in use, whichever process reported last, and every
/// limit in use is shown with the number of processes using it.
#[test]
fn a_bulkhead_under_drift_shows_its_smallest_limit_and_each_in_use() {
    let uses = vec![
        ("limit=20 lease=30s".to_owned(), 2),
        ("limit=10 lease=30s".to_owned(), 1),
        ("limit=20 lease=1m".to_owned(), 1),
    ];
    let drifted = state_in_use(
        PolicyKind::Bulkhead,
        "limit=20 lease=30s",
        &[12, 0, 0, 0],
        uses,
    );
    assert_eq!(drifted.get("limit"), Some(&StatusValue::Count(10)));
    assert_eq!(
        drifted.get("limits"),
        Some(&StatusValue::Counts(vec![
            ("10".to_owned(), 1),
            ("20".to_owned(), 3)
        ]))
    );
    assert_eq!(
        drifted.summary(),
        [
            "12/10 in use".to_owned(),
            "limits in use: 10×1 20×3".to_owned()
        ]
    );
}

/// An adaptive limit is the fleet's, with the latencies it came from; pinned by an override,
/// it is the number.
#[test]
fn a_bulkhead_with_an_adaptive_limit_shows_the_fleets_and_its_latencies() {
    let adaptive = "limit=adaptive(min=2,initial=20,max=400) lease=30s";
    let learnt = state(PolicyKind::Bulkhead, adaptive, &[7, 11_400, 40_200, 20_000]);
    assert_eq!(learnt.get("limit"), Some(&StatusValue::Count(11)));
    assert_eq!(
        learnt.summary(),
        [
            "7/11 in use".to_owned(),
            "adaptive: latency 40200µs against 20000µs".to_owned()
        ]
    );
    let pinned = state(
        PolicyKind::Bulkhead,
        "limit=4 lease=30s",
        &[3, 11_400, 40_200, 20_000],
    );
    assert_eq!(pinned.get("limit"), Some(&StatusValue::Count(4)));
    assert_eq!(pinned.get("latency_us"), Some(&StatusValue::Unset));
    // No estimate yet (no report answered): the limit is not known.
    let fresh = state(PolicyKind::Bulkhead, adaptive, &[0, 0, 0, 0]);
    assert_eq!(fresh.get("limit"), Some(&StatusValue::Unset));
}

#[test]
fn a_breaker_shows_its_window_and_the_time_to_its_probe() {
    let names: Vec<&str> = fields(&state(PolicyKind::CircuitBreaker, "", &[-1; 8]))
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    assert_eq!(
        names,
        [
            "state",
            "generation",
            "window_total",
            "window_failures",
            "retry_after_ms",
            "window_slow",
            "forced_until_ms"
        ]
    );
    let absent = state(PolicyKind::CircuitBreaker, "open=10s", &[-1; 8]);
    assert_eq!(
        absent.summary(),
        [
            "closed".to_owned(),
            "generation 0, 0 of 0 failed, 0 slow".to_owned()
        ]
    );
    assert_eq!(absent.get("retry_after_ms"), Some(&StatusValue::Unset));
    let open = state(
        PolicyKind::CircuitBreaker,
        "open=10s",
        &[1, 3, 4_120, 4, 2, 1, 0, 0],
    );
    assert_eq!(
        open.summary(),
        [
            "open".to_owned(),
            "generation 3, 2 of 4 failed, 1 slow, probe in 4s 120ms".to_owned()
        ]
    );
    assert_eq!(open.get("retry_after_ms"), Some(&StatusValue::Count(4_120)));
    assert_eq!(open.get("window_slow"), Some(&StatusValue::Count(1)));
    let forced = state(PolicyKind::CircuitBreaker, "", &[3, 4, 0, 0, 0, 0, 0, 0]);
    assert_eq!(forced.summary()[1], "generation 4, 0 of 0 failed, 0 slow");
    assert_eq!(forced.get("forced_until_ms"), Some(&StatusValue::Unset));
    let for_a_while = state(
        PolicyKind::CircuitBreaker,
        "",
        &[4, 4, 0, 0, 0, 0, 0, 70_000],
    );
    assert_eq!(
        for_a_while.get("state"),
        Some(&StatusValue::Text("forced_closed"))
    );
    assert_eq!(
        for_a_while.get("forced_until_ms"),
        Some(&StatusValue::Count(70_000))
    );
    let lapsed = state(
        PolicyKind::CircuitBreaker,
        "",
        &[0, 5, 0, 9, 9, 0, 10_000, 0],
    );
    assert_eq!(lapsed.get("generation"), Some(&StatusValue::Count(0)));
}

#[test]
fn a_rate_limit_shows_what_processes_report() {
    let reported = state(PolicyKind::RateLimit, "rate=100 burst=7", &[]);
    assert_eq!(
        reported.summary(),
        ["100/s".to_owned(), "burst 7".to_owned()]
    );
    assert_eq!(reported.get("rate"), Some(&StatusValue::Number(100.0)));
    let unknown = state(PolicyKind::RateLimit, "", &[]);
    assert_eq!(unknown.summary(), ["?/s".to_owned(), String::new()]);
}

#[test]
fn an_unreadable_figure_is_a_malformed_reply() {
    let reported = Registered::read(
        &"0".repeat(64),
        "[\"circuit_breaker\",\"p\",\"p\",\"global\"]",
        (String::new(), String::new()),
        false,
        Vec::new(),
    )
    .expect("a readable entry");
    let snapshot = Snapshot {
        script: "breaker_status",
        now_ms: 0,
        figures: vec![9, 0, 0, 0, 0, 0, 0, 0],
    };
    let error = (policy::descriptor(PolicyKind::CircuitBreaker).status)(&reported, &snapshot)
        .expect_err("phase 9 is no phase");
    assert_eq!(
        error.failure_kind(),
        Some(crate::FailureKind::MalformedReply)
    );
    assert!(
        error.to_string().contains("breaker_status replied phase 9"),
        "{error}"
    );
}

#[test]
fn a_forced_state_whose_time_passed_is_over() {
    let forced = |phase: i64, until: i64| {
        let breaker = state(
            PolicyKind::CircuitBreaker,
            "",
            &[phase, 3, 0, 0, 0, 0, 0, until],
        );
        forced_now(&breaker, 10_000)
    };
    assert_eq!(forced(3, 0), Some(Phase::ForcedOpen), "until a reset");
    assert_eq!(forced(4, 20_000), Some(Phase::ForcedClosed));
    assert_eq!(forced(3, 10_000), None, "its time is up");
    assert_eq!(forced(4, 5_000), None);
    assert_eq!(forced(1, 0), None, "open, not forced");
}

#[tokio::test(start_paused = true)]
async fn who_forced_a_breaker_or_set_an_override_is_recorded_until_replaced() {
    let coordinator = Coordinator::in_memory();
    let admin = coordinator.admin();
    let breaker = BreakerId::new("partner-api");
    let key = breaker.identity(&coordinator).expect("an identity").key;
    let alice = Operator::new("alice@ops").with_reason("incident 4711");
    let open = BreakerCommand::Open { lasts: None };
    admin
        .breaker_by(&breaker, open, &alice)
        .await
        .expect("opened");
    let records = coordinator.operator_records().await.expect("read");
    let recorded = records
        .steered(PolicyKind::CircuitBreaker, &key, "forced_open")
        .expect("reads");
    let recorded = recorded.expect("alice's record");
    assert_eq!(
        (&recorded.who, &recorded.reason),
        (&alice.who, &alice.reason)
    );
    assert!(recorded.at_ms.is_some_and(|at| at > 0), "{recorded:?}");
    // A reset is a command of its own: the forced state's record is gone with it.
    admin
        .breaker(&breaker, BreakerCommand::Reset)
        .await
        .expect("reset");
    let records = coordinator.operator_records().await.expect("read");
    assert_eq!(
        records
            .steered(PolicyKind::CircuitBreaker, &key, "forced_open")
            .ok(),
        Some(None)
    );

    let setting = "bulkhead.partner-api.limit";
    admin
        .set_override_by(setting, "40", &alice)
        .await
        .expect("set");
    let values = admin.config(Some(setting)).await.expect("config");
    let operator = values[0].operator.as_ref().expect("alice's");
    assert_eq!(operator.who, "alice@ops");
    admin.set_override(setting, "41").await.expect("set");
    let values = admin.config(Some(setting)).await.expect("config");
    assert_eq!(
        (values[0].value.as_str(), &values[0].operator),
        ("41", &None)
    );
    let blank = Operator::new("alice@ops").with_reason(" ");
    let refused = admin.set_override_by(setting, "42", &blank).await;
    assert!(
        matches!(refused, Err(Error::InvalidConfig { .. })),
        "{refused:?}"
    );
}

/// A policy's settings include its dotted keys, and not those of a policy whose name extends
/// its own.
#[tokio::test(start_paused = true)]
async fn config_of_a_policy_lists_its_dotted_keys_only() {
    let coordinator = Coordinator::in_memory();
    let admin = coordinator.admin();
    for setting in [
        "bulkhead.partner.thresholds.normal",
        "bulkhead.partner.limit",
        "bulkhead.partner.eu.limit",
    ] {
        admin.set_override(setting, "1").await.expect("set");
    }
    let settings = |values: Vec<ConfigValue>| -> Vec<String> {
        values.into_iter().map(|value| value.setting).collect()
    };
    let partner = admin
        .config(Some("bulkhead.partner"))
        .await
        .expect("config");
    assert_eq!(
        settings(partner),
        [
            "bulkhead.partner.limit",
            "bulkhead.partner.thresholds.normal"
        ]
    );
    let eu = admin
        .config(Some("bulkhead.partner.eu"))
        .await
        .expect("config");
    assert_eq!(settings(eu), ["bulkhead.partner.eu.limit"]);
}
