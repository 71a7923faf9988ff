//! What the registry reads back: the identities in use with each process's values and
//! rates, and the processes reporting.

use super::bounds::{DRIFT_WINDOW, REPORT_EVERY};
use crate::identity::{Identity, KeyBase, PolicyKind};

/// A process reporting to the namespace: what [`Admin::processes`](crate::admin::Admin::processes)
/// lists (`caracal processes`). A process reports with its uses, every few seconds while it
/// makes calls, and is listed until 15 s pass without a report.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Process {
    /// Its id, drawn at start-up (the `process` of its events and transition messages).
    pub id: String,
    /// The machine's name.
    pub host: String,
    /// Its process id on that machine.
    pub pid: u32,
    /// The version of caracal it runs.
    pub version: String,
    /// Its last report, in ms since the Unix epoch (the coordinator's clock).
    pub seen_ms: u64,
    /// How long ago that was when it was listed, by the coordinator's clock (so a reader's
    /// own clock, however far off, does not enter it).
    pub age_ms: u64,
    /// How many identities it uses.
    pub identities: u64,
}

impl Process {
    /// Reads a process's record; `None` for one this version cannot read.
    pub(crate) fn read(id: &str, record: &str, seen_ms: u64, now_ms: u64) -> Option<Self> {
        let record: serde_json::Value = serde_json::from_str(record).ok()?;
        Some(Process {
            id: id.to_owned(),
            host: record["host"].as_str()?.to_owned(),
            pid: u32::try_from(record["pid"].as_u64()?).ok()?,
            version: record["version"].as_str()?.to_owned(),
            seen_ms,
            age_ms: now_ms.saturating_sub(seen_ms),
            identities: record["identities"].as_u64()?,
        })
    }
}

/// One identity as the registry holds it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Registered {
    pub(crate) kind: PolicyKind,
    pub(crate) name: String,
    pub(crate) operation: String,
    pub(crate) scope: String,
    pub(crate) key: KeyBase,
    pub(crate) values: String,
    pub(crate) sources: String,
    pub(crate) drift: bool,
    /// What each process that reported it within [`DRIFT_WINDOW`] said last.
    pub(crate) uses: Vec<Reported>,
}

/// What one process said of an identity in its last report: the values it uses, and what it
/// adds of its own (JSON `{"admitted": r, "rejected": {reason: r}, "degraded": {reason: r},
/// "ignored": [key], "sources": "…"}`, rates per second since its report before).
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Reported {
    /// The reporter: the process's id and its call site's, `<process>/<site>`.
    pub(crate) process: String,
    pub(crate) values: String,
    /// Where each of its values came from, in the order of `values` (empty from a version
    /// that did not say).
    pub(crate) sources: String,
    pub(crate) rates: Rates,
    /// The keys whose fleet override it ignores.
    pub(crate) ignored: Vec<String>,
}

/// One value in force in one process: what [`Registered::in_force`] lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InForce<'a> {
    /// The process's id (as `caracal processes` lists it).
    pub(crate) process: &'a str,
    pub(crate) key: &'a str,
    pub(crate) value: &'a str,
    /// Where it came from: `fleet`, `config` or `attribute`.
    pub(crate) source: &'a str,
}

/// An identity's decisions per second across the fleet, as its processes last reported them
/// (each over the few seconds between two of its reports): what `caracal top` shows.
#[derive(Debug, Clone, PartialEq, Default)]
#[non_exhaustive]
pub struct Rates {
    /// Calls admitted (a retry budget: retries allowed).
    pub admitted: f64,
    /// Calls turned away, by reason (`capacity`, `circuit_open`, `budget_exhausted`…).
    pub rejected: Vec<(String, f64)>,
    /// Calls decided without the coordinator, by reason (`fail_open`, `fail_closed`…).
    pub degraded: Vec<(String, f64)>,
    /// Calls a policy in shadow mode would have turned away (and let run), by reason.
    pub would_reject: Vec<(String, f64)>,
    /// For a kind that decides by priority class (bulkhead, rate limit): per class that
    /// decided anything, `(class, admitted, rejected)`, highest class first.
    pub classes: Vec<(String, f64, f64)>,
    /// For a retry budget: the latest run on its local share (its batches failed, so it
    /// could not learn the fleet's totals) of any process, if one ran on it in the last five
    /// minutes: `(seconds it lasted, seconds since it ended)`, the second 0 while it still
    /// ran at that process's last report.
    pub local_share: Option<(f64, f64)>,
}

