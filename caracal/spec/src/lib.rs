//! The arguments of [caracal](https://docs.rs/caracal)'s policies as data: for each kind, its
//! keys with their types, bounds, defaults and a line of documentation.
//!
//! One table, three readers: `caracal-macros` checks an attribute's arguments against it at
//! compile time and fills in the defaults; `caracal` checks run-time configuration (TOML and
//! fleet overrides) against the same bounds and builds its tower layers with the same defaults;
//! a test of `caracal` checks its documentation's tables against it. A bound or a default is
//! written here and nowhere else.
//!
//! A new kind is one file (its [`Kind`] constant) and one line in [`KINDS`].
//!
//! ```
//! let lease = caracal_spec::kind("bulkhead").and_then(|kind| kind.key("lease")).unwrap();
//! assert_eq!(lease.default.duration(), std::time::Duration::from_secs(30));
//! ```
#![no_std]
#![forbid(unsafe_code)]

use core::fmt;
use core::time::Duration;

pub mod breaker;
pub mod bulkhead;
pub mod hedge;
pub mod rate_limit;
pub mod retry;
pub mod retry_budget;
pub mod timeout;

/// The policy kinds that own shared state, and that configuration and the admin API name.
///
/// ```
/// use caracal_spec::PolicyKind;
/// assert_eq!(PolicyKind::CircuitBreaker.as_str(), "circuit_breaker");
/// assert_eq!("bulkhead".parse::<PolicyKind>().ok(), Some(PolicyKind::Bulkhead));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum PolicyKind {
    /// `#[bulkhead]`.
    Bulkhead,
    /// `#[circuit_breaker]`.
    CircuitBreaker,
    /// `#[rate_limit]`.
    RateLimit,
    /// `#[retry_budget]`.
    RetryBudget,
}

impl PolicyKind {
    /// Every kind.
    pub const ALL: [PolicyKind; 4] = [
        PolicyKind::Bulkhead,
        PolicyKind::CircuitBreaker,
        PolicyKind::RateLimit,
        PolicyKind::RetryBudget,
    ];

    /// The kind as the attribute, events, configuration and the `caracal` command name it.
    pub const fn as_str(self) -> &'static str {
        self.names().0
    }

    /// The kind as the keys of its shared state name it (@gkoos/caracal's names, so that
    /// replicas of both share one state).
    pub const fn key_name(self) -> &'static str {
        self.names().1
    }

    const fn names(self) -> (&'static str, &'static str) {
        match self {
            PolicyKind::Bulkhead => (bulkhead::KIND.name, "bulkhead"),
            PolicyKind::CircuitBreaker => (breaker::KIND.name, "breaker"),
            PolicyKind::RateLimit => (rate_limit::KIND.name, "ratelimit"),
            PolicyKind::RetryBudget => (retry_budget::KIND.name, "retrybudget"),
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is no [`PolicyKind`]'s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownKind;

impl fmt::Display for UnknownKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("unknown policy kind: expected ")?;
        for (index, kind) in PolicyKind::ALL.iter().enumerate() {
            let separator = match index {
                0 => "",
                _ if index + 1 == PolicyKind::ALL.len() => " or ",
                _ => ", ",
            };
            write!(f, "{separator}`{kind}`")?;
        }
        Ok(())
    }
}

impl core::str::FromStr for PolicyKind {
    type Err = UnknownKind;

    fn from_str(text: &str) -> Result<Self, UnknownKind> {
        PolicyKind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == text)
            .ok_or(UnknownKind)
    }
}

/// Every kind that takes arguments, in the order the documentation lists them.
pub const KINDS: &[&Kind] = &[
    &bulkhead::KIND,
    &breaker::KIND,
    &rate_limit::KIND,
    &timeout::KIND,
    &retry::KIND,
    &retry_budget::KIND,
    &hedge::KIND,
];

/// The kind named `name` (as the attribute is named: `circuit_breaker`), if there is one.
pub fn kind(name: &str) -> Option<&'static Kind> {
    KINDS.iter().copied().find(|kind| kind.name == name)
}

/// The arguments every coordinated kind takes besides its own keys: who shares a budget or a
/// breaker with whom. They name the call site, so they are never set at run time.
pub const IDENTITY: &[&str] = &["name", "operation", "scope", "local"];

/// The longest identity part (a name, an operation, a scope), in UTF-8 bytes.
pub const MAX_PART_BYTES: usize = 1024;

