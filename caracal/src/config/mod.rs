//! Configuration at run time: a TOML table per policy kind and name overrides the attribute's
//! values for every call site of that kind and name (any operation, any scope).
//!
//! ```toml
//! [bulkhead.partner-api]
//! limit = 40
//! max_wait = "50ms"
//!
//! [circuit_breaker.partner-api]
//! failure_threshold = 0.3
//! open = "10s"
//! ```
//!
//! Every kind's keys, their bounds and defaults: [the configuration guide](crate::guide::configuration).
//!
//! Three layers decide a value, the first that has it winning: a **fleet override** (set with
//! `caracal config set`, stored in the coordinator under the namespace, applied by every
//! connected process within a second), this process's [`Config`]
//! ([`Coordinator::set_config`](crate::Coordinator::set_config)), then the attribute.

pub(crate) mod keys;
pub(crate) mod overrides;

use std::collections::BTreeMap;
use std::path::Path;

use self::keys::Read as _;
pub(crate) use self::keys::Setting;
use crate::error::Error;
use crate::identity::{PolicyKind, check_part};
use crate::priority::{self, Priority, Thresholds};

/// One policy's overridden values, by key.
pub(crate) type Table = BTreeMap<&'static str, Setting>;

/// Every policy's overridden values, by kind and name.
pub(crate) type Tables = BTreeMap<PolicyKind, BTreeMap<String, Table>>;

/// The table of `kind`'s policy `name`, if there is one.
pub(crate) fn table<'t>(tables: &'t Tables, kind: PolicyKind, name: &str) -> Option<&'t Table> {
    tables.get(&kind)?.get(name)
}

/// Values that override the attributes' in this process: a TOML table per policy kind and
/// name. Apply one with [`Coordinator::set_config`](crate::Coordinator::set_config); an empty
/// `Config` (the default) overrides nothing.
///
/// ```
/// let config = caracal::Config::from_toml_str(
///     r#"
///     [bulkhead.partner-api]
///     limit = 40
///     max_wait = "50ms"
///     "#,
/// )?;
/// caracal::Coordinator::in_memory().set_config(config);
///
/// let typo = caracal::Config::from_toml_str("[bulkhead.partner-api]\nlimt = 40");
/// assert!(typo.unwrap_err().to_string().contains("[bulkhead.partner-api], key `limt`"));
/// # Ok::<(), caracal::Error>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Config {
    pub(crate) tables: Tables,
}

/// Where a configuration error is: the file (if any), the table, the key.
struct Place<'a> {
    file: Option<&'a Path>,
    table: Option<String>,
    key: Option<String>,
}

impl Place<'_> {
    fn error(&self, reason: impl std::fmt::Display) -> Error {
        let mut place = Vec::new();
        if let Some(file) = self.file {
            place.push(format!("file {}", file.display()));
        }
        if let Some(table) = &self.table {
            place.push(format!("table [{table}]"));
        }
        if let Some(key) = &self.key {
            place.push(format!("key `{key}`"));
        }
        if place.is_empty() {
            Error::config(reason.to_string())
        } else {
            Error::config(format!("{}: {reason}", place.join(", ")))
        }
    }
}

impl Config {
    /// Reads a configuration from TOML text.
    ///
    /// An unknown kind, a table without a name, an unknown key, a key that cannot be
    /// overridden (`scope`, `local`, `classify`, `when`), a value of the wrong type or out of
    /// range is [`Error::InvalidConfig`] naming the table and the key. Nothing is ignored.
    pub fn from_toml_str(text: &str) -> Result<Config, Error> {
        parse(text, None)
    }

    /// Reads a configuration from a TOML file; errors also name the file.
    pub fn from_toml_file(path: impl AsRef<Path>) -> Result<Config, Error> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|error| {
            Error::config(format!("cannot read the file {}: {error}", path.display()))
        })?;
        parse(&text, Some(path))
    }

    /// Whether it overrides nothing.
    pub fn is_empty(&self) -> bool {
        self.tables.is_empty()
    }
}

fn parse(text: &str, file: Option<&Path>) -> Result<Config, Error> {
    let mut place = Place {
        file,
        table: None,
        key: None,
    };
    let root: toml::Table = text.parse().map_err(|error: toml::de::Error| {
        let line = error
            .span()
            .map(|span| text[..span.start.min(text.len())].lines().count().max(1));
        let message = error.message().trim_end().to_owned();
        match line {
            Some(line) => place.error(format!("line {line}: {message}")),
            None => place.error(message),
        }
    })?;
    let mut tables = Tables::new();
    for (kind_name, policies) in &root {
        place.table = Some(kind_name.clone());
        let kind =
            crate::identity::policy_kind(kind_name).map_err(|error| place.error(reason(&error)))?;
        let toml::Value::Table(policies) = policies else {
            return Err(place.error(format!(
                "`{kind_name}` must be a table of named policies, like [{kind_name}.partner-api]"
            )));
        };
        for (name, values) in policies {
            let toml::Value::Table(values) = values else {
                return Err(place.error(format!(
                    "`{name}` is outside a named table: write [{kind_name}.<name>] and put `{name}` in it"
                )));
            };
            place.table = Some(format!("{kind_name}.{name}"));
            check_part(name).map_err(|why| place.error(format!("the name {why}")))?;
            let table = read_table(kind, values, &mut place)?;
            tables.entry(kind).or_default().insert(name.clone(), table);
        }
    }
    Ok(Config { tables })
}

