//! The `caracal` command: a thin layer over [`caracal::admin`].
//!
//! ```text
//! caracal [--url URL] [--namespace NS] [--json] status
//! caracal [--url URL] [--namespace NS] [--json] watch
//! caracal [--url URL] [--namespace NS] breaker open  NAME [--operation OP] [--scope S] [--for DURATION]
//! caracal [--url URL] [--namespace NS] breaker close NAME [--operation OP] [--scope S] [--for DURATION]
//! caracal [--url URL] [--namespace NS] breaker reset NAME [--operation OP] [--scope S]
//! caracal [--url URL] [--namespace NS] config get [KEY] | config set KEY VALUE | config unset KEY
//! ```
//!
//! Every command that steers the fleet takes `--force`, `--reason TEXT` and `--who TEXT` (by
//! default `$USER@hostname`): who and why are stored with it (see [`caracal::admin::Operator`]).
//!
//! Exit status: 0 on success, 2 on a usage error (including a malformed `--for` duration,
//! and a setting, value, name or scope the library rejects as invalid), 1 when the
//! coordinator fails (Redis unreachable or refusing, missing permissions), 3 when a command
//! that changes the fleet would change nothing in use (no process uses the breaker or policy
//! it names, or the sites that do would ignore the value; `--force` does it anyway). Every error is one
//! line on stderr, `caracal: <message>`. The reference is the operations guide of the
//! `caracal` crate.
//!
//! The library exists so that a package can build this same command as a binary of its own
//! ([`run`] is all of `main`): caracal's integration suites do.

mod args;
mod render;

use std::ffi::OsString;
use std::fmt;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use caracal::admin::{
    Admin, BreakerCommand, BreakerId, IdentityStatus, Operator, Refusal, redacted_url,
};
use caracal::{Coordinator, RedisBuilder};
use clap::Parser;
use clap::error::ErrorKind;

use crate::args::{BreakerTarget, Cli, Command, ConfigCommand, Steer};

/// Runs the command with these arguments (the first is the program's name), printing its
/// output and errors; returns its exit status.
pub fn run<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(error) => return clap_error(&error),
    };
    // Needs no coordinator, nor a URL to reach one.
    if let Command::Completions { shell } = cli.command {
        return completions(shell);
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => return fail(&Failure::Coordinator(format!("cannot start: {error}"))),
    };
    match runtime.block_on(execute(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Quiet) => ExitCode::SUCCESS,
        Err(failure) => fail(&failure),
    }
}

/// Why the command failed.
#[derive(Debug)]
enum Failure {
    /// What was asked cannot be done as written: exit 2.
    Usage(String),
    /// The coordinator (or the terminal) failed: exit 1.
    Coordinator(String),
    /// No process uses what the command names, or would apply it: exit 3 (`--force` does it
    /// anyway).
    Refused(String),
    /// The reader of our output went away (`caracal status | head -1`): stop, quietly.
    Quiet,
}

impl Failure {
    fn code(&self) -> u8 {
        match self {
            Failure::Usage(_) => 2,
            Failure::Coordinator(_) => 1,
            Failure::Refused(_) => 3,
            Failure::Quiet => 0,
        }
    }

    /// A failure of a command on a connected coordinator: what the user gave that the
    /// library rejects (a setting, a value, a name, a scope) is theirs to fix, anything else
    /// is the coordinator's.
    fn of(error: &caracal::Error) -> Self {
        match error {
            caracal::Error::InvalidConfig { .. } | caracal::Error::InvalidScope { .. } => {
                Failure::Usage(one_line(error))
            }
            _ => Failure::Coordinator(one_line(error)),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Usage(message) | Failure::Coordinator(message) | Failure::Refused(message) => {
                f.write_str(message)
            }
            Failure::Quiet => Ok(()),
        }
    }
}

/// Prints `failure` as one line on stderr; its exit status.
fn fail(failure: &Failure) -> ExitCode {
    let _ = writeln!(
        std::io::stderr().lock(),
        "caracal: {}",
        single(&failure.to_string())
    );
    ExitCode::from(failure.code())
}

