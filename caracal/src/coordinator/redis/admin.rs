//! The registry, fleet overrides, operator records and state reads on Redis (see
//! `coordinator::registry`, `coordinator::fleet` and `coordinator::operators`).

use futures_util::StreamExt;
use redis::Value;

use super::{RedisBackend, reply, scripts};
use crate::coordinator::protocol::FleetOverrides;
use crate::coordinator::registry::{
    self, DRIFT_WINDOW, MAX_IDENTITIES, MOST_PROCESSES_PER_IDENTITY, Process, Registered, Report,
    Reporting,
};
use crate::error::Error;
use crate::identity::KeyBase;

/// The registry's keys: the prefix of its 256 hashes (an identity's is named by the first
/// two hex digits of its tag, so no hash grows past a few hundred fields and Redis never
/// resizes a large table inside a report) and their expiry set (see
/// `lua/registry_prelude.lua`).
fn registry_keys(base: &KeyBase) -> [String; 2] {
    [base.key("entries:"), base.key("entries:expiry")]
}

/// Where a version kept its registry: the prefix of its hashes and their expiry set, how many
/// of a tag's hex digits name an identity's hash, and how an entry is laid out (the
/// `lua/registry_read.lua` argument).
struct Layout {
    keys: fn(&KeyBase) -> [String; 2],
    digits: usize,
    entry: &'static str,
}

/// Every layout the registry was kept in, this version's first. Processes of earlier versions
/// write theirs until they are upgraded (a rolling upgrade has both at once), and what an
/// operator held there stays listed until it ends, so a reader lists them after this one's,
/// and reports forget what expired in them until they are gone: eight fields per identity in
/// 256 hashes, and before that in a single hash (no digit naming it). The eight-field layout
/// also holds the retry budgets this version reports (so an earlier process finds them),
/// within the registry's bound, each until its ttl after the last report
/// (`lua/registry_report.lua`).
const LAYOUTS: [Layout; 3] = [
    Layout {
        keys: registry_keys,
        digits: 2,
        entry: "head",
    },
    Layout {
        keys: |base| [base.key("identities:"), base.key("identities:expiry")],
        digits: 2,
        entry: "fields",
    },
    Layout {
        keys: |base| [base.key("registry"), base.key("registry:expiry")],
        digits: 0,
        entry: "fields",
    },
];

fn process_keys(base: &KeyBase) -> [String; 2] {
    [base.key("processes"), base.key("processes:expiry")]
}

/// The most processes `caracal processes` lists.
const MOST_PROCESSES: u64 = 10_000;

/// The most processes one read lists: a fraction of a millisecond of the server's time,
/// however large the fleet (each is one small record).
const PROCESSES_PAGE: usize = 32;

/// A page of a listing: where the next starts (`None` after the last), and its entries.
type Page<T> = (Option<u64>, Vec<T>);

/// The most identities one registry script reports: with what a report forgets beside them
/// (bounded in `lua/registry_report.lua` by the same figure), a fraction of a millisecond of
/// the server's time, whatever the registry's size.
const REGISTRY_PAGE: usize = 8;

/// The most identities one registry read lists: the page size whose reads stayed within a
/// millisecond of the server's time on a quiet machine (README). A page's cost is mostly its
/// identities' `<tag>:u` maps (up to 100 processes' values, about 16 KiB each), whatever the
/// layout, and the earlier layouts read five fields an identity, so a larger page would cost
/// the server as many times more.
const READ_PAGE: usize = 8;

/// The namespace's operator records (see `coordinator::operators`).
fn operators_key(base: &KeyBase) -> String {
    base.key("operators")
}

/// The overrides, their version and their operator records (see `lua/overrides_write.lua`).
fn override_keys(base: &KeyBase) -> [String; 3] {
    [
        base.key("overrides"),
        base.key("overrides:version"),
        operators_key(base),
    ]
}

