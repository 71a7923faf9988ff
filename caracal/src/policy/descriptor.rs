//! A policy kind as the rest of caracal sees it: its name, its status fields and how a table
//! shows them, the events it emits and the decisions it counts. Each kind declares one
//! [`Descriptor`] in its own folder and [`POLICIES`](super::POLICIES) lists them; `caracal
//! status` (library and command), the metrics' documentation and the tests that tie events to
//! their names are driven from these, so a new kind adds its own and one line there, not an arm
//! in every `match`.

use std::fmt;
use std::time::Duration;

use crate::coordinator::registry::{Registered, Snapshot, StatusRead};
use crate::error::Error;
use crate::identity::PolicyKind;

/// One policy kind.
#[derive(Debug)]
pub(crate) struct Descriptor {
    /// The kind; its name is [`PolicyKind::as_str`].
    pub(crate) kind: PolicyKind,
    /// What `caracal status` shows of an identity of this kind, in this order.
    pub(crate) fields: &'static [Field],
    /// The table's STATE and DETAIL cells: templates over the fields (see [`render`]).
    pub(crate) table: [&'static str; 2],
    /// How its live state is read (`None`: what was reported says all an operator reads).
    pub(crate) read: Option<StatusRead>,
    /// Builds its fields' values, in [`fields`](Self::fields)' order, from what processes
    /// reported and what the read answered ([`Snapshot::NOTHING`] when there is no read).
    pub(crate) status: fn(&Registered, &Snapshot) -> Result<Vec<StatusValue>, Error>,
    /// The `event` of every event it emits.
    // Read by the tests that hold the emitted events to it.
    #[cfg_attr(not(test), expect(dead_code))]
    pub(crate) events: &'static [&'static str],
    /// The `reason`s it counts under each decision of `caracal_decisions_total`.
    // Read by the tests that hold the metrics' documentation to it.
    #[cfg_attr(not(test), expect(dead_code))]
    pub(crate) decisions: Decisions,
}

/// The `reason` label values of one kind's decisions (see [`crate::metrics`]).
#[derive(Debug)]
pub(crate) struct Decisions {
    /// Under `admitted`.
    #[cfg_attr(not(test), expect(dead_code))]
    pub(crate) admitted: &'static [&'static str],
    /// Under `rejected`.
    #[cfg_attr(not(test), expect(dead_code))]
    pub(crate) rejected: &'static [&'static str],
    /// Under `degraded`.
    #[cfg_attr(not(test), expect(dead_code))]
    pub(crate) degraded: &'static [&'static str],
}

/// One status field of a kind.
#[derive(Debug)]
pub(crate) struct Field {
    /// Its name: the key in `status --json` and in table templates.
    pub(crate) name: &'static str,
    /// What it holds, and in what unit.
    pub(crate) unit: Unit,
}

impl Field {
    /// A field `status` (and `status --json`) shows.
    pub(crate) const fn new(name: &'static str, unit: Unit) -> Self {
        Field { name, unit }
    }
}

/// What a status field holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unit {
    /// A count (calls, slots, a generation).
    Count,
    /// Admissions per second.
    PerSecond,
    /// A state's name.
    State,
    /// A time left in milliseconds, which a table shows as a duration.
    Millis,
}

/// The value of one status field.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum StatusValue {
    /// Not known or not set: `null` in JSON, `?` in a table.
    Unset,
    /// A count.
    Count(u64),
    /// A number that need not be whole (a rate).
    Number(f64),
    /// A name (a state).
    Text(&'static str),
    /// Values in use and how many processes use each (`limits` under drift): a JSON object
    /// (`{"10": 1, "20": 2}`), `10×1 20×2` in a table.
    Counts(Vec<(String, u64)>),
}

impl StatusValue {
    /// `value` as a count, or unset.
    pub(crate) fn count(value: Option<impl Into<u64>>) -> Self {
        value.map_or(StatusValue::Unset, |n| StatusValue::Count(n.into()))
    }
}