/// An error with its causes, on one line.
fn one_line(error: &(dyn std::error::Error + 'static)) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    single(&message)
}

/// `text` with every run of whitespace (newlines included) made one space.
fn single(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Help and the version go to stdout (exit 0); a usage error is one line on stderr: clap's
/// own first line, its tip if it has one, and where to read more (exit 2).
fn clap_error(error: &clap::Error) -> ExitCode {
    if matches!(
        error.kind(),
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion
    ) {
        let _ = write!(std::io::stdout().lock(), "{}", error.render());
        return ExitCode::SUCCESS;
    }
    let rendered = error.render().to_string();
    // The first paragraph is the error (a list of missing arguments continues it on the
    // lines below); a tip and the usage come in later paragraphs.
    let lines: Vec<&str> = rendered.lines().map(str::trim).collect();
    let first: Vec<&str> = lines
        .iter()
        .copied()
        .skip_while(|line| line.is_empty())
        .take_while(|line| !line.is_empty())
        .collect();
    let first = single(&first.join(" "));
    let mut message = first.strip_prefix("error: ").unwrap_or(&first).to_owned();
    if message.is_empty() {
        message = "invalid arguments".to_owned();
    }
    if let Some(tip) = lines.iter().find_map(|line| line.strip_prefix("tip: ")) {
        message.push_str(&format!(" ({tip})"));
    }
    match lines.iter().find_map(|line| line.strip_prefix("Usage: ")) {
        Some(usage) => message.push_str(&format!("; usage: {usage}")),
        None => message.push_str("; see 'caracal --help'"),
    }
    fail(&Failure::Usage(message))
}

/// Where to connect, from the options and the environment.
struct Target {
    urls: Vec<String>,
    namespace: String,
}

impl Target {
    fn of(cli: &Cli) -> Result<Self, Failure> {
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let Some(url) = cli.url.clone().or_else(|| env("CARACAL_REDIS_URL")) else {
            return Err(Failure::Usage(
                "no Redis to connect to: pass --url or set CARACAL_REDIS_URL".to_owned(),
            ));
        };
        // A Sentinel URL separates its sentinels with commas: one URL, not cluster seeds.
        let sentinel = ["redis-sentinel://", "rediss-sentinel://"]
            .iter()
            .any(|scheme| url.trim_start().starts_with(scheme));
        let urls: Vec<String> = if sentinel {
            vec![url.trim().to_owned()]
        } else {
            url.split(',').map(|u| u.trim().to_owned()).collect()
        };
        if urls.iter().any(String::is_empty) {
            return Err(Failure::Usage(format!(
                "the Redis URL `{}` lists an empty URL (a stray comma?)",
                redacted_url(&url)
            )));
        }
        let namespace = match &cli.namespace {
            Some(namespace) => namespace.clone(),
            None => env("CARACAL_NAMESPACE").unwrap_or_else(|| "default".to_owned()),
        };
        if namespace.trim().is_empty() {
            return Err(Failure::Usage("the namespace is blank".to_owned()));
        }
        Ok(Target { urls, namespace })
    }

    /// Connects as `Coordinator::from_env` would: one URL is a standalone server (or a
    /// Sentinel URL), several are cluster seeds. Any failure here is the coordinator's (exit 1): unreachable,
    /// refused credentials, missing permissions, a URL the client cannot use.
    async fn connect(&self) -> Result<Coordinator, Failure> {
        self.builder().connect().await.map_err(|error| {
            let urls: Vec<String> = self.urls.iter().map(|u| redacted_url(u)).collect();
            Failure::Coordinator(format!(
                "cannot connect to {} (namespace `{}`): {}",
                urls.join(","),
                self.namespace,
                one_line(&error)
            ))
        })
    }
}

impl Target {
    fn builder(&self) -> RedisBuilder {
        let builder = match &self.urls[..] {
            [url] => Coordinator::redis(url.clone()),
            seeds => Coordinator::redis_cluster(seeds.to_vec()),
        };
        builder.namespace(self.namespace.clone())
    }
}

/// `doctor` connects on its own: it reports what `connect` would refuse, check by check.
async fn doctor(target: &Target, json: bool) -> Result<(), Failure> {
    let checks = target.builder().doctor().await;
    print(&render::doctor(&checks, json))?;
    let failed: Vec<&str> = checks.iter().filter(|c| !c.ok).map(|c| c.check).collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(Failure::Coordinator(format!(
            "caracal cannot run as documented here: {} failed",
            failed.join(", ")
        )))
    }
}

async fn execute(cli: Cli) -> Result<(), Failure> {
    let target = Target::of(&cli)?;
    if let Command::Doctor = cli.command {
        return doctor(&target, cli.json).await;
    }
    let coordinator = target.connect().await?;
    let admin = coordinator.admin();
    let result = match cli.command {
        Command::Status => status(&admin, &target.namespace, cli.json).await,
        Command::Watch => watch(&admin, &target.namespace, cli.json).await,
        Command::Processes => processes(&admin, &target.namespace, cli.json).await,
        // Not faster than 10 times a second: each redraw reads the whole status.
        Command::Top { interval } => {
            let every = interval.max(Duration::from_millis(100));
            top(&admin, &target.namespace, cli.json, every).await
        }
        Command::Breaker(command) => breaker(&admin, command, cli.json).await,
        Command::Config(command) => config(&admin, command, cli.json).await,
        // Answered above, before connecting.
        Command::Doctor => doctor(&target, cli.json).await,
        Command::Completions { shell } => {
            completions(shell);
            Ok(())
        }
    };
    coordinator.shutdown().await;
    result
}

/// Prints the completion script of the command for `shell`.
fn completions(shell: clap_complete::Shell) -> ExitCode {
    use clap::CommandFactory;
    clap_complete::generate(
        shell,
        &mut Cli::command(),
        "caracal",
        &mut std::io::stdout(),
    );
    ExitCode::SUCCESS
}

/// Writes `text` to stdout.
fn print(text: &str) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|error| match error.kind() {
            std::io::ErrorKind::BrokenPipe => Failure::Quiet,
            _ => Failure::Coordinator(format!("cannot write the output: {error}")),
        })
}