/// The overrides' keys, the namespace's marker and the operator records (see
/// `lua/overrides_read.lua`).
fn override_read_keys(base: &KeyBase) -> [String; 4] {
    let [overrides, version, operators] = override_keys(base);
    [overrides, version, base.key("marker"), operators]
}

/// `{a, b, a, b, …}` as pairs.
fn pairs(script: &str, strings: Vec<String>) -> Result<Vec<(String, String)>, Error> {
    if !strings.len().is_multiple_of(2) {
        return Err(reply::malformed(script, "an odd number of fields"));
    }
    let mut strings = strings.into_iter();
    Ok(std::iter::from_fn(|| Some((strings.next()?, strings.next()?))).collect())
}

/// An array reply's items.
fn items(script: &str, value: Value) -> Result<Vec<Value>, Error> {
    match value {
        Value::Array(items) => Ok(items),
        other => Err(reply::malformed(
            script,
            format_args!("{other:?} instead of an array"),
        )),
    }
}

fn string(script: &str, value: Value) -> Result<String, Error> {
    reply::strings(script, Value::Array(vec![value]))?
        .pop()
        .ok_or_else(|| reply::malformed(script, "no string"))
}

fn integer(script: &str, value: Value) -> Result<i64, Error> {
    match value {
        Value::Int(n) => Ok(n),
        other => Err(reply::malformed(
            script,
            format_args!("{other:?} where an integer belongs"),
        )),
    }
}

fn unsigned(script: &str, n: i64) -> Result<u64, Error> {
    u64::try_from(n)
        .map_err(|_| reply::malformed(script, format_args!("{n} where a count belongs")))
}

/// A page's reply (see `lua/registry_read.lua`): the server's time, where the next page
/// starts (`None` after the last, or where it would not move past `start`), and the items
/// after them, checked to come in groups of `group`.
fn page_of(
    script: &str,
    value: Value,
    start: u64,
    group: usize,
) -> Result<(u64, Option<u64>, Vec<Value>), Error> {
    let mut items = items(script, value)?.into_iter();
    let now = unsigned(script, integer(script, items.next().unwrap_or(Value::Nil))?)?;
    let next = match integer(script, items.next().unwrap_or(Value::Nil))? {
        -1 => None,
        next => Some(unsigned(script, next)?).filter(|&next| next > start),
    };
    let items: Vec<Value> = items.collect();
    if !items.len().is_multiple_of(group) {
        return Err(reply::malformed(
            script,
            format_args!(
                "{} items after the time, not groups of {group}",
                items.len()
            ),
        ));
    }
    Ok((now, next, items))
}

/// How many pages of a listing are read at once: each page's script holds the server for a
/// fraction of a millisecond, but one at a time the 1 250 pages of a registry at its bound
/// took a round trip each (about a second), where pipelined they share them.
const PAGES_IN_FLIGHT: usize = 32;

/// Every entry of a listing read `size` ranks a page from rank 0, at most `most` ranks deep,
/// [`PAGES_IN_FLIGHT`] pages at once (a page that is not the last ends `size` ranks on, so
/// where each starts is known before any answers), up to the first that says it is the last
/// (those read past it are dropped); an entry listed on two pages (its rank moved meanwhile)
/// is kept once, by its `key`.
async fn paged<T, K, Fut>(
    most: u64,
    size: usize,
    page: impl FnMut(u64) -> Fut,
    key: impl Fn(&T) -> K,
) -> Result<Vec<T>, Error>
where
    K: Eq + std::hash::Hash,
    Fut: std::future::Future<Output = Result<Page<T>, Error>>,
{
    let mut listed = Vec::new();
    let mut keys = std::collections::HashSet::new();
    let mut pages = futures_util::stream::iter((0..most).step_by(size.max(1)))
        .map(page)
        .buffered(PAGES_IN_FLIGHT);
    while let Some(page) = pages.next().await {
        let (next, entries) = page?;
        for entry in entries {
            if keys.insert(key(&entry)) {
                listed.push(entry);
            }
        }
        if next.is_none() {
            break;
        }
    }
    Ok(listed)
}

