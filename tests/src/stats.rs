//! Server-side command counters from `INFO commandstats`.
//!
//! Reading the counters is itself a command: a `delta` between two reads on the same server
//! includes the `info` call of the first read (Redis counts a command after running it), and
//! a fresh redis-rs connection adds `client|setinfo` calls. Assert on the commands you care
//! about with [`CommandStats::calls`], or account for those in exact comparisons.

use std::collections::BTreeMap;

use crate::cluster::RedisCluster;

/// Calls and total time of one command.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommandStat {
    /// Number of calls.
    pub calls: u64,
    /// Total microseconds spent executing it.
    pub usec: u64,
}

/// Per-command counters, keyed by lowercase command name (`evalsha`, `zrem`,
/// `client|setinfo` for subcommands).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommandStats {
    commands: BTreeMap<String, CommandStat>,
}

impl CommandStats {
    /// Reads `INFO commandstats` from one server.
    ///
    /// # Panics
    /// When the command fails or its output cannot be parsed.
    pub fn read(conn: &mut redis::Connection) -> Self {
        let text: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(conn)
            .unwrap_or_else(|e| panic!("INFO commandstats failed: {e}"));
        Self::parse(&text)
    }

    /// Reads and sums the counters of every node of `cluster`.
    pub fn read_cluster(cluster: &RedisCluster) -> Self {
        let mut total = Self::default();
        for node in cluster.nodes() {
            total.add(&Self::read(&mut node.connection()));
        }
        total
    }

    /// Parses the text of `INFO commandstats`.
    ///
    /// # Panics
    /// On a `cmdstat_` line without numeric `calls` and `usec`.
    pub fn parse(text: &str) -> Self {
        let mut commands = BTreeMap::new();
        for line in text.lines() {
            let Some((name, fields)) = line
                .trim()
                .strip_prefix("cmdstat_")
                .and_then(|l| l.split_once(':'))
            else {
                continue;
            };
            let number = |key: &str| -> u64 {
                fields
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| panic!("no numeric `{key}` in commandstats line {line:?}"))
            };
            let stat = CommandStat {
                calls: number("calls"),
                usec: number("usec"),
            };
            commands.insert(name.to_ascii_lowercase(), stat);
        }
        Self { commands }
    }

    /// What happened since `before`: per-command differences, commands without new calls
    /// omitted. Counters that went down (a reset or restart in between) count from zero.
    pub fn delta(&self, before: &Self) -> Self {
        let mut commands = BTreeMap::new();
        for (name, now) in &self.commands {
            let then = before.commands.get(name).copied().unwrap_or_default();
            let diff = if now.calls >= then.calls {
                CommandStat {
                    calls: now.calls - then.calls,
                    usec: now.usec.saturating_sub(then.usec),
                }
            } else {
                *now
            };
            if diff.calls > 0 {
                commands.insert(name.clone(), diff);
            }
        }
        Self { commands }
    }

    /// Calls of `command` (case-insensitive), 0 when absent.
    pub fn calls(&self, command: &str) -> u64 {
        self.get(command).calls
    }

    /// Microseconds spent in `command` (case-insensitive), 0 when absent.
    pub fn usec(&self, command: &str) -> u64 {
        self.get(command).usec
    }

    /// Counters of `command` (case-insensitive), zero when absent.
    pub fn get(&self, command: &str) -> CommandStat {
        self.commands
            .get(&command.to_ascii_lowercase())
            .copied()
            .unwrap_or_default()
    }

    /// Sum of calls over all commands.
    pub fn total_calls(&self) -> u64 {
        self.commands.values().map(|s| s.calls).sum()
    }

    /// Every command with its counters, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, CommandStat)> {
        self.commands.iter().map(|(k, v)| (k.as_str(), *v))
    }

    /// `command → calls`, handy for exact `assert_eq!`s.
    pub fn calls_map(&self) -> BTreeMap<String, u64> {
        self.commands
            .iter()
            .map(|(k, v)| (k.clone(), v.calls))
            .collect()
    }

    /// A copy without the listed commands (e.g. `["info", "client|setinfo"]`).
    pub fn without(&self, commands: &[&str]) -> Self {
        let mut copy = self.clone();
        for command in commands {
            copy.commands.remove(&command.to_ascii_lowercase());
        }
        copy
    }

    /// Adds `other`'s counters to these.
    pub fn add(&mut self, other: &Self) {
        for (name, stat) in &other.commands {
            let entry = self.commands.entry(name.clone()).or_default();
            entry.calls += stat.calls;
            entry.usec += stat.usec;
        }
    }
}

/// Zeroes a server's counters with `CONFIG RESETSTAT`.
///
/// # Panics
/// When the command fails.
pub fn reset(conn: &mut redis::Connection) {
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query::<()>(conn)
        .unwrap_or_else(|e| panic!("CONFIG RESETSTAT failed: {e}"));
}

/// Zeroes the counters of every node of `cluster`.
pub fn reset_cluster(cluster: &RedisCluster) {
    for node in cluster.nodes() {
        reset(&mut node.connection());
    }
}
