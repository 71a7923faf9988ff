//! The `caracal` command as a process: exit statuses, one-line errors, and what each command
//! prints. The fleet's side (processes following what the command changed) is in
//! `fleet_ops`.
//!
//! The command is caracal-cli's, built as this package's `caracal-command` binary (a
//! package's integration tests can only name its own binaries).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use caracal::circuit_breaker;
use caracal_tests::wait::wait_until;
use caracal_tests::{RedisCluster, RedisServer};

use crate::common::{PATIENCE, TestError, unique};

/// The command under test.
const CARACAL: &str = env!("CARGO_BIN_EXE_caracal-command");

/// The command: `$CARACAL_TEST_COMMAND` when set (a copy of this build's, which a build of
/// another checkout sharing the target directory cannot replace mid-run), else cargo's.
pub(crate) fn command_binary() -> String {
    std::env::var("CARACAL_TEST_COMMAND").unwrap_or_else(|_| CARACAL.to_owned())
}

/// How a run of the command ended.
#[derive(Debug)]
pub(crate) struct Ran {
    pub(crate) status: i32,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Ran {
    /// Asserts it succeeded, silently on stderr; its stdout.
    pub(crate) fn ok(self) -> String {
        assert_eq!((self.status, self.stderr.as_str()), (0, ""), "{self:?}");
        self.stdout
    }

    /// Asserts it exited with `status` and said why in exactly one line on stderr (nothing
    /// on stdout); that line.
    pub(crate) fn failed(self, status: i32) -> String {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(self.stdout, "", "{self:?}");
        assert!(
            self.stderr.starts_with("caracal: ")
                && self.stderr.ends_with('\n')
                && self.stderr.lines().count() == 1,
            "not one `caracal: …` line on stderr: {self:?}"
        );
        self.stderr.trim_end().to_owned()
    }
}

/// Runs the command with `args` and `env` (and none of the `CARACAL_*` variables this
/// process may have), within [`PATIENCE`].
pub(crate) fn run(args: &[&str], env: &[(&str, &str)]) -> Ran {
    let mut command = Command::new(command_binary());
    command
        .args(args)
        .env_remove("CARACAL_REDIS_URL")
        .env_remove("CARACAL_NAMESPACE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.spawn().expect("spawn caracal");
    // Read both pipes while it runs, so a full pipe never blocks it.
    let pipe = |reader: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut reader) = reader {
                let _ = reader.read_to_string(&mut text);
            }
            text
        })
    };
    let stdout = pipe(child.stdout.take().map(|s| Box::new(s) as _));
    let stderr = pipe(child.stderr.take().map(|s| Box::new(s) as _));
    let deadline = Instant::now() + PATIENCE;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for caracal") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("caracal {args:?} did not end within {PATIENCE:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Ran {
        status: status
            .code()
            .expect("caracal exited, not killed by a signal"),
        stdout: stdout.join().expect("stdout"),
        stderr: stderr.join().expect("stderr"),
    }
}

/// Runs `caracal --url <url> --namespace <namespace> <args>`.
pub(crate) fn caracal(url: &str, namespace: &str, args: &[&str]) -> Ran {
    let mut all = vec!["--url", url, "--namespace", namespace];
    all.extend_from_slice(args);
    run(&all, &[])
}

/// `config get`'s lines without who set each override (` by alice@ops at …: why`).
pub(crate) fn settings(output: &str) -> String {
    output
        .lines()
        .map(|line| line.split_once(" by ").map_or(line, |(setting, _)| setting))
        .map(|line| format!("{line}\n"))
        .collect()
}

/// The generation in a `breaker` command's output, `… (generation N)`.
pub(crate) fn generation(output: &str) -> u64 {
    output
        .trim_end()
        .strip_suffix(')')
        .and_then(|rest| rest.rsplit_once("(generation "))
        .and_then(|(_, n)| n.parse().ok())
        .unwrap_or_else(|| panic!("no generation in {output:?}"))
}

/// A port nothing listens on.
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