/// One millisecond: the shortest duration most keys accept.
pub const MILLISECOND: Duration = Duration::from_millis(1);

/// The longest duration any key accepts: past it a value is a typo, not a setting.
pub const DAY: Duration = Duration::from_secs(24 * 60 * 60);

/// `shadow = true`: the policy decides every call as it would when enforcing, and its shared
/// state evolves as if the calls it would refuse had been refused, but it lets them run and
/// counts them (`would_reject`). Every kind that can refuse a call takes it.
pub const SHADOW: Key = Key {
    name: "shadow",
    ty: Type::Flag,
    default: Default::Flag(false),
    doc: "decide every call as enforcing would, but let the calls it would refuse run, and count them",
};

/// A share of a limit, as `thresholds(…)` takes it: at least a thousandth (shares are kept in
/// thousandths), at most the whole limit.
const SHARE: Type = Type::Float {
    min: 0.001,
    max: 1.0,
    hint: " (a share of the limit: 0.8 is four fifths of it)",
};

/// `thresholds(normal = 0.8)`: a `Normal` call is admitted only while the fleet's use is below
/// this share of the limit (of the burst, for a rate limit). Every kind with a limit that can
/// be shared out by priority takes it, with [`THRESHOLDS_SHEDDABLE`].
pub const THRESHOLDS_NORMAL: Key = Key {
    name: "thresholds.normal",
    ty: SHARE,
    default: Default::Float(1.0),
    doc: "the share of the limit `Normal` calls may use; `Critical` ones always have the whole of it",
};

/// `thresholds(sheddable = 0.5)`: like [`THRESHOLDS_NORMAL`], for `Sheddable` calls; at most
/// the `normal` share.
pub const THRESHOLDS_SHEDDABLE: Key = Key {
    name: "thresholds.sheddable",
    ty: SHARE,
    default: Default::Float(1.0),
    doc: "the share of the limit `Sheddable` calls may use, at most the `normal` one",
};

/// `thresholds.sheddable` at most `thresholds.normal`: the kinds that take thresholds keep
/// their classes in order.
pub const THRESHOLDS_ORDERED: AtMost = AtMost {
    key: &THRESHOLDS_SHEDDABLE,
    limit: &THRESHOLDS_NORMAL,
    why: "a sheddable call would be admitted where a normal one is refused",
};

/// The argument naming a call's priority, `priority = expr` (a `caracal::Priority` evaluated
/// once per call): code, so never set at run time. The kinds with
/// [`prioritized`](Kind::prioritized) take it.
pub const PRIORITY: &str = "priority";

/// The most keys a kind has: the size of a table with one entry per key of any kind.
pub const MAX_KEYS: usize = {
    let mut most = 0;
    let mut index = 0;
    while index < KINDS.len() {
        if KINDS[index].keys.len() > most {
            most = KINDS[index].keys.len();
        }
        index += 1;
    }
    most
};

/// A policy kind's arguments.
#[derive(Debug)]
pub struct Kind {
    /// The attribute's name, which configuration and events use too.
    pub name: &'static str,
    /// Its keys with values, in the order messages list them.
    pub keys: &'static [Key],
    /// Its arguments naming a function of the user's, after the keys.
    pub functions: &'static [Function],
    /// Whether it takes the [`IDENTITY`] arguments, after the functions.
    pub identity: bool,
    /// Whether run-time configuration may change its keys.
    pub run_time: bool,
    /// Whether its one key is written alone (`#[timeout("2s")]`), not as `key = value`.
    pub positional: bool,
    /// What its keys' values must satisfy together, which every reader checks alike: the
    /// attribute at compile time, a configuration table, a fleet override against the values
    /// in force.
    pub at_most: &'static [AtMost],
    /// Whether it takes [`PRIORITY`], after the identity's arguments.
    pub prioritized: bool,
}

/// Two keys of one kind whose values must be in order: `key`'s at most `limit`'s.
#[derive(Debug)]
pub struct AtMost {
    /// The key whose value must not exceed the other's.
    pub key: &'static Key,
    /// The key that bounds it.
    pub limit: &'static Key,
    /// What goes wrong otherwise, as the end of the message (`the … could never open`).
    pub why: &'static str,
}

impl AtMost {
    /// The message for `key = value` above `limit = bound`, each value as the reader shows it.
    pub fn message<V: fmt::Display, B: fmt::Display>(
        &self,
        value: V,
        bound: B,
    ) -> OutOfOrder<'_, V, B> {
        OutOfOrder {
            relation: self,
            value,
            bound,
        }
    }
}

