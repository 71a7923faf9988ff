use super::*;
use crate::identity::{Identity, PolicyKind, Scope};
use crate::priority::Priority;

/// The reporting process of `reporter` (which names process and site alike here).
fn process(reporter: &'static str) -> Reporting {
    Reporting {
        id: reporter,
        record: "{}".to_owned(),
        ttl_ms: 1_000,
    }
}

fn report(values: &str, reporter: &str) -> Report {
    under_fleet(0, values, reporter)
}

fn under_fleet(fleet: u64, values: &str, reporter: &str) -> Report {
    let identity = Identity::new("ns", PolicyKind::Bulkhead, "b", "op", &Scope::GLOBAL);
    Report {
        key: identity.key.clone(),
        description: describe(&identity),
        values: values.to_owned(),
        sources: "attribute attribute attribute".to_owned(),
        reporter: reporter.to_owned(),
        ttl_ms: 1_000,
        fleet,
        extra: "{}".to_owned(),
    }
}

/// While a fleet-wide change spreads, processes report the old values and the new ones
/// side by side: that is the change being applied, not processes that disagree.
#[test]
fn reporters_under_different_fleet_overrides_are_no_drift() {
    let mut store = Store::default();
    assert_eq!(
        store.report(0, &process("a"), &[under_fleet(1, "limit=3", "a")]),
        [false]
    );
    assert_eq!(
        store.report(10, &process("b"), &[under_fleet(2, "limit=1", "b")]),
        [false]
    );
    assert_eq!(
        store.report(20, &process("a"), &[under_fleet(1, "limit=3", "a")]),
        [false]
    );
    assert_eq!(
        store.report(30, &process("a"), &[under_fleet(2, "limit=1", "a")]),
        [false]
    );
    assert_eq!(
        store.report(40, &process("b"), &[under_fleet(2, "limit=5", "b")]),
        [true]
    );
}

#[test]
fn two_reporters_with_different_values_are_drift_until_they_agree_for_a_window() {
    let mut store = Store::default();
    let drift_ms = DRIFT_WINDOW.as_millis() as u64;
    assert_eq!(
        store.report(0, &process("a"), &[report("limit=3", "a")]),
        [false]
    );
    assert_eq!(
        store.report(10, &process("b"), &[report("limit=3", "b")]),
        [false]
    );
    assert_eq!(
        store.report(20, &process("a"), &[report("limit=5", "a")]),
        [true]
    );
    assert_eq!(
        store.report(30, &process("b"), &[report("limit=3", "b")]),
        [true]
    );
    let listed = store.read(40);
    assert_eq!(listed.len(), 1);
    let entry = &listed[0];
    assert!(entry.drift);
    assert_eq!(
        (
            entry.kind,
            entry.name.as_str(),
            entry.operation.as_str(),
            entry.scope.as_str()
        ),
        (PolicyKind::Bulkhead, "b", "op", "global")
    );
    assert_eq!(entry.value("limit"), Some("3"));
    // Both agree again: drift lapses a window after the last disagreement.
    assert_eq!(
        store.report(40, &process("a"), &[report("limit=3", "a")]),
        [true]
    );
    assert_eq!(
        store.report(30 + drift_ms + 1, &process("a"), &[report("limit=3", "a")]),
        [false]
    );
}

/// An identity an operator steered is listed, reported by no process, for as long as the
/// state it stored lasts; a process that then reports it is no drift from that.
#[test]
fn a_held_identity_is_listed_unreported_until_its_state_ends() {
    let mut store = Store::default();
    let r = report("limit=3", "a");
    store.hold(0, &r.key, &r.description, 500);
    let listed = store.read(499);
    assert_eq!(listed.len(), 1);
    assert!(!listed[0].reported() && !listed[0].used(), "{listed:?}");
    assert!(store.read(500).is_empty());
    store.hold(600, &r.key, &r.description, 5_000);
    assert_eq!(store.report(700, &process("a"), &[r]), [false]);
    let listed = store.read(800);
    assert!(listed[0].reported() && listed[0].used(), "{listed:?}");
}