#[test]
fn usage_errors_exit_2_with_one_line() {
    // With a URL that cannot be reached: anything that got past the arguments would exit 1.
    let url = format!("redis://127.0.0.1:{}", closed_port());
    for args in [
        &["nonsense"][..],
        &[],
        &["breaker"],
        &["breaker", "open"],
        &["breaker", "close", "--scope", "eu"],
        &["breaker", "open", "partner-api", "--for", "10"],
        &["breaker", "open", "partner-api", "--for", "abc"],
        &["breaker", "close", "partner-api", "--for", "1 fortnight"],
        &["breaker", "reset", "partner-api", "--for", "1s"],
        &["status", "--jsn"],
        &["config", "set", "bulkhead.partner-api.limit"],
        &["config", "frobnicate"],
    ] {
        let mut all = vec!["--url", url.as_str()];
        all.extend_from_slice(args);
        let line = run(&all, &[]).failed(2);
        assert!(!line.contains("cannot connect"), "{args:?}: {line}");
    }
    // Where to connect is part of the usage.
    let line = run(&["status"], &[]).failed(2);
    assert!(line.contains("CARACAL_REDIS_URL"), "{line}");
    let line = run(&["status"], &[("CARACAL_REDIS_URL", " ")]).failed(2);
    assert!(line.contains("--url"), "{line}");
    // The tip clap has is kept, on the same line.
    let line = run(&["--url", &url, "stauts"], &[]).failed(2);
    assert!(line.contains("'status'"), "{line}");
    // Help and the version are not errors.
    let help = run(&["--help"], &[]).ok();
    assert!(help.contains("Usage: caracal"), "{help}");
    let help = run(&["breaker", "open", "--help"], &[]).ok();
    assert!(help.contains("--for <DURATION>"), "{help}");
    assert!(run(&["--version"], &[]).ok().starts_with("caracal "));
}

/// Completion scripts for every shell clap knows, without a Redis (nor a URL) to reach.
#[test]
fn completions_are_printed_for_every_shell() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script = run(&["completions", shell], &[]).ok();
        for word in ["caracal", "breaker", "config", "status", "completions"] {
            assert!(script.contains(word), "{shell}: no `{word}` in\n{script}");
        }
    }
    run(&["completions", "tcsh"], &[]).failed(2);
}

#[test]
fn an_unreachable_redis_exits_1_with_one_line() {
    let url = format!("redis://127.0.0.1:{}", closed_port());
    for args in [
        &["status"][..],
        &["status", "--json"],
        &["watch"],
        &["breaker", "open", "partner-api", "--for", "1m"],
        &["breaker", "reset", "partner-api"],
        &["config", "get"],
        &["config", "set", "bulkhead.partner-api.limit", "40"],
    ] {
        let mut all = vec!["--url", url.as_str()];
        all.extend_from_slice(args);
        let line = run(&all, &[]).failed(1);
        assert!(
            line.contains("cannot connect") && line.contains(&url),
            "{args:?}: {line}"
        );
    }
    // The same from the environment; a password is never shown.
    let secret = format!("redis://ops:hunter2@127.0.0.1:{}", closed_port());
    let line = run(&["status"], &[("CARACAL_REDIS_URL", &secret)]).failed(1);
    assert!(
        line.contains("ops:***@") && !line.contains("hunter2"),
        "{line}"
    );
}

#[test]
fn what_the_library_rejects_exits_2_with_one_line() {
    let server = RedisServer::start();
    let (url, namespace) = (server.url(), unique("cli-rejects"));
    for (args, says) in [
        (
            &["config", "set", "bulkhead.partner-api.limt", "3"][..],
            "limt",
        ),
        (
            &["config", "set", "bulkhead.partner-api.limit", "0"],
            "limit",
        ),
        (
            &["config", "set", "bulkhead.partner-api.limit", "-1"],
            "limit",
        ),
        (
            &["config", "set", "circuit_breaker.partner-api.open", "soon"],
            "open",
        ),
        (
            &["config", "set", "bulkheads.partner-api.limit", "3"],
            "kind",
        ),
        (
            &["config", "set", "partner-api", "3"],
            "<kind>.<name>.<key>",
        ),
        (
            &["config", "set", "bulkhead.partner-api.scope", "eu"],
            "scope",
        ),
        (&["config", "unset", "rate_limit.search.speed"], "speed"),
        (
            &["breaker", "open", "partner-api", "--for", "0s"],
            "forced state",
        ),
        (&["breaker", "open", "partner-api", "--scope", " "], "scope"),
    ] {
        let line = caracal(&url, &namespace, args).failed(2);
        assert!(line.contains(says), "{args:?}: {line}");
    }
    assert_eq!(caracal(&url, &namespace, &["config", "get"]).ok(), "");
    // A blank namespace is the user's to fix too.
    caracal(&url, " ", &["status"]).failed(2);
}

