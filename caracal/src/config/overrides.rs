//! The overrides a coordinator applies to every call: its process's [`Config`] and the fleet's
//! overrides, fleet first.
//!
//! A call reads them once, at admission. With none set — the usual case — that is one atomic
//! load; otherwise a read lock and a map lookup by kind and name.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use super::keys::{self, Setting};
use super::{Config, Table, Tables, table};
use crate::identity::PolicyKind;

/// Which layer a value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Source {
    #[default]
    Attribute,
    Config,
    Fleet,
}

impl Source {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Source::Attribute => "attribute",
            Source::Config => "config",
            Source::Fleet => "fleet",
        }
    }
}

/// A policy's values as the attribute gives them, and as overrides change them. Comparable
/// and kept per call site, so the text of one site's values is made once for all its scopes.
pub(crate) trait Values: Clone + PartialEq + Send + 'static {
    const KIND: PolicyKind;

    /// The value of `key` (one of [`keys::keys`]`(KIND)`), `None` when unset (an optional
    /// argument not given).
    fn get(&self, key: &str) -> Option<Setting>;

    /// Sets `key` to a value [`keys`] checked for it.
    fn set(&mut self, key: &str, setting: Setting);

    /// How long the shared state these values govern lives without use: the registry keeps
    /// an identity no longer.
    fn lifetime(&self) -> std::time::Duration;

    /// Why the values as a whole make no sense, if they don't (the relations the kind's spec
    /// declares between its keys): when an override would break them (say a
    /// `minimum_throughput` above the attribute's `window_size`), the attribute's stay.
    fn inconsistent(&self) -> Option<String> {
        keys::out_of_order(Self::KIND, |key| self.get(key))
    }
}

/// A policy's effective values and where each came from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Resolved<V> {
    pub(crate) values: V,
    /// One per key of the kind, in [`keys::keys`] order (those past the kind's keys unused).
    pub(crate) sources: [Source; keys::MAX_KEYS],
    /// The keys whose override these values cannot take, ignored (see [`Overrides::resolve`]).
    pub(crate) ignored: Vec<&'static str>,
}

impl<V: Values> Resolved<V> {
    /// The attribute's values, untouched.
    pub(crate) fn attribute(values: &V) -> Self {
        Resolved {
            values: values.clone(),
            sources: [Source::Attribute; keys::MAX_KEYS],
            ignored: Vec::new(),
        }
    }

    /// `(key, value, source)` for every key of the kind.
    pub(crate) fn entries(&self) -> impl Iterator<Item = (&'static str, Option<Setting>, Source)> {
        keys::keys(V::KIND)
            .iter()
            .zip(&self.sources)
            .map(|(key, source)| (key.name, self.values.get(key.name), *source))
    }

    /// The values alone, as one line (`limit=3 lease=30s max_wait=none`): what processes
    /// compare to notice drift.
    pub(crate) fn values_text(&self) -> String {
        #[cfg(test)]
        FORMATTED.set(FORMATTED.get() + 1);
        let parts: Vec<_> = self
            .entries()
            .map(|(key, value, _)| format!("{key}={}", text(value)))
            .collect();
        parts.join(" ")
    }

    /// Where each value came from, in the same order (`attribute fleet attribute`).
    pub(crate) fn sources_text(&self) -> String {
        let parts: Vec<_> = self
            .entries()
            .map(|(_, _, source)| source.as_str())
            .collect();
        parts.join(" ")
    }
}

