//! This process's uses of identities, noted by the call sites and reported to the registry
//! in rounds.

use std::any::Any;
use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use super::registry::{MAX_IDENTITIES, REPORT_EVERY, Report, Reported, Reporting, describe};
use super::{Coordinator, FORGET_IDLE_AFTER, feed};
use crate::config::overrides::{Resolved, Values};
use crate::events;
use crate::identity::{Identity, KeyBase};
use crate::sync::lock;

/// How long a new identity or a change of values waits to be reported with others.
const REPORT_SOON: Duration = Duration::from_millis(20);
/// The most call sites a process remembers.
const MAX_USES: usize = 10_000;
/// Reports a use sits out before it is forgotten: [`FORGET_IDLE_AFTER`].
const FORGET_AFTER_REPORTS: u32 =
    FORGET_IDLE_AFTER.as_secs().div_ceil(REPORT_EVERY.as_secs()) as u32;

/// What this process remembers of one call site's use of an identity.
#[derive(Debug)]
struct Use {
    site: usize,
    identity: Identity,
    /// Shared with the site's other uses while its values stay the same (see [`Texts`]).
    values: Arc<str>,
    sources: Arc<str>,
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

/// A use due for a report, as the report is made of it.
#[derive(Debug)]
struct Due {
    identity: Identity,
    site: usize,
    values: Arc<str>,
    sources: Arc<str>,
    ttl_ms: u64,
    fleet: u64,
    ignored: Vec<&'static str>,
}

/// A call site's values as text, kept while they resolve the same: every new identity of
/// the site shares it rather than formatting its own — the values of a site are the same for
/// all its scopes until the overrides change.
#[derive(Debug)]
struct Texts {
    /// The `Resolved<V>` the text was made of.
    resolved: Box<dyn Any + Send>,
    values: Arc<str>,
    sources: Arc<str>,
}

/// What [`Usage`] guards with one lock.
#[derive(Debug, Default)]
struct Noted {
    uses: HashMap<KeyBase, Vec<Use>>,
    /// Per site with a use.
    texts: HashMap<usize, Texts>,
    /// The round ([`Usage::reports`]) of the last sweep at [`MAX_USES`]: a use turns unused
    /// only when a report goes out, so another sweep in the same round would free nothing —
    /// and scan every use again on every new identity.
    swept: Option<u64>,
    /// Sweeps made.
    #[cfg(test)]
    sweeps: usize,
}

impl Texts {
    /// The text of `site`'s `resolved` values and sources: the one `kept` for the site while
    /// they are the same.
    fn of<V: Values>(
        kept: &mut HashMap<usize, Texts>,
        site: usize,
        resolved: &Resolved<V>,
    ) -> (Arc<str>, Arc<str>) {
        let texts = match kept.entry(site) {
            Entry::Occupied(texts)
                if texts.get().resolved.downcast_ref::<Resolved<V>>() == Some(resolved) =>
            {
                texts.into_mut()
            }
            entry => entry
                .insert_entry(Texts {
                    resolved: Box::new(resolved.clone()),
                    values: resolved.values_text().into(),
                    sources: resolved.sources_text().into(),
                })
                .into_mut(),
        };
        (Arc::clone(&texts.values), Arc::clone(&texts.sources))
    }
}

/// The identities this process uses.
#[derive(Debug, Default)]
pub(super) struct Usage {
    uses: Mutex<Noted>,
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
        lock(&self.coordinator.inner.usage.uses).uses.len()
    }

    /// How many times the uses were swept at their cap.
    #[cfg(test)]
    fn sweeps(&self) -> usize {
        lock(&self.coordinator.inner.usage.uses).sweeps
    }

