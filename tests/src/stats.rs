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

/// Every command one server ran, with its arguments: the slow log, set to log every command.
/// Unlike [`CommandStats`] it tells scripts apart (by the SHA an `EVALSHA` names), so a test
/// can count one script's calls while the coordinator's own background scripts (the identity
/// registry's reports, the fleet overrides' checks) run beside them. Commands run inside
/// scripts are logged too, before the script that ran them.
#[derive(Debug, Clone, Default)]
pub struct CommandLog {
    commands: Vec<Vec<String>>,
    runs: Vec<ScriptRun>,
}

/// One script call as the slow log tells it: how long it held the server and how many
/// commands it ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptRun {
    /// Its arguments after `EVALSHA` (as far as the log keeps them: see
    /// [`CommandLog::calls_of`]).
    pub args: Vec<String>,
    /// How long it ran, in microseconds, as the server timed it (logging every command
    /// inside it adds a little).
    pub micros: u64,
    /// The commands it ran.
    pub commands: usize,
}

impl CommandLog {
    /// Starts logging every command on the server behind `conn`, from an empty log. Loads
    /// every caracal script first, so no call in the log is a refused `EVALSHA` sent again
    /// as an `EVAL`.
    ///
    /// # Panics
    /// When the server refuses the configuration.
    pub fn start(conn: &mut redis::Connection) {
        for body in all_scripts() {
            redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(body)
                .exec(conn)
                .unwrap_or_else(|e| panic!("SCRIPT LOAD failed: {e}"));
        }
        redis::pipe()
            .cmd("CONFIG")
            .arg("SET")
            .arg("slowlog-log-slower-than")
            .arg(0)
            .cmd("CONFIG")
            .arg("SET")
            .arg("slowlog-max-len")
            .arg(1_000_000)
            .cmd("SLOWLOG")
            .arg("RESET")
            .exec(conn)
            .unwrap_or_else(|e| panic!("cannot log every command: {e}"));
    }

    /// The commands logged since [`start`](Self::start), oldest first.
    ///
    /// # Panics
    /// When the log cannot be read.
    pub fn read(conn: &mut redis::Connection) -> Self {
        let entries: redis::Value = redis::cmd("SLOWLOG")
            .arg("GET")
            .arg(-1)
            .query(conn)
            .unwrap_or_else(|e| panic!("SLOWLOG GET failed: {e}"));
        let redis::Value::Array(entries) = entries else {
            panic!("SLOWLOG GET replied {entries:?}");
        };
        // Newest first in the log; each entry is [id, time, micros, args, client, name].
        let mut logged: Vec<(u64, Vec<String>, String)> = entries
            .into_iter()
            .filter_map(|entry| match entry {
                redis::Value::Array(fields) => {
                    let mut fields = fields.into_iter().skip(2);
                    let micros = redis::from_redis_value::<u64>(fields.next()?).ok()?;
                    let args = redis::from_redis_value::<Vec<String>>(fields.next()?).ok()?;
                    let client = fields
                        .next()
                        .and_then(|client| redis::from_redis_value::<String>(client).ok())
                        .unwrap_or_default();
                    Some((micros, args, client))
                }
                _ => None,
            })
            .collect();
        logged.reverse();
        logged.retain(|(_, args, _)| {
            let name = args.first().map(|n| n.to_ascii_lowercase());
            !matches!(name.as_deref(), Some("slowlog" | "config"))
        });
        // A script runs alone: the commands it ran are logged right before it, each with
        // the script's client, which has no address (`?:0`).
        let mut runs = Vec::new();
        let mut inside = 0;
        for (micros, args, client) in &logged {
            if client.starts_with("?:") {
                inside += 1;
                continue;
            }
            let name = args.first().map(|n| n.to_ascii_lowercase());
            if matches!(name.as_deref(), Some("evalsha" | "eval")) {
                runs.push(ScriptRun {
                    args: args[1..].to_vec(),
                    micros: *micros,
                    commands: inside,
                });
            }
            inside = 0;
        }
        let commands = logged.into_iter().map(|(_, args, _)| args).collect();
        Self { commands, runs }
    }