#[cfg(test)]
thread_local! {
    /// How many times this thread made the text of resolved values.
    pub(crate) static FORMATTED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A value as text, `none` when unset.
pub(crate) fn text(value: Option<Setting>) -> String {
    value.map_or_else(|| "none".to_owned(), |value| value.to_string())
}

/// How many coordinators of the process have an override set: while none has, local policies
/// skip looking up their coordinator at all.
static OVERRIDING: AtomicUsize = AtomicUsize::new(0);

/// Whether any coordinator of this process overrides anything.
#[inline]
pub(crate) fn anywhere() -> bool {
    OVERRIDING.load(Ordering::Acquire) > 0
}

#[derive(Debug, Default)]
struct Layers {
    config: Tables,
    fleet: Tables,
}

/// An override said to be ignored: the policy's kind and name, and the key.
type Said = (PolicyKind, String, &'static str);

/// The overrides of one coordinator.
#[derive(Debug, Default)]
pub(crate) struct Overrides {
    /// Whether any override is set: the fast path's only read.
    any: AtomicBool,
    /// Bumped on every change, so what was derived from the overrides can tell it is stale.
    generation: AtomicU64,
    layers: RwLock<Arc<Layers>>,
    /// The overrides said to be ignored under the current generation: each is said once.
    said: Mutex<(u64, HashSet<Said>)>,
}

impl Drop for Overrides {
    fn drop(&mut self) {
        if *self.any.get_mut() {
            OVERRIDING.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Overrides {
    /// Replaces this process's configuration.
    pub(crate) fn set_config(&self, config: Config) {
        self.update(|layers| layers.config = config.tables);
    }

    /// Replaces the fleet's overrides.
    pub(crate) fn set_fleet(&self, fleet: Tables) {
        self.update(|layers| layers.fleet = fleet);
    }

    fn update(&self, change: impl FnOnce(&mut Layers)) {
        let mut guard = self.layers.write().unwrap_or_else(|e| e.into_inner());
        let mut layers = Layers {
            config: guard.config.clone(),
            fleet: guard.fleet.clone(),
        };
        change(&mut layers);
        let any = !layers.config.is_empty() || !layers.fleet.is_empty();
        *guard = Arc::new(layers);
        if self.any.swap(any, Ordering::AcqRel) != any {
            if any {
                OVERRIDING.fetch_add(1, Ordering::AcqRel);
            } else {
                OVERRIDING.fetch_sub(1, Ordering::AcqRel);
            }
        }
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Changes every time the overrides do.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The fleet's overrides as this process holds them.
    pub(crate) fn fleet(&self) -> Tables {
        self.snapshot().fleet.clone()
    }

    fn snapshot(&self) -> Arc<Layers> {
        Arc::clone(&self.layers.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// `attribute`'s values for the policy `name`, with the overrides applied.
    pub(crate) fn resolve<V: Values>(&self, name: &str, attribute: &V) -> Resolved<V> {
        let attribute_only = || Resolved::attribute(attribute);
        if !self.any.load(Ordering::Acquire) {
            return attribute_only();
        }
        let layers = self.snapshot();
        let tables = [
            (table(&layers.config, V::KIND, name), Source::Config),
            (table(&layers.fleet, V::KIND, name), Source::Fleet),
        ];
        if tables.iter().all(|(table, _)| table.is_none()) {
            return attribute_only();
        }
        let mut resolved = attribute_only();
        // Config first, then the fleet: the later layer wins. A value the site's other
        // values cannot take (a `minimum_throughput` above its `window_size`) is ignored
        // alone: the identity's other overrides stay in force.
        for (table, source) in tables {
            for (index, key) in keys::keys(V::KIND).iter().enumerate() {
                let Some(setting) = table.and_then(|table: &Table| table.get(key.name)) else {
                    continue;
                };
                let before = resolved.clone();
                resolved.values.set(key.name, *setting);
                resolved.sources[index] = source;
                if let Some(reason) = resolved.values.inconsistent() {
                    resolved = before;
                    resolved.ignored.push(key.name);
                    self.ignored(V::KIND, name, key.name, *setting, &reason);
                }
            }
        }
        resolved
    }

    /// Whether the configuration or the fleet's overrides have a table for `kind` `name`.
    pub(crate) fn names(&self, kind: PolicyKind, name: &str) -> bool {
        let layers = self.snapshot();
        [&layers.config, &layers.fleet]
            .into_iter()
            .any(|tables| table(tables, kind, name).is_some())
    }

    /// Says, once per change of the overrides, that `key = setting` of the policy `name` is
    /// not applied here, and why.
    fn ignored(
        &self,
        kind: PolicyKind,
        name: &str,
        key: &'static str,
        setting: Setting,
        reason: &str,
    ) {
        let generation = self.generation();
        let mut said = self.said.lock().unwrap_or_else(|e| e.into_inner());
        if said.0 != generation {
            *said = (generation, HashSet::new());
        }
        if said.1.insert((kind, name.to_owned(), key)) {
            crate::events::config_ignored(kind, name, key, &text(Some(setting)), reason);
        }
    }

    /// Whether any override is set at all.
    #[cfg(test)]
    fn any(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[derive(Debug, Clone, PartialEq)]
    struct Limits {
        limit: u32,
        max_wait: Option<Duration>,
    }

    impl Values for Limits {
        const KIND: PolicyKind = PolicyKind::Bulkhead;

        fn get(&self, key: &str) -> Option<Setting> {
            match key {
                "limit" => Some(Setting::Count(self.limit)),
                "max_wait" => self.max_wait.map(Setting::Duration),
                _ => None,
            }
        }

        fn set(&mut self, key: &str, setting: Setting) {
            match (key, setting) {
                ("limit", Setting::Count(n)) => self.limit = n,
                ("max_wait", Setting::Duration(d)) => self.max_wait = Some(d),
                _ => {}
            }
        }

        fn lifetime(&self) -> Duration {
            Duration::from_secs(1)
        }

        fn inconsistent(&self) -> Option<String> {
            (self.limit == 13).then(|| "13 is not a limit".to_owned())
        }
    }

    fn tables(text: &str) -> Tables {
        Config::from_toml_str(text).expect("valid").tables
    }

    #[test]
    fn the_fleet_wins_over_the_config_which_wins_over_the_attribute() {
        let overrides = Overrides::default();
        let attribute = Limits {
            limit: 3,
            max_wait: None,
        };
        assert!(!overrides.any());
        assert_eq!(overrides.resolve("a", &attribute).values, attribute);
        overrides.set_config(Config {
            tables: tables("[bulkhead.a]\nlimit = 5\nmax_wait = \"1s\""),
        });
        overrides.set_fleet(tables("[bulkhead.a]\nlimit = 1"));
        let resolved = overrides.resolve("a", &attribute);
        assert_eq!(
            resolved.values,
            Limits {
                limit: 1,
                max_wait: Some(Duration::from_secs(1))
            }
        );
        assert_eq!(
            resolved.values_text(),
            "limit=1 lease=none max_wait=1s keep=none shadow=none thresholds.normal=none \
             thresholds.sheddable=none"
        );
        assert_eq!(
            resolved.sources_text(),
            "fleet attribute config attribute attribute attribute attribute"
        );
        assert_eq!(overrides.resolve("b", &attribute).values, attribute);
        overrides.set_fleet(Tables::new());
        assert_eq!(overrides.resolve("a", &attribute).values.limit, 5);
        overrides.set_config(Config::default());
        assert!(!overrides.any());
        assert_eq!(overrides.resolve("a", &attribute).values, attribute);
    }

    #[test]
    fn inconsistent_overrides_leave_the_attribute_values() {
        let overrides = Overrides::default();
        overrides.set_fleet(tables("[bulkhead.a]\nlimit = 13"));
        let attribute = Limits {
            limit: 3,
            max_wait: None,
        };
        assert_eq!(overrides.resolve("a", &attribute).values, attribute);
    }

    /// The key that breaks the values is the one ignored; the identity's others apply.
    #[test]
    fn an_inconsistent_override_is_ignored_alone() {
        let overrides = Overrides::default();
        overrides.set_fleet(tables("[bulkhead.a]\nlimit = 13\nmax_wait = \"2s\""));
        let attribute = Limits {
            limit: 3,
            max_wait: None,
        };
        let resolved = overrides.resolve("a", &attribute);
        assert_eq!(
            resolved.values,
            Limits {
                limit: 3,
                max_wait: Some(Duration::from_secs(2))
            }
        );
        assert_eq!(
            resolved.sources_text(),
            "attribute attribute fleet attribute attribute attribute attribute"
        );
    }
}