/// An [`AtMost`] broken by two values: its message as `Display`.
#[derive(Debug)]
pub struct OutOfOrder<'a, V, B> {
    relation: &'a AtMost,
    value: V,
    bound: B,
}

impl<V: fmt::Display, B: fmt::Display> fmt::Display for OutOfOrder<'_, V, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let OutOfOrder {
            relation,
            value,
            bound,
        } = self;
        write!(
            f,
            "`{}` ({value}) is larger than `{}` ({bound}): {}",
            relation.key.name, relation.limit.name, relation.why
        )
    }
}

impl Kind {
    /// The key `name`, if the kind has it.
    pub fn key(&self, name: &str) -> Option<&Key> {
        self.keys.iter().find(|key| key.name == name)
    }

    /// Every argument the attribute accepts, in the order messages list them: the keys (a
    /// group of keys once, by its [`argument`](Key::argument)), the functions, the identity's,
    /// then [`PRIORITY`].
    pub fn arguments(&self) -> impl Iterator<Item = &'static str> + use<> {
        let identity: &'static [&'static str] = if self.identity { IDENTITY } else { &[] };
        let priority: &'static [&'static str] = if self.prioritized { &[PRIORITY] } else { &[] };
        let keys: &'static [Key] = self.keys;
        let functions: &'static [Function] = self.functions;
        keys.iter()
            .enumerate()
            // A group's keys are listed together, so its first one stands for it.
            .filter(move |(at, key)| *at == 0 || keys[at - 1].argument() != key.argument())
            .map(|(_, key)| key.argument())
            .chain(functions.iter().map(|function| function.name))
            .chain(identity.iter().copied())
            .chain(priority.iter().copied())
    }
}

/// One key: `limit = 20`, `open = "30s"`; or one of a group, `thresholds.normal`, which an
/// attribute writes as `thresholds(normal = 0.8)` and configuration as `thresholds.normal`.
#[derive(Debug)]
pub struct Key {
    /// As the attribute, the configuration and the tower setter name it.
    pub name: &'static str,
    /// What values it accepts.
    pub ty: Type,
    /// Its value when not given.
    pub default: Default,
    /// What it means, in one line.
    pub doc: &'static str,
}

impl Key {
    /// The attribute's argument that gives it: its name, or its group's for a key of a group
    /// (`thresholds` for `thresholds.normal`).
    ///
    /// ```
    /// use caracal_spec::{THRESHOLDS_NORMAL, bulkhead};
    /// assert_eq!(THRESHOLDS_NORMAL.argument(), "thresholds");
    /// assert_eq!(bulkhead::LIMIT.argument(), "limit");
    /// ```
    pub fn argument(&self) -> &'static str {
        self.group().map_or(self.name, |(group, _)| group)
    }

    /// Its group and its name inside it (`("thresholds", "normal")`), for a key of a group.
    pub fn group(&self) -> Option<(&'static str, &'static str)> {
        self.name.split_once('.')
    }
}

/// What a key accepts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Type {
    /// An integer (a `u32`) within `min..=max`.
    Integer {
        /// The smallest accepted.
        min: u32,
        /// The largest accepted.
        max: u32,
    },
    /// A number (an `f64`) within `min..=max`.
    Float {
        /// The smallest accepted.
        min: f64,
        /// The largest accepted.
        max: f64,
        /// What the number is, appended to messages about a value out of range: ` (a
        /// fraction: 0.5 is half the observations)`; empty if it goes without saying.
        hint: &'static str,
    },
    /// A duration, written as a string with a unit, within `min..=max`.
    Duration {
        /// The shortest accepted.
        min: Duration,
        /// The longest accepted.
        max: Duration,
    },
    /// One of a few strings.
    Choice(&'static [&'static str]),
    /// `true` or `false`.
    Flag,
    /// The name of another policy's identity, a string (`budget = "partner-api"`): code
    /// naming code, so never set at run time.
    Name,
}

impl Type {
    /// A duration from `min` to a [`DAY`], the bounds of most duration keys.
    pub const fn duration(min: Duration) -> Type {
        Type::Duration { min, max: DAY }
    }
}

/// A key's value when not given.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Default {
    /// There is none: the attribute needs the key. `example` shows it given (`limit = 20`).
    Required {
        /// The key as a message suggests writing it.
        example: &'static str,
    },
    /// Unset: the behaviour the key would change is off (no `max_wait`: reject at once).
    Unset,
    /// This integer.
    Integer(u32),
    /// This number.
    Float(f64),
    /// This duration.
    Duration(Duration),
    /// This choice.
    Choice(&'static str),
    /// This boolean.
    Flag(bool),
    /// Computed from another key's value (a duration).
    Derived(Derived),
}