impl RedisBackend {
    /// Reports `reports` in calls of at most [`REGISTRY_PAGE`] identities each: a script
    /// holds the server while it runs, so however many identities a process uses, no call
    /// keeps the fleet waiting for more than a fraction of a millisecond. A call may handle
    /// fewer than it was sent (the identities' maps of processes' values it read reached its
    /// budget): the rest go in the next.
    pub(in crate::coordinator) async fn registry_report(
        &self,
        base: &KeyBase,
        process: &Reporting,
        reports: &[Report],
    ) -> Result<Vec<bool>, Error> {
        let mut drifts = Vec::with_capacity(reports.len());
        while drifts.len() < reports.len() {
            let rest = &reports[drifts.len()..];
            let page = &rest[..rest.len().min(REGISTRY_PAGE)];
            drifts.extend(self.registry_report_page(base, process, page).await?);
        }
        Ok(drifts)
    }

    async fn registry_report_page(
        &self,
        base: &KeyBase,
        process: &Reporting,
        reports: &[Report],
    ) -> Result<Vec<bool>, Error> {
        let script = &scripts::REGISTRY_REPORT;
        let drift_ms = u64::try_from(DRIFT_WINDOW.as_millis()).unwrap_or(u64::MAX);
        let mut args: Vec<String> = vec![
            MAX_IDENTITIES.to_string(),
            drift_ms.to_string(),
            process.id.to_owned(),
            process.record.clone(),
            process.ttl_ms.to_string(),
            MOST_PROCESSES_PER_IDENTITY.to_string(),
        ];
        for report in reports {
            args.extend([
                report.key.tag().to_owned(),
                report.description.clone(),
                report.values.clone(),
                report.sources.clone(),
                report.reporter.clone(),
                report.ttl_ms.to_string(),
                report.fleet.to_string(),
                report.extra.clone(),
            ]);
        }
        let [current, earlier, earliest] = LAYOUTS.map(|layout| (layout.keys)(base));
        let [processes, processes_expiry] = process_keys(base);
        let keys = [
            &current[0],
            &current[1],
            &processes,
            &processes_expiry,
            &earliest[0],
            &earliest[1],
            &earlier[0],
            &earlier[1],
        ]
        .map(String::clone);
        let value = self.link.eval(script, base, &keys, args).await?;
        let handled = match &value {
            Value::Array(flags) if (1..=reports.len()).contains(&flags.len()) => flags.len(),
            _ => {
                return Err(reply::malformed(
                    script.name,
                    format_args!("{value:?}: not 1 to {} flags", reports.len()),
                ));
            }
        };
        let groups = reply::integer_groups::<1>(script.name, value, handled)?;
        groups
            .into_iter()
            .map(|[flag]| reply::flag(script.name, flag))
            .collect()
    }

    /// The identities of the namespace's registry, read a page of [`READ_PAGE`] at a time, the
    /// last to expire first and at most [`MAX_IDENTITIES`] (the registry's bound, which the
    /// fleet's reports restore a few pages at a time when a registry overflows it); one listed
    /// on two pages (it was reported meanwhile) is listed once. Then those only an earlier
    /// version's layout holds (see [`LAYOUTS`]), within the same bound; of one in several,
    /// what the earlier layouts alone hold is added to it (processes of both versions use
    /// it: see [`Registered::merge`]).
    pub(in crate::coordinator) async fn registry_read(
        &self,
        base: &KeyBase,
    ) -> Result<Vec<Registered>, Error> {
        let most = u64::from(MAX_IDENTITIES);
        let mut listed: Vec<Registered> = Vec::new();
        let mut known: std::collections::HashMap<KeyBase, usize> = std::collections::HashMap::new();
        for layout in &LAYOUTS {
            let keys = (layout.keys)(base);
            let read = paged(
                most.saturating_sub(listed.len() as u64),
                READ_PAGE,
                |start| self.registry_read_page(base, &keys, layout, start),
                |entry| entry.key.clone(),
            )
            .await?;
            for entry in read {
                match known.get(&entry.key) {
                    Some(&at) => listed[at].merge(entry),
                    None => {
                        known.insert(entry.key.clone(), listed.len());
                        listed.push(entry);
                    }
                }
            }
        }
        Ok(listed)
    }

