//! How the status reads: a table for people, JSON lines for programs.

use std::time::Duration;

use caracal::PolicyKind;
use caracal::admin::{IdentityStatus, PolicyState};
use serde::Serialize;

/// One identity as a line of `status --json`.
#[derive(Debug, Serialize)]
struct Line<'a> {
    kind: &'static str,
    name: &'a str,
    operation: &'a str,
    scope: &'a str,
    drift: bool,
    #[serde(flatten)]
    state: State,
}

/// The fields of each kind.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum State {
    Bulkhead {
        limit: Option<u32>,
        occupancy: u32,
    },
    CircuitBreaker {
        state: &'static str,
        generation: u64,
        window_total: u32,
        window_failures: u32,
        retry_after_ms: Option<u64>,
    },
    RateLimit {
        rate: Option<f64>,
        burst: Option<u32>,
    },
    /// A kind this version of the command does not know: its common fields only.
    Unknown {},
}

fn kind(kind: PolicyKind) -> &'static str {
    kind.as_str()
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// `status --json`: one object per identity, each on its own line.
pub(crate) fn json_lines(identities: &[IdentityStatus]) -> String {
    let mut out = String::new();
    for identity in identities {
        let state = match &identity.state {
            PolicyState::Bulkhead { limit, occupancy } => State::Bulkhead {
                limit: *limit,
                occupancy: *occupancy,
            },
            PolicyState::CircuitBreaker {
                state,
                generation,
                window_total,
                window_failures,
                retry_after,
                ..
            } => State::CircuitBreaker {
                state: state.as_str(),
                generation: *generation,
                window_total: *window_total,
                window_failures: *window_failures,
                retry_after_ms: retry_after.map(millis),
            },
            PolicyState::RateLimit { rate, burst } => State::RateLimit {
                rate: *rate,
                burst: *burst,
            },
            _ => State::Unknown {},
        };
        let line = Line {
            kind: kind(identity.kind),
            name: &identity.name,
            operation: &identity.operation,
            scope: &identity.scope,
            drift: identity.drift,
            state,
        };
        // Strings, numbers and options only: serializing cannot fail.
        if let Ok(text) = serde_json::to_string(&line) {
            out.push_str(&text);
            out.push('\n');
        }
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

/// `850ms`, `4s 120ms`, `4m 59s`: milliseconds while they matter, whole seconds after.
fn readable(duration: Duration) -> String {
    let shown = if duration >= Duration::from_secs(10) {
        Duration::from_secs(duration.as_secs())
    } else {
        Duration::from_millis(millis(duration))
    };
    humantime::format_duration(shown).to_string()
}

fn row(identity: &IdentityStatus) -> [String; 7] {
    let (state, detail) = match &identity.state {
        PolicyState::Bulkhead { limit, occupancy } => (
            match limit {
                Some(limit) => format!("{occupancy}/{limit} in use"),
                None => format!("{occupancy} in use"),
            },
            String::new(),
        ),
        PolicyState::CircuitBreaker {
            state,
            generation,
            window_total,
            window_failures,
            retry_after,
            ..
        } => {
            let mut detail =
                format!("generation {generation}, {window_failures} of {window_total} failed");
            if let Some(retry_after) = retry_after {
                detail.push_str(&format!(", probe in {}", readable(*retry_after)));
            }
            (state.as_str().to_owned(), detail)
        }
        PolicyState::RateLimit { rate, burst } => (
            rate.map_or_else(|| "?/s".to_owned(), |rate| format!("{rate}/s")),
            burst.map_or_else(String::new, |burst| format!("burst {burst}")),
        ),
        _ => ("?".to_owned(), String::new()),
    };
    [
        kind(identity.kind).to_owned(),
        identity.name.clone(),
        identity.operation.clone(),
        identity.scope.clone(),
        if identity.drift { "yes" } else { "-" }.to_owned(),
        state,
        detail,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_left_read_well() {
        assert_eq!(readable(Duration::from_micros(555_321)), "555ms");
        assert_eq!(readable(Duration::from_millis(4_120)), "4s 120ms");
        assert_eq!(readable(Duration::from_millis(299_983)), "4m 59s");
        assert_eq!(readable(Duration::ZERO), "0s");
    }
}