async fn status(admin: &Admin, namespace: &str, json: bool) -> Result<(), Failure> {
    let identities = admin.status().await.map_err(|e| Failure::of(&e))?;
    if json {
        print(&render::json_lines(&identities))
    } else {
        print(&render::table(&identities, namespace))
    }
}

async fn processes(admin: &Admin, namespace: &str, json: bool) -> Result<(), Failure> {
    let processes = admin.processes().await.map_err(|e| Failure::of(&e))?;
    print(&render::processes(&processes, namespace, json))
}

/// How often `watch` redraws when nothing changed (occupancy moves without a change event).
const REDRAW_EVERY: Duration = Duration::from_secs(1);

async fn watch(admin: &Admin, namespace: &str, json: bool) -> Result<(), Failure> {
    let view = Live {
        command: "watch",
        json: render::json_lines,
        table: render::table,
        every: None,
    };
    live(admin, namespace, json, view).await
}

async fn top(admin: &Admin, namespace: &str, json: bool, every: Duration) -> Result<(), Failure> {
    let view = Live {
        command: "top",
        json: render::top_json_lines,
        table: render::top,
        every: Some(every),
    };
    live(admin, namespace, json, view).await
}

/// A view of the status redrawn until Ctrl-C: `watch` and `top`.
struct Live {
    command: &'static str,
    json: fn(&[IdentityStatus]) -> String,
    table: fn(&[IdentityStatus], &str) -> String,
    /// Redrawn this often; `None`: at every change an operator would see (and every second).
    every: Option<Duration>,
}

async fn live(admin: &Admin, namespace: &str, json: bool, view: Live) -> Result<(), Failure> {
    let terminal = std::io::stdout().is_terminal() && !json;
    // Listening from the start: an interrupt while the first frame is drawn ends the view
    // cleanly too.
    let mut interrupts = Interrupts::listen()?;
    let mut first = true;
    loop {
        let now = humantime::format_rfc3339_seconds(SystemTime::now());
        let body = match admin.status().await {
            Ok(identities) if json => (view.json)(&identities),
            Ok(identities) => (view.table)(&identities, namespace),
            Err(error) if json => render::json_line(&render::Unavailable {
                unavailable: one_line(&error),
            }),
            // A live view outlives a blip: say so in the snapshot, and try again.
            Err(error) => format!("unavailable: {}\n", one_line(&error)),
        };
        let heading = format!(
            "caracal {}: namespace `{namespace}`, {now} (Ctrl-C to stop)\n",
            view.command
        );
        let frame = if json {
            body
        } else if terminal {
            // Home, clear the screen, draw.
            format!("\x1b[H\x1b[2J{heading}\n{body}")
        } else if first {
            format!("{heading}{body}")
        } else {
            format!("\n{heading}{body}")
        };
        print(&frame)?;
        first = false;
        let next = async {
            match view.every {
                Some(every) => tokio::time::sleep(every).await,
                None => admin.changed(REDRAW_EVERY).await,
            }
        };
        tokio::select! {
            () = next => {}
            () = interrupts.next() => return Ok(()),
        }
    }
}

