//! The command line, as clap reads it.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// See and steer a fleet's caracal bulkheads, circuit breakers and rate limits.
///
/// Connects to the Redis the fleet coordinates through: --url, or the environment variable
/// CARACAL_REDIS_URL (a comma-separated list means Redis Cluster seeds); in the namespace
/// --namespace, or CARACAL_NAMESPACE, or `default`.
#[derive(Debug, Parser)]
// A missing subcommand is a usage error (one line, exit 2), not a help page.
#[command(
    name = "caracal",
    version,
    max_term_width = 100,
    subcommand_required = true,
    arg_required_else_help = false
)]
pub(crate) struct Cli {
    /// The Redis URL (`redis://host:6379`, `rediss://…`); comma-separated for cluster seeds.
    /// Default: $CARACAL_REDIS_URL.
    #[arg(long, global = true, value_name = "URL")]
    pub(crate) url: Option<String>,

    /// The namespace the fleet's policies live in. Default: $CARACAL_NAMESPACE, then `default`.
    #[arg(long, global = true, value_name = "NS")]
    pub(crate) namespace: Option<String>,

    /// Print JSON instead of text: one object per line.
    #[arg(long, global = true)]
    pub(crate) json: bool,

    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Every identity in use in the namespace, with its state now.
    Status,
    /// The status table, redrawn on every change (and every second), until Ctrl-C.
    Watch,
    /// A live table, redrawn every --interval until Ctrl-C: per identity the fleet's
    /// admitted/s, rejected/s (by reason), in flight / limit, breaker state and failure rate.
    /// The rates are each process's over the few seconds between two of its reports (5 s).
    Top {
        /// How often to redraw, with a unit (`1s`, `500ms`; at least 100ms).
        #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = duration)]
        interval: Duration,
    },
    /// Every process reporting to the namespace: id, host, pid, caracal version, last report
    /// and how many identities it uses. A process reports every few seconds while it makes
    /// calls, and is listed until 15 s pass without a report.
    Processes,
    /// Check the server as the fleet would use it: its kind and version, role, cluster slots,
    /// atomic scripts that can read TIME, PEXPIREAT … GT, pub/sub, the ACL grant, eviction,
    /// persistence, admin commands, the round trip. One line per check (one JSON object with
    /// --json); exit 0 when caracal can run there, 1 naming what cannot.
    Doctor,
    /// Force a circuit breaker open or closed, or reset it, in every process.
    #[command(subcommand, subcommand_required = true, arg_required_else_help = false)]
    Breaker(BreakerCommand),
    /// Read the values in force; set or remove fleet-wide overrides.
    #[command(subcommand, subcommand_required = true, arg_required_else_help = false)]
    Config(ConfigCommand),
    /// Print the shell completion script for SHELL (bash, zsh, fish, elvish, powershell);
    /// for bash: `caracal completions bash > /etc/bash_completion.d/caracal`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum BreakerCommand {
    /// Every process rejects calls with `circuit_open`, without running them, until --for
    /// elapses (then half-open at the next call) or a reset.
    Open {
        #[command(flatten)]
        breaker: BreakerTarget,
        #[command(flatten)]
        lasts: Lasts,
        #[command(flatten)]
        steer: Steer,
    },
    /// Every process admits every call and records nothing, until --for elapses (then
    /// closed) or a reset.
    Close {
        #[command(flatten)]
        breaker: BreakerTarget,
        #[command(flatten)]
        lasts: Lasts,
        #[command(flatten)]
        steer: Steer,
    },
    /// Closed, with an empty window and a new generation.
    Reset {
        #[command(flatten)]
        breaker: BreakerTarget,
        #[command(flatten)]
        steer: Steer,
    },
}

/// Which breaker.
#[derive(Debug, Args)]
pub(crate) struct BreakerTarget {
    /// The breaker's name.
    #[arg(value_name = "NAME")]
    pub(crate) name: String,
    /// Its operation. Default: NAME.
    #[arg(long, value_name = "OP")]
    pub(crate) operation: Option<String>,
    /// Its scope. Default: `global`.
    #[arg(long, value_name = "S")]
    pub(crate) scope: Option<String>,
}