#[test]
fn an_identity_is_forgotten_once_its_ttl_passes_unreported() {
    let mut store = Store::default();
    store.report(0, &process("a"), &[report("limit=3", "a")]);
    assert_eq!(store.read(999).len(), 1);
    assert!(store.read(1_000).is_empty());
}

#[test]
fn a_value_with_spaces_is_one_value() {
    let mut store = Store::default();
    let mut r = report("window=1m 30s open=3s", "a");
    r.sources = "attribute fleet".to_owned();
    store.report(0, &process("a"), &[r]);
    let entry = &store.read(1)[0];
    assert_eq!(entry.value("window"), Some("1m 30s"));
    let entries: Vec<_> = entry.entries().collect();
    assert_eq!(
        entries,
        [("window", "1m 30s", "attribute"), ("open", "3s", "fleet")]
    );
}

#[test]
fn entries_read_values_and_sources_by_key() {
    let mut store = Store::default();
    let mut r = report("limit=3 lease=30s max_wait=none", "a");
    r.sources = "fleet config attribute".to_owned();
    store.report(0, &process("a"), &[r]);
    let entry = &store.read(1)[0];
    assert_eq!(entry.value("lease"), Some("30s"));
    assert_eq!(entry.value("max_wait"), None);
    let entries: Vec<_> = entry.entries().collect();
    assert_eq!(
        entries,
        [
            ("limit", "3", "fleet"),
            ("lease", "30s", "config"),
            ("max_wait", "none", "attribute")
        ]
    );
}

/// The entry of the identity `description` whose `values` the attribute set, as `uses`
/// reported it.
fn reported_entry(description: &str, values: &str, uses: Vec<Reported>) -> Registered {
    let values = (values.to_owned(), "attribute".to_owned());
    Registered::read(&"0".repeat(64), description, values, false, uses).expect("readable")
}

