//! The key table's reading and checking of values.

use super::*;

#[test]
fn values_are_read_from_text_and_toml_alike() {
    let limit = find(PolicyKind::Bulkhead, "limit").unwrap();
    assert_eq!(limit.read_text(" 40 "), Ok(Setting::Count(40)));
    assert_eq!(
        limit.read_toml(&toml::Value::Integer(40)),
        Ok(Setting::Count(40))
    );
    assert!(
        limit
            .read_text("0")
            .unwrap_err()
            .contains("from 1 to 1000000, got 0")
    );
    assert!(
        limit
            .read_toml(&toml::Value::String("40".into()))
            .unwrap_err()
            .contains("not a string")
    );
    let open = find(PolicyKind::CircuitBreaker, "open").unwrap();
    assert_eq!(
        open.read_text("10s"),
        Ok(Setting::Duration(Duration::from_secs(10)))
    );
    assert!(open.read_text("10").is_err(), "a duration needs a unit");
    assert!(open.read_text("25h").is_err());
    let rate = find(PolicyKind::RateLimit, "rate").unwrap();
    assert_eq!(
        rate.read_toml(&toml::Value::Integer(200)),
        Ok(Setting::Number(200.0))
    );
    assert!(rate.read_text("NaN").is_err());
    let choice = find(PolicyKind::CircuitBreaker, "on_coordinator_error").unwrap();
    assert_eq!(
        choice.read_text("fail_closed"),
        Ok(Setting::Choice("fail_closed"))
    );
    assert!(choice.read_text("closed").is_err());
}

#[test]
fn unknown_and_fixed_keys_say_so() {
    assert!(
        find(PolicyKind::Bulkhead, "limt")
            .unwrap_err()
            .contains("expected one of `limit`, `lease`, `max_wait`")
    );
    assert!(
        find(PolicyKind::RateLimit, "scope")
            .unwrap_err()
            .contains("cannot be set at run time")
    );
}

#[test]
fn max_keys_is_the_most_any_kind_has() {
    let most = PolicyKind::ALL
        .map(|kind| keys(kind).len())
        .into_iter()
        .max();
    assert_eq!(most, Some(MAX_KEYS));
}

#[test]
fn canonical_text_reads_back() {
    for kind in PolicyKind::ALL {
        for key in keys(kind) {
            let sample = match key.ty {
                Type::Integer { min, .. } => Setting::Count(min),
                Type::Float { max, .. } => Setting::Number(max),
                Type::Duration { min, .. } => Setting::Duration(min * 3 / 2),
                Type::Choice(choices) => Setting::Choice(choices[0]),
                Type::Flag => Setting::Flag(true),
                Type::Name => continue,
            };
            assert_eq!(
                key.read_text(&sample.to_string()),
                Ok(sample),
                "{}",
                key.name
            );
        }
    }
}
