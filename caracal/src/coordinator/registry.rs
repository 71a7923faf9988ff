//! The identity registry: which identities the namespace's processes use, by name (keys hold
//! only hashes), with the values each uses them with — for `caracal status` and `config get`,
//! and to notice drift (processes using one identity with different values).
//!
//! Each process keeps, per identity and call site, the values it last used; every
//! [`REPORT_EVERY`] it reports those used since its previous report in one command, and
//! reports at once an identity it starts using or whose values change. The coordinator keeps
//! each identity until its ttl (the life of the state it describes, at least a few report
//! periods) passes without a report, and at most [`MAX_IDENTITIES`]. A report answers whether
//! another reporter used other values within [`DRIFT_WINDOW`]; a change of that answer is a
//! `config.drift` event.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use super::{Coordinator, feed};
use crate::config::overrides::{Resolved, Values};
use crate::error::Error;
use crate::error::FailureKind;
use crate::events;
use crate::identity::{Identity, KeyBase, PolicyKind};
use crate::script::Script;
use crate::sync::lock;

/// How often a process reports the identities it uses.
pub(crate) const REPORT_EVERY: Duration = Duration::from_secs(5);
/// How long a new identity or a change of values waits to be reported with others.
const REPORT_SOON: Duration = Duration::from_millis(20);
/// How long a reporter's values count as in use, for drift.
pub(crate) const DRIFT_WINDOW: Duration = Duration::from_secs(15);
/// The most identities a namespace's registry keeps.
pub(crate) const MAX_IDENTITIES: u32 = 10_000;
/// The most processes whose values and rates the registry keeps per identity (past it, the
/// longest silent is forgotten): what bounds a report's cost in a large fleet.
pub(crate) const MOST_PROCESSES_PER_IDENTITY: usize = 100;
/// The most call sites a process remembers.
const MAX_USES: usize = 10_000;
/// Reports a use sits out before it is forgotten: [`super::FORGET_IDLE_AFTER`].
const FORGET_AFTER_REPORTS: u32 = super::FORGET_IDLE_AFTER
    .as_secs()
    .div_ceil(REPORT_EVERY.as_secs()) as u32;

/// One identity as a process reports it.
#[derive(Debug, Clone)]
pub(crate) struct Report {
    pub(crate) key: KeyBase,
    /// JSON `[kind, name, operation, scope]`.
    pub(crate) description: String,
    pub(crate) values: String,
    pub(crate) sources: String,
    /// This process and call site.
    pub(crate) reporter: String,
    pub(crate) ttl_ms: u64,
    /// The version of the fleet's overrides the values were resolved under: reporters under
    /// different versions are in the middle of applying a fleet-wide change, not drifting.
    pub(crate) fleet: u64,
    /// What the process adds of its own (JSON, see [`Reported`]): its decisions per second
    /// since its last report, and the keys whose fleet override it ignores.
    pub(crate) extra: String,
}

/// This process as it reports itself with its uses: its id, its record (JSON: host, pid,
/// version, identities) and how long it stays listed without another report.
#[derive(Debug, Clone)]
pub(crate) struct Reporting {
    pub(crate) id: &'static str,
    pub(crate) record: String,
    pub(crate) ttl_ms: u64,
}

impl Reporting {
    /// This process, using `identities` identities.
    fn now(identities: usize) -> Self {
        let record = serde_json::json!({
            "host": host(),
            "pid": std::process::id(),
            "version": env!("CARGO_PKG_VERSION"),
            "identities": identities,
        });
        Reporting {
            id: feed::process_id(),
            record: record.to_string(),
            ttl_ms: u64::try_from((REPORT_EVERY * 3).as_millis()).unwrap_or(u64::MAX),
        }
    }
}

/// The machine's name, as the kernel has it (`unknown` where it cannot be read).
fn host() -> &'static str {
    static HOST: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .map(|host| host.trim().to_owned())
            .filter(|host| !host.is_empty())
            .unwrap_or_else(|| "unknown".to_owned())
    });
    &HOST
}

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
    }
}

impl Reported {
    /// The identity's decisions in this process since they were last taken.
    fn rates_of(identity: &Identity) -> crate::tally::Rates {
        crate::tally::take([
            identity.kind.as_str(),
            &identity.name,
            &identity.operation,
            identity.scope.as_str(),
        ])
    }