    /// Enters the identity at `key` (`description`, as a report describes it) in the
    /// namespace's registry for `lasts_ms`, used or not, and removes it from the earlier
    /// layouts (see `lua/registry_hold.lua`): of each layout, in the script's order (this
    /// one's, the eight-field one's, the single hash's), the hash the identity's tag names and
    /// the expiry set, every key it touches declared.
    pub(in crate::coordinator) async fn registry_hold(
        &self,
        base: &KeyBase,
        key: &KeyBase,
        description: &str,
        lasts_ms: u64,
    ) -> Result<(), Error> {
        let script = &scripts::REGISTRY_HOLD;
        let drift_ms = u64::try_from(DRIFT_WINDOW.as_millis()).unwrap_or(u64::MAX);
        let tag = key.tag();
        let [current, earlier, earliest] = LAYOUTS.each_ref().map(|layout| {
            let [prefix, expiry] = (layout.keys)(base);
            [format!("{prefix}{}", &tag[..layout.digits]), expiry]
        });
        let keys = [current, earlier, earliest].concat();
        let value = self
            .link
            .eval(script, base, &keys, (tag, description, lasts_ms, drift_ms))
            .await?;
        integer(script.name, value).map(drop)
    }

    /// One page from `start` of the registry at `keys`, kept in `layout`: where the next
    /// starts (`None` after the last), and its identities.
    async fn registry_read_page(
        &self,
        base: &KeyBase,
        keys: &[String; 2],
        layout: &Layout,
        start: u64,
    ) -> Result<Page<Registered>, Error> {
        let script = &scripts::REGISTRY_READ;
        let args = (start, READ_PAGE, layout.digits, layout.entry);
        let value = self.link.eval(script, base, keys, args).await?;
        let (now, next, items) = page_of(script.name, value, start, 6)?;
        let mut listed = Vec::new();
        let mut items = items.into_iter();
        while let (
            Some(tag),
            Some(description),
            Some(values),
            Some(sources),
            Some(drift),
            Some(uses),
        ) = (
            items.next(),
            items.next(),
            items.next(),
            items.next(),
            items.next(),
            items.next(),
        ) {
            let drift = reply::flag(script.name, integer(script.name, drift)?)?;
            let entry = Registered::read(
                &string(script.name, tag)?,
                &string(script.name, description)?,
                (string(script.name, values)?, string(script.name, sources)?),
                drift,
                registry::uses_of(&string(script.name, uses)?, now),
            );
            listed.extend(entry);
        }
        Ok((next, listed))
    }

    /// Every process reporting to the namespace (at most [`MOST_PROCESSES`]), by id, read a
    /// page of [`PROCESSES_PAGE`] at a time; one listed on two pages (it reported meanwhile)
    /// is listed once.
    pub(in crate::coordinator) async fn processes(
        &self,
        base: &KeyBase,
    ) -> Result<Vec<Process>, Error> {
        let mut listed = paged(
            MOST_PROCESSES,
            PROCESSES_PAGE,
            |start| self.processes_page(base, start),
            |process| process.id.clone(),
        )
        .await?;
        listed.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(listed)
    }

