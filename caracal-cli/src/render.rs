//! How the status reads: a table for people, JSON lines for programs.

use std::time::{Duration, UNIX_EPOCH};

use caracal::admin::{ConfigValue, IdentityStatus, Operator, PolicyState, StatusValue};
use serde::{Serialize, Serializer};

/// One identity as a line of `status --json`.
#[derive(Debug, Serialize)]
struct Line<'a> {
    kind: &'static str,
    name: &'a str,
    operation: &'a str,
    scope: &'a str,
    drift: bool,
    #[serde(flatten)]
    state: Fields<'a>,
    /// Who forced it and why, while that forced state lasts.
    #[serde(skip_serializing_if = "Option::is_none")]
    operator: Option<Who<'a>>,
}

/// `operator` in JSON: `{"who", "reason", "at"}`, `at` in ms since the epoch.
#[derive(Debug, Serialize)]
pub(crate) struct Who<'a> {
    who: &'a str,
    reason: Option<&'a str>,
    at: Option<u64>,
}

impl<'a> Who<'a> {
    fn of(operator: &'a Operator) -> Self {
        Who {
            who: &operator.who,
            reason: operator.reason.as_deref(),
            at: operator.at_ms,
        }
    }
}

/// ` by alice@ops-1 at 2025-12-01T17:53:00Z: incident 4711`: who gave a command, when and
/// why, as the text output appends it.
pub(crate) fn by(operator: &Operator) -> String {
    let mut text = format!(" by {}", operator.who);
    if let Some(at) = operator.at_ms {
        let at = UNIX_EPOCH + Duration::from_millis(at);
        text.push_str(&format!(" at {}", humantime::format_rfc3339_seconds(at)));
    }
    if let Some(reason) = &operator.reason {
        text.push_str(&format!(": {reason}"));
    }
    text
}

/// The fields of the identity's kind, in the kind's order.
#[derive(Debug)]
struct Fields<'a>(&'a PolicyState);

impl Serialize for Fields<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.fields().map(|(name, value)| (name, Json(value))))
    }
}

/// A field's value in JSON: unset is `null`.
#[derive(Debug)]
struct Json<'a>(&'a StatusValue);

impl Serialize for Json<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            StatusValue::Count(n) => serializer.serialize_u64(*n),
            StatusValue::Number(n) => serializer.serialize_f64(*n),
            StatusValue::Text(text) => serializer.serialize_str(text),
            // Unset, and any kind of value this version of the command does not know.
            _ => serializer.serialize_none(),
        }
    }
}

/// `breaker … --json`: what the command did.
#[derive(Debug, Serialize)]
pub(crate) struct BreakerChanged<'a> {
    pub(crate) kind: &'static str,
    pub(crate) name: &'a str,
    pub(crate) operation: &'a str,
    pub(crate) scope: &'a str,
    pub(crate) from: &'static str,
    pub(crate) to: &'static str,
    pub(crate) generation: u64,
    /// How long the forced state lasts; `null` until a reset.
    pub(crate) for_ms: Option<u64>,
}

/// `config get|set --json`: one value in force and where it came from (and, for a fleet
/// override, who set it and why).
#[derive(Debug, Serialize)]
pub(crate) struct Value<'a> {
    pub(crate) setting: &'a str,
    pub(crate) value: &'a str,
    pub(crate) source: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) operator: Option<Who<'a>>,
}

impl<'a> Value<'a> {
    pub(crate) fn of(value: &'a ConfigValue) -> Self {
        Value {
            setting: &value.setting,
            value: &value.value,
            source: &value.source,
            operator: value.operator.as_ref().map(Who::of),
        }
    }
}

/// `config unset --json`: whether there was an override to remove.
#[derive(Debug, Serialize)]
pub(crate) struct Removed<'a> {
    pub(crate) setting: &'a str,
    pub(crate) removed: bool,
}

/// `watch --json`, when a snapshot could not be read.
#[derive(Debug, Serialize)]
pub(crate) struct Unavailable {
    pub(crate) unavailable: String,
}

/// One object as a line of JSON.
pub(crate) fn json_line(object: &impl Serialize) -> String {
    // Strings, numbers, booleans and options only: serializing cannot fail.
    let mut line = serde_json::to_string(object).unwrap_or_default();
    line.push('\n');
    line
}

/// `status --json`: one object per identity, each on its own line.
pub(crate) fn json_lines(identities: &[IdentityStatus]) -> String {
    let mut out = String::new();
    for identity in identities {
        let line = Line {
            kind: identity.kind.as_str(),
            name: &identity.name,
            operation: &identity.operation,
            scope: &identity.scope,
            drift: identity.drift,
            state: Fields(&identity.state),
            operator: identity.operator.as_ref().map(Who::of),
        };
        out.push_str(&json_line(&line));
    }
    out
}

/// The table's header.
const HEADER: [&str; 7] = [
    "KIND",
    "NAME",
    "OPERATION",
    "SCOPE",
    "DRIFT",
    "STATE",
    "DETAIL",
];

/// `status`: an aligned table, one row per identity (a note when there is none).
pub(crate) fn table(identities: &[IdentityStatus], namespace: &str) -> String {
    if identities.is_empty() {
        return format!("no identity in use in namespace `{namespace}`\n");
    }
    let rows: Vec<[String; 7]> = identities.iter().map(row).collect();
    let mut widths = HEADER.map(|title| title.chars().count());
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header = HEADER.map(str::to_owned);
    for row in std::iter::once(&header).chain(&rows) {
        let mut line = String::new();
        for (cell, width) in row.iter().zip(widths) {
            line.push_str(cell);
            for _ in cell.chars().count()..width + 2 {
                line.push(' ');
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn row(identity: &IdentityStatus) -> [String; 7] {
    let [state, mut detail] = identity.state.summary();
    if let Some(operator) = &identity.operator {
        detail.push_str(&format!(", forced{}", by(operator)));
    }
    [
        identity.kind.as_str().to_owned(),
        identity.name.clone(),
        identity.operation.clone(),
        identity.scope.clone(),
        if identity.drift { "yes" } else { "-" }.to_owned(),
        state,
        detail,
    ]
}
