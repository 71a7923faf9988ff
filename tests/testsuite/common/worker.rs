//! Worker processes: one OS process of a fleet each, configured like a real service.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

const WORKER: &str = env!("CARGO_BIN_EXE_caracal-worker");

/// The worker binary: `$CARACAL_TEST_WORKER` when set (a copy of this build's, which a build
/// of another checkout sharing the target directory cannot replace mid-run), else cargo's.
pub(crate) fn worker_binary() -> String {
    std::env::var("CARACAL_TEST_WORKER").unwrap_or_else(|_| WORKER.to_owned())
}

/// The arguments of a ledger scenario's worker (`ledger-hold`, `ledger-take`): its scope, the
/// ledger it records in (`ledger_url`, under `name`) and `shared`, then each worker's own.
pub(crate) fn ledger_args<'a>(
    scope: &'a str,
    ledger_url: &'a str,
    name: &'a str,
    shared: &'a [&'a str],
) -> impl Fn(&[&str]) -> Vec<String> + 'a {
    move |own| {
        [
            format!("scope={scope}"),
            format!("ledger={ledger_url}"),
            format!("ledger_name={name}"),
        ]
        .into_iter()
        .chain(shared.iter().chain(own).map(|&arg| arg.to_owned()))
        .collect()
    }
}

/// A worker process and the lines it printed.
pub(crate) struct Worker {
    pub(crate) child: Child,
    stdin: ChildStdin,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Worker {
    pub(crate) fn spawn(redis_url: &str, namespace: &str, scenario: &str, args: &[String]) -> Self {
        Worker::spawn_with_env(redis_url, namespace, scenario, args, &[])
    }

    /// [`spawn`](Self::spawn), with `env` added to its environment (`CARACAL_CONFIG`, …).
    pub(crate) fn spawn_with_env(
        redis_url: &str,
        namespace: &str,
        scenario: &str,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Self {
        let mut child = Command::new(worker_binary())
            .arg(scenario)
            .args(args)
            .env("CARACAL_REDIS_URL", redis_url)
            .env("CARACAL_NAMESPACE", namespace)
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the worker");
        let stdin = child.stdin.take().expect("worker stdin");
        let stdout = child.stdout.take().expect("worker stdout");
        let (send, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        Worker {
            child,
            stdin,
            lines,
        }
    }

    /// Starts the scenario of a worker spawned with `start=on-go`.
    pub(crate) fn go(&mut self) {
        self.send("go");
    }

    /// Writes `line` to the worker's stdin (the commands of the `scrapes` scenario).
    pub(crate) fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}")
            .and_then(|()| self.stdin.flush())
            .expect("write to the worker");
    }

    /// Sends the worker a signal (`"STOP"`, `"CONT"`, `"KILL"`).
    pub(crate) fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {}", self.child.id());
    }

    /// The next line starting with `prefix`, within `timeout`.
    pub(crate) fn expect_line(&self, prefix: &str, timeout: Duration) -> String {
        let mut lines = self.lines_through(prefix, timeout);
        lines.pop().expect("the line looked for ends the lines")
    }

    /// Every line printed up to and including the next one starting with `prefix`, within
    /// `timeout`.
    pub(crate) fn lines_through(&self, prefix: &str, timeout: Duration) -> Vec<String> {
        let deadline = Instant::now() + timeout;
        let mut lines = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let found = line.starts_with(prefix);
                    lines.push(line);
                    if found {
                        return lines;
                    }
                }
                Err(_) => panic!("worker printed no `{prefix}` line within {timeout:?}"),
            }
        }
    }

    /// The next line the worker printed, if one comes within `timeout`.
    pub(crate) fn next_line(&self, timeout: Duration) -> Option<String> {
        self.lines.recv_timeout(timeout).ok()
    }

    pub(crate) fn field(line: &str, name: &str) -> u64 {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name}= in {line:?}"))
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