/// How long a forced state lasts.
#[derive(Debug, Args)]
pub(crate) struct Lasts {
    /// How long, with a unit (`30s`, `5m`, `1h`). Default: until a reset.
    #[arg(long = "for", value_name = "DURATION", value_parser = duration)]
    pub(crate) lasts: Option<Duration>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum ConfigCommand {
    /// The values in force, `setting = value (source)`: of every identity in use, and every
    /// fleet override. When processes disagree on a setting (drift: a process's own Config
    /// file gives another value), each value in force with the ids of the processes using it
    /// (`--json`: whenever a process uses it). With KEY (`bulkhead.partner-api.limit`, or `bulkhead.partner-api`),
    /// only those.
    Get {
        /// `<kind>.<name>.<key>` or `<kind>.<name>`.
        #[arg(value_name = "KEY")]
        key: Option<String>,
    },
    /// Set a fleet-wide override: every connected process applies it within a second, to
    /// calls admitted from then on.
    Set {
        /// `<kind>.<name>.<key>`, like `bulkhead.partner-api.limit`.
        #[arg(value_name = "KEY")]
        key: String,
        /// The value, as the attribute's argument takes it (`40`, `0.3`, `10s`).
        #[arg(value_name = "VALUE", allow_hyphen_values = true)]
        value: String,
        #[command(flatten)]
        steer: Steer,
    },
    /// Remove a fleet-wide override.
    Unset {
        /// `<kind>.<name>.<key>`.
        #[arg(value_name = "KEY")]
        key: String,
        #[command(flatten)]
        steer: Steer,
    },
}

/// What every command that changes the fleet takes.
#[derive(Debug, Args)]
pub(crate) struct Steer {
    /// Do it even though no process uses what it names, or the sites that do would ignore
    /// it (without it, that exits 3 naming what is in use).
    #[arg(long)]
    pub(crate) force: bool,
    /// Why: stored with the command, shown by `status` (a forced breaker) and `config get`
    /// (an override), and carried by the events of every process that follows it.
    #[arg(long, value_name = "TEXT")]
    pub(crate) reason: Option<String>,
    /// Who gives the command, stored with it. Default: $USER@hostname.
    #[arg(long, value_name = "TEXT")]
    pub(crate) who: Option<String>,
}

/// A duration with a unit, as humantime reads it.
fn duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|error| format!("{error} (write it like 30s, 5m, 1h)"))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("caracal").chain(args.iter().copied()))
    }

    #[test]
    fn breaker_arguments_and_defaults() {
        let cli = parse(&["breaker", "open", "partner-api", "--for", "1s"]).expect("parses");
        let Command::Breaker(BreakerCommand::Open { breaker, lasts, .. }) = cli.command else {
            panic!("{cli:?}");
        };
        assert_eq!(breaker.name, "partner-api");
        assert_eq!((breaker.operation, breaker.scope), (None, None));
        assert_eq!(lasts.lasts, Some(Duration::from_secs(1)));
        // Global options go before or after the subcommand.
        let cli = parse(&["breaker", "reset", "x", "--url", "redis://h:1"]).expect("parses");
        assert_eq!(cli.url.as_deref(), Some("redis://h:1"));
    }

    #[test]
    fn usage_errors() {
        for args in [
            &["nonsense"][..],
            &["breaker", "open"],
            &["breaker", "open", "x", "--for", "10"],
            &["breaker", "open", "x", "--for", "abc"],
            &["breaker", "reset", "x", "--for", "1s"],
            &["config", "set", "bulkhead.x.limit"],
            &[],
        ] {
            let error = parse(args).expect_err("a usage error");
            assert_eq!(error.exit_code(), 2, "{args:?}: {error}");
        }
    }

    #[test]
    fn who_and_why_go_with_every_command_that_steers() {
        let cli = parse(&[
            "breaker",
            "reset",
            "x",
            "--reason",
            "all clear",
            "--who",
            "bob",
        ])
        .expect("parses");
        let Command::Breaker(BreakerCommand::Reset { steer, .. }) = cli.command else {
            panic!("{cli:?}");
        };
        assert_eq!(
            (steer.reason.as_deref(), steer.who.as_deref()),
            (Some("all clear"), Some("bob"))
        );
        let cli =
            parse(&["config", "unset", "bulkhead.x.limit", "--reason", "over"]).expect("parses");
        assert!(matches!(
            cli.command,
            Command::Config(ConfigCommand::Unset { steer, .. })
                if steer.reason.as_deref() == Some("over") && steer.who.is_none()
        ));
    }

    #[test]
    fn a_value_may_start_with_a_hyphen() {
        let cli = parse(&["config", "set", "bulkhead.x.limit", "-1"]).expect("parses");
        assert!(matches!(
            cli.command,
            Command::Config(ConfigCommand::Set { value, .. }) if value == "-1"
        ));
    }
}
