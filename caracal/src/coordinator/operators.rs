//! Who steered what, and why: the operator of each identity an operator forced into a state
//! (a breaker's) and of each fleet override, kept per namespace in one hash (`caracal:v1:{<namespace>}:operators`) beside the
//! overrides, written by the admin's commands and read by `status`, `config get`, and the
//! processes that announce a change an operator made.
//!
//! The kernels never see them (a breaker's state stays integers, its scripts unchanged): a
//! record is a JSON object `{"who", "reason", "at", …}` under a field naming its subject, and
//! says what the command made of it (the state, as its kind names it; the override's value),
//! so a record
//! that outlived what it describes (a timed force that ended, a value changed by a version
//! that keeps no records) is never shown as the state in force. Fields:
//!
//! - `<kind>:<identity tag>` (`circuit_breaker:…`): `{…, "state"}`, the state the command
//!   forced (a breaker's `closed` for a reset); written before the command runs, so a process
//!   that learns of the change finds it.
//! - `override:<kind>.<name>.<key>`: `{…, "value"}`, while the override is set.
//! - `override`: `{…, "setting", "version"}`, the change that made that version of the
//!   overrides (what `config.applied` names).
//!
//! The overrides' records are written by the same script as the overrides, atomically.

use serde_json::{Map, Value};

use super::Coordinator;
use crate::error::Error;
use crate::error::FailureKind;
use crate::identity::{KeyBase, PolicyKind};
use crate::operator::Operator;

/// A stored record, read: its operator, and what else it says.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    pub(crate) operator: Operator,
    rest: Map<String, Value>,
}

/// 9999-12-31T23:59:59.999Z, in ms since the Unix epoch.
const LAST_DATE_MS: u64 = 253_402_300_799_999;

impl Record {
    /// Reads the record stored under `field`; one that does not read (written by hand, or by
    /// a version that wrote another layout) is an error naming the field.
    pub(crate) fn read(field: &str, text: &str) -> Result<Self, Error> {
        let malformed = |what: &str| {
            Error::unavailable(
                FailureKind::MalformedReply,
                format!("the operator record `{field}` does not read: {what}"),
            )
        };
        let Ok(Value::Object(mut rest)) = serde_json::from_str::<Value>(text) else {
            return Err(malformed("not a JSON object"));
        };
        let who = match rest.remove("who") {
            Some(Value::String(who)) => who,
            _ => return Err(malformed("no `who` text")),
        };
        let reason = match rest.remove("reason") {
            Some(Value::String(reason)) => Some(reason),
            None | Some(Value::Null) => None,
            Some(_) => return Err(malformed("a `reason` that is no text")),
        };
        // Past the year 9999 a time cannot be written as a date (the command would fail to
        // print it): no coordinator's clock stamps one.
        let Some(at_ms) = rest
            .remove("at")
            .as_ref()
            .and_then(Value::as_u64)
            .filter(|&at| at <= LAST_DATE_MS)
        else {
            return Err(malformed("no `at` time"));
        };
        Ok(Record {
            operator: Operator {
                who,
                reason,
                at_ms: Some(at_ms),
            },
            rest,
        })
    }

    /// Its text field `name`, if it has one.
    pub(crate) fn text(&self, name: &str) -> Option<&str> {
        self.rest.get(name).and_then(Value::as_str)
    }

    /// Its count field `name`, if it has one.
    pub(crate) fn count(&self, name: &str) -> Option<u64> {
        self.rest.get(name).and_then(Value::as_u64)
    }
}

/// Adds the store's time to a record a command handed it (what the scripts do with `TIME`).
pub(crate) fn stamp(unstamped: &str, at_ms: u64, extra: &[(&str, Value)]) -> String {
    let mut record = match serde_json::from_str::<Value>(unstamped) {
        Ok(Value::Object(record)) => record,
        // Built by `Operator::unstamped`: always an object.
        _ => Map::new(),
    };
    record.insert("at".to_owned(), Value::from(at_ms));
    for (name, value) in extra {
        record.insert((*name).to_owned(), value.clone());
    }
    Value::Object(record).to_string()
}

/// The field of the record of `kind`'s identity at `key`.
pub(crate) fn steered_field(kind: PolicyKind, key: &KeyBase) -> String {
    format!("{}:{}", kind.as_str(), key.tag())
}

/// The field of the record of the override `setting` (`lua/overrides_write.lua` spells it
/// the same way).
pub(crate) fn override_field(setting: &str) -> String {
    format!("override:{setting}")
}