fn read_table<'a>(
    kind: PolicyKind,
    values: &'a toml::Table,
    place: &mut Place<'a>,
) -> Result<Table, Error> {
    let mut table = Table::new();
    for (key_name, value) in flattened(values) {
        place.key = Some(key_name.clone());
        let key = keys::find(kind, &key_name).map_err(|why| place.error(why))?;
        let setting = key.read_toml(value).map_err(|why| place.error(why))?;
        table.insert(key.name, setting);
    }
    place.key = None;
    check_table(kind, &table).map_err(|why| place.error(why))?;
    Ok(table)
}

/// A policy's values with the keys of a group flattened: TOML reads `thresholds.normal = 0.7`
/// (and `thresholds = { normal = 0.7 }`) as a table `thresholds` holding `normal`, which is
/// the key `thresholds.normal`.
fn flattened(values: &toml::Table) -> Vec<(String, &toml::Value)> {
    let mut flat = Vec::with_capacity(values.len());
    for (name, value) in values {
        match value {
            toml::Value::Table(group) => {
                flat.extend(
                    group
                        .iter()
                        .map(|(member, value)| (format!("{name}.{member}"), value)),
                );
            }
            _ => flat.push((name.clone(), value)),
        }
    }
    flat
}

/// What a table of `kind` must satisfy as a whole: the relations its spec declares.
pub(crate) fn check_table(kind: PolicyKind, table: &Table) -> Result<(), String> {
    keys::out_of_order(kind, |key| table.get(key).copied()).map_or(Ok(()), Err)
}

/// The class a `thresholds.<class>` key shares the limit out to.
fn threshold_class(key: &str) -> Option<Priority> {
    let class: Priority = key.strip_prefix("thresholds.")?.parse().ok()?;
    (class != Priority::Critical).then_some(class)
}

/// The value of `key` in `thresholds` if it is a `thresholds.<class>` key: the share of the
/// limit, as configuration writes it.
pub(crate) fn threshold(thresholds: Thresholds, key: &str) -> Option<Setting> {
    let class = threshold_class(key)?;
    Some(Setting::Number(
        f64::from(thresholds.thousandths(class)) / 1000.0,
    ))
}

/// Sets `key` in `thresholds` if it is a `thresholds.<class>` key; whether the two shares
/// still make sense is the values' [`inconsistent`](overrides::Values::inconsistent) to say.
pub(crate) fn set_threshold(thresholds: &mut Thresholds, key: &str, setting: Setting) {
    if let (Some(class), Setting::Number(share)) = (threshold_class(key), setting) {
        *thresholds = thresholds.with(class, priority::thousandths(share));
    }
}

/// An error's reason without the "invalid configuration" prefix.
fn reason(error: &Error) -> String {
    match error {
        Error::InvalidConfig { reason } => reason.clone(),
        other => other.to_string(),
    }
}

/// A fleet override's address, as `caracal config set` takes it: `<kind>.<name>.<key>`. The
/// name may itself hold dots.
#[derive(Debug, Clone)]
pub(crate) struct OverrideKey {
    pub(crate) kind: PolicyKind,
    pub(crate) name: String,
    pub(crate) key: &'static keys::Key,
}

impl OverrideKey {
    /// Reads `<kind>.<name>.<key>`.
    pub(crate) fn parse(text: &str) -> Result<Self, Error> {
        let malformed = || {
            Error::config(format!(
                "`{text}` is not a setting: write <kind>.<name>.<key>, like bulkhead.partner-api.limit"
            ))
        };
        let (kind, rest) = text.split_once('.').ok_or_else(malformed)?;
        let kind = crate::identity::policy_kind(kind)?;
        // A name may hold dots, and so may a key (`thresholds.normal`): the key is the longest
        // of the kind's that ends the text, else the last part (an unknown key, reported so).
        let (name, key) = keys::keys(kind)
            .iter()
            .filter_map(|key| {
                let name = rest.strip_suffix(key.name)?.strip_suffix('.')?;
                Some((name, key.name))
            })
            .max_by_key(|(_, key)| key.len())
            .or_else(|| rest.rsplit_once('.'))
            .ok_or_else(malformed)?;
        check_part(name).map_err(|why| Error::config(format!("`{text}`: the name {why}")))?;
        let key = keys::find(kind, key).map_err(|why| Error::config(format!("`{text}`: {why}")))?;
        Ok(OverrideKey {
            kind,
            name: name.to_owned(),
            key,
        })
    }

    /// Reads a value for this key.
    pub(crate) fn value(&self, text: &str) -> Result<Setting, Error> {
        self.key
            .read_text(text)
            .map_err(|why| Error::config(format!("{self}: {why}")))
    }
}

impl std::fmt::Display for OverrideKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.kind, self.name, self.key.name)
    }
}

#[cfg(test)]
mod tests;
