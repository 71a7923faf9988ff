//! The registry as the in-memory backend keeps it.

use std::collections::HashMap;

use super::bounds::{DRIFT_WINDOW, MAX_IDENTITIES, MOST_PROCESSES_PER_IDENTITY};
use super::read::{Process, Registered, fresh};
use super::report::{Report, Reporting};
use crate::identity::KeyBase;

/// The registry as the in-memory backend keeps it: the same rules as
/// `lua/registry_report.lua` and `lua/registry_read.lua`.
#[derive(Debug, Default)]
pub(in crate::coordinator) struct Store {
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
    pub(in crate::coordinator) fn report(
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
                let entry = self
                    .entries
                    .entry(report.key.clone())
                    .or_insert_with(|| Entry {
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
    pub(in crate::coordinator) fn forget_expired(&mut self, now: u64) {
        self.processes.retain(|_, (_, _, expires)| *expires > now);
        self.entries.retain(|_, entry| entry.expires > now);
        crate::sync::shrink(&mut self.entries);
    }

    /// How many identities are listed.
    #[cfg(test)]
    pub(in crate::coordinator) fn len(&self) -> usize {
        self.entries.len()
    }

    /// An identity an operator steered, listed by name until `lasts_ms` past `now`, as
    /// `lua/registry_hold.lua` does.
    pub(in crate::coordinator) fn hold(
        &mut self,
        now: u64,
        key: &KeyBase,
        description: &str,
        lasts_ms: u64,
    ) {
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

    pub(in crate::coordinator) fn read(&self, now: u64) -> Vec<Registered> {
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
    pub(in crate::coordinator) fn processes(&self, now: u64) -> Vec<Process> {
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
