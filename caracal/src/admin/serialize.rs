//! `serde::Serialize` for the admin types (feature `serde`): the shapes `caracal … --json`
//! prints, so a service can serve its fleet's status itself, as Spring's actuator does.
//!
//! ```
//! # async fn endpoint() -> Result<(), caracal::Error> {
//! let admin = caracal::Coordinator::in_memory().admin();
//! for identity in admin.status().await? {
//!     // {"kind":"bulkhead","name":"partner-api",…,"drift":false,"limit":6,"occupancy":3,…}
//!     println!("{}", serde_json::to_string(&identity).expect("serializable"));
//! }
//! # Ok(()) }
//! ```

use serde::ser::{Serialize, SerializeMap, Serializer};

use super::{Check, ConfigValue, IdentityStatus, Operator, PolicyState, Process, Rates};
use crate::policy::descriptor::StatusValue;

/// `{"check": "round_trip", "ok": true, "detail": "p50 90 µs, p99 180 µs"}`.
impl Serialize for Check {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(3))?;
        map.serialize_entry("check", self.check)?;
        map.serialize_entry("ok", &self.ok)?;
        map.serialize_entry("detail", &self.detail)?;
        map.end()
    }
}

/// A count or a number as such, a state as its name, unset as `null`, counts in use as an
/// object (`{"10": 1, "20": 2}`).
impl Serialize for StatusValue {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            StatusValue::Unset => serializer.serialize_none(),
            StatusValue::Count(n) => serializer.serialize_u64(*n),
            StatusValue::Number(n) => serializer.serialize_f64(*n),
            StatusValue::Text(text) => serializer.serialize_str(text),
            StatusValue::Counts(counts) => serializer.collect_map(
                counts
                    .iter()
                    .map(|(value, processes)| (value.as_str(), *processes)),
            ),
        }
    }
}

/// The kind's fields, by name, in the kind's order.
impl Serialize for PolicyState {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.fields())
    }
}

/// `kind`, `name`, `operation`, `scope`, `drift`, `shadow`, `in_use`, the state's fields, then `operator` while
/// an operator's forced state lasts: a line of `caracal status --json`.
impl Serialize for IdentityStatus {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("kind", self.kind.as_str())?;
        map.serialize_entry("name", &self.name)?;
        map.serialize_entry("operation", &self.operation)?;
        map.serialize_entry("scope", &self.scope)?;
        map.serialize_entry("drift", &self.drift)?;
        map.serialize_entry("shadow", &self.shadow)?;
        map.serialize_entry("in_use", &self.in_use)?;
        for (name, value) in self.state.fields() {
            map.serialize_entry(name, value)?;
        }
        if let Some(operator) = &self.operator {
            map.serialize_entry("operator", operator)?;
        }
        map.end()
    }
}

/// `setting`, `value`, `source`, `processes` (the ids of those using it, when any do), `drift` when
/// processes disagree on the setting, `operator` for a fleet override set with one, and
/// `ignored_by` for one that processes ignore: a line of `caracal config get --json`.
impl Serialize for ConfigValue {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("setting", &self.setting)?;
        map.serialize_entry("value", &self.value)?;
        map.serialize_entry("source", &self.source)?;
        if !self.processes.is_empty() {
            map.serialize_entry("processes", &self.processes)?;
        }
        if self.drift {
            map.serialize_entry("drift", &true)?;
        }
        if let Some(operator) = &self.operator {
            map.serialize_entry("operator", operator)?;
        }
        if self.ignored_by > 0 {
            map.serialize_entry("ignored_by", &self.ignored_by)?;
        }
        map.end()
    }
}

/// `who`, `reason` and `at` (ms since the Unix epoch), `null` where unknown.
impl Serialize for Operator {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(3))?;
        map.serialize_entry("who", &self.who)?;
        map.serialize_entry("reason", &self.reason)?;
        map.serialize_entry("at", &self.at_ms)?;
        map.end()
    }
}

/// `id`, `host`, `pid`, `version`, `last_seen_ms`, `age_ms` and `identities`: a line of
/// `caracal processes --json`.
impl Serialize for Process {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(7))?;
        map.serialize_entry("id", &self.id)?;
        map.serialize_entry("host", &self.host)?;
        map.serialize_entry("pid", &self.pid)?;
        map.serialize_entry("version", &self.version)?;
        map.serialize_entry("last_seen_ms", &self.seen_ms)?;
        map.serialize_entry("age_ms", &self.age_ms)?;
        map.serialize_entry("identities", &self.identities)?;
        map.end()
    }
}

/// `admitted`, and `rejected` and `degraded` by reason: decisions per second; a retry budget's
/// latest run on its local share as `local_share: {"seconds": …, "ago_seconds": …}`.
impl Serialize for Rates {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        struct ByReason<'a>(&'a [(String, f64)]);
        impl Serialize for ByReason<'_> {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_map(self.0.iter().map(|(reason, rate)| (reason, rate)))
            }
        }
        /// `{"critical": {"admitted": …, "rejected": …}, …}`.
        struct ByClass<'a>(&'a [(String, f64, f64)]);
        impl Serialize for ByClass<'_> {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                let mut map = serializer.serialize_map(Some(self.0.len()))?;
                for (class, admitted, rejected) in self.0 {
                    map.serialize_entry(
                        class,
                        &ByReason(&[
                            ("admitted".to_owned(), *admitted),
                            ("rejected".to_owned(), *rejected),
                        ]),
                    )?;
                }
                map.end()
            }
        }
        let mut map = serializer.serialize_map(Some(5))?;
        map.serialize_entry("admitted", &self.admitted)?;
        map.serialize_entry("rejected", &ByReason(&self.rejected))?;
        map.serialize_entry("degraded", &ByReason(&self.degraded))?;
        map.serialize_entry("would_reject", &ByReason(&self.would_reject))?;
        // Only a kind that decides by class has them.
        if !self.classes.is_empty() {
            map.serialize_entry("classes", &ByClass(&self.classes))?;
        }
        // Only a retry budget that ran on its local share lately has it.
        if let Some((seconds, ago_seconds)) = self.local_share {
            map.serialize_entry(
                "local_share",
                &ByReason(&[
                    ("seconds".to_owned(), seconds),
                    ("ago_seconds".to_owned(), ago_seconds),
                ]),
            )?;
        }
        map.end()
    }
}
