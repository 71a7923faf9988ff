//! What may be configured at run time: each policy kind's keys, their types and bounds (the
//! kind's table in `caracal-spec`, which `caracal-macros` checks the same at compile time), and
//! the parsing of a value from TOML or from text (a fleet override).

use std::fmt;
use std::time::Duration;

pub(crate) use caracal_spec::Key;
use caracal_spec::{KINDS, Type};

use crate::identity::PolicyKind;

/// The most keys a kind has.
pub(crate) const MAX_KEYS: usize = caracal_spec::MAX_KEYS;

/// The spec's table of `kind`, found by the kind's name.
fn spec(kind: PolicyKind) -> &'static caracal_spec::Kind {
    caracal_spec::kind(kind.as_str())
        .filter(|spec| spec.run_time)
        .unwrap_or_else(|| panic!("caracal-spec has no run-time table for `{kind}`"))
}

/// The keys of `kind`, in the attribute's order.
pub(crate) fn keys(kind: PolicyKind) -> &'static [Key] {
    spec(kind).keys
}

/// Whether `name` is an argument of some kind that is part of the call site (its identity, or
/// a function of the user's), so never overridden.
fn fixed(name: &str) -> bool {
    caracal_spec::IDENTITY.contains(&name)
        || name == caracal_spec::PRIORITY
        || KINDS
            .iter()
            .any(|kind| kind.functions.iter().any(|function| function.name == name))
}

/// The key `name` of `kind`, or why there is none.
pub(crate) fn find(kind: PolicyKind, name: &str) -> Result<&'static Key, String> {
    if let Some(key) = keys(kind).iter().find(|key| key.name == name) {
        return Ok(key);
    }
    if fixed(name) {
        return Err(format!(
            "`{name}` cannot be set at run time: it is part of the call site"
        ));
    }
    if name == "thresholds.critical" && keys(kind).iter().any(|key| key.argument() == "thresholds")
    {
        return Err(
            "`Critical` calls always have the whole limit: only `thresholds.normal` and \
             `thresholds.sheddable` are set"
                .to_owned(),
        );
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

/// Why `kind`'s values, as `get` reads them, break one of the relations the spec declares
/// between its keys (`AtMost`), if they do; a key `get` has no value for breaks none.
pub(crate) fn out_of_order(
    kind: PolicyKind,
    get: impl Fn(&str) -> Option<Setting>,
) -> Option<String> {
    spec(kind).at_most.iter().find_map(|relation| {
        let value = get(relation.key.name)?;
        let bound = get(relation.limit.name)?;
        (value.number()? > bound.number()?).then(|| relation.message(value, bound).to_string())
    })
}

/// A configured value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Setting {
    Count(u32),
    Number(f64),
    Duration(Duration),
    Choice(&'static str),
    Flag(bool),
    /// A bulkhead's `limit = adaptive(min, initial, max)`: only an attribute (or a layer)
    /// sets it; configuration and overrides pin a number instead.
    Adaptive {
        min: u32,
        initial: u32,
        max: u32,
    },
}

/// The canonical text of a value: what fleet overrides store and `config get` shows.
impl Setting {
    /// Its value as a number, for a count or a number.
    fn number(self) -> Option<f64> {
        match self {
            Setting::Count(n) => Some(f64::from(n)),
            Setting::Number(x) => Some(x),
            _ => None,
        }
    }
}

impl fmt::Display for Setting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Setting::Count(n) => write!(f, "{n}"),
            Setting::Number(x) => write!(f, "{x}"),
            Setting::Duration(d) => write!(f, "{}", humantime::format_duration(*d)),
            Setting::Choice(choice) => f.write_str(choice),
            Setting::Flag(flag) => write!(f, "{flag}"),
            Setting::Adaptive { min, initial, max } => {
                // No spaces: processes report their values as one `key=value …` line.
                write!(f, "adaptive(min={min},initial={initial},max={max})")
            }
        }
    }
}

/// Reading and checking a value for a key of the spec.
pub(crate) trait Read {
    /// Reads a TOML value.
    fn read_toml(&self, value: &toml::Value) -> Result<Setting, String>;