impl Rates {
    /// Adds `other`'s rates to these.
    fn add(&mut self, other: &Rates) {
        self.admitted += other.admitted;
        for (mine, theirs) in [
            (&mut self.rejected, &other.rejected),
            (&mut self.degraded, &other.degraded),
            (&mut self.would_reject, &other.would_reject),
        ] {
            for (reason, rate) in theirs {
                match mine.iter_mut().find(|(known, _)| known == reason) {
                    Some((_, sum)) => *sum += rate,
                    None => mine.push((reason.clone(), *rate)),
                }
            }
            mine.sort_by(|a, b| a.0.cmp(&b.0));
        }
        for (class, admitted, rejected) in &other.classes {
            match self.classes.iter_mut().find(|(known, ..)| known == class) {
                Some((_, mine_admitted, mine_rejected)) => {
                    *mine_admitted += admitted;
                    *mine_rejected += rejected;
                }
                None => self.classes.push((class.clone(), *admitted, *rejected)),
            }
        }
        self.classes.sort_by_key(|(class, ..)| {
            std::cmp::Reverse(class.parse::<crate::priority::Priority>().ok())
        });
        // The run that ended last; of two that ended together, the longer.
        self.local_share = match (self.local_share, other.local_share) {
            (Some(mine), Some(theirs)) => {
                let later = |(ran, ago): (f64, f64)| (-ago, ran);
                Some(if later(theirs) > later(mine) {
                    theirs
                } else {
                    mine
                })
            }
            (mine, theirs) => mine.or(theirs),
        };
    }
}

impl Reported {
    /// The identity's decisions in this process since they were last taken.
    pub(in crate::coordinator) fn rates_of(identity: &Identity) -> crate::tally::Rates {
        crate::tally::take([
            identity.kind.as_str(),
            &identity.name,
            &identity.operation,
            identity.scope.as_str(),
        ])
    }

