//! Every rejection path of the TOML loader, and the fleet override address.

use std::time::Duration;

use super::*;

/// Each text is refused with a reason holding its expected part.
fn assert_rejections(cases: &[(&str, &str)]) {
    for (text, expected) in cases {
        let reason = rejection(text);
        assert!(
            reason.contains(expected),
            "{text:?}\n  gave {reason:?}\n  expected {expected:?}"
        );
    }
}

fn rejection(text: &str) -> String {
    match Config::from_toml_str(text) {
        Err(Error::InvalidConfig { reason }) => reason,
        other => panic!("expected InvalidConfig for {text:?}, got {other:?}"),
    }
}

#[test]
fn a_full_configuration_is_read() {
    let config = Config::from_toml_str(
        r#"
        [bulkhead.partner-api]
        limit = 40
        max_wait = "50ms"

        [circuit_breaker.partner-api]
        failure_threshold = 0.3
        open = "10s"
        on_coordinator_error = "fail_closed"

        [rate_limit.search]
        rate = 200
        burst = 20

        [bulkhead."name.with.dots"]
        lease = "1m"
        "#,
    )
    .expect("valid");
    let table = |kind, name: &str| table(&config.tables, kind, name).expect("present");
    let bulkhead = table(PolicyKind::Bulkhead, "partner-api");
    assert_eq!(bulkhead["limit"], Setting::Count(40));
    assert_eq!(
        bulkhead["max_wait"],
        Setting::Duration(Duration::from_millis(50))
    );
    let breaker = table(PolicyKind::CircuitBreaker, "partner-api");
    assert_eq!(breaker["failure_threshold"], Setting::Number(0.3));
    assert_eq!(
        breaker["on_coordinator_error"],
        Setting::Choice("fail_closed")
    );
    assert_eq!(
        table(PolicyKind::RateLimit, "search")["rate"],
        Setting::Number(200.0)
    );
    assert_eq!(
        table(PolicyKind::Bulkhead, "name.with.dots")["lease"],
        Setting::Duration(Duration::from_secs(60))
    );
    assert!(
        Config::from_toml_str("")
            .expect("empty is valid")
            .is_empty()
    );
}

#[test]
fn every_rejection_names_the_table_and_the_key() {
    let cases = [
        (
            "[bulkhead.a]\nlimit = 0",
            "table [bulkhead.a], key `limit`: must be an integer from 1 to 1000000, got 0",
        ),
        (
            "[bulkhead.a]\nlimit = \"40\"",
            "table [bulkhead.a], key `limit`: must be an integer from 1 to 1000000, not a string",
        ),
        (
            "[bulkhead.a]\nlimit = -1",
            "key `limit`: must be an integer from 1 to 1000000, got -1",
        ),
        (
            "[bulkhead.a]\nlimt = 4",
            "table [bulkhead.a], key `limt`: unknown key `limt` for `bulkhead`; expected one of `limit`, `lease`, `max_wait`",
        ),
        (
            "[bulkhead.a]\nscope = \"x\"",
            "key `scope`: `scope` cannot be set at run time",
        ),
        (
            "[circuit_breaker.b]\nfailure_threshold = 50",
            "table [circuit_breaker.b], key `failure_threshold`: must be a number from 0.001 to 0.999 (a fraction: 0.5 is half the observations), got 50",
        ),
        (
            "[circuit_breaker.b]\nopen = \"10\"",
            "key `open`: must be a duration with a unit",
        ),
        (
            "[circuit_breaker.b]\nopen = 10",
            "key `open`: must be a duration with a unit from 1ms to 1day, like \"250ms\" or \"2s\", not a integer",
        ),
        (
            "[circuit_breaker.b]\non_coordinator_error = \"closed\"",
            "key `on_coordinator_error`: must be \"fail_open\" or \"fail_closed\", got `closed`",
        ),
        (
            "[circuit_breaker.b]\nclassify = \"f\"",
            "key `classify`: `classify` cannot be set at run time",
        ),
        (
            "[circuit_breaker.b]\nminimum_throughput = 50\nwindow_size = 10",
            "table [circuit_breaker.b]: `minimum_throughput` (50) is larger than `window_size` (10)",
        ),
        (
            "[rate_limit.c]\nrate = 0",
            "table [rate_limit.c], key `rate`: must be a number from 0.000001 to 1000000 (admissions per second), got 0",
        ),
        (
            "[rate_limit.c]\nwhen = \"f\"",
            "`when` cannot be set at run time",
        ),
        (
            "[retry.d]\nmax_attempts = 3",
            "table [retry]: unknown policy kind `retry`",
        ),
        (
            "[bulkhead]\nlimit = 3",
            "table [bulkhead]: `limit` is outside a named table: write [bulkhead.<name>]",
        ),
        (
            "bulkhead = 3",
            "table [bulkhead]: `bulkhead` must be a table of named policies",
        ),
        (
            "[bulkhead.\" \"]\nlimit = 3",
            "table [bulkhead. ]: the name must not be blank",
        ),
        ("[bulkhead.a]\nlimit = ", "line 2: "),
    ];
    assert_rejections(&cases);
}