impl Default {
    /// The integer default; panics (at compile time, where it is used in a `const`) on a key
    /// of another type, which is a mistake in the caller.
    pub const fn integer(self) -> u32 {
        match self {
            Default::Integer(n) => n,
            _ => panic!("the default is not an integer"),
        }
    }

    /// The number default; panics like [`integer`](Self::integer).
    pub const fn float(self) -> f64 {
        match self {
            Default::Float(x) => x,
            _ => panic!("the default is not a number"),
        }
    }

    /// The duration default; panics like [`integer`](Self::integer).
    pub const fn duration(self) -> Duration {
        match self {
            Default::Duration(d) => d,
            _ => panic!("the default is not a duration"),
        }
    }

    /// The choice default; panics like [`integer`](Self::integer).
    pub const fn choice(self) -> &'static str {
        match self {
            Default::Choice(choice) => choice,
            _ => panic!("the default is not a choice"),
        }
    }

    /// The boolean default; panics like [`integer`](Self::integer).
    pub const fn flag(self) -> bool {
        match self {
            Default::Flag(flag) => flag,
            _ => panic!("the default is not a boolean"),
        }
    }

    /// The rule of a derived default; panics like [`integer`](Self::integer).
    pub const fn derived(self) -> Derived {
        match self {
            Default::Derived(rule) => rule,
            _ => panic!("the default is not derived"),
        }
    }
}

/// A default computed from another duration key: `max(times × of, at_least)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Derived {
    /// The key it follows.
    pub of: &'static str,
    /// How many times that key's value.
    pub times: u32,
    /// The least it is.
    pub at_least: Duration,
}

impl Derived {
    /// The default when the key it follows is `of`.
    pub fn apply(self, of: Duration) -> Duration {
        of.saturating_mul(self.times).max(self.at_least)
    }
}

/// An argument naming a function of the user's (`classify = my_classifier`): code, so never set
/// at run time.
#[derive(Debug)]
pub struct Function {
    /// The argument's name.
    pub name: &'static str,
    /// The function's type, as messages show it: `fn(&E) -> bool`.
    pub shape: &'static str,
    /// What is done without it.
    pub default: &'static str,
    /// What it decides, in one line.
    pub doc: &'static str,
}

/// A duration as a user would write it: in the largest unit that keeps it whole (`30s`,
/// `24h`, `100ms`; zero as `0ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Human(pub Duration);

impl fmt::Display for Human {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nanos = self.0.as_nanos();
        if nanos == 0 {
            return f.write_str("0ms");
        }
        let units = [
            (3_600_000_000_000, "h"),
            (60_000_000_000, "m"),
            (1_000_000_000, "s"),
            (1_000_000, "ms"),
            (1_000, "us"),
        ];
        match units.iter().find(|(unit, _)| nanos.is_multiple_of(*unit)) {
            Some((unit, suffix)) => write!(f, "{}{suffix}", nanos / unit),
            None => write!(f, "{nanos}ns"),
        }
    }
}

/// The bounds as the documentation's tables show them: `1 to 1000000`, `100ms to 24h`.
impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Type::Integer { min, max } => write!(f, "{min} to {max}"),
            Type::Float { min, max, .. } => write!(f, "{min} to {max}"),
            Type::Duration { min, max } => write!(f, "{} to {}", Human(min), Human(max)),
            Type::Choice(choices) => {
                for (index, choice) in choices.iter().enumerate() {
                    let separator = if index == 0 { "" } else { " or " };
                    write!(f, "{separator}`\"{choice}\"`")?;
                }
                Ok(())
            }
            Type::Flag => f.write_str("`true` or `false`"),
            Type::Name => f.write_str("a name"),
        }
    }
}

/// The default as the documentation's tables show it: `required`, `` `20` ``,
/// `` `"30s"` ``, `none`, `` `max(3 × open, 60s)` ``.
impl fmt::Display for Default {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Default::Required { .. } => f.write_str("required"),
            Default::Unset => f.write_str("none"),
            Default::Integer(n) => write!(f, "`{n}`"),
            Default::Float(x) => write!(f, "`{x}`"),
            Default::Duration(d) => write!(f, "`\"{}\"`", Human(d)),
            Default::Choice(choice) => write!(f, "`\"{choice}\"`"),
            Default::Flag(flag) => write!(f, "`{flag}`"),
            Default::Derived(Derived {
                of,
                times,
                at_least,
            }) if at_least.is_zero() => write!(f, "`{times} × {of}`"),
            Default::Derived(Derived {
                of,
                times,
                at_least,
            }) => write!(f, "`max({times} × {of}, {})`", Human(at_least)),
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use std::string::ToString;