    /// The JSON a report carries of `rates`, `ignored` and the values' `sources`: the object
    /// a `serde_json::Value` would write (keys and reasons sorted, the last of a reason
    /// kept), written directly — one per use reported, every round, without building a map.
    pub(in crate::coordinator) fn extra(
        rates: &crate::tally::Rates,
        ignored: &[&'static str],
        sources: &str,
    ) -> String {
        let mut out = Vec::with_capacity(128);
        out.extend_from_slice(br#"{"admitted":"#);
        write_json(&mut out, |out| serde_json::to_writer(out, &rates.admitted));
        // Only a kind that decides by class has them: the others' reports stay as they were.
        if !rates.classes.is_empty() {
            out.extend_from_slice(br#","classes":{"#);
            for (at, (class, admitted, rejected)) in rates.classes.iter().enumerate() {
                if at > 0 {
                    out.push(b',');
                }
                write_json(&mut out, |out| {
                    serde_json::to_writer(&mut *out, class.as_str())?;
                    out.push(b':');
                    serde_json::to_writer(out, &[admitted, rejected])
                });
            }
            out.push(b'}');
        }
        out.extend_from_slice(br#","degraded":"#);
        write_by_reason(&mut out, &rates.degraded);
        out.extend_from_slice(br#","ignored":"#);
        write_json(&mut out, |out| serde_json::to_writer(out, ignored));
        // Only a retry budget that ran on its local share lately has it.
        if let Some((ran, ago)) = rates.local_share {
            out.extend_from_slice(br#","local_share":"#);
            write_json(&mut out, |out| serde_json::to_writer(out, &[ran, ago]));
        }
        out.extend_from_slice(br#","rejected":"#);
        write_by_reason(&mut out, &rates.rejected);
        out.extend_from_slice(br#","sources":"#);
        write_json(&mut out, |out| serde_json::to_writer(out, sources));
        out.extend_from_slice(br#","would_reject":"#);
        write_by_reason(&mut out, &rates.would_reject);
        out.push(b'}');
        String::from_utf8(out).unwrap_or_default()
    }

    /// Reads what `process` reported; what it cannot read counts as nothing said.
    pub(super) fn read(process: &str, values: &str, extra: &str) -> Self {
        let extra: serde_json::Value = serde_json::from_str(extra).unwrap_or_default();
        let by_reason = |field: &str| -> Vec<(String, f64)> {
            extra[field].as_object().map_or_else(Vec::new, |rates| {
                rates
                    .iter()
                    .filter_map(|(reason, rate)| Some((reason.clone(), rate.as_f64()?)))
                    .collect()
            })
        };
        Reported {
            process: process.to_owned(),
            values: values.to_owned(),
            sources: extra["sources"].as_str().unwrap_or_default().to_owned(),
            rates: Rates {
                admitted: extra["admitted"].as_f64().unwrap_or(0.0),
                rejected: by_reason("rejected"),
                degraded: by_reason("degraded"),
                would_reject: by_reason("would_reject"),
                classes: extra["classes"]
                    .as_object()
                    .map_or_else(Vec::new, |classes| {
                        classes
                            .iter()
                            .filter_map(|(class, rates)| {
                                Some((class.clone(), rates[0].as_f64()?, rates[1].as_f64()?))
                            })
                            .collect()
                    }),
                local_share: extra["local_share"][0]
                    .as_f64()
                    .zip(extra["local_share"][1].as_f64()),
            },
            ignored: extra["ignored"].as_array().map_or_else(Vec::new, |keys| {
                keys.iter()
                    .filter_map(|key| Some(key.as_str()?.to_owned()))
                    .collect()
            }),
        }
    }
}

impl Registered {
    /// Reads a registry entry; `None` for one this version cannot read (say, written by a
    /// later one), which is skipped rather than failing the whole listing.
    pub(crate) fn read(
        tag: &str,
        description: &str,
        (values, sources): (String, String),
        drift: bool,
        uses: Vec<Reported>,
    ) -> Option<Self> {
        let [kind, name, operation, scope]: [String; 4] = serde_json::from_str(description).ok()?;
        Some(Registered {
            kind: kind.parse().ok()?,
            name,
            operation,
            scope,
            key: KeyBase::from_tag(tag)?,
            values,
            sources,
            drift,
            uses,
        })
    }

    /// Adds what `other` (the same identity, as another layout of the registry holds it)
    /// knows: the uses it lists of processes this one does not (processes of two versions
    /// each write their own during a rolling upgrade), its values and sources when this one
    /// has none (an operator's hold here, reports only there), and its drift.
    pub(crate) fn merge(&mut self, other: Registered) {
        if self.values.is_empty() {
            self.values = other.values;
            self.sources = other.sources;
        }
        self.drift |= other.drift;
        for reported in other.uses {
            if !self
                .uses
                .iter()
                .any(|mine| mine.process == reported.process)
            {
                self.uses.push(reported);
            }
        }
        self.uses.sort_by(|a, b| a.values.cmp(&b.values));
    }

    /// Whether a process reported it: one an operator steered that no process reported has
    /// no values (see `lua/registry_hold.lua`).
    pub(crate) fn reported(&self) -> bool {
        !self.values.is_empty()
    }

    /// Whether a process uses it now: one reported it within [`DRIFT_WINDOW`] (a process
    /// reports an identity every [`REPORT_EVERY`] while it uses it).
    pub(crate) fn used(&self) -> bool {
        !self.uses.is_empty()
    }

    /// Every value in force in a process that uses it now (reported it within
    /// [`DRIFT_WINDOW`]): one per key and call site, in the order of the values.
    pub(crate) fn in_force(&self) -> impl Iterator<Item = InForce<'_>> {
        self.uses.iter().flat_map(|reported| {
            let process = reported
                .process
                .split_once('/')
                .map_or(reported.process.as_str(), |(process, _)| process);
            // A reporter that did not say (an earlier version) is taken to use the sources
            // the identity was last reported with.
            let sources = match reported.sources.as_str() {
                "" => self.sources.as_str(),
                sources => sources,
            };
            pairs(&reported.values)
                .zip(sources.split(' '))
                .map(move |((key, value), source)| InForce {
                    process,
                    key,
                    value,
                    source,
                })
        })
    }

    /// Each value of `key` in use, and how many processes use it, smallest first.
    pub(crate) fn in_use(&self, key: &str) -> Vec<(String, u64)> {
        let mut counts: Vec<(String, u64)> = Vec::new();
        for used in self.in_force().filter(|used| used.key == key) {
            match counts.iter_mut().find(|(known, _)| known == used.value) {
                Some((_, count)) => *count += 1,
                None => counts.push((used.value.to_owned(), 1)),
            }
        }
        counts.sort_by(
            |(a, _), (b, _)| match (a.parse::<f64>(), b.parse::<f64>()) {
                (Ok(a), Ok(b)) => a.total_cmp(&b),
                _ => a.cmp(b),
            },
        );
        counts
    }

    /// The fleet's decisions per second, as its processes last reported them.
    pub(crate) fn rates(&self) -> Rates {
        let mut sum = Rates::default();
        for reported in &self.uses {
            sum.add(&reported.rates);
        }
        sum
    }

    /// The processes that ignore the fleet override of `key`.
    pub(crate) fn ignoring<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a str> {
        self.uses
            .iter()
            .filter(move |r| r.ignored.iter().any(|k| k == key))
            .map(|r| r.process.as_str())
    }

    /// The value of `key` as reported (`None` if it was not, or is unset).
    pub(crate) fn value(&self, key: &str) -> Option<&str> {
        pairs(&self.values)
            .find(|(name, _)| *name == key)
            .map(|(_, value)| value)
            .filter(|value| *value != "none")
    }

    /// The value of `key` as reported, parsed (`None` if it was not, is unset or unreadable).
    pub(crate) fn parsed<T: std::str::FromStr>(&self, key: &str) -> Option<T> {
        self.value(key)?.parse().ok()
    }

    /// Each key's value and where it came from, in the kind's key order.
    pub(crate) fn entries(&self) -> impl Iterator<Item = (&str, &str, &str)> {
        pairs(&self.values)
            .zip(self.sources.split(' '))
            .map(|((key, value), source)| (key, value, source))
    }
}

/// Writes a `null` where a value could not be written (none of [`Reported::extra`]'s can
/// fail: numbers, text, lists of text into memory).
fn write_json(out: &mut Vec<u8>, write: impl FnOnce(&mut Vec<u8>) -> serde_json::Result<()>) {
    if write(out).is_err() {
        out.extend_from_slice(b"null");
    }
}

/// `rates` as a JSON object by reason, sorted, the last of a reason kept.
fn write_by_reason(out: &mut Vec<u8>, rates: &[(&'static str, f64)]) {
    let mut sorted: Vec<&(&'static str, f64)> = rates.iter().collect();
    sorted.sort_by_key(|(reason, _)| *reason);
    out.push(b'{');
    let mut first = true;
    let mut reasons = sorted.into_iter().peekable();
    while let Some((reason, rate)) = reasons.next() {
        if reasons.peek().is_some_and(|(next, _)| next == reason) {
            continue;
        }
        if !std::mem::take(&mut first) {
            out.push(b',');
        }
        write_json(out, |out| serde_json::to_writer(out, reason));
        out.push(b':');
        write_json(out, |out| serde_json::to_writer(out, rate));
    }
    out.push(b'}');
}

/// The processes' reports of one identity as `registry_report.lua` keeps them (JSON
/// `{process: [values, ms, extra]}`): those made within [`DRIFT_WINDOW`] of `now`. An
/// unreadable map holds none.
pub(crate) fn uses_of(map: &str, now: u64) -> Vec<Reported> {
    let Ok(serde_json::Value::Object(map)) = serde_json::from_str(map) else {
        return Vec::new();
    };
    fresh(
        map.iter().filter_map(|(process, reported)| {
            let extra = reported[2].as_str().unwrap_or("{}");
            Some((
                process.as_str(),
                (reported[0].as_str()?, reported[1].as_u64()?, extra),
            ))
        }),
        now,
    )
}

/// Each process's report (values, when, extra) as it reads, those made within
/// [`DRIFT_WINDOW`] of `now`, in the order of their values.
pub(super) fn fresh<'a>(
    reported: impl Iterator<Item = (&'a str, (&'a str, u64, &'a str))>,
    now: u64,
) -> Vec<Reported> {
    let drift_ms = u64::try_from(DRIFT_WINDOW.as_millis()).unwrap_or(u64::MAX);
    // A process reports an identity every round while it uses it: rates older than two
    // rounds are of one that stopped (or a process gone), and count as none.
    let rates_ms = u64::try_from((REPORT_EVERY * 2).as_millis()).unwrap_or(u64::MAX);
    let mut uses: Vec<Reported> = reported
        .filter(|(_, (_, at, _))| now.saturating_sub(*at) < drift_ms)
        .map(|(process, (values, at, extra))| {
            let mut reported = Reported::read(process, values, extra);
            let age_ms = now.saturating_sub(at);
            if age_ms > rates_ms {
                reported.rates = Rates::default();
            }
            // A run on the local share that had ended by the report ended longer ago now.
            if let Some((_, ago)) = &mut reported.rates.local_share
                && *ago > 0.0
            {
                *ago += age_ms as f64 / 1000.0;
            }
            reported
        })
        .collect();
    uses.sort_by(|a, b| a.values.cmp(&b.values));
    uses
}

/// The `key=value` pairs of a line of values. A value may hold spaces (a duration reads
/// `1m 30s`): a word without `=` continues the value before it.
fn pairs(values: &str) -> impl Iterator<Item = (&str, &str)> {
    let mut starts: Vec<usize> = values
        .match_indices(' ')
        .map(|(at, _)| at + 1)
        .filter(|&at| {
            let word = values[at..].split(' ').next().unwrap_or_default();
            word.contains('=')
        })
        .collect();
    starts.insert(0, 0);
    let ends: Vec<usize> = starts
        .iter()
        .skip(1)
        .map(|&start| start - 1)
        .chain(std::iter::once(values.len()))
        .collect();
    starts
        .into_iter()
        .zip(ends)
        .filter_map(move |(start, end)| values[start..end].split_once('='))
}