    /// Records the use; whether it is the site's first of `identity`.
    fn noted<S, V: Values>(&self, identity: &Identity, site: &S, resolved: &Resolved<V>) -> bool {
        let usage = &self.coordinator.inner.usage;
        let site = std::ptr::from_ref(site) as usize;
        let generation = self.coordinator.inner.overrides.generation();
        let fleet = self.coordinator.inner.fleet.version();
        let first;
        {
            let mut noted = lock(&usage.uses);
            let noted = &mut *noted;
            let found = noted
                .uses
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
                let (values, sources) = Texts::of(&mut noted.texts, site, resolved);
                if values == found.values && found.ignored == resolved.ignored {
                    return false;
                }
                found.ignored.clone_from(&resolved.ignored);
                found.values = values;
                found.sources = sources;
                found.changed = true;
                first = false;
            } else {
                let round = usage.reports.load(Ordering::SeqCst);
                if noted.uses.len() >= MAX_USES && noted.swept != Some(round) {
                    noted.uses.retain(|_, uses| uses.iter().any(|u| u.used));
                    noted.swept = Some(round);
                    #[cfg(test)]
                    {
                        noted.sweeps += 1;
                    }
                }
                let lifetime =
                    u64::try_from(resolved.values.lifetime().as_millis()).unwrap_or(u64::MAX);
                let floor = u64::try_from((REPORT_EVERY * 3).as_millis()).unwrap_or(u64::MAX);
                let (values, sources) = Texts::of(&mut noted.texts, site, resolved);
                noted
                    .uses
                    .entry(identity.key.clone())
                    .or_default()
                    .push(Use {
                        site,
                        identity: identity.clone(),
                        values,
                        sources,
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
        let (identities, due) = self.take_due();
        // Made out of the lock: calls noting uses meanwhile never wait for a report's text.
        // Rates are taken once per identity, whichever of its sites reports it.
        let mut rates: HashMap<KeyBase, crate::tally::Rates> = HashMap::new();
        let (sent, sites): (Vec<Report>, Vec<usize>) = due
            .into_iter()
            .map(|due| {
                let taken = rates
                    .entry(due.identity.key.clone())
                    .or_insert_with(|| Reported::rates_of(&due.identity));
                let report = Report {
                    description: describe(&due.identity),
                    extra: Reported::extra(taken, &due.ignored, &due.sources),
                    key: due.identity.key,
                    values: due.values.to_string(),
                    sources: due.sources.to_string(),
                    reporter: format!("{}/{:x}", feed::process_id(), due.site),
                    ttl_ms: due.ttl_ms,
                    fleet: due.fleet,
                };
                (report, due.site)
            })
            .collect();
        if sent.is_empty() {
            return;
        }
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
                let mut noted = lock(&self.coordinator.inner.usage.uses);
                for (report, site) in sent.iter().zip(&sites) {
                    if let Some(u) = find(&mut noted.uses, &report.key, *site) {
                        u.changed = true;
                    }
                }
                return;
            }
        };
        let mut announced = Vec::new();
        {
            let mut noted = lock(&self.coordinator.inner.usage.uses);
            for ((report, site), drift) in sent.iter().zip(&sites).zip(drifts) {
                if let Some(u) = find(&mut noted.uses, &report.key, *site)
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

    /// Starts a round: forgets the uses idle too long and takes those due for a report (used
    /// or changed since the last, changed first, at most what the registry keeps), marking
    /// them reported; with how many identities this process uses.
    fn take_due(&self) -> (usize, Vec<Due>) {
        let mut noted = lock(&self.coordinator.inner.usage.uses);
        let noted = &mut *noted;
        let uses = &mut noted.uses;
        // Under the lock, so a site that notes a use after this report's uses are read sees
        // the new round.
        self.coordinator
            .inner
            .usage
            .reports
            .fetch_add(1, Ordering::SeqCst);
        uses.retain(|_, uses| {
            uses.retain(|u| u.idle < FORGET_AFTER_REPORTS);
            !uses.is_empty()
        });
        crate::sync::shrink(uses);
        let live: HashSet<usize> = uses.values().flatten().map(|u| u.site).collect();
        noted.texts.retain(|site, _| live.contains(site));
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
        // The registry keeps no more than this: a process using more identities reports the
        // changed ones first, and the rest in later rounds.
        due.sort_by_key(|u| !u.changed);
        due.truncate(MAX_IDENTITIES as usize);
        let due = due
            .into_iter()
            .map(|u| {
                u.used = false;
                u.changed = false;
                Due {
                    identity: u.identity.clone(),
                    site: u.site,
                    values: Arc::clone(&u.values),
                    sources: Arc::clone(&u.sources),
                    ttl_ms: u.ttl_ms,
                    fleet: u.fleet,
                    ignored: u.ignored.clone(),
                }
            })
            .collect();
        (uses.len(), due)
    }
}

fn find<'a>(
    uses: &'a mut HashMap<KeyBase, Vec<Use>>,
    key: &KeyBase,
    site: usize,
) -> Option<&'a mut Use> {
    uses.get_mut(key)?.iter_mut().find(|u| u.site == site)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::keys::Setting;
    use crate::config::overrides::FORMATTED;
    use crate::identity::{PolicyKind, Scope};

    /// A rate limit's values, as far as noting a use needs them.
    #[derive(Debug, Clone, PartialEq)]
    struct Rate(u32);

    impl Values for Rate {
        const KIND: PolicyKind = PolicyKind::RateLimit;

        fn get(&self, key: &str) -> Option<Setting> {
            (key == "rate").then_some(Setting::Count(self.0))
        }

        fn set(&mut self, key: &str, setting: Setting) {
            if let ("rate", Setting::Count(rate)) = (key, setting) {
                self.0 = rate;
            }
        }

        fn lifetime(&self) -> Duration {
            Duration::from_secs(1)
        }
    }

    /// Notes `site`'s use of the scope `scope` with `resolved`.
    fn note(coordinator: &Coordinator, site: &u8, scope: &str, resolved: &Resolved<Rate>) {
        let scope = Scope::new(scope.to_owned()).expect("a valid scope");
        let identity = coordinator.identity(PolicyKind::RateLimit, "r", "op", &scope);
        coordinator.uses().note_use(&identity, site, resolved);
    }

    /// A site's values are the same for all its scopes: their text is made once, not per new
    /// identity, until they change.
    #[test]
    fn a_sites_values_are_formatted_once_for_all_its_scopes() {
        let coordinator = Coordinator::in_memory();
        let (site, other) = (0_u8, 0_u8);
        let resolved = Resolved::attribute(&Rate(5));
        let before = FORMATTED.get();
        for n in 0..100 {
            note(&coordinator, &site, &format!("user-{n}"), &resolved);
        }
        assert_eq!(FORMATTED.get() - before, 1);
        note(&coordinator, &other, "user-0", &resolved);
        assert_eq!(FORMATTED.get() - before, 2, "another site has its own text");
        note(
            &coordinator,
            &site,
            "user-100",
            &Resolved::attribute(&Rate(6)),
        );
        assert_eq!(
            FORMATTED.get() - before,
            3,
            "changed values have a new text"
        );
        let uses = lock(&coordinator.inner.usage.uses);
        let values = |scope: &str| {
            let scope = Scope::new(scope.to_owned()).expect("a valid scope");
            let key = coordinator
                .identity(PolicyKind::RateLimit, "r", "op", &scope)
                .key;
            uses.uses[&key]
                .iter()
                .find(|u| u.site == std::ptr::from_ref(&site) as usize)
                .map(|u| u.values.to_string())
        };
        assert_eq!(
            values("user-7").as_deref(),
            Some(resolved.values_text().as_str())
        );
        assert_eq!(
            values("user-100").as_deref(),
            Some(
                "rate=6 burst=none prefetch=none shadow=none thresholds.normal=none thresholds.sheddable=none"
            )
        );
    }

    /// A round takes every use noted since the last, marked reported, with the site's text:
    /// the report is made of what it took, after the lock is released.
    #[test]
    fn a_round_takes_the_uses_due_once() {
        let coordinator = Coordinator::in_memory();
        let site = 0_u8;
        let resolved = Resolved::attribute(&Rate(5));
        for n in 0..3 {
            note(&coordinator, &site, &format!("user-{n}"), &resolved);
        }
        let (identities, due) = coordinator.uses().take_due();
        assert_eq!((identities, due.len()), (3, 3));
        assert!(due.iter().all(|due| *due.values == *resolved.values_text()));
        let (identities, due) = coordinator.uses().take_due();
        assert_eq!((identities, due.len()), (3, 0), "reported already");
    }

    /// Once at the cap with every use live, a steady stream of new identities sweeps the uses
    /// once per round rather than once per identity.
    #[test]
    fn new_identities_at_the_cap_sweep_once_a_round() {
        let coordinator = Coordinator::in_memory();
        let site = 0_u8;
        let resolved = Resolved::attribute(&Rate(5));
        for n in 0..MAX_USES + 100 {
            note(&coordinator, &site, &format!("user-{n}"), &resolved);
        }
        assert_eq!(coordinator.uses().sweeps(), 1);
        assert_eq!(coordinator.uses().count(), MAX_USES + 100);
    }
}