    /// The JSON a report carries of `rates`, `ignored` and the values' `sources`.
    fn extra(rates: &crate::tally::Rates, ignored: &[&'static str], sources: &str) -> String {
        let by_reason = |rates: &[(&'static str, f64)]| {
            serde_json::Value::Object(
                rates
                    .iter()
                    .map(|(reason, rate)| ((*reason).to_owned(), serde_json::json!(rate)))
                    .collect(),
            )
        };
        serde_json::json!({
            "admitted": rates.admitted,
            "rejected": by_reason(&rates.rejected),
            "degraded": by_reason(&rates.degraded),
            "would_reject": by_reason(&rates.would_reject),
            "ignored": ignored,
            "sources": sources,
        })
        .to_string()
    }

    /// Reads what `process` reported; what it cannot read counts as nothing said.
    fn read(process: &str, values: &str, extra: &str) -> Self {
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
fn fresh<'a>(
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
            if now.saturating_sub(at) > rates_ms {
                reported.rates = Rates::default();
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

/// How a kind's live state is read for `caracal status`: its status script (in `lua/`, by
/// name) and the suffixes of the keys it reads. The kind declares it; the backends answer it
/// without knowing which kind asks.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StatusRead {
    /// The script.
    pub(crate) script: &'static Script,
    /// The suffixes of its `KEYS`, in order.
    pub(crate) keys: &'static [&'static str],
    /// How many integers it answers after the server's time.
    pub(crate) figures: usize,
    /// The in-memory backend's form of the read.
    pub(crate) memory: MemoryRead,
}

/// A status read in the in-memory backend: the types of state the kind keeps there (one per
/// key the script reads), and the script's figures from an identity's states of those types
/// (each maybe none), at a time in ms.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MemoryRead {
    pub(crate) states: &'static [fn() -> TypeId],
    pub(crate) figures: fn(&[Found<'_>], u64) -> Vec<i64>,
}

/// One state a [`MemoryRead`] looked for: what the identity holds of that type, if anything.
pub(crate) type Found<'a> = Option<&'a dyn Any>;

/// The `index`th state a [`MemoryRead`] found, as a `T`.
pub(crate) fn found<'a, T: 'static>(states: &[Found<'a>], index: usize) -> Option<&'a T> {
    states.get(index).copied().flatten()?.downcast_ref()
}

/// What an identity's shared state holds now, as its kind's status read answers: the
/// backend's time and the kind's figures, which the kind reads.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Snapshot {
    /// The script that answered, to name in a complaint about its reply.
    pub(crate) script: &'static str,
    pub(crate) now_ms: u64,
    pub(crate) figures: Vec<i64>,
}

impl Snapshot {
    /// What a kind without a status read is given.
    pub(crate) const NOTHING: Snapshot = Snapshot {
        script: "",
        now_ms: 0,
        figures: Vec::new(),
    };

    /// Exactly `N` figures.
    pub(crate) fn figures<const N: usize>(&self) -> Result<[i64; N], Error> {
        <[i64; N]>::try_from(self.figures.as_slice()).map_err(|_| {
            self.malformed(format_args!(
                "{} figures instead of {N}",
                self.figures.len()
            ))
        })
    }

    /// The error of a reply the kind cannot read.
    pub(crate) fn malformed(&self, detail: impl fmt::Display) -> Error {
        Error::unavailable(
            FailureKind::MalformedReply,
            format!("{} replied {detail}", self.script),
        )
    }
}

/// JSON `[kind, name, operation, scope]`: how the registry names an identity.
pub(crate) fn describe(identity: &Identity) -> String {
    let parts = [
        identity.kind.as_str(),
        &identity.name,
        &identity.operation,
        identity.scope.as_str(),
    ];
    serde_json::to_string(&parts).unwrap_or_default()
}

/// What this process remembers of one call site's use of an identity.
#[derive(Debug)]
struct Use {
    site: usize,
    identity: Identity,
    values: String,
    sources: String,
    ttl_ms: u64,
    /// The overrides' generation the values were resolved under.
    generation: u64,
    /// The fleet overrides' version they were resolved under.
    fleet: u64,
    /// Used since the last report.
    used: bool,
    /// Not reported since it changed.
    changed: bool,
    /// Whether the registry last said processes disagree on it.
    drift: bool,
    /// Reports since it was last used.
    idle: u32,
    /// The keys whose fleet override the site's values cannot take.
    ignored: Vec<&'static str>,
}

/// The identities this process uses.
#[derive(Debug, Default)]
pub(super) struct Usage {
    uses: Mutex<HashMap<KeyBase, Vec<Use>>>,
    soon: Arc<Notify>,
    reporting: AtomicBool,
    /// Reports sent: a site that caches its use notes it again after each.
    reports: AtomicU64,
}

/// The call sites' uses of identities, reported to the namespace's registry: the part of a
/// coordinator that [`Coordinator::uses`] hands out.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Uses<'a> {
    pub(super) coordinator: &'a Coordinator,
}

impl Uses<'_> {
    /// Notes that the call site `site` uses `identity` with `resolved` values. Costs a lookup
    /// when nothing changed; the report goes out in the background, a moment after a site's
    /// first call of an identity (so an operator who acts on it right after a deploy finds it
    /// in use) and with the next round otherwise. The call never waits for it.
    pub(crate) fn note_use<S, V: Values>(
        &self,
        identity: &Identity,
        site: &S,
        resolved: &Resolved<V>,
    ) {
        if self.noted(identity, site, resolved) {
            self.coordinator.inner.usage.soon.notify_one();
        }
    }

    /// Changes whenever a use must be noted again to stay true: the overrides changed (a
    /// site's values may have) or a report went out (the next tells the registry of the sites
    /// used since). A site that caches what it noted compares this, and notes again when it
    /// differs.
    pub(crate) fn round(&self) -> u64 {
        let reports = self.coordinator.inner.usage.reports.load(Ordering::SeqCst);
        let generation = self.coordinator.inner.overrides.generation();
        reports << 32 ^ generation
    }

    /// How many identities this process notes uses of.
    #[cfg(test)]
    pub(crate) fn count(&self) -> usize {
        lock(&self.coordinator.inner.usage.uses).len()
    }

    /// Records the use; whether it is the site's first of `identity`.
    fn noted<S, V: Values>(&self, identity: &Identity, site: &S, resolved: &Resolved<V>) -> bool {
        let usage = &self.coordinator.inner.usage;
        let site = std::ptr::from_ref(site) as usize;
        let generation = self.coordinator.inner.overrides.generation();
        let fleet = self.coordinator.inner.fleet.version();
        let first;
        {
            let mut uses = lock(&usage.uses);
            let found = uses
                .get_mut(&identity.key)
                .and_then(|uses| uses.iter_mut().find(|u| u.site == site));
            if let Some(found) = found {
                found.used = true;
                found.idle = 0;
                if found.generation == generation {
                    return false;
                }
                found.generation = generation;
                found.fleet = fleet;
                let values = resolved.values_text();
                if values == found.values && found.ignored == resolved.ignored {
                    return false;
                }
                found.ignored.clone_from(&resolved.ignored);
                found.values = values;
                found.sources = resolved.sources_text();
                found.changed = true;
                first = false;
            } else {
                if uses.len() >= MAX_USES {
                    uses.retain(|_, uses| uses.iter().any(|u| u.used));
                }
                let lifetime =
                    u64::try_from(resolved.values.lifetime().as_millis()).unwrap_or(u64::MAX);
                let floor = u64::try_from((REPORT_EVERY * 3).as_millis()).unwrap_or(u64::MAX);
                uses.entry(identity.key.clone()).or_default().push(Use {
                    site,
                    identity: identity.clone(),
                    values: resolved.values_text(),
                    sources: resolved.sources_text(),
                    ttl_ms: lifetime.max(floor),
                    generation,
                    fleet,
                    used: true,
                    changed: true,
                    drift: false,
                    idle: 0,
                    ignored: resolved.ignored.clone(),
                });
                first = true;
            }
        }
        self.start_reporting();
        if !first {
            usage.soon.notify_one();
        }
        first
    }

    fn start_reporting(&self) {
        self.coordinator
            .start_once(&self.coordinator.inner.usage.reporting, |weak| async move {
                while let Some(coordinator) = super::live(&weak) {
                    let soon = Arc::clone(&coordinator.inner.usage.soon);
                    drop(coordinator);
                    let woken = tokio::time::timeout(REPORT_EVERY, soon.notified())
                        .await
                        .is_ok();
                    if woken {
                        tokio::time::sleep(REPORT_SOON).await;
                    }
                    match super::upgrade(&weak) {
                        Some(coordinator) => {
                            coordinator.uses().report_uses().await;
                            coordinator.forget_idle();
                        }
                        None => return,
                    }
                }
            });
    }

    /// Sends one report of every use since the last, and announces changes of drift.
    async fn report_uses(&self) {
        let identities;
        let reports: Vec<(Report, usize)> = {
            let mut uses = lock(&self.coordinator.inner.usage.uses);
            // Under the lock, so a site that notes a use after this report's uses are read
            // sees the new round.
            self.coordinator
                .inner
                .usage
                .reports
                .fetch_add(1, Ordering::SeqCst);
            uses.retain(|_, uses| {
                uses.retain(|u| u.idle < FORGET_AFTER_REPORTS);
                !uses.is_empty()
            });
            crate::sync::shrink(&mut uses);
            identities = uses.len();
            let mut due: Vec<&mut Use> = uses
                .values_mut()
                .flatten()
                .filter_map(|u| {
                    if !u.used {
                        u.idle += 1;
                    }
                    (u.used || u.changed).then_some(u)
                })
                .collect();
            // The registry keeps no more than this: a process using more identities reports
            // the changed ones first, and the rest in later rounds.
            due.sort_by_key(|u| !u.changed);
            due.truncate(MAX_IDENTITIES as usize);
            // Taken once per identity, whichever of its sites reports it.
            let mut rates: HashMap<KeyBase, crate::tally::Rates> = HashMap::new();
            due.into_iter()
                .map(|u| {
                    u.used = false;
                    u.changed = false;
                    let taken = rates
                        .entry(u.identity.key.clone())
                        .or_insert_with(|| Reported::rates_of(&u.identity));
                    let extra = Reported::extra(taken, &u.ignored, &u.sources);
                    let report = Report {
                        key: u.identity.key.clone(),
                        description: describe(&u.identity),
                        values: u.values.clone(),
                        sources: u.sources.clone(),
                        reporter: format!("{}/{:x}", feed::process_id(), u.site),
                        ttl_ms: u.ttl_ms,
                        fleet: u.fleet,
                        extra,
                    };
                    (report, u.site)
                })
                .collect()
        };
        if reports.is_empty() {
            return;
        }
        let sent: Vec<Report> = reports.iter().map(|(report, _)| report.clone()).collect();
        let process = Reporting::now(identities);
        let namespace = self.coordinator.namespace_base();
        let drifts = match self
            .coordinator
            .inner
            .backend
            .registry_report(&namespace, &process, &sent)
            .await
        {
            Ok(drifts) => drifts,
            Err(_) => {
                // Reported again with the next round.
                let mut uses = lock(&self.coordinator.inner.usage.uses);
                for (report, site) in &reports {
                    if let Some(u) = find(&mut uses, &report.key, *site) {
                        u.changed = true;
                    }
                }
                return;
            }
        };
        let mut announced = Vec::new();
        {
            let mut uses = lock(&self.coordinator.inner.usage.uses);
            for ((report, site), drift) in reports.iter().zip(drifts) {
                if let Some(u) = find(&mut uses, &report.key, *site)
                    && u.drift != drift
                {
                    u.drift = drift;
                    announced.push((u.identity.clone(), u.values.clone(), drift));
                }
            }
        }
        for (identity, values, drift) in announced {
            events::config_drift(&identity.at(), &values, drift);
        }
    }
}

fn find<'a>(
    uses: &'a mut HashMap<KeyBase, Vec<Use>>,
    key: &KeyBase,
    site: usize,
) -> Option<&'a mut Use> {
    uses.get_mut(key)?.iter_mut().find(|u| u.site == site)
}

/// The registry as the in-memory backend keeps it: the same rules as
/// `lua/registry_report.lua` and `lua/registry_read.lua`.
#[derive(Debug, Default)]
pub(super) struct Store {
    entries: HashMap<KeyBase, Entry>,
    /// Per reporting process: its record, its last report and when it is forgotten.
    processes: HashMap<String, (String, u64, u64)>,
}

#[derive(Debug)]
struct Entry {
    description: String,
    values: String,
    sources: String,
    reporter: String,
    fleet: u64,
    reported_at: u64,
    drift_until: u64,
    expires: u64,
    /// Per process, the values it last reported, when, and what it added (see [`Reported`]).
    uses: HashMap<String, (String, u64, String)>,
}

impl Store {
    pub(super) fn report(
        &mut self,
        now: u64,
        process: &Reporting,
        reports: &[Report],
    ) -> Vec<bool> {
        self.forget_expired(now);
        self.processes.insert(
            process.id.to_owned(),
            (
                process.record.clone(),
                now,
                now.saturating_add(process.ttl_ms),
            ),
        );
        let drift_ms = u64::try_from(DRIFT_WINDOW.as_millis()).unwrap_or(u64::MAX);
        let drifts = reports
            .iter()
            .map(|report| {
                let entry = self.entries.entry(report.key.clone()).or_insert(Entry {
                    description: String::new(),
                    values: report.values.clone(),
                    sources: String::new(),
                    reporter: report.reporter.clone(),
                    fleet: report.fleet,
                    reported_at: now,
                    drift_until: 0,
                    expires: 0,
                    uses: HashMap::new(),
                });
                // One only an operator entered (no reporter) has no values to drift from.
                if entry.values != report.values
                    && !entry.reporter.is_empty()
                    && entry.reporter != report.reporter
                    && entry.fleet == report.fleet
                    && now.saturating_sub(entry.reported_at) < drift_ms
                {
                    entry.drift_until = now + drift_ms;
                }
                entry.description.clone_from(&report.description);
                entry.values.clone_from(&report.values);
                entry.sources.clone_from(&report.sources);
                entry.reporter.clone_from(&report.reporter);
                entry.fleet = report.fleet;
                entry.reported_at = now;
                entry.expires = entry.expires.max(now.saturating_add(report.ttl_ms));
                entry.uses.remove(process.id);
                entry
                    .uses
                    .retain(|_, (_, at, _)| now.saturating_sub(*at) < drift_ms);
                while entry.uses.len() >= MOST_PROCESSES_PER_IDENTITY {
                    let oldest = entry
                        .uses
                        .iter()
                        .min_by_key(|(_, (_, at, _))| *at)
                        .map(|(id, _)| id.clone());
                    let Some(oldest) = oldest else { break };
                    entry.uses.remove(&oldest);
                }
                entry.uses.insert(
                    process.id.to_owned(),
                    (report.values.clone(), now, report.extra.clone()),
                );
                entry.drift_until > now
            })
            .collect();
        let excess = self.entries.len().saturating_sub(MAX_IDENTITIES as usize);
        if excess > 0 {
            let mut soonest: Vec<_> = self
                .entries
                .iter()
                .map(|(key, entry)| (entry.expires, key.clone()))
                .collect();
            soonest.sort_unstable();
            for (_, key) in soonest.into_iter().take(excess) {
                self.entries.remove(&key);
            }
        }
        drifts
    }

