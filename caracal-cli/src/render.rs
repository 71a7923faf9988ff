//! How the status reads: a table for people, JSON lines for programs.

use std::time::{Duration, UNIX_EPOCH};

use caracal::PolicyKind;
use caracal::admin::{Check, IdentityStatus, Operator, Process, StatusValue};
use serde::Serialize;

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

/// `config set --json`: the value stored (`config get` prints caracal's `ConfigValue`).
#[derive(Debug, Serialize)]
pub(crate) struct Value<'a> {
    pub(crate) setting: &'a str,
    pub(crate) value: &'a str,
    pub(crate) source: &'a str,
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

/// `status --json`: one object per identity, each on its own line (as caracal's `serde`
/// feature serializes an identity).
pub(crate) fn json_lines(identities: &[IdentityStatus]) -> String {
    identities.iter().map(json_line).collect()
}

/// The DETAIL of an identity no process uses now.
const NOT_IN_USE: &str = "not in use";

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
    aligned(HEADER, identities.iter().map(row).collect())
}

/// `rows` under `header`, each column as wide as its widest cell.
fn aligned<const N: usize>(header: [&str; N], rows: Vec<[String; N]>) -> String {
    let mut widths = header.map(|title| title.chars().count());
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header = header.map(str::to_owned);
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

/// `processes`: an aligned table, one row per process, its last report shown as an age (a
/// note when there is none); with `json`, one object per line.
/// `doctor`'s checklist: `ok`/`FAIL`, the check, what was found.
pub(crate) fn doctor(checks: &[Check], json: bool) -> String {
    if json {
        return checks.iter().map(json_line).collect();
    }
    let rows = checks
        .iter()
        .map(|check| {
            let verdict = if check.ok { "ok" } else { "FAIL" };
            [
                verdict.to_owned(),
                check.check.to_owned(),
                check.detail.clone(),
            ]
        })
        .collect();
    aligned(["", "CHECK", "FOUND"], rows)
}

pub(crate) fn processes(processes: &[Process], namespace: &str, json: bool) -> String {
    if json {
        return processes.iter().map(json_line).collect();
    }
    if processes.is_empty() {
        return format!("no process reports to namespace `{namespace}`\n");
    }
    let rows = processes
        .iter()
        .map(|process| {
            let age = Duration::from_secs(process.age_ms / 1000);
            [
                process.id.clone(),
                process.host.clone(),
                process.pid.to_string(),
                process.version.clone(),
                format!("{} ago", humantime::format_duration(age)),
                process.identities.to_string(),
            ]
        })
        .collect();
    let header = [
        "PROCESS",
        "HOST",
        "PID",
        "VERSION",
        "LAST SEEN",
        "IDENTITIES",
    ];
    aligned(header, rows)
}

fn row(identity: &IdentityStatus) -> [String; 7] {
    let [mut state, mut detail] = identity.state.summary();
    if identity.shadow {
        // What it shows is what it would do: it lets every call run.
        state.push_str(" (shadow)");
    }
    if let Some(operator) = &identity.operator {
        detail.push_str(&format!(", forced{}", by(operator)));
    }
    if !identity.in_use {
        // Its state is stored though no process uses it (say, a breaker forced ahead).
        detail = if detail.is_empty() {
            NOT_IN_USE.to_owned()
        } else {
            format!("{detail}, {NOT_IN_USE}")
        };
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

/// `top --json`: a line of `status --json` per identity, with the fleet's `rates`:
/// `{"admitted": r, "rejected": {reason: r}, "degraded": {reason: r}}`, per second.
pub(crate) fn top_json_lines(identities: &[IdentityStatus]) -> String {
    identities
        .iter()
        .map(|identity| {
            let mut line = serde_json::to_value(identity).unwrap_or_default();
            if let Some(line) = line.as_object_mut() {
                let rates = serde_json::to_value(&identity.rates).unwrap_or_default();
                line.insert("rates".to_owned(), rates);
            }
            json_line(&line)
        })
        .collect()
}

const TOP_HEADER: [&str; 10] = [
    "KIND",
    "NAME",
    "SCOPE",
    "ADMITTED/s",
    "REJECTED/s",
    "WHY",
    "IN FLIGHT",
    "STATE",
    "FAILURES",
    "WOULD_REJECT/s",
];

/// A breaker's window for `top`: its failure and slow-call rates, or, while it is open with
/// nothing in its window, when it probes next.
fn window(failed: u64, slow: u64, total: u64, retry_after_ms: Option<u64>) -> String {
    match retry_after_ms {
        Some(ms) if total == 0 => {
            let left = Duration::from_secs(ms.div_ceil(1000));
            format!("probe in {}", humantime::format_duration(left))
        }
        _ if total == 0 => "-".to_owned(),
        _ => {
            let share = |n: u64| n as f64 * 100.0 / total as f64;
            format!(
                "{:.1}% failed, {:.1}% slow of {total}",
                share(failed),
                share(slow)
            )
        }
    }
}

/// `for 4m 12s more` until `until_ms`, both on the epoch's clock in milliseconds.
fn time_left(until_ms: u64, now_ms: u64) -> String {
    let left = Duration::from_secs(until_ms.saturating_sub(now_ms).div_ceil(1000));
    format!("for {} more", humantime::format_duration(left))
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        })
}

/// Which classes a policy that decides by class refused, when it refused any:
/// `by class: critical 0.0, normal 5.0, sheddable 35.0`.
fn by_class(classes: &[(String, f64, f64)]) -> Option<String> {
    if classes.iter().all(|(_, _, rejected)| *rejected == 0.0) {
        return None;
    }
    let shown: Vec<String> = classes
        .iter()
        .map(|(class, _, rejected)| format!("{class} {rejected:.1}"))
        .collect();
    Some(format!("by class: {}", shown.join(", ")))
}

/// When a retry budget last ran on its local share (it could not learn the fleet's totals),
/// if lately: `local share 12s, 40s ago`, or `local share 12s, now` while it still did.
fn local_share(local_share: Option<(f64, f64)>) -> Option<String> {
    let (ran, ago) = local_share?;
    let seconds = |s: f64| humantime::format_duration(Duration::from_secs(s.round() as u64));
    let when = if ago > 0.0 {
        format!("{} ago", seconds(ago))
    } else {
        "now".to_owned()
    };
    Some(format!("local share {}, {when}", seconds(ran)))
}

/// `top`: per identity the fleet's rates, a bulkhead's occupancy of its limit, the others'
/// state, and a breaker's failure rate over its window.
pub(crate) fn top(identities: &[IdentityStatus], namespace: &str) -> String {
    if identities.is_empty() {
        return format!("no identity in use in namespace `{namespace}`\n");
    }
    let rows = identities.iter().map(top_row).collect();
    aligned(TOP_HEADER, rows)
}

fn top_row(identity: &IdentityStatus) -> [String; 10] {
    let rates = &identity.rates;
    // Folded from 0: a sum of no floats is -0. A call refused for want of the coordinator
    // (failing closed) is refused too: counted here, and told apart in WHY; one let through
    // (failing open) is not.
    let refused_degraded = rates
        .degraded
        .iter()
        .filter(|(reason, _)| reason != "fail_open");
    let rejected = rates
        .rejected
        .iter()
        .chain(refused_degraded)
        .fold(0.0, |sum, (_, rate)| sum + rate);
    let why: Vec<String> = rates
        .rejected
        .iter()
        .map(|(reason, rate)| format!("{reason} {rate:.1}"))
        .chain(
            rates
                .degraded
                .iter()
                .map(|(reason, rate)| format!("{reason} {rate:.1} (degraded)")),
        )
        .chain(by_class(&rates.classes))
        .chain(local_share(rates.local_share))
        .collect();
    // A shadow policy's refusals, which ran: apart from REJECTED/s, which were refused.
    let would_reject = if rates.would_reject.is_empty() {
        "-".to_owned()
    } else {
        let shown: Vec<String> = rates
            .would_reject
            .iter()
            .map(|(reason, rate)| format!("{reason} {rate:.1}"))
            .collect();
        shown.join(", ")
    };
    let [summary, _] = identity.state.summary();
    let count = |field: &str| match identity.state.get(field) {
        Some(StatusValue::Count(n)) => Some(*n),
        _ => None,
    };
    let (in_flight, mut state) = match identity.kind {
        PolicyKind::Bulkhead => {
            // An adaptive limit: the latency it came from, against the fleet's base.
            let adaptive =
                count("latency_us")
                    .zip(count("base_latency_us"))
                    .map(|(latency, base)| {
                        let ms = |us: u64| us as f64 / 1000.0;
                        format!("adaptive: {:.1}ms vs {:.1}ms", ms(latency), ms(base))
                    });
            let in_flight = summary.trim_end_matches(" in use").to_owned();
            (in_flight, adaptive.unwrap_or_else(|| "-".into()))
        }
        _ => ("-".to_owned(), summary),
    };
    // How long a forced state lasts: what an operator must know before it ends by itself.
    if let Some(until_ms) = count("forced_until_ms") {
        state.push_str(&format!(" {}", time_left(until_ms, now_ms())));
    }
    // Who forced it, and why: the first thing an operator asks of a forced breaker.
    if let Some(operator) = &identity.operator {
        state.push_str(&format!(" by {}", operator.who));
        if let Some(reason) = &operator.reason {
            state.push_str(&format!(" ({reason})"));
        }
    }
    let failures = match (count("window_failures"), count("window_total")) {
        (Some(failed), Some(total)) => window(
            failed,
            count("window_slow").unwrap_or(0),
            total,
            count("retry_after_ms"),
        ),
        _ => "-".to_owned(),
    };
    [
        identity.kind.as_str().to_owned(),
        identity.name.clone(),
        identity.scope.clone(),
        format!("{:.1}", rates.admitted),
        format!("{rejected:.1}"),
        if why.is_empty() {
            "-".to_owned()
        } else {
            why.join(", ")
        },
        in_flight,
        state,
        failures,
        would_reject,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_breakers_window_shows_failures_slow_calls_or_its_next_probe() {
        assert_eq!(window(3, 49, 100, None), "3.0% failed, 49.0% slow of 100");
        assert_eq!(window(0, 0, 0, Some(12_300)), "probe in 13s");
        assert_eq!(window(0, 0, 0, None), "-");
        assert_eq!(
            window(5, 0, 10, Some(1_000)),
            "50.0% failed, 0.0% slow of 10"
        );
    }

    #[test]
    fn a_forced_state_shows_its_time_left() {
        assert_eq!(time_left(1_000_000 + 252_000, 1_000_000), "for 4m 12s more");
        assert_eq!(time_left(5, 10), "for 0s more");
    }

    #[test]
    fn refusals_by_class_show_only_when_a_class_was_refused() {
        let class = |name: &str, admitted, rejected| (name.to_owned(), admitted, rejected);
        assert_eq!(
            by_class(&[
                class("critical", 12.0, 0.0),
                class("normal", 20.0, 5.0),
                class("sheddable", 1.0, 35.25)
            ])
            .as_deref(),
            Some("by class: critical 0.0, normal 5.0, sheddable 35.2")
        );
        assert_eq!(by_class(&[class("critical", 12.0, 0.0)]), None);
        assert_eq!(by_class(&[]), None);
    }

    #[test]
    fn a_run_on_the_local_share_shows_how_long_and_when() {
        assert_eq!(
            local_share(Some((12.4, 40.2))).as_deref(),
            Some("local share 12s, 40s ago")
        );
        assert_eq!(
            local_share(Some((75.0, 0.0))).as_deref(),
            Some("local share 1m 15s, now")
        );
        assert_eq!(local_share(None), None);
    }
}