    use super::*;

    /// Whether `default` is a value `ty` accepts, or no value at all.
    fn within(ty: Type, default: Default) -> bool {
        match (ty, default) {
            (_, Default::Required { .. } | Default::Unset | Default::Derived(_)) => true,
            (Type::Integer { min, max }, Default::Integer(n)) => (min..=max).contains(&n),
            (Type::Float { min, max, .. }, Default::Float(x)) => (min..=max).contains(&x),
            (Type::Duration { min, max }, Default::Duration(d)) => (min..=max).contains(&d),
            (Type::Choice(choices), Default::Choice(choice)) => choices.contains(&choice),
            (Type::Flag, Default::Flag(_)) => true,
            _ => false,
        }
    }

    #[test]
    fn every_default_is_a_value_its_key_accepts() {
        for kind in KINDS {
            for key in kind.keys {
                assert!(within(key.ty, key.default), "{}.{}", kind.name, key.name);
            }
        }
    }

    #[test]
    fn a_derived_default_follows_a_duration_key_of_its_kind() {
        for kind in KINDS {
            for key in kind.keys {
                if let Default::Derived(rule) = key.default {
                    let of = kind.key(rule.of).expect("the key it follows");
                    assert!(matches!(of.ty, Type::Duration { .. }), "{}", key.name);
                    assert!(matches!(key.ty, Type::Duration { .. }), "{}", key.name);
                }
            }
        }
    }

    #[test]
    fn a_required_keys_example_gives_it() {
        for kind in KINDS.iter().filter(|kind| !kind.positional) {
            for key in kind.keys {
                if let Default::Required { example } = key.default {
                    assert!(
                        example.starts_with(&(key.name.to_string() + " = ")),
                        "{example}"
                    );
                }
            }
        }
    }

    #[test]
    fn names_are_unique_and_found() {
        for (index, kind) in KINDS.iter().enumerate() {
            assert!(KINDS[..index].iter().all(|other| other.name != kind.name));
            assert_eq!(
                super::kind(kind.name).map(|found| found.keys.len()),
                Some(kind.keys.len())
            );
            let arguments: std::vec::Vec<_> = kind.arguments().collect();
            for (at, name) in arguments.iter().enumerate() {
                assert!(
                    !arguments[..at].contains(name),
                    "{}: {name} twice",
                    kind.name
                );
            }
            assert!(kind.positional <= (kind.keys.len() == 1 && kind.functions.is_empty()));
        }
        assert_eq!(super::kind("gauge").map(|kind| kind.name), None);
    }

    #[test]
    fn a_groups_keys_are_one_argument_listed_where_its_first_key_is() {
        let arguments: std::vec::Vec<_> = bulkhead::KIND.arguments().collect();
        assert_eq!(
            arguments,
            [
                "limit",
                "lease",
                "max_wait",
                "keep",
                "shadow",
                "thresholds",
                "name",
                "operation",
                "scope",
                "local",
                "priority"
            ]
        );
        for kind in KINDS {
            for (at, key) in kind.keys.iter().enumerate() {
                // Together, so `arguments` lists a group once.
                let earlier = kind.keys[..at]
                    .iter()
                    .rposition(|other| other.argument() == key.argument());
                assert!(
                    earlier.is_none_or(|earlier| earlier + 1 == at),
                    "{}",
                    key.name
                );
            }
        }
    }

    #[test]
    fn durations_read_as_written() {
        let cases = [
            (Duration::ZERO, "0ms"),
            (Duration::from_nanos(1), "1ns"),
            (Duration::from_millis(100), "100ms"),
            (Duration::from_secs(90), "90s"),
            (DAY, "24h"),
        ];
        for (duration, text) in cases {
            assert_eq!(Human(duration).to_string(), text);
        }
        let rule = breaker::WINDOW.default.derived();
        assert_eq!(rule.apply(Duration::from_secs(1)), Duration::from_secs(60));
        assert_eq!(rule.apply(Duration::from_secs(30)), Duration::from_secs(90));
    }
}
