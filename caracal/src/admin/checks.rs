//! No silent no-ops: before an operator's command changes anything, whether any process uses
//! what it names, and whether the sites that do would accept it.

use std::fmt;

use super::Admin;
use crate::config::keys::{self, Read};
use crate::config::{OverrideKey, Table, check_table};
use crate::coordinator::registry::Registered;
use crate::error::Error;
use crate::identity::{Identity, PolicyKind};

/// Why a command was not carried out: as written, it would change nothing any process uses
/// (no process reports what it names), or every site that uses it would ignore it. The
/// command's `--force` does it anyway; `caracal` exits 3 with this as its one line.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Refusal {
    /// What is wrong, and what is known instead (the scopes in use for that name, or the names
    /// in use for that kind, or the site that would reject the value).
    pub reason: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for Refusal {}

fn refuse(reason: String) -> Option<Refusal> {
    Some(Refusal { reason })
}

/// A kind's name in a sentence: `circuit breaker`.
fn spoken(kind: PolicyKind) -> String {
    kind.as_str().replace('_', " ")
}

/// `partner-api (operation get, scope region:eu)`: the identity, its defaults left out.
pub(crate) fn label(identity: &Registered) -> String {
    let mut parts = Vec::new();
    if identity.operation != identity.name {
        parts.push(format!("operation {}", identity.operation));
    }
    if identity.scope != "global" {
        parts.push(format!("scope {}", identity.scope));
    }
    if parts.is_empty() {
        identity.name.clone()
    } else {
        format!("{} ({})", identity.name, parts.join(", "))
    }
}

/// `a, b and 3 more`: a sorted, deduplicated list, cut short.
fn listing(mut items: Vec<String>) -> String {
    const SHOWN: usize = 8;
    items.sort();
    items.dedup();
    let more = items.len().saturating_sub(SHOWN);
    items.truncate(SHOWN);
    let mut text = items.join(", ");
    if more > 0 {
        text.push_str(&format!(" and {more} more"));
    }
    text
}

/// What is in use of `kind` when no process uses the name `name`.
fn names_in_use(registered: &[Registered], kind: PolicyKind, name: &str) -> Option<Refusal> {
    let names: Vec<String> = registered
        .iter()
        .filter(|identity| identity.kind == kind)
        .map(|identity| identity.name.clone())
        .collect();
    let known = if names.is_empty() {
        format!("no {} is in use", spoken(kind))
    } else {
        format!("in use: {}", listing(names))
    };
    refuse(format!(
        "no process uses a {} named `{name}` ({known}; --force to do it anyway)",
        spoken(kind)
    ))
}

/// How long a process takes at most to report an identity after its first call there (it
/// reports in the background, a moment after the call: see `coordinator::registry`), with a
/// margin for the round trip: a command that finds nothing reads the registry once more after
/// it, so an identity used right before (a deploy, then an operator's command) is found.
const FIRST_REPORT_WITHIN: std::time::Duration = std::time::Duration::from_millis(300);

impl Admin {
    /// The registry, read once more after [`FIRST_REPORT_WITHIN`] when no identity is
    /// `wanted`.
    async fn registered_where(
        &self,
        wanted: impl Fn(&Registered) -> bool,
    ) -> Result<Vec<Registered>, Error> {
        let registered = self.reported().await?;
        if registered.iter().any(&wanted) {
            return Ok(registered);
        }
        tokio::time::sleep(FIRST_REPORT_WITHIN).await;
        self.reported().await
    }

    /// The registry's identities that processes reported: not those only an operator's
    /// command entered, which no process may use.
    async fn reported(&self) -> Result<Vec<Registered>, Error> {
        let mut registered = self.coordinator.registry_read().await?;
        registered.retain(Registered::reported);
        Ok(registered)
    }

    /// Whether some process uses `identity`, a `kind`'s: `None` when one reports it, else why
    /// not and what is in use under that name.
    pub(super) async fn check_in_use(
        &self,
        kind: PolicyKind,
        identity: &Identity,
    ) -> Result<Option<Refusal>, Error> {
        let registered = self
            .registered_where(|known| known.key == identity.key)
            .await?;
        if registered.iter().any(|known| known.key == identity.key) {
            return Ok(None);
        }
        let same_name: Vec<&Registered> = registered
            .iter()
            .filter(|known| known.kind == kind && known.name == identity.name)
            .collect();
        if same_name.is_empty() {
            return Ok(names_in_use(&registered, kind, &identity.name));
        }
        let asked = Registered {
            kind,
            name: identity.name.to_string(),
            operation: identity.operation.to_string(),
            scope: identity.scope.as_str().to_owned(),
            key: identity.key.clone(),
            values: String::new(),
            sources: String::new(),
            drift: false,
            uses: Vec::new(),
        };
        Ok(refuse(format!(
            "no process uses {} {} (in use: {}; --force to do it anyway)",
            spoken(kind),
            label(&asked),
            listing(same_name.into_iter().map(label).collect())
        )))
    }

    /// Whether a fleet override of `setting` (to `value`; `None` to remove it) would reach a
    /// site some process uses, and be applied there: `None` when so, else why not.
    pub async fn check_override(
        &self,
        setting: &str,
        value: Option<&str>,
    ) -> Result<Option<Refusal>, Error> {
        let key = OverrideKey::parse(setting)?;
        let setting = value.map(|value| key.value(value)).transpose()?;
        let registered = self
            .registered_where(|known| known.kind == key.kind && known.name == key.name)
            .await?;
        let sites: Vec<&Registered> = registered
            .iter()
            .filter(|identity| identity.kind == key.kind && identity.name == key.name)
            .collect();
        if sites.is_empty() {
            return Ok(names_in_use(&registered, key.kind, &key.name));
        }
        let Some(setting) = setting else {
            return Ok(None);
        };
        for site in sites {
            let mut table = reported_table(site);
            table.insert(key.key.name, setting);
            if let Err(why) = check_table(site.kind, &table) {
                return Ok(refuse(format!(
                    "{key} = {setting} would be ignored by {} {}: {why} (--force to set it anyway)",
                    spoken(site.kind),
                    label(site),
                )));
            }
        }
        Ok(None)
    }
}

/// The values a site reported, as a table (those this version cannot read left out).
fn reported_table(site: &Registered) -> Table {
    let mut table = Table::new();
    for (name, value, _) in site.entries() {
        if value == "none" {
            continue;
        }
        if let Ok(key) = keys::find(site.kind, name)
            && let Ok(setting) = key.read_text(value)
        {
            table.insert(key.name, setting);
        }
    }
    table
}