/// Ctrl-C (and, on Unix, SIGTERM): what ends a watch.
struct Interrupts {
    #[cfg(unix)]
    signals: [tokio::signal::unix::Signal; 2],
}

impl Interrupts {
    fn listen() -> Result<Self, Failure> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let listen = |kind| {
                signal(kind).map_err(|error| {
                    Failure::Coordinator(format!("cannot listen for Ctrl-C: {error}"))
                })
            };
            Ok(Interrupts {
                signals: [
                    listen(SignalKind::interrupt())?,
                    listen(SignalKind::terminate())?,
                ],
            })
        }
        #[cfg(not(unix))]
        Ok(Interrupts {})
    }

    async fn next(&mut self) {
        #[cfg(unix)]
        {
            let [interrupt, terminate] = &mut self.signals;
            tokio::select! {
                _ = interrupt.recv() => {}
                _ = terminate.recv() => {}
            }
        }
        #[cfg(not(unix))]
        {
            if tokio::signal::ctrl_c().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

fn breaker_id(target: &BreakerTarget) -> BreakerId {
    let mut id = BreakerId::new(target.name.clone());
    if let Some(operation) = &target.operation {
        id = id.operation(operation.clone());
    }
    if let Some(scope) = &target.scope {
        id = id.scope(scope.clone());
    }
    id
}

/// `partner-api`, or `partner-api (operation get, scope region:eu)` off the defaults.
fn breaker_label(target: &BreakerTarget) -> String {
    let mut qualifiers = Vec::new();
    if let Some(operation) = target.operation.as_ref().filter(|op| **op != target.name) {
        qualifiers.push(format!("operation {operation}"));
    }
    if let Some(scope) = target.scope.as_ref().filter(|scope| *scope != "global") {
        qualifiers.push(format!("scope {scope}"));
    }
    if qualifiers.is_empty() {
        target.name.clone()
    } else {
        format!("{} ({})", target.name, qualifiers.join(", "))
    }
}

/// Who gives the command, and why: `--who` (else `$USER@hostname`) and `--reason`.
fn operator(steer: &Steer) -> Operator {
    let operator = match &steer.who {
        Some(who) => Operator::new(who.clone()),
        None => Operator::from_env(),
    };
    match &steer.reason {
        Some(reason) => operator.with_reason(reason.clone()),
        None => operator,
    }
}

/// Exit 3 with `refusal`, unless it is forced or there is none.
fn unless_forced(refusal: Option<Refusal>, steer: &Steer) -> Result<(), Failure> {
    match refusal {
        Some(refusal) if !steer.force => Err(Failure::Refused(refusal.reason)),
        _ => Ok(()),
    }
}

async fn breaker(admin: &Admin, command: args::BreakerCommand, json: bool) -> Result<(), Failure> {
    let (target, command, lasts, steer) = match command {
        args::BreakerCommand::Open {
            breaker,
            lasts,
            steer,
        } => (
            breaker,
            BreakerCommand::Open { lasts: lasts.lasts },
            lasts.lasts,
            steer,
        ),
        args::BreakerCommand::Close {
            breaker,
            lasts,
            steer,
        } => (
            breaker,
            BreakerCommand::Close { lasts: lasts.lasts },
            lasts.lasts,
            steer,
        ),
        args::BreakerCommand::Reset { breaker, steer } => {
            (breaker, BreakerCommand::Reset, None, steer)
        }
    };
    let id = breaker_id(&target);
    if !steer.force {
        let refusal = admin
            .check_breaker(&id, command)
            .await
            .map_err(|e| Failure::of(&e))?;
        unless_forced(refusal, &steer)?;
    }
    let changed = admin
        .breaker_by(&id, command, &operator(&steer))
        .await
        .map_err(|e| Failure::of(&e))?;
    if json {
        return print(&render::json_line(&render::BreakerChanged {
            kind: "circuit_breaker",
            name: &target.name,
            operation: target.operation.as_deref().unwrap_or(&target.name),
            scope: target.scope.as_deref().unwrap_or("global"),
            from: changed.from.as_str(),
            to: changed.to.as_str(),
            generation: changed.generation,
            for_ms: lasts.map(|lasts| u64::try_from(lasts.as_millis()).unwrap_or(u64::MAX)),
        }));
    }
    let until = match lasts {
        Some(lasts) => format!(" for {}", humantime::format_duration(lasts)),
        None => String::new(),
    };
    print(&format!(
        "{}: {} → {}{until} (generation {})\n",
        breaker_label(&target),
        changed.from.as_str(),
        changed.to.as_str(),
        changed.generation
    ))
}

async fn config(admin: &Admin, command: ConfigCommand, json: bool) -> Result<(), Failure> {
    match command {
        ConfigCommand::Get { key } => {
            let values = admin
                .config(key.as_deref())
                .await
                .map_err(|e| Failure::of(&e))?;
            let mut out = String::new();
            for value in values {
                if json {
                    out.push_str(&render::json_line(&value));
                } else {
                    let by = value.operator.as_ref().map(render::by).unwrap_or_default();
                    let ignored = match value.ignored_by {
                        0 => String::new(),
                        1 => ", ignored by 1 process".to_owned(),
                        n => format!(", ignored by {n} processes"),
                    };
                    // Under drift, which processes use each value (all of them: `--json`).
                    let drift = match value.drift {
                        true => format!("; drift, used by {}", value.processes.join(", ")),
                        false => String::new(),
                    };
                    out.push_str(&format!(
                        "{} = {} ({}{ignored}{drift}){by}\n",
                        value.setting, value.value, value.source
                    ));
                }
            }
            print(&out)
        }
        ConfigCommand::Set { key, value, steer } => {
            if !steer.force {
                let refusal = admin
                    .check_override(&key, Some(&value))
                    .await
                    .map_err(|e| Failure::of(&e))?;
                unless_forced(refusal, &steer)?;
            }
            admin
                .set_override_by(&key, &value, &operator(&steer))
                .await
                .map_err(|e| Failure::of(&e))?;
            // The value as stored (`0.5s` reads back as `500ms`).
            let stored = admin
                .config(Some(&key))
                .await
                .ok()
                .and_then(|values| {
                    values
                        .into_iter()
                        .find(|v| v.setting == key && v.source == "fleet")
                })
                .map_or(value, |v| v.value);
            if json {
                return print(&render::json_line(&render::Value {
                    setting: &key,
                    value: &stored,
                    source: "fleet",
                }));
            }
            print(&format!(
                "{key} = {stored} (fleet): every process applies it within a second\n"
            ))
        }
        ConfigCommand::Unset { key, steer } => {
            if !steer.force {
                let refusal = admin
                    .check_override(&key, None)
                    .await
                    .map_err(|e| Failure::of(&e))?;
                unless_forced(refusal, &steer)?;
            }
            let removed = admin
                .unset_override_by(&key, &operator(&steer))
                .await
                .map_err(|e| Failure::of(&e))?;
            if json {
                return print(&render::json_line(&render::Removed {
                    setting: &key,
                    removed,
                }));
            }
            print(&if removed {
                format!("{key}: fleet override removed\n")
            } else {
                format!("{key}: there was no fleet override\n")
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_one_line() {
        assert_eq!(single("a\n  b\tc\n"), "a b c");
    }

    #[test]
    fn labels_name_operation_and_scope_off_the_defaults() {
        let target = |operation: Option<&str>, scope: Option<&str>| BreakerTarget {
            name: "api".to_owned(),
            operation: operation.map(str::to_owned),
            scope: scope.map(str::to_owned),
        };
        assert_eq!(breaker_label(&target(None, None)), "api");
        assert_eq!(breaker_label(&target(Some("api"), Some("global"))), "api");
        assert_eq!(
            breaker_label(&target(Some("get"), Some("eu"))),
            "api (operation get, scope eu)"
        );
    }
}