    /// Reads a value written as text (`40`, `0.3`, `50ms`, `fail_closed`).
    fn read_text(&self, text: &str) -> Result<Setting, String>;

    /// Checks a value against the key's type and bounds.
    fn check(&self, setting: Setting) -> Result<Setting, String>;
}

impl Read for Key {
    fn read_toml(&self, value: &toml::Value) -> Result<Setting, String> {
        let setting = match (self.ty, value) {
            (Type::Integer { .. }, toml::Value::Integer(n)) => {
                Setting::Count(u32::try_from(*n).map_err(|_| out_of_range(self, n))?)
            }
            (Type::Float { .. }, toml::Value::Integer(n)) => Setting::Number(*n as f64),
            (Type::Float { .. }, toml::Value::Float(x)) => Setting::Number(*x),
            (Type::Flag, toml::Value::Boolean(flag)) => Setting::Flag(*flag),
            (Type::Duration { .. } | Type::Choice(_), toml::Value::String(text)) => {
                return self.read_text(text);
            }
            _ => {
                return Err(format!(
                    "must be {}, not a {}",
                    expected(self),
                    value.type_str()
                ));
            }
        };
        self.check(setting)
    }

    fn read_text(&self, text: &str) -> Result<Setting, String> {
        let text = text.trim();
        let setting = match self.ty {
            Type::Integer { .. } => {
                Setting::Count(text.parse().map_err(|_| malformed(self, text))?)
            }
            Type::Float { .. } => Setting::Number(text.parse().map_err(|_| malformed(self, text))?),
            Type::Duration { .. } => Setting::Duration(
                humantime::parse_duration(text).map_err(|_| malformed(self, text))?,
            ),
            Type::Choice(choices) => Setting::Choice(
                choices
                    .iter()
                    .find(|choice| **choice == text)
                    .ok_or_else(|| malformed(self, text))?,
            ),
            Type::Flag => Setting::Flag(text.parse().map_err(|_| malformed(self, text))?),
            // Only kinds that run-time configuration never reaches have one.
            Type::Name => {
                return Err(format!(
                    "`{}` names code, it is not set at run time",
                    self.name
                ));
            }
        };
        self.check(setting)
    }

    fn check(&self, setting: Setting) -> Result<Setting, String> {
        let within = match (self.ty, setting) {
            (Type::Integer { min, max }, Setting::Count(n)) => (min..=max).contains(&n),
            (Type::Float { min, max, .. }, Setting::Number(x)) => {
                x.is_finite() && (min..=max).contains(&x)
            }
            (Type::Duration { min, max }, Setting::Duration(d)) => (min..=max).contains(&d),
            (Type::Choice(_), Setting::Choice(_)) | (Type::Flag, Setting::Flag(_)) => true,
            _ => false,
        };
        if within {
            Ok(setting)
        } else {
            Err(out_of_range(self, setting))
        }
    }
}

/// What `key` accepts, as messages say it.
fn expected(key: &Key) -> String {
    match key.ty {
        Type::Integer { min, max } => format!("an integer from {min} to {max}"),
        Type::Float { min, max, hint } => format!("a number from {min} to {max}{hint}"),
        Type::Duration { min, max } => format!(
            "a duration with a unit from {} to {}, like \"250ms\" or \"2s\"",
            humantime::format_duration(min),
            humantime::format_duration(max)
        ),
        Type::Choice(choices) => {
            let quoted: Vec<_> = choices.iter().map(|c| format!("\"{c}\"")).collect();
            quoted.join(" or ")
        }
        Type::Flag => "`true` or `false`".to_owned(),
        Type::Name => "a name".to_owned(),
    }
}

fn out_of_range(key: &Key, value: impl fmt::Display) -> String {
    format!("must be {}, got {value}", expected(key))
}

fn malformed(key: &Key, text: &str) -> String {
    format!("must be {}, got `{text}`", expected(key))
}

#[cfg(test)]
mod tests;
