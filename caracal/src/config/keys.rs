//! What may be configured at run time: each policy kind's keys, their types and bounds, and
//! the parsing of a value from TOML or from text (a fleet override). The bounds are the
//! attribute's (`caracal-macros` checks the same at compile time).

use std::fmt;
use std::time::Duration;

use crate::identity::PolicyKind;

const MILLISECOND: Duration = Duration::from_millis(1);
const DAY: Duration = Duration::from_secs(24 * 60 * 60);
/// The shortest bulkhead lease: renewal every third of it must stay practical.
const MIN_LEASE: Duration = Duration::from_millis(100);

/// The type and bounds of one key.
#[derive(Debug, Clone, Copy)]
enum Type {
    Count {
        min: u32,
        max: u32,
    },
    Number {
        min: f64,
        max: f64,
        hint: &'static str,
    },
    Duration {
        min: Duration,
        max: Duration,
    },
    Choice(&'static [&'static str]),
}

/// One configurable key of a policy kind.
#[derive(Debug)]
pub(crate) struct Key {
    pub(crate) name: &'static str,
    kind: Type,
}

const fn key(name: &'static str, kind: Type) -> Key {
    Key { name, kind }
}

const FRACTION: Type = Type::Number {
    min: 0.001,
    max: 0.999,
    hint: " (a fraction: 0.5 is half the observations)",
};

const fn count(min: u32, max: u32) -> Type {
    Type::Count { min, max }
}

const fn duration(min: Duration) -> Type {
    Type::Duration { min, max: DAY }
}

const BULKHEAD: &[Key] = &[
    key("limit", count(1, 1_000_000)),
    key("lease", duration(MIN_LEASE)),
    key("max_wait", duration(MILLISECOND)),
];

const CIRCUIT_BREAKER: &[Key] = &[
    key("minimum_throughput", count(1, u32::MAX)),
    key("failure_threshold", FRACTION),
    key("window_size", count(1, 1_000_000)),
    key("window", duration(MILLISECOND)),
    key("open", duration(MILLISECOND)),
    key("half_open_probes", count(1, 10_000)),
    key("half_open_successes", count(1, 10_000)),
    key("probe_lease", duration(MILLISECOND)),
    key("slow_call", duration(MILLISECOND)),
    key("slow_call_threshold", FRACTION),
    key(
        "on_coordinator_error",
        Type::Choice(&["fail_open", "fail_closed"]),
    ),
];

const RATE_LIMIT: &[Key] = &[
    key(
        "rate",
        Type::Number {
            min: 0.000_001,
            max: 1_000_000.0,
            hint: " (admissions per second)",
        },
    ),
    key("burst", count(1, 1_000_000)),
];

/// The most keys a kind has.
pub(crate) const MAX_KEYS: usize = 11;

/// Arguments that name or shape an identity, or are code: never overridden.
const FIXED: &[&str] = &["name", "operation", "scope", "local", "classify", "when"];

/// The keys of `kind`, in the attribute's order.
pub(crate) fn keys(kind: PolicyKind) -> &'static [Key] {
    match kind {
        PolicyKind::Bulkhead => BULKHEAD,
        PolicyKind::CircuitBreaker => CIRCUIT_BREAKER,
        PolicyKind::RateLimit => RATE_LIMIT,
    }
}

/// The key `name` of `kind`, or why there is none.
pub(crate) fn find(kind: PolicyKind, name: &str) -> Result<&'static Key, String> {
    if let Some(key) = keys(kind).iter().find(|key| key.name == name) {
        return Ok(key);
    }
    if FIXED.contains(&name) {
        return Err(format!(
            "`{name}` cannot be set at run time: it is part of the call site"
        ));
    }
    let expected: Vec<_> = keys(kind)
        .iter()
        .map(|key| format!("`{}`", key.name))
        .collect();
    Err(format!(
        "unknown key `{name}` for `{kind}`; expected one of {}",
        expected.join(", ")
    ))
}