#[test]
fn config_get_set_unset() {
    let server = RedisServer::start();
    let (url, namespace) = (server.url(), unique("cli-config"));
    let caracal = |args: &[&str]| caracal(&url, &namespace, args);
    assert_eq!(
        caracal(&["config", "set", "bulkhead.cli-x.limit", "40", "--force"]).ok(),
        "bulkhead.cli-x.limit = 40 (fleet): every process applies it within a second\n"
    );
    // Stored (and printed) as the library reads it.
    assert_eq!(
        caracal(&[
            "config",
            "set",
            "circuit_breaker.cli-x.open",
            "0.5s",
            "--force"
        ])
        .ok(),
        "circuit_breaker.cli-x.open = 500ms (fleet): every process applies it within a second\n"
    );
    assert_eq!(
        settings(&caracal(&["config", "get"]).ok()),
        "bulkhead.cli-x.limit = 40 (fleet)\ncircuit_breaker.cli-x.open = 500ms (fleet)\n"
    );
    assert_eq!(
        settings(&caracal(&["config", "get", "bulkhead.cli-x"]).ok()),
        "bulkhead.cli-x.limit = 40 (fleet)\n"
    );
    assert_eq!(
        settings(&caracal(&["config", "get", "circuit_breaker.cli-x.open"]).ok()),
        "circuit_breaker.cli-x.open = 500ms (fleet)\n"
    );
    // The environment names the Redis and the namespace just as well; another namespace
    // sees none of it.
    let env = [
        ("CARACAL_REDIS_URL", url.as_str()),
        ("CARACAL_NAMESPACE", namespace.as_str()),
    ];
    assert_eq!(
        settings(&run(&["config", "get", "bulkhead.cli-x.limit"], &env).ok()),
        "bulkhead.cli-x.limit = 40 (fleet)\n"
    );
    assert_eq!(
        run(&["config", "get"], &[("CARACAL_REDIS_URL", &url)]).ok(),
        ""
    );
    assert_eq!(
        caracal(&["config", "unset", "bulkhead.cli-x.limit", "--force"]).ok(),
        "bulkhead.cli-x.limit: fleet override removed\n"
    );
    assert_eq!(
        caracal(&["config", "unset", "bulkhead.cli-x.limit", "--force"]).ok(),
        "bulkhead.cli-x.limit: there was no fleet override\n"
    );
    assert_eq!(
        settings(&caracal(&["config", "get"]).ok()),
        "circuit_breaker.cli-x.open = 500ms (fleet)\n"
    );
}

#[test]
fn breaker_commands_print_the_change() {
    let server = RedisServer::start();
    let (url, namespace) = (server.url(), unique("cli-breaker-out"));
    let caracal = |args: &[&str]| caracal(&url, &namespace, args);
    let opened = caracal(&["breaker", "open", "cli-x", "--force"]).ok();
    assert!(
        opened.starts_with("cli-x: closed → forced_open (generation "),
        "{opened}"
    );
    let reset = caracal(&["breaker", "reset", "cli-x", "--force"]).ok();
    assert!(
        reset.starts_with("cli-x: forced_open → closed (generation "),
        "{reset}"
    );
    assert!(generation(&reset) > generation(&opened), "{opened}{reset}");
    // Off the default operation and scope, the output names them; that is another breaker.
    let closed = caracal(&[
        "breaker",
        "close",
        "cli-x",
        "--operation",
        "get",
        "--scope",
        "region:eu",
        "--for",
        "90s",
        "--force",
    ])
    .ok();
    assert!(
        closed.starts_with(
            "cli-x (operation get, scope region:eu): closed → forced_closed for 1m 30s (generation "
        ),
        "{closed}"
    );
    let reset = caracal(&[
        "breaker",
        "reset",
        "cli-x",
        "--scope",
        "region:eu",
        "--operation",
        "get",
        "--force",
    ])
    .ok();
    assert!(
        reset.starts_with("cli-x (operation get, scope region:eu): forced_closed → closed"),
        "{reset}"
    );
}