/// The field of the record of the change that made the overrides' current version.
pub(crate) const LAST_OVERRIDE_FIELD: &str = "override";

/// Every record of a namespace, as read at once (by field); each is read when asked for.
#[derive(Debug, Default)]
pub(crate) struct Records(Vec<(String, String)>);

impl Records {
    fn get(&self, field: &str) -> Result<Option<Record>, Error> {
        self.0
            .iter()
            .find(|(name, _)| name == field)
            .map(|(name, text)| Record::read(name, text))
            .transpose()
    }

    /// The operator who forced `kind`'s identity at `key` into `state`, if its record says
    /// so.
    pub(crate) fn steered(
        &self,
        kind: PolicyKind,
        key: &KeyBase,
        state: &str,
    ) -> Result<Option<Operator>, Error> {
        Ok(self
            .get(&steered_field(kind, key))?
            .filter(|record| record.text("state") == Some(state))
            .map(|record| record.operator))
    }

    /// The operator who set the override `setting` to `value`, if its record says so.
    pub(crate) fn setting(&self, setting: &str, value: &str) -> Result<Option<Operator>, Error> {
        Ok(self
            .get(&override_field(setting))?
            .filter(|record| record.text("value") == Some(value))
            .map(|record| record.operator))
    }
}

impl Coordinator {
    /// Every operator record of the namespace.
    pub(crate) async fn operator_records(&self) -> Result<Records, Error> {
        let namespace = self.namespace_base();
        let pairs = self.inner.backend.operators_read(&namespace, &[]).await?;
        Ok(Records(pairs))
    }

    /// The operator who forced `kind`'s identity at `key` into `state`, if its record says so.
    pub(crate) async fn steered_by(
        &self,
        kind: PolicyKind,
        key: &KeyBase,
        state: &str,
    ) -> Result<Option<Operator>, Error> {
        let namespace = self.namespace_base();
        let field = steered_field(kind, key);
        let pairs = self
            .inner
            .backend
            .operators_read(&namespace, std::slice::from_ref(&field))
            .await?;
        Records(pairs).steered(kind, key, state)
    }

    /// Records `operator` as forcing `kind`'s identity at `key` into `state` (a breaker's
    /// reset: `closed`), or, without one, forgets whoever forced it before: a later command
    /// replaces the record of an earlier one.
    pub(crate) async fn record_steering(
        &self,
        kind: PolicyKind,
        key: &KeyBase,
        state: &str,
        operator: Option<&Operator>,
    ) -> Result<(), Error> {
        let namespace = self.namespace_base();
        let record = operator.map(|operator| operator.unstamped(&[("state", state)]));
        let field = steered_field(kind, key);
        self.inner
            .backend
            .operator_write(&namespace, &field, record.as_deref())
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Scope;

    #[test]
    fn a_record_reads_back_and_a_malformed_one_is_an_error() {
        let operator = Operator::new("alice@ops").with_reason("incident \"42\"\n");
        let stored = stamp(
            &operator.unstamped(&[("state", "forced_open")]),
            1_764_536_400_123,
            &[],
        );
        let kind = PolicyKind::CircuitBreaker;
        let key = KeyBase::derive("ns", kind, "b", "b", &Scope::GLOBAL);
        let records = Records(vec![(steered_field(kind, &key), stored)]);
        let read = records.steered(kind, &key, "forced_open").expect("reads");
        assert_eq!(
            read,
            Some(Operator {
                at_ms: Some(1_764_536_400_123),
                ..operator
            })
        );
        let forced_closed = records.steered(kind, &key, "forced_closed");
        assert_eq!(forced_closed.ok(), Some(None));
        for bad in [
            "",
            "[]",
            "{\"reason\":null,\"at\":1}",
            "{\"who\":\"a\",\"at\":-1}",
            // Past the year 9999: no date to show.
            "{\"who\":\"a\",\"at\":253402300800000}",
            "{\"who\":\"a\",\"reason\":3,\"at\":1}",
        ] {
            let records = Records(vec![(steered_field(kind, &key), bad.to_owned())]);
            let error = records.steered(kind, &key, "forced_open").expect_err(bad);
            assert_eq!(
                error.failure_kind(),
                Some(FailureKind::MalformedReply),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_blank_or_oversized_operator_is_refused() {
        assert!(Operator::new("a@b").with_reason("why").check().is_ok());
        for operator in [
            Operator::new(" "),
            Operator::new("a@b").with_reason(""),
            Operator::new("x".repeat(1025)),
        ] {
            assert!(matches!(operator.check(), Err(Error::InvalidConfig { .. })));
        }
    }
}