    /// Every call of the script whose source is `body` by `EVALSHA`, oldest first.
    pub fn runs_of<'a>(&'a self, body: &str) -> impl Iterator<Item = &'a ScriptRun> + 'a {
        let sha = redis::Script::new(body).get_hash().to_owned();
        self.runs
            .iter()
            .filter(move |run| run.args.first() == Some(&sha))
    }

    /// Calls of the script whose source is `body`, by `EVALSHA` or `EVAL`.
    pub fn script_calls(&self, body: &str) -> usize {
        let sha = redis::Script::new(body).get_hash().to_owned();
        self.commands
            .iter()
            .filter(
                |args| match args.first().map(|n| n.to_ascii_lowercase()).as_deref() {
                    Some("evalsha") => args.get(1) == Some(&sha),
                    // The slow log cuts long arguments: compare what it kept.
                    Some("eval") => args.get(1).is_some_and(|logged| {
                        let kept = logged.split(" ... (").next().unwrap_or(logged);
                        body.starts_with(kept)
                    }),
                    _ => false,
                },
            )
            .count()
    }

    /// Calls of `command` (case-insensitive), scripts counted as `evalsha` / `eval`.
    pub fn calls(&self, command: &str) -> usize {
        self.calls_of(command).count()
    }

    /// Every call of `command` (case-insensitive), oldest first, each with its arguments
    /// after the command's name (as far as the slow log keeps them: 32 at most, the last
    /// one then saying how many more there were).
    pub fn calls_of<'a>(&'a self, command: &'a str) -> impl Iterator<Item = &'a [String]> + 'a {
        self.commands.iter().filter_map(move |args| {
            let (name, rest) = args.split_first()?;
            name.eq_ignore_ascii_case(command).then_some(rest)
        })
    }

    /// The commands that are neither calls of the scripts in `bodies` nor among `commands`.
    pub fn others(&self, bodies: &[&str], commands: &[&str]) -> Vec<Vec<String>> {
        let shas: Vec<String> = bodies
            .iter()
            .map(|body| redis::Script::new(body).get_hash().to_owned())
            .collect();
        self.commands
            .iter()
            .filter(|args| {
                let name = args
                    .first()
                    .map(|n| n.to_ascii_lowercase())
                    .unwrap_or_default();
                let script = name == "evalsha" && args.get(1).is_some_and(|sha| shas.contains(sha));
                !script && !commands.iter().any(|c| c.eq_ignore_ascii_case(&name))
            })
            .cloned()
            .collect()
    }
}

/// Every Lua script caracal sends, by the name it gives it, and the files (under `caracal/`)
/// its text is made of, in order: a kind's scripts live in its kernel's folder (a breaker or
/// rate limit script is sent after its kind's prelude), the coordinator's own in `lua/`.
const SCRIPTS: &[(&str, &[&str])] = &[
    ("acl_check", &["lua/acl_check.lua"]),
    (
        "registry_report",
        &[REGISTRY_PRELUDE, "lua/registry_report.lua"],
    ),
    (
        "registry_read",
        &[REGISTRY_PRELUDE, "lua/registry_read.lua"],
    ),
    (
        "registry_hold",
        &[REGISTRY_PRELUDE, "lua/registry_hold.lua"],
    ),
    ("processes_read", &["lua/processes_read.lua"]),
    ("overrides_read", &["lua/overrides_read.lua"]),
    ("overrides_write", &["lua/overrides_write.lua"]),
    ("bulkhead_lease", &["src/policy/bulkhead/kernel/lease.lua"]),
    (
        "bulkhead_status",
        &["src/policy/bulkhead/kernel/status.lua"],
    ),
    (
        "rate_limit",
        &[RATE_PRELUDE, "src/policy/rate_limit/kernel/admit.lua"],
    ),
    (
        "rate_limit_give_back",
        &[RATE_PRELUDE, "src/policy/rate_limit/kernel/give_back.lua"],
    ),
    (
        "breaker_admit",
        &[BREAKER_PRELUDE, "src/policy/breaker/kernel/admit.lua"],
    ),
    (
        "breaker_observe",
        &[BREAKER_PRELUDE, "src/policy/breaker/kernel/observe.lua"],
    ),
    (
        "breaker_settle",
        &[BREAKER_PRELUDE, "src/policy/breaker/kernel/settle.lua"],
    ),
    (
        "breaker_force",
        &[BREAKER_PRELUDE, "src/policy/breaker/kernel/force.lua"],
    ),
    ("breaker_status", &["src/policy/breaker/kernel/status.lua"]),
];

/// What the registry's scripts are sent after: the layout of an identity's entry.
const REGISTRY_PRELUDE: &str = "lua/registry_prelude.lua";

/// What the breaker's scripts but its status read are sent after.
const BREAKER_PRELUDE: &str = "src/policy/breaker/kernel/prelude.lua";

/// What the rate limit's scripts are sent after.
const RATE_PRELUDE: &str = "src/policy/rate_limit/kernel/prelude.lua";

/// The source of caracal's Lua script `name` (`"bulkhead_lease"`), as the coordinator sends it
/// (a breaker script after its prelude).
///
/// # Panics
/// When there is no such script.
pub fn script_source(name: &str) -> String {
    let (_, files) = SCRIPTS
        .iter()
        .find(|(script, _)| *script == name)
        .unwrap_or_else(|| panic!("no script {name}"));
    files.iter().map(|file| caracal_file(file)).collect()
}

/// The text of `caracal/<path>`.
fn caracal_file(path: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../caracal")
        .join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn all_scripts() -> Vec<String> {
    SCRIPTS
        .iter()
        .map(|(name, _)| script_source(name))
        .collect()
}

/// The scripts a coordinator runs in the background whatever the calls: the identity
/// registry's reports and the fleet overrides' checks.
pub fn background_scripts() -> Vec<String> {
    ["registry_report", "overrides_read"]
        .map(script_source)
        .to_vec()
}