/// With no process using anything, every command that changes the fleet would change nothing
/// in use: exit 3, one line saying so; `--force` does it anyway.
#[test]
fn commands_on_what_no_process_uses_exit_3() {
    let server = RedisServer::start();
    let (url, namespace) = (server.url(), unique("cli-unused"));
    let caracal = |args: &[&str]| caracal(&url, &namespace, args);
    for (args, says) in [
        (
            &["breaker", "open", "cli-x", "--for", "1m"][..],
            "no process uses a circuit breaker named `cli-x` (no circuit breaker is in use",
        ),
        (
            &["breaker", "reset", "cli-x"],
            "no circuit breaker is in use",
        ),
        (
            &["config", "set", "bulkhead.cli-x.limit", "7"],
            "no process uses a bulkhead named `cli-x` (no bulkhead is in use",
        ),
        (
            &["config", "unset", "rate_limit.cli-x.rate"],
            "no rate limit is in use",
        ),
    ] {
        let line = caracal(args).failed(3);
        assert!(line.contains(says), "{args:?}: {line}");
        assert!(line.contains("--force"), "{args:?}: {line}");
    }
    // Nothing was done.
    assert_eq!(settings(&caracal(&["config", "get"]).ok()), "");
    caracal(&["config", "set", "bulkhead.cli-x.limit", "7", "--force"]).ok();
    assert_eq!(
        settings(&caracal(&["config", "get"]).ok()),
        "bulkhead.cli-x.limit = 7 (fleet)\n"
    );
}

/// `--json` is taken by every command that prints: one JSON object per line.
#[test]
fn json_on_every_command() {
    let server = RedisServer::start();
    let (url, namespace) = (server.url(), unique("cli-json"));
    let json = |args: &[&str]| -> Vec<serde_json::Value> {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        caracal(&url, &namespace, &all)
            .ok()
            .lines()
            .map(|line| serde_json::from_str(line).expect("a JSON object per line"))
            .collect()
    };
    let opened = json(&[
        "breaker", "open", "cli-x", "--scope", "eu", "--for", "2m", "--force",
    ]);
    assert_eq!(
        opened,
        [serde_json::json!({
            "kind": "circuit_breaker", "name": "cli-x", "operation": "cli-x", "scope": "eu",
            "from": "closed", "to": "forced_open", "generation": opened[0]["generation"],
            "for_ms": 120_000
        })]
    );
    assert!(opened[0]["generation"].is_u64(), "{opened:?}");
    assert_eq!(
        json(&[
            "config",
            "set",
            "circuit_breaker.cli-x.open",
            "0.5s",
            "--force"
        ]),
        [
            serde_json::json!({"setting": "circuit_breaker.cli-x.open", "value": "500ms", "source": "fleet"})
        ]
    );
    // `config get` adds who set it (without `--who`, this user) and when.
    let mut got = json(&["config", "get"]);
    let operator = got[0]
        .as_object_mut()
        .and_then(|object| object.remove("operator"))
        .unwrap_or_default();
    assert_eq!(
        got,
        [
            serde_json::json!({"setting": "circuit_breaker.cli-x.open", "value": "500ms", "source": "fleet"})
        ]
    );
    assert!(
        operator["who"]
            .as_str()
            .is_some_and(|who| who.contains('@'))
            && operator["reason"].is_null()
            && operator["at"].is_u64(),
        "{operator}"
    );
    assert_eq!(
        json(&["config", "unset", "circuit_breaker.cli-x.open", "--force"]),
        [serde_json::json!({"setting": "circuit_breaker.cli-x.open", "removed": true})]
    );
    // No process uses the breaker, but its forced state is listed (issue 27, item 4).
    let status = json(&["status"]);
    assert_eq!(
        status
            .iter()
            .map(|line| (&line["scope"], &line["in_use"], &line["state"]))
            .collect::<Vec<_>>(),
        [(
            &serde_json::json!("eu"),
            &serde_json::json!(false),
            &serde_json::json!("forced_open")
        )],
        "{status:?}"
    );
    assert_eq!(json(&["processes"]), Vec::<serde_json::Value>::new());
    // The flag goes after the command just as well.
    let reset = caracal(
        &url,
        &namespace,
        &[
            "breaker", "reset", "cli-x", "--scope", "eu", "--force", "--json",
        ],
    )
    .ok();
    let reset: serde_json::Value = serde_json::from_str(reset.trim_end()).expect("JSON");
    assert_eq!(
        (&reset["from"], &reset["to"], &reset["for_ms"]),
        (
            &serde_json::json!("forced_open"),
            &serde_json::json!("closed"),
            &serde_json::Value::Null
        )
    );
}