    /// Drops the processes and identities whose time ran out, as their keys expire in Redis.
    pub(super) fn forget_expired(&mut self, now: u64) {
        self.processes.retain(|_, (_, _, expires)| *expires > now);
        self.entries.retain(|_, entry| entry.expires > now);
        crate::sync::shrink(&mut self.entries);
    }

    /// How many identities are listed.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// An identity an operator steered, listed by name until `lasts_ms` past `now`, as
    /// `lua/registry_hold.lua` does.
    pub(super) fn hold(&mut self, now: u64, key: &KeyBase, description: &str, lasts_ms: u64) {
        let drift_ms = u64::try_from(DRIFT_WINDOW.as_millis()).unwrap_or(u64::MAX);
        let until = now.saturating_add(lasts_ms);
        let entry = self.entries.entry(key.clone()).or_insert(Entry {
            description: String::new(),
            values: String::new(),
            sources: String::new(),
            reporter: String::new(),
            fleet: 0,
            reported_at: 0,
            drift_until: 0,
            expires: 0,
            uses: HashMap::new(),
        });
        description.clone_into(&mut entry.description);
        let reported =
            !entry.reporter.is_empty() && now.saturating_sub(entry.reported_at) < drift_ms;
        entry.expires = if reported {
            entry.expires.max(until)
        } else {
            until
        };
    }

