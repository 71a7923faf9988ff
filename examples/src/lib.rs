//! Runnable examples live beside this crate as `[[example]]` targets. What more than one of
//! them needs lives here: the benchmarks' JSON lines, their reading of Redis' `INFO`, their
//! `--seconds` argument, and the worker processes of the fleet benchmarks.

use std::error::Error;
use std::ffi::OsStr;
use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

/// The Redis the examples use: `CARACAL_REDIS_URL`, else `redis://127.0.0.1:6379`.
pub fn redis_url() -> String {
    std::env::var("CARACAL_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// Prints one JSON line: a figure name and its numeric fields. A whole number is written
/// without decimals, anything else with three; a value that is not finite (a ratio to a
/// baseline that could not be measured) is `null`.
pub fn emit(figure: &str, fields: &[(&str, f64)]) {
    emit_labelled(figure, &[], fields);
}

/// Prints one JSON line: a figure name and text fields (say, why a part was skipped).
pub fn emit_text(figure: &str, fields: &[(&str, &str)]) {
    emit_labelled(figure, fields, &[]);
}

/// Prints one JSON line: a figure name, its text fields (labels: which run a line belongs to),
/// then its numeric fields, written as [`emit`] writes them.
pub fn emit_labelled(figure: &str, labels: &[(&str, &str)], fields: &[(&str, f64)]) {
    let labels = labels
        .iter()
        .map(|&(name, value)| format!("\"{name}\":{}", json_string(value)));
    let fields = fields
        .iter()
        .map(|&(name, value)| format!("\"{name}\":{}", json_number(value)));
    let all: Vec<String> = labels.chain(fields).collect();
    println!("{{\"figure\":\"{figure}\",{}}}", all.join(","));
}

fn json_number(value: f64) -> String {
    if !value.is_finite() {
        "null".to_owned()
    } else if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{value:.0}")
    } else {
        format!("{value:.3}")
    }
}

fn json_string(text: &str) -> String {
    let mut quoted = String::with_capacity(text.len() + 2);
    quoted.push('"');
    for c in text.chars() {
        match c {
            '"' => quoted.push_str("\\\""),
            '\\' => quoted.push_str("\\\\"),
            '\n' => quoted.push_str("\\n"),
            c if u32::from(c) < 0x20 => quoted.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => quoted.push(c),
        }
    }
    quoted.push('"');
    quoted
}

/// `(command, calls, usec)` of every line of an `INFO commandstats` reply.
///
/// Redis counts a command a script runs on that command's own line as well as inside the
/// script's time: summing every line counts it twice.
pub fn commandstats(info: &str) -> impl Iterator<Item = (&str, f64, f64)> {
    info.lines().filter_map(|line| {
        let (command, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
        let field = |name: &str| {
            stats
                .split(',')
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        Some((command, field("calls"), field("usec")))
    })
}

/// A copy of the running example started as a worker process, talking over its stdio: one
/// command a line on its stdin, one answer a line on its stdout (its stderr is the parent's).
/// Killed if dropped, so a parent that fails leaves no worker behind.
pub struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
}

impl Worker {
    /// Starts this executable with `args` (the example's worker mode is its first argument).
    pub fn start<I, S>(args: I) -> std::io::Result<Worker>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut child = tokio::process::Command::new(std::env::current_exe()?)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        Ok(Worker {
            child,
            stdin,
            stdout: BufReader::new(stdout).lines(),
        })
    }

    /// Writes `command` and a newline to the worker's stdin.
    pub async fn send(&mut self, command: &str) -> std::io::Result<()> {
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await?;
        self.stdin.flush().await
    }

    /// The worker's next line; an error saying how it exited if it closed its stdout instead.
    pub async fn line(&mut self) -> Result<String, Box<dyn Error>> {
        match self.stdout.next_line().await? {
            Some(line) => Ok(line),
            None => Err(format!("a worker exited: {}", self.child.wait().await?).into()),
        }
    }

    /// Closes the worker's stdin (its signal to stop) and waits until it exits, successfully.
    pub async fn finish(self) -> Result<(), Box<dyn Error>> {
        // Its stdout stays open until it has exited: a worker's last words must not fail.
        let Worker {
            mut child,
            stdin,
            stdout: _stdout,
        } = self;
        drop(stdin);
        let status = child.wait().await?;
        if !status.success() {
            return Err(format!("a worker exited: {status}").into());
        }
        Ok(())
    }
}

/// Workers of the same example that say `ready` once connected, and answer each command with
/// one line.
pub struct Fleet {
    workers: Vec<Worker>,
}

impl Fleet {
    /// Starts `processes` workers with `args` and waits until every one has said `ready`.
    pub async fn start<S: AsRef<OsStr>>(
        processes: usize,
        args: &[S],
    ) -> Result<Fleet, Box<dyn Error>> {
        let workers = (0..processes)
            .map(|_| Worker::start(args))
            .collect::<Result<_, _>>()?;
        let mut fleet = Fleet { workers };
        for line in fleet.answers().await? {
            if line != "ready" {
                return Err(format!("a worker said {line:?} instead of ready").into());
            }
        }
        Ok(fleet)
    }

    /// Sends worker `i` the `i`-th of `commands`.
    pub async fn send_each<I>(&mut self, commands: I) -> Result<(), Box<dyn Error>>
    where
        I: IntoIterator<Item = String>,
    {
        for (worker, command) in self.workers.iter_mut().zip(commands) {
            worker.send(&command).await?;
        }
        Ok(())
    }

    /// Sends every worker `command`.
    pub async fn send_all(&mut self, command: &str) -> Result<(), Box<dyn Error>> {
        let count = self.workers.len();
        self.send_each(std::iter::repeat_n(command.to_owned(), count))
            .await
    }

    /// One line from every worker, in order.
    pub async fn answers(&mut self) -> Result<Vec<String>, Box<dyn Error>> {
        let mut lines = Vec::with_capacity(self.workers.len());
        for worker in &mut self.workers {
            lines.push(worker.line().await?);
        }
        Ok(lines)
    }

    /// Closes every worker's stdin and waits for it to shut down cleanly.
    pub async fn finish(self) -> Result<(), Box<dyn Error>> {
        for worker in self.workers {
            worker.finish().await?;
        }
        Ok(())
    }
}

/// The worker's side of a [`Fleet`]: connects to the Redis at `url` in `namespace`, installs
/// the coordinator, says `ready`, and hands back the coordinator and the commands to come.
pub async fn serve_fleet(
    url: String,
    namespace: &str,
) -> Result<(caracal::Coordinator, Lines<BufReader<tokio::io::Stdin>>), Box<dyn Error>> {
    let coordinator = caracal::Coordinator::redis(url)
        .namespace(namespace)
        .connect()
        .await?;
    caracal::install(coordinator.clone())?;
    println!("ready");
    Ok((coordinator, BufReader::new(tokio::io::stdin()).lines()))
}

/// Reads `[--seconds N]` (N positive), `default` without it; the rest of `args` is the
/// example's own.
pub fn parse_seconds(args: &[String], default: u64) -> Result<u64, Box<dyn Error>> {
    match args {
        [] => Ok(default),
        [flag, value] if flag == "--seconds" => match value.parse() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("--seconds {value}: want a positive whole number").into()),
        },
        _ => Err(format!("unknown arguments {args:?}").into()),
    }
}