/// A comma-separated URL is a list of cluster seeds, as for `Coordinator::from_env`.
#[test]
fn a_comma_separated_url_is_a_cluster() {
    let cluster = RedisCluster::start(3);
    let seeds = cluster.seed_urls().join(",");
    let namespace = unique("cli-cluster");
    let caracal = |args: &[&str]| caracal(&seeds, &namespace, args);
    caracal(&["config", "set", "rate_limit.cli-x.rate", "2.5", "--force"]).ok();
    assert_eq!(
        settings(&caracal(&["config", "get"]).ok()),
        "rate_limit.cli-x.rate = 2.5 (fleet)\n"
    );
    let opened = caracal(&["breaker", "open", "cli-x", "--for", "1m", "--force"]).ok();
    assert!(
        opened.starts_with("cli-x: closed → forced_open for 1m (generation "),
        "{opened}"
    );
}

#[circuit_breaker(name = "cli-watch", scope = scope)]
async fn watched(scope: &str) -> Result<(), TestError> {
    Ok(())
}

/// `watch` on a pipe prints one snapshot after another: the breaker this process used, then
/// forced open by another `caracal`; Ctrl-C ends it with status 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_redraws_and_ends_on_ctrl_c() {
    let server = RedisServer::start();
    let (url, namespace, scope) = (server.url(), unique("cli-watch"), unique("scope"));
    let coordinator = caracal::Coordinator::redis(url.clone())
        .namespace(namespace.clone())
        .connect()
        .await
        .expect("connect");
    coordinator
        .scoped(watched(&scope))
        .await
        .expect("a closed breaker admits");

    let mut child = Command::new(command_binary())
        .args(["--url", &url, "--namespace", &namespace, "watch"])
        .env_remove("CARACAL_REDIS_URL")
        .env_remove("CARACAL_NAMESPACE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn caracal watch");
    let stdout = child.stdout.take().expect("stdout");
    let (send, lines) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if send.send(line).is_err() {
                break;
            }
        }
    });
    let seen = std::sync::Mutex::new(Vec::<String>::new());
    let wait_for = |what: &str, pattern: &dyn Fn(&str) -> bool| {
        wait_until(PATIENCE, what, || {
            let mut seen = seen.lock().expect("seen");
            seen.extend(lines.try_iter());
            seen.iter().any(|line| pattern(line))
        });
    };
    let row = |state: &'static str| {
        let scope = scope.clone();
        move |line: &str| {
            line.contains("cli-watch") && line.contains(&scope) && line.contains(state)
        }
    };
    let closed = row(" closed ");
    wait_for("a snapshot with the breaker closed", &closed);
    let first = seen.lock().expect("seen")[0].clone();
    assert!(
        first.starts_with(&format!("caracal watch: namespace `{namespace}`, ")),
        "{first}"
    );

    let opened = tokio::task::spawn_blocking({
        let (url, namespace, scope) = (url.clone(), namespace.clone(), scope.clone());
        move || {
            caracal(
                &url,
                &namespace,
                &["breaker", "open", "cli-watch", "--scope", &scope],
            )
        }
    })
    .await
    .expect("caracal breaker open");
    opened.ok();
    let forced = row("forced_open");
    wait_for("a snapshot with the breaker forced open", &forced);

    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill -INT");
    assert!(status.success());
    let deadline = Instant::now() + PATIENCE;
    let exited = loop {
        if let Some(status) = child.try_wait().expect("wait for watch") {
            break status;
        }
        assert!(Instant::now() < deadline, "watch still runs after Ctrl-C");
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr)
        .expect("read stderr");
    assert_eq!((exited.code(), stderr.as_str()), (Some(0), ""));
    coordinator.shutdown().await;
}