    pub(super) fn read(&self, now: u64) -> Vec<Registered> {
        let mut listed: Vec<_> = self
            .entries
            .iter()
            .filter(|(_, entry)| entry.expires > now)
            .filter_map(|(key, entry)| {
                Registered::read(
                    key.tag(),
                    &entry.description,
                    (entry.values.clone(), entry.sources.clone()),
                    entry.drift_until > now,
                    fresh(
                        entry.uses.iter().map(|(process, (values, at, extra))| {
                            (process.as_str(), (values.as_str(), *at, extra.as_str()))
                        }),
                        now,
                    ),
                )
            })
            .collect();
        listed.sort_by(|a, b| a.key.tag().cmp(b.key.tag()));
        listed
    }

    /// The processes reporting, as `lua/processes_read.lua` lists them.
    pub(super) fn processes(&self, now: u64) -> Vec<Process> {
        let mut listed: Vec<Process> = self
            .processes
            .iter()
            .filter(|(_, (_, _, expires))| *expires > now)
            .filter_map(|(id, (record, at, _))| Process::read(id, record, *at, now))
            .collect();
        listed.sort_by(|a, b| a.id.cmp(&b.id));
        listed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Scope;

    /// The reporting process of `reporter` (which names process and site alike here).
    fn process(reporter: &'static str) -> Reporting {
        Reporting {
            id: reporter,
            record: "{}".to_owned(),
            ttl_ms: 1_000,
        }
    }

    fn report(values: &str, reporter: &str) -> Report {
        under_fleet(0, values, reporter)
    }

    fn under_fleet(fleet: u64, values: &str, reporter: &str) -> Report {
        let identity = Identity::new("ns", PolicyKind::Bulkhead, "b", "op", &Scope::GLOBAL);
        Report {
            key: identity.key.clone(),
            description: describe(&identity),
            values: values.to_owned(),
            sources: "attribute attribute attribute".to_owned(),
            reporter: reporter.to_owned(),
            ttl_ms: 1_000,
            fleet,
            extra: "{}".to_owned(),
        }
    }

    /// While a fleet-wide change spreads, processes report the old values and the new ones
    /// side by side: that is the change being applied, not processes that disagree.
    #[test]
    fn reporters_under_different_fleet_overrides_are_no_drift() {
        let mut store = Store::default();
        assert_eq!(
            store.report(0, &process("a"), &[under_fleet(1, "limit=3", "a")]),
            [false]
        );
        assert_eq!(
            store.report(10, &process("b"), &[under_fleet(2, "limit=1", "b")]),
            [false]
        );
        assert_eq!(
            store.report(20, &process("a"), &[under_fleet(1, "limit=3", "a")]),
            [false]
        );
        assert_eq!(
            store.report(30, &process("a"), &[under_fleet(2, "limit=1", "a")]),
            [false]
        );
        assert_eq!(
            store.report(40, &process("b"), &[under_fleet(2, "limit=5", "b")]),
            [true]
        );
    }

    #[test]
    fn two_reporters_with_different_values_are_drift_until_they_agree_for_a_window() {
        let mut store = Store::default();
        let drift_ms = DRIFT_WINDOW.as_millis() as u64;
        assert_eq!(
            store.report(0, &process("a"), &[report("limit=3", "a")]),
            [false]
        );
        assert_eq!(
            store.report(10, &process("b"), &[report("limit=3", "b")]),
            [false]
        );
        assert_eq!(
            store.report(20, &process("a"), &[report("limit=5", "a")]),
            [true]
        );
        assert_eq!(
            store.report(30, &process("b"), &[report("limit=3", "b")]),
            [true]
        );
        let listed = store.read(40);
        assert_eq!(listed.len(), 1);
        let entry = &listed[0];
        assert!(entry.drift);
        assert_eq!(
            (
                entry.kind,
                entry.name.as_str(),
                entry.operation.as_str(),
                entry.scope.as_str()
            ),
            (PolicyKind::Bulkhead, "b", "op", "global")
        );
        assert_eq!(entry.value("limit"), Some("3"));
        // Both agree again: drift lapses a window after the last disagreement.
        assert_eq!(
            store.report(40, &process("a"), &[report("limit=3", "a")]),
            [true]
        );
        assert_eq!(
            store.report(30 + drift_ms + 1, &process("a"), &[report("limit=3", "a")]),
            [false]
        );
    }

    /// An identity an operator steered is listed, reported by no process, for as long as the
    /// state it stored lasts; a process that then reports it is no drift from that.
    #[test]
    fn a_held_identity_is_listed_unreported_until_its_state_ends() {
        let mut store = Store::default();
        let r = report("limit=3", "a");
        store.hold(0, &r.key, &r.description, 500);
        let listed = store.read(499);
        assert_eq!(listed.len(), 1);
        assert!(!listed[0].reported() && !listed[0].used(), "{listed:?}");
        assert!(store.read(500).is_empty());
        store.hold(600, &r.key, &r.description, 5_000);
        assert_eq!(store.report(700, &process("a"), &[r]), [false]);
        let listed = store.read(800);
        assert!(listed[0].reported() && listed[0].used(), "{listed:?}");
    }

    #[test]
    fn an_identity_is_forgotten_once_its_ttl_passes_unreported() {
        let mut store = Store::default();
        store.report(0, &process("a"), &[report("limit=3", "a")]);
        assert_eq!(store.read(999).len(), 1);
        assert!(store.read(1_000).is_empty());
    }

    #[test]
    fn a_value_with_spaces_is_one_value() {
        let mut store = Store::default();
        let mut r = report("window=1m 30s open=3s", "a");
        r.sources = "attribute fleet".to_owned();
        store.report(0, &process("a"), &[r]);
        let entry = &store.read(1)[0];
        assert_eq!(entry.value("window"), Some("1m 30s"));
        let entries: Vec<_> = entry.entries().collect();
        assert_eq!(
            entries,
            [("window", "1m 30s", "attribute"), ("open", "3s", "fleet")]
        );
    }

    #[test]
    fn entries_read_values_and_sources_by_key() {
        let mut store = Store::default();
        let mut r = report("limit=3 lease=30s max_wait=none", "a");
        r.sources = "fleet config attribute".to_owned();
        store.report(0, &process("a"), &[r]);
        let entry = &store.read(1)[0];
        assert_eq!(entry.value("lease"), Some("30s"));
        assert_eq!(entry.value("max_wait"), None);
        let entries: Vec<_> = entry.entries().collect();
        assert_eq!(
            entries,
            [
                ("limit", "3", "fleet"),
                ("lease", "30s", "config"),
                ("max_wait", "none", "attribute")
            ]
        );
    }

    /// What a process adds to its report reads back as it was sent, and the fleet's rates are
    /// the sum of its processes'.
    #[test]
    fn reports_carry_rates_and_ignored_keys_that_add_up_across_processes() {
        let rates = crate::tally::Rates {
            admitted: 10.0,
            rejected: vec![("capacity", 2.0)],
            degraded: vec![],
            would_reject: vec![("open", 1.5)],
        };
        let extra = Reported::extra(&rates, &["minimum_throughput"], "attribute");
        let map = serde_json::json!({
            "p1": ["limit=3", 100_000, extra],
            "p2": ["limit=3", 100_000, Reported::extra(&rates, &[], "attribute")],
            // Past the drift window: forgotten.
            "p3": ["limit=9", 80_000, "{}"],
        });
        let uses = uses_of(&map.to_string(), 100_100);
        assert_eq!(uses.len(), 2, "{uses:?}");
        let entry = Registered::read(
            &"0".repeat(64),
            r#"["bulkhead","b","b","global"]"#,
            ("limit=3".to_owned(), "attribute".to_owned()),
            false,
            uses,
        )
        .expect("readable");
        assert_eq!(
            entry.rates(),
            Rates {
                admitted: 20.0,
                rejected: vec![("capacity".to_owned(), 4.0)],
                degraded: vec![],
                would_reject: vec![("open".to_owned(), 3.0)],
            }
        );
        assert_eq!(
            entry.ignoring("minimum_throughput").collect::<Vec<_>>(),
            ["p1"]
        );
        assert_eq!(entry.in_use("limit"), [("3".to_owned(), 2)]);
    }

    #[test]
    fn an_unreadable_extra_says_nothing() {
        let reported = Reported::read("p", "limit=3", "not json");
        assert_eq!(reported.rates, Rates::default());
        assert!(reported.ignored.is_empty());
    }
}