impl fmt::Display for StatusValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StatusValue::Unset => f.write_str("?"),
            StatusValue::Count(n) => write!(f, "{n}"),
            StatusValue::Number(n) => write!(f, "{n}"),
            StatusValue::Text(text) => f.write_str(text),
            StatusValue::Counts(counts) => {
                let shown: Vec<String> = counts
                    .iter()
                    .map(|(value, processes)| format!("{value}×{processes}"))
                    .collect();
                f.write_str(&shown.join(" "))
            }
        }
    }
}

impl Field {
    /// The field's value as a table shows it: a time in milliseconds while they matter,
    /// whole seconds after (`850ms`, `4s 120ms`, `4m 59s`); anything else as it is.
    pub(crate) fn show(&self, value: &StatusValue) -> String {
        match (self.unit, value) {
            (Unit::Millis, StatusValue::Count(ms)) => {
                let shown = if *ms >= 10_000 {
                    Duration::from_secs(ms / 1000)
                } else {
                    Duration::from_millis(*ms)
                };
                humantime::format_duration(shown).to_string()
            }
            _ => value.to_string(),
        }
    }
}

/// Fills in a table template: `{field}` is the field as [`Field::show`] shows its value (`?`
/// when unset); a `[…]` group is left out whole when a field in it is unset. `value` looks a
/// field and its value up by name.
pub(crate) fn render<'a>(
    template: &str,
    value: impl Fn(&str) -> Option<(&'a Field, &'a StatusValue)>,
) -> String {
    let mut out = String::new();
    let mut group: Option<(String, bool)> = None;
    let mut rest = template;
    while let Some(at) = rest.find(['{', '[', ']']) {
        let (text, tail) = rest.split_at(at);
        let target = match &mut group {
            Some((held, _)) => held,
            None => &mut out,
        };
        target.push_str(text);
        rest = &tail[1..];
        match tail.as_bytes()[0] {
            b'[' => group = Some((String::new(), true)),
            b']' => {
                if let Some((held, complete)) = group.take()
                    && complete
                {
                    out.push_str(&held);
                }
            }
            _ => {
                let (name, tail) = rest.split_once('}').unwrap_or((rest, ""));
                rest = tail;
                let (shown, set) = match value(name) {
                    Some((field, value)) => (field.show(value), *value != StatusValue::Unset),
                    None => (StatusValue::Unset.to_string(), false),
                };
                match &mut group {
                    Some((held, complete)) => {
                        *complete &= set;
                        held.push_str(&shown);
                    }
                    None => out.push_str(&shown),
                }
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::POLICIES;

    /// Every kind's status read names keys: a batch of reads tells one identity's keys from
    /// the next by their number (the coordinator's `batch_keys`).
    #[test]
    fn every_status_read_names_keys() {
        for policy in POLICIES {
            if let Some(read) = policy.read {
                assert!(
                    !read.keys.is_empty(),
                    "{:?}'s status read names no keys",
                    policy.kind
                );
            }
        }
    }

    #[test]
    fn every_kind_has_one_descriptor_in_kind_order() {
        let kinds: Vec<PolicyKind> = POLICIES.iter().map(|policy| policy.kind).collect();
        assert_eq!(kinds, PolicyKind::ALL);
    }

    #[test]
    fn templates_name_only_their_kinds_fields() {
        for policy in POLICIES {
            for template in policy.table {
                let named: Vec<&str> = template
                    .split('{')
                    .skip(1)
                    .filter_map(|part| part.split_once('}').map(|(name, _)| name))
                    .collect();
                for name in named {
                    assert!(
                        policy.fields.iter().any(|field| field.name == name),
                        "{}: `{name}` in {template:?}",
                        policy.kind
                    );
                }
            }
        }
    }

    #[test]
    fn times_left_read_well() {
        let field = Field::new("left_ms", Unit::Millis);
        let shown = |ms| field.show(&StatusValue::Count(ms));
        assert_eq!(shown(555), "555ms");
        assert_eq!(shown(4_120), "4s 120ms");
        assert_eq!(shown(299_983), "4m 59s");
        assert_eq!(shown(0), "0s");
    }

    #[test]
    fn a_group_with_an_unset_field_is_left_out() {
        let values = [
            (Field::new("a", Unit::Count), StatusValue::Count(3)),
            (Field::new("b", Unit::Count), StatusValue::Unset),
            (Field::new("c", Unit::PerSecond), StatusValue::Number(2.5)),
        ];
        let value = |name: &str| {
            values
                .iter()
                .find(|(field, _)| field.name == name)
                .map(|(field, value)| (field, value))
        };
        assert_eq!(render("{a}[/{b}] in use", value), "3 in use");
        assert_eq!(render("{a}[/{c}] in use", value), "3/2.5 in use");
        assert_eq!(render("{b}/s", value), "?/s");
        assert_eq!(render("[burst {b}]", value), "");
        assert_eq!(render("", value), "");
    }

    /// Every `policy_event!` and `would_reject!` of the crate's sources, by its event name.
    fn emitted_events() -> Vec<String> {
        fn walk(dir: &std::path::Path, names: &mut Vec<String>) {
            for entry in std::fs::read_dir(dir).expect("readable source tree") {
                let path = entry.expect("a directory entry").path();
                if path.is_dir() {
                    walk(&path, names);
                } else if path.extension().is_some_and(|ext| ext == "rs") {
                    let source = std::fs::read_to_string(&path).expect("a readable source");
                    let emits = source
                        .match_indices("policy_event!(")
                        .chain(source.match_indices("would_reject!("));
                    for (at, _) in emits {
                        let rest = &source[at..];
                        if let Some(name) = rest.split('"').nth(1) {
                            names.push(name.to_owned());
                        }
                    }
                }
            }
        }
        let mut names = Vec::new();
        walk(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            &mut names,
        );
        names
    }

    /// The event names a kind declares are the ones its code emits, and it emits no event of
    /// the kind that its descriptor leaves out.
    #[test]
    fn declared_events_are_the_emitted_ones() {
        let emitted_events = emitted_events();
        for policy in POLICIES {
            let prefix = format!("{}.", policy.kind);
            let mut emitted: Vec<&str> = emitted_events
                .iter()
                .map(String::as_str)
                .filter(|name| name.starts_with(&prefix))
                .collect();
            emitted.sort_unstable();
            emitted.dedup();
            let mut declared = policy.events.to_vec();
            declared.sort_unstable();
            assert_eq!(emitted, declared, "{}", policy.kind);
        }
    }

    /// The metrics' table of decisions and reasons is the descriptors'.
    #[test]
    fn the_metrics_reasons_table_is_the_descriptors() {
        let source = include_str!("../metrics.md");
        for policy in POLICIES {
            let start = format!("| `{}` | ", policy.kind);
            let row = source
                .lines()
                .find(|line| line.starts_with(&start))
                .unwrap_or_else(|| panic!("no row for {}", policy.kind));
            let cells: Vec<&str> = row[start.len()..]
                .trim_end_matches(" |")
                .split(" | ")
                .collect();
            // The table explains what two of the breaker's reasons mean; the names are what
            // must agree.
            fn names(cell: &str) -> Vec<&str> {
                cell.split(", ")
                    .map(|part| part.split(' ').next().unwrap_or_default().trim_matches('`'))
                    .collect()
            }
            let decisions = &policy.decisions;
            for (shown, declared) in
                cells
                    .iter()
                    .zip([decisions.admitted, decisions.rejected, decisions.degraded])
            {
                assert_eq!(names(shown), declared, "{}: {row}", policy.kind);
            }
            assert_eq!(cells.len(), 3, "{row}");
        }
    }
}