#[test]
fn a_file_is_named_in_its_errors() {
    let dir = std::env::temp_dir().join(format!("caracal-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("caracal.toml");
    std::fs::write(&path, "[bulkhead.a]\nlimit = 0\n").unwrap();
    let reason = match Config::from_toml_file(&path) {
        Err(Error::InvalidConfig { reason }) => reason,
        other => panic!("{other:?}"),
    };
    assert!(
        reason.starts_with(&format!(
            "file {}, table [bulkhead.a], key `limit`",
            path.display()
        )),
        "{reason}"
    );
    let missing = Config::from_toml_file(dir.join("missing.toml")).unwrap_err();
    assert!(
        missing.to_string().contains("cannot read the file"),
        "{missing}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A group's keys read the same however TOML spells them: dotted, as an inline table, or
/// quoted whole.
#[test]
fn thresholds_read_dotted_inline_or_quoted() {
    let config = Config::from_toml_str(
        r#"
        [bulkhead.dotted]
        thresholds.normal = 0.7
        thresholds.sheddable = 0.4

        [bulkhead.inline]
        thresholds = { normal = 0.7, sheddable = 0.4 }

        [rate_limit.quoted]
        "thresholds.normal" = 0.7
        "thresholds.sheddable" = 0.4
        "#,
    )
    .expect("valid");
    for (kind, name) in [
        (PolicyKind::Bulkhead, "dotted"),
        (PolicyKind::Bulkhead, "inline"),
        (PolicyKind::RateLimit, "quoted"),
    ] {
        let table = table(&config.tables, kind, name).expect("present");
        assert_eq!(table["thresholds.normal"], Setting::Number(0.7), "{name}");
        assert_eq!(
            table["thresholds.sheddable"],
            Setting::Number(0.4),
            "{name}"
        );
    }
}

#[test]
fn thresholds_are_shares_with_sheddable_at_most_normal() {
    let cases = [
        (
            "[bulkhead.a]\nthresholds.normal = 0.8\nthresholds.sheddable = 0.9",
            "table [bulkhead.a]: `thresholds.sheddable` (0.9) is larger than `thresholds.normal` (0.8)",
        ),
        (
            "[rate_limit.a]\nthresholds = { normal = 0.5, sheddable = 0.6 }",
            "table [rate_limit.a]: `thresholds.sheddable` (0.6) is larger than",
        ),
        (
            "[bulkhead.a]\nthresholds.normal = 0",
            "key `thresholds.normal`: must be a number from 0.001 to 1 (a share of the limit",
        ),
        (
            "[bulkhead.a]\nthresholds.sheddable = 1.5",
            "key `thresholds.sheddable`: must be a number from 0.001 to 1",
        ),
        (
            "[bulkhead.a]\nthresholds.critical = 0.5",
            "key `thresholds.critical`: `Critical` calls always have the whole limit",
        ),
        (
            "[circuit_breaker.a]\nthresholds.normal = 0.5",
            "unknown key `thresholds.normal` for `circuit_breaker`",
        ),
        (
            "[bulkhead.a]\npriority = \"critical\"",
            "key `priority`: `priority` cannot be set at run time",
        ),
    ];
    assert_rejections(&cases);
}

/// A key may hold a dot as a name may: the key is the kind's longest that ends the address.
#[test]
fn override_keys_find_a_dotted_key_after_a_dotted_name() {
    for (text, name) in [
        ("bulkhead.partner.api.thresholds.normal", "partner.api"),
        ("bulkhead.thresholds.thresholds.normal", "thresholds"),
        ("rate_limit.search.thresholds.sheddable", "search"),
    ] {
        let key = OverrideKey::parse(text).expect(text);
        assert_eq!(key.name, name, "{text}");
        assert!(key.key.name.starts_with("thresholds."), "{text}");
        assert_eq!(key.to_string(), text);
    }
    let key = OverrideKey::parse("bulkhead.a.thresholds.normal").expect("valid");
    assert_eq!(key.value("0.7").expect("valid"), Setting::Number(0.7));
    assert!(key.value("0").is_err());
    let unknown = OverrideKey::parse("bulkhead.a.thresholds.large").unwrap_err();
    assert!(
        unknown.to_string().contains("unknown key `large`"),
        "{unknown}"
    );
}

#[test]
fn override_keys_are_kind_name_key() {
    let key = OverrideKey::parse("bulkhead.partner.api.limit").expect("valid");
    assert_eq!(
        (key.kind, key.name.as_str(), key.key.name),
        (PolicyKind::Bulkhead, "partner.api", "limit")
    );
    assert_eq!(key.to_string(), "bulkhead.partner.api.limit");
    assert_eq!(key.value("7").expect("valid"), Setting::Count(7));
    assert!(
        key.value("0")
            .unwrap_err()
            .to_string()
            .contains("bulkhead.partner.api.limit: must be an integer")
    );
    for bad in [
        "bulkhead",
        "bulkhead.limit",
        "retry.a.max_attempts",
        "bulkhead.a.scope",
        "bulkhead. .limit",
    ] {
        assert!(OverrideKey::parse(bad).is_err(), "{bad}");
    }
}

/// The run-time kinds are exactly the kinds whose spec table says so, found by name: a kind
/// added to one and not the other fails here rather than at its first configuration.
#[test]
fn the_run_time_kinds_are_the_specs() {
    let spec: Vec<_> = caracal_spec::KINDS
        .iter()
        .filter(|kind| kind.run_time)
        .map(|kind| kind.name)
        .collect();
    let kinds: Vec<_> = PolicyKind::ALL.iter().map(|kind| kind.as_str()).collect();
    assert_eq!(kinds, spec);
    for kind in PolicyKind::ALL {
        let names: Vec<_> = keys::keys(kind).iter().map(|key| key.name).collect();
        let spec = caracal_spec::kind(kind.as_str()).expect("found above");
        assert_eq!(
            names,
            spec.keys.iter().map(|key| key.name).collect::<Vec<_>>()
        );
    }
}

/// Between a page's `<!-- spec: {name} -->` and `<!-- /spec -->` markers: the table the spec
/// renders there.
fn rendered<'a>(page: &'a str, name: &str) -> &'a str {
    let open = format!("<!-- spec: {name} -->\n");
    let start = page.find(&open).expect("the page has the marker") + open.len();
    let end = start
        + page[start..]
            .find("<!-- /spec -->")
            .expect("the table ends");
    &page[start..end]
}

/// Fails with the table to paste when the page's differs from the spec's.
fn assert_renders(page: &str, name: &str, expected: &str) {
    assert!(
        rendered(page, name) == expected,
        "the `{name}` table of the docs differs from caracal-spec; it should read:\n{expected}"
    );
}

/// What a key's values are, for the tables.
fn accepts(ty: &caracal_spec::Type) -> String {
    use caracal_spec::Type;
    match ty {
        Type::Integer { .. } => format!("an integer, {ty}"),
        Type::Float { .. } => format!("a number, {ty}"),
        Type::Duration { .. } => format!("a duration, {ty}"),
        Type::Choice(_) | Type::Flag => format!("{ty}"),
        Type::Name => "a string literal or a path to a `const &str`".to_owned(),
    }
}

/// A key as the attribute writes it: `limit`, or `thresholds(normal = …)` for a key of a group.
fn written(key: &caracal_spec::Key) -> String {
    match key.group() {
        Some((group, member)) => format!("{group}({member} = …)"),
        None => key.name.to_owned(),
    }
}

/// What a call's priority is without `priority = …`, as the attributes' tables say it.
const PRIORITY_DEFAULT: &str = "the task's";

#[test]
fn the_attributes_bounds_table_is_the_specs() {
    let mut table =
        String::from("| attribute | argument | accepts | default |\n|---|---|---|---|\n");
    for kind in caracal_spec::KINDS {
        for key in kind.keys {
            let argument = if kind.positional {
                "(the one argument)".to_owned()
            } else {
                format!("`{}`", written(key))
            };
            let accepts = accepts(&key.ty);
            table += &format!(
                "| `#[{}]` | {argument} | {accepts} | {} |\n",
                kind.name, key.default
            );
        }
        for function in kind.functions {
            table += &format!(
                "| `#[{}]` | `{}` | a path to `{}` | {} |\n",
                kind.name, function.name, function.shape, function.default
            );
        }
        if kind.prioritized {
            table += &format!(
                "| `#[{}]` | `{}` | an expression of type `caracal::Priority` | {PRIORITY_DEFAULT} |\n",
                kind.name,
                caracal_spec::PRIORITY
            );
        }
    }
    assert_renders(include_str!("../../docs/attributes.md"), "bounds", &table);
}

#[test]
fn the_configuration_keys_table_is_the_specs() {
    let mut table = String::from("| kind | keys |\n|---|---|\n");
    for kind in caracal_spec::KINDS.iter().filter(|kind| kind.run_time) {
        let keys: Vec<_> = kind
            .keys
            .iter()
            .map(|key| format!("`{}`", key.name))
            .collect();
        table += &format!("| `{}` | {} |\n", kind.name, keys.join(", "));
    }
    assert_renders(include_str!("../../docs/configuration.md"), "keys", &table);
}

/// Each attribute's own table (under its `## `#[name]`` heading) lists its arguments in the
/// spec's order, each with the spec's default (a row may explain it further: `none: reject at
/// once`).
#[test]
fn each_attributes_table_has_the_specs_defaults() {
    let page = include_str!("../../docs/attributes.md");
    for kind in caracal_spec::KINDS.iter().filter(|kind| !kind.positional) {
        let heading = format!("\n## `#[{}]`", kind.name);
        let start = page.find(&heading).expect("a section per attribute") + heading.len();
        let section = &page[start..];
        let section = &section[..section.find("\n## ").unwrap_or(section.len())];
        let rows: Vec<(&str, &str)> = section
            .lines()
            .filter_map(|line| {
                let mut cells = line.strip_prefix("| `")?.split(" | ");
                Some((cells.next()?.strip_suffix('`')?, cells.next()?))
            })
            .collect();
        let priority = kind.prioritized.then(|| {
            (
                caracal_spec::PRIORITY.to_owned(),
                PRIORITY_DEFAULT.to_owned(),
            )
        });
        let expected: Vec<(String, String)> = kind
            .keys
            .iter()
            .map(|key| (written(key), key.default.to_string()))
            .chain(
                kind.functions
                    .iter()
                    .map(|function| (function.name.to_owned(), function.default.to_owned())),
            )
            .chain(priority)
            .collect();
        assert_eq!(
            rows.iter().map(|(name, _)| *name).collect::<Vec<_>>(),
            expected
                .iter()
                .map(|(name, _)| name.as_str())
                .collect::<Vec<_>>(),
            "the arguments of #[{}]",
            kind.name
        );
        for ((name, default), (_, expected)) in rows.iter().zip(&expected) {
            assert!(
                default.starts_with(expected.as_str()),
                "#[{}] `{name}`: the docs say the default is {default}, the spec {expected}",
                kind.name
            );
        }
    }
}