/// A configured value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Setting {
    Count(u32),
    Number(f64),
    Duration(Duration),
    Choice(&'static str),
}

/// The canonical text of a value: what fleet overrides store and `config get` shows.
impl fmt::Display for Setting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Setting::Count(n) => write!(f, "{n}"),
            Setting::Number(x) => write!(f, "{x}"),
            Setting::Duration(d) => write!(f, "{}", humantime::format_duration(*d)),
            Setting::Choice(choice) => f.write_str(choice),
        }
    }
}

impl Key {
    /// Reads a TOML value.
    pub(crate) fn read_toml(&self, value: &toml::Value) -> Result<Setting, String> {
        let setting = match (self.kind, value) {
            (Type::Count { .. }, toml::Value::Integer(n)) => {
                Setting::Count(u32::try_from(*n).map_err(|_| self.out_of_range(n))?)
            }
            (Type::Number { .. }, toml::Value::Integer(n)) => Setting::Number(*n as f64),
            (Type::Number { .. }, toml::Value::Float(x)) => Setting::Number(*x),
            (Type::Duration { .. } | Type::Choice(_), toml::Value::String(text)) => {
                return self.read_text(text);
            }
            _ => {
                return Err(format!(
                    "must be {}, not a {}",
                    self.expected(),
                    value.type_str()
                ));
            }
        };
        self.check(setting)
    }

    /// Reads a value written as text (`40`, `0.3`, `50ms`, `fail_closed`).
    pub(crate) fn read_text(&self, text: &str) -> Result<Setting, String> {
        let text = text.trim();
        let setting = match self.kind {
            Type::Count { .. } => Setting::Count(text.parse().map_err(|_| self.malformed(text))?),
            Type::Number { .. } => Setting::Number(text.parse().map_err(|_| self.malformed(text))?),
            Type::Duration { .. } => Setting::Duration(
                humantime::parse_duration(text).map_err(|_| self.malformed(text))?,
            ),
            Type::Choice(choices) => Setting::Choice(
                choices
                    .iter()
                    .find(|choice| **choice == text)
                    .ok_or_else(|| self.malformed(text))?,
            ),
        };
        self.check(setting)
    }

    pub(crate) fn check(&self, setting: Setting) -> Result<Setting, String> {
        let within = match (self.kind, setting) {
            (Type::Count { min, max }, Setting::Count(n)) => (min..=max).contains(&n),
            (Type::Number { min, max, .. }, Setting::Number(x)) => {
                x.is_finite() && (min..=max).contains(&x)
            }
            (Type::Duration { min, max }, Setting::Duration(d)) => (min..=max).contains(&d),
            (Type::Choice(_), Setting::Choice(_)) => true,
            _ => false,
        };
        if within {
            Ok(setting)
        } else {
            Err(self.out_of_range(setting))
        }
    }

    fn expected(&self) -> String {
        match self.kind {
            Type::Count { min, max } => format!("an integer from {min} to {max}"),
            Type::Number { min, max, hint } => format!("a number from {min} to {max}{hint}"),
            Type::Duration { min, max } => format!(
                "a duration with a unit from {} to {}, like \"250ms\" or \"2s\"",
                humantime::format_duration(min),
                humantime::format_duration(max)
            ),
            Type::Choice(choices) => {
                let quoted: Vec<_> = choices.iter().map(|c| format!("\"{c}\"")).collect();
                quoted.join(" or ")
            }
        }
    }

    fn out_of_range(&self, value: impl fmt::Display) -> String {
        format!("must be {}, got {value}", self.expected())
    }

    fn malformed(&self, text: &str) -> String {
        format!("must be {}, got `{text}`", self.expected())
    }
}

#[cfg(test)]
mod tests {
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
                let sample = match key.kind {
                    Type::Count { min, .. } => Setting::Count(min),
                    Type::Number { max, .. } => Setting::Number(max),
                    Type::Duration { min, .. } => Setting::Duration(min * 3 / 2),
                    Type::Choice(choices) => Setting::Choice(choices[0]),
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
}