/// What a process adds to its report reads back as it was sent, and the fleet's rates are
/// the sum of its processes'.
#[test]
fn reports_carry_rates_and_ignored_keys_that_add_up_across_processes() {
    let rates = crate::tally::Rates {
        admitted: 10.0,
        rejected: vec![("capacity", 2.0)],
        degraded: vec![],
        would_reject: vec![("open", 1.5)],
        classes: vec![
            (Priority::Critical, 8.0, 0.0),
            (Priority::Sheddable, 2.0, 2.0),
        ],
        local_share: None,
    };
    let extra = Reported::extra(&rates, &["minimum_throughput"], "attribute");
    let map = serde_json::json!({
        "p1": ["limit=3", 100_000, extra],
        "p2": ["limit=3", 100_000, Reported::extra(&rates, &[], "attribute")],
        // Past the drift window: forgotten.
        "p3": ["limit=9", 80_000, "{}"],
    });
    let uses = uses_of(&map.to_string(), 100_100);
    assert_eq!(uses.len(), 2, "{uses:?}");
    let entry = reported_entry(r#"["bulkhead","b","b","global"]"#, "limit=3", uses);
    assert_eq!(
        entry.rates(),
        Rates {
            admitted: 20.0,
            rejected: vec![("capacity".to_owned(), 4.0)],
            degraded: vec![],
            would_reject: vec![("open".to_owned(), 3.0)],
            classes: vec![
                ("critical".to_owned(), 16.0, 0.0),
                ("sheddable".to_owned(), 4.0, 4.0)
            ],
            local_share: None,
        }
    );
    assert_eq!(
        entry.ignoring("minimum_throughput").collect::<Vec<_>>(),
        ["p1"]
    );
    assert_eq!(entry.in_use("limit"), [("3".to_owned(), 2)]);
}

#[test]
fn an_unreadable_extra_says_nothing() {
    let reported = Reported::read("p", "limit=3", "not json");
    assert_eq!(reported.rates, Rates::default());
    assert!(reported.ignored.is_empty());
}

/// What a process adds reads as the JSON object it always was, its keys and reasons in order,
/// text escaped, a rate that is no number `null`.
#[test]
fn a_reports_extra_is_the_json_it_was() {
    let rates = crate::tally::Rates {
        admitted: f64::NAN,
        rejected: vec![("timeout", 1.0), ("capacity", 2.25)],
        degraded: vec![],
        would_reject: vec![("open", 1.5)],
        classes: vec![(Priority::Normal, 0.5, 1.0)],
        local_share: None,
    };
    assert_eq!(
        Reported::extra(
            &rates,
            &["minimum_throughput", "limit"],
            "attribute \"fleet\""
        ),
        r#"{"admitted":null,"classes":{"normal":[0.5,1.0]},"degraded":{},"ignored":["minimum_throughput","limit"],"rejected":{"capacity":2.25,"timeout":1.0},"sources":"attribute \"fleet\"","would_reject":{"open":1.5}}"#
    );
    let none = crate::tally::Rates::default();
    assert_eq!(
        Reported::extra(&none, &[], ""),
        r#"{"admitted":0.0,"degraded":{},"ignored":[],"rejected":{},"sources":"","would_reject":{}}"#
    );
}

/// A retry budget's run on its local share reads back as it was sent, older by the report's
/// age once it ended; the fleet's is the run that ended last.
#[test]
fn reports_carry_the_latest_run_on_the_local_share() {
    let ran = |local_share| crate::tally::Rates {
        local_share,
        ..crate::tally::Rates::default()
    };
    let ended = Reported::extra(&ran(Some((12.0, 40.0))), &[], "attribute");
    assert_eq!(
        ended,
        r#"{"admitted":0.0,"degraded":{},"ignored":[],"local_share":[12.0,40.0],"rejected":{},"sources":"attribute","would_reject":{}}"#
    );
    let map = serde_json::json!({
        // Reported 2 s ago.
        "p1": ["percent=20", 98_000, ended],
        "p2": ["percent=20", 100_000, Reported::extra(&ran(Some((3.0, 30.0))), &[], "")],
        "p3": ["percent=20", 100_000, Reported::extra(&ran(None), &[], "")],
    });
    let uses = uses_of(&map.to_string(), 100_000);
    let local: Vec<_> = uses.iter().map(|u| u.rates.local_share).collect();
    assert_eq!(local, [Some((12.0, 42.0)), Some((3.0, 30.0)), None]);
    let entry = reported_entry(r#"["retry_budget","r","r","global"]"#, "percent=20", uses);
    assert_eq!(entry.rates().local_share, Some((3.0, 30.0)));
    let on_it = Reported::extra(&ran(Some((5.0, 0.0))), &[], "");
    let still = uses_of(
        &serde_json::json!({"p": ["", 98_000, on_it]}).to_string(),
        100_000,
    );
    assert_eq!(
        still[0].rates.local_share,
        Some((5.0, 0.0)),
        "on it at its report"
    );
}

/// One identity in two layouts (an operator's hold in this one, a process of an earlier
/// version reporting it with drift in its own): the listing keeps the other layout's values,
/// sources and drift where this one's entry has none, and never loses drift either way.
#[test]
fn an_identity_in_two_layouts_keeps_the_values_and_drift_either_holds() {
    let description = r#"["bulkhead","b","b","global"]"#;
    let held = || {
        let nothing = (String::new(), String::new());
        Registered::read(&"0".repeat(64), description, nothing, false, Vec::new())
            .expect("readable")
    };
    let reported = |values: &str, drift: bool| Registered {
        drift,
        ..reported_entry(description, values, Vec::new())
    };

    let mut listed = held();
    listed.merge(reported("limit=5", true));
    assert_eq!(
        (
            listed.values.as_str(),
            listed.sources.as_str(),
            listed.drift
        ),
        ("limit=5", "attribute", true),
        "the earlier layout's values and drift dropped"
    );
    assert!(listed.reported());

    // Values of its own are kept, and drift noticed in either stays noticed.
    let mut listed = reported("limit=3", false);
    listed.merge(reported("limit=5", true));
    assert_eq!((listed.values.as_str(), listed.drift), ("limit=3", true));
    let mut listed = reported("limit=3", true);
    listed.merge(reported("limit=5", false));
    assert_eq!((listed.values.as_str(), listed.drift), ("limit=3", true));
}