#[circuit_breaker(name = "cli-held", scope = scope)]
async fn held(scope: &str) -> Result<(), TestError> {
    Ok(())
}

/// Issue 27, item 4: `caracal breaker open NAME --scope S --force` on an identity no process
/// uses exited 0, but `status` (table and `--json`) never listed it: the operator could not
/// see the state they had just forced. Now it is listed with that state, marked unused (the
/// table's detail, `in_use: false`), through the command and the admin API alike, beside an
/// identity a process does use, marked in use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_breaker_forced_where_no_process_uses_it_is_listed_unused() {
    let server = RedisServer::start();
    let (url, namespace) = (server.url(), unique("cli-held"));
    let coordinator = caracal::Coordinator::redis(url.clone())
        .namespace(namespace.clone())
        .connect()
        .await
        .expect("connect");
    coordinator
        .scoped(held("used"))
        .await
        .expect("a closed breaker admits");
    let command = |args: &'static [&'static str]| {
        let (url, namespace) = (url.clone(), namespace.clone());
        tokio::task::spawn_blocking(move || caracal(&url, &namespace, args))
    };
    command(&["breaker", "open", "cli-held", "--scope", "idle", "--force"])
        .await
        .expect("caracal breaker open")
        .ok();
    // The identity in use shows once its process reported it (a moment after its call).
    let lines = wait_until_listed(&command, "used").await;
    let line = |scope: &str| {
        lines
            .iter()
            .find(|line| line["scope"] == scope)
            .unwrap_or_else(|| panic!("no {scope} in {lines:?}"))
            .clone()
    };
    let (idle, used) = (line("idle"), line("used"));
    assert_eq!(
        (&idle["in_use"], &idle["state"], &idle["name"]),
        (
            &serde_json::json!(false),
            &serde_json::json!("forced_open"),
            &serde_json::json!("cli-held")
        ),
        "{idle}"
    );
    assert_eq!(
        (&used["in_use"], &used["state"]),
        (&serde_json::json!(true), &serde_json::json!("closed")),
        "{used}"
    );
    let table = command(&["status"]).await.expect("caracal status").ok();
    let row = |scope: &str| {
        table
            .lines()
            .find(|row| row.split_whitespace().nth(3) == Some(scope))
            .unwrap_or_else(|| panic!("no {scope} row in\n{table}"))
            .to_owned()
    };
    assert!(
        row("idle").contains("forced_open") && row("idle").contains("not in use"),
        "{table}"
    );
    assert!(!row("used").contains("not in use"), "{table}");
    let status = coordinator.admin().status().await.expect("status");
    let listed: Vec<(&str, bool, String)> = status
        .iter()
        .map(|identity| {
            let [state, _] = identity.state.summary();
            (identity.scope.as_str(), identity.in_use, state)
        })
        .collect();
    assert_eq!(
        listed,
        [
            ("idle", false, "forced_open".to_owned()),
            ("used", true, "closed".to_owned())
        ]
    );
}

/// `status --json`'s lines once one lists `scope`, within [`PATIENCE`].
async fn wait_until_listed<F>(command: &F, scope: &str) -> Vec<serde_json::Value>
where
    F: Fn(&'static [&'static str]) -> tokio::task::JoinHandle<Ran>,
{
    let deadline = Instant::now() + PATIENCE;
    loop {
        let out = command(&["status", "--json"])
            .await
            .expect("caracal status --json")
            .ok();
        let lines: Vec<serde_json::Value> = out
            .lines()
            .map(|line| serde_json::from_str(line).expect("a JSON line"))
            .collect();
        if lines.iter().any(|line| line["scope"] == scope) {
            return lines;
        }
        assert!(Instant::now() < deadline, "{scope} never listed: {out}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
