//! Who steers the fleet: an operator, as the commands that force a breaker or override a
//! setting record it. Below the coordinator, which stores the records, and the events, which
//! carry who and why.

use serde_json::{Map, Value};

use crate::error::Error;
use crate::identity::check_part;

/// An operator, as a command that steers the fleet records it: who gave it, why, and (once
/// stored) when.
///
/// Given to [`Admin::breaker_by`], [`Admin::set_override_by`] and
/// [`Admin::unset_override_by`]; read back in [`IdentityStatus::operator`] (while the breaker
/// is in the state that operator forced) and [`ConfigValue::operator`] (while the override
/// holds the value that operator set). The events of the change carry `who` and `reason`.
///
/// ```
/// use caracal::admin::Operator;
///
/// let operator = Operator::new("alice@ops-1").with_reason("partner-api incident 4711");
/// assert_eq!(operator.who, "alice@ops-1");
/// assert_eq!(operator.reason.as_deref(), Some("partner-api incident 4711"));
/// assert_eq!(operator.at_ms, None, "stamped by the coordinator when stored");
/// // `$USER@hostname`, as `caracal` records it without `--who`.
/// assert!(Operator::from_env().who.contains('@'));
/// ```
///
/// [`Admin::breaker_by`]: crate::admin::Admin::breaker_by
/// [`Admin::set_override_by`]: crate::admin::Admin::set_override_by
/// [`Admin::unset_override_by`]: crate::admin::Admin::unset_override_by
/// [`IdentityStatus::operator`]: crate::admin::IdentityStatus::operator
/// [`ConfigValue::operator`]: crate::admin::ConfigValue::operator
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Operator {
    /// Who (`alice@ops-1`): not blank, at most 1024 bytes.
    pub who: String,
    /// Why, if they said: not blank, at most 1024 bytes.
    pub reason: Option<String>,
    /// When the coordinator stored it, in ms since the Unix epoch on the coordinator's clock;
    /// `None` in one built to be given to a command.
    pub at_ms: Option<u64>,
}

impl Operator {
    /// `who`, giving no reason.
    pub fn new(who: impl Into<String>) -> Self {
        Operator {
            who: who.into(),
            reason: None,
            at_ms: None,
        }
    }

    /// The same operator, giving `reason`.
    pub fn with_reason(mut self, reason: impl Into<String>) -> Self {
        self.reason = Some(reason.into());
        self
    }

    /// The user of this process: `$USER@hostname` (`$USERNAME` where there is no `$USER`; the
    /// host from `$HOSTNAME`, else `/etc/hostname`, else the `hostname` command), with
    /// `unknown` for what cannot be found.
    pub fn from_env() -> Self {
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let user = env("USER").or_else(|| env("USERNAME"));
        let host = env("HOSTNAME")
            .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
            .or_else(|| {
                let output = std::process::Command::new("hostname").output().ok()?;
                output
                    .status
                    .success()
                    .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
            })
            .map(|host| host.trim().to_owned())
            .filter(|host| !host.is_empty());
        let unknown = || "unknown".to_owned();
        Operator::new(format!(
            "{}@{}",
            user.unwrap_or_else(unknown),
            host.unwrap_or_else(unknown)
        ))
    }

    /// Refuses a blank or oversized `who` or `reason`, as [`Error::InvalidConfig`].
    pub(crate) fn check(&self) -> Result<(), Error> {
        check_part(&self.who).map_err(|why| Error::config(format!("the operator {why}")))?;
        if let Some(reason) = &self.reason {
            check_part(reason).map_err(|why| Error::config(format!("the reason {why}")))?;
        }
        Ok(())
    }

    /// What a command hands the store: who and why, with `extra` (what the command made of
    /// its subject); the store adds the time.
    pub(crate) fn unstamped(&self, extra: &[(&str, &str)]) -> String {
        let mut record = Map::new();
        record.insert("who".to_owned(), Value::from(self.who.as_str()));
        record.insert(
            "reason".to_owned(),
            self.reason.as_deref().map_or(Value::Null, Value::from),
        );
        for (name, value) in extra {
            record.insert((*name).to_owned(), Value::from(*value));
        }
        Value::Object(record).to_string()
    }
}