    /// One page of the processes from `start`: where the next starts (`None` after the
    /// last), and its processes.
    async fn processes_page(&self, base: &KeyBase, start: u64) -> Result<Page<Process>, Error> {
        let script = &scripts::PROCESSES_READ;
        let value = self
            .link
            .eval(script, base, &process_keys(base), (start, PROCESSES_PAGE))
            .await?;
        let (now, next, items) = page_of(script.name, value, start, 3)?;
        let mut listed = Vec::new();
        let mut items = items.into_iter();
        while let (Some(id), Some(record), Some(seen)) = (items.next(), items.next(), items.next())
        {
            let seen = unsigned(script.name, integer(script.name, seen)?)?;
            let process = Process::read(
                &string(script.name, id)?,
                &string(script.name, record)?,
                seen,
                now,
            );
            listed.extend(process);
        }
        Ok((next, listed))
    }

    /// The fleet's overrides and their version, unless `known` is already the version.
    pub(in crate::coordinator) async fn overrides_read(
        &self,
        base: &KeyBase,
        known: Option<u64>,
    ) -> Result<FleetOverrides, Error> {
        let script = &scripts::OVERRIDES_READ;
        let known = known.map_or(-1, |v| i64::try_from(v).unwrap_or(i64::MAX));
        let incarnation = self.link.incarnation();
        let (marker, epoch) = incarnation.marker();
        let candidate = crate::token::fresh().simple().to_string();
        let value = self
            .link
            .eval(script, base, &override_read_keys(base), (known, candidate))
            .await?;
        let mut items = items(script.name, value)?.into_iter();
        let version = unsigned(
            script.name,
            integer(script.name, items.next().unwrap_or(Value::Nil))?,
        )?;
        let mut rest = reply::strings(script.name, Value::Array(items.collect()))?.into_iter();
        let read = rest
            .next()
            .ok_or_else(|| reply::malformed(script.name, "no marker"))?;
        incarnation.marker_read(marker.as_deref(), read, epoch);
        if u64::try_from(known).ok() == Some(version) {
            return Ok(FleetOverrides {
                version,
                changed: None,
            });
        }
        let operator = rest
            .next()
            .ok_or_else(|| reply::malformed(script.name, "no operator record"))?;
        let pairs = pairs(script.name, rest.collect())?;
        Ok(FleetOverrides {
            version,
            changed: Some((pairs, Some(operator).filter(|record| !record.is_empty()))),
        })
    }

    /// Sets (`value`) or removes (`None`) one fleet override; answers whether it changed
    /// anything.
    pub(in crate::coordinator) async fn overrides_write(
        &self,
        base: &KeyBase,
        setting: &str,
        value: Option<&str>,
        operator: Option<&str>,
    ) -> Result<bool, Error> {
        let script = &scripts::OVERRIDES_WRITE;
        let command = if value.is_some() { "set" } else { "unset" };
        let args = [
            self.channel(),
            command,
            setting,
            value.unwrap_or(""),
            operator.unwrap_or(""),
        ];
        let value = self
            .link
            .eval(script, base, &override_keys(base), &args)
            .await?;
        let [_version, changed] = reply::integers::<2>(script.name, value)?;
        reply::flag(script.name, changed)
    }

    /// The operator records of `fields` that exist (of every field, for none).
    pub(in crate::coordinator) async fn operators_read(
        &self,
        base: &KeyBase,
        fields: &[String],
    ) -> Result<Vec<(String, String)>, Error> {
        let script = &scripts::OPERATORS_READ;
        let value = self
            .link
            .eval(script, base, &[operators_key(base)], fields)
            .await?;
        pairs(script.name, reply::strings(script.name, value)?)
    }

    /// Stores the operator record `record` (without its time) under `field`, or removes it.
    pub(in crate::coordinator) async fn operator_write(
        &self,
        base: &KeyBase,
        field: &str,
        record: Option<&str>,
    ) -> Result<(), Error> {
        let script = &scripts::OPERATOR_WRITE;
        let value = self
            .link
            .eval(
                script,
                base,
                &[operators_key(base)],
                &[field, record.unwrap_or("")],
            )
            .await?;
        integer(script.name, value).map(drop)
    }
}
