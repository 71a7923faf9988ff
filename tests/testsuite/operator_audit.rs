//! The operator's audit trail: who forced a breaker or set an override, and why, as `caracal`
//! records it (`--reason`, `--who`, by default `$USER@hostname`), shown by `status` and
//! `config get` while it holds, and carried by the events of the processes that follow the
//! change. The commands are the real `caracal` binary; the process following them is this
//! one, through a coordinator of its own.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use caracal::admin::{BreakerCommand, BreakerId, Operator};
use caracal::{Coordinator, FailureKind, circuit_breaker};
use caracal_tests::{EventLog, RedisServer};
use serde_json::{Value, json};

use crate::cli::{Ran, run};
use crate::common::{PATIENCE, TestError, code, eventually, unique};

#[circuit_breaker(name = "audited", scope = scope)]
async fn audited(scope: &str) -> Result<(), TestError> {
    Ok(())
}

/// `caracal --url <url> --namespace <namespace> <args>` with `env`, off the runtime's threads.
async fn caracal(url: &str, namespace: &str, args: &[&str], env: &[(&str, &str)]) -> Ran {
    let all: Vec<String> = ["--url", url, "--namespace", namespace]
        .iter()
        .chain(args)
        .map(|arg| (*arg).to_owned())
        .collect();
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
        .collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = all.iter().map(String::as_str).collect();
        let env: Vec<(&str, &str)> = env.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        run(&args, &env)
    })
    .await
    .expect("the command ran")
}

/// Its JSON lines.
fn lines(output: &str) -> Vec<Value> {
    output
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON object per line"))
        .collect()
}

fn now_ms() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970");
    u64::try_from(since.as_millis()).expect("ms fit in u64")
}

/// `operator` is `{who, reason, at}`, `at` the server's time of the command: between the
/// moments before and after it on this machine's clock (the server runs on it).
fn assert_operator(operator: &Value, who: &str, reason: Option<&str>, between: (u64, u64)) {
    assert_eq!(
        (&operator["who"], &operator["reason"]),
        (&json!(who), &json!(reason)),
        "{operator}"
    );
    let at = operator["at"].as_u64().expect("`at` in ms");
    assert!(
        between.0 <= at + 1 && at <= between.1 + 1,
        "{at} not within {between:?}"
    );
    assert_eq!(operator.as_object().map(|o| o.len()), Some(3), "{operator}");
}

/// The state_changed events of this scope's `audited` breaker to `to`.
fn changes(log: &EventLog, scope: &str, to: &str) -> Vec<caracal_tests::CapturedEvent> {
    log.matching("circuit_breaker.state_changed", |f| {
        f.get("name").map(String::as_str) == Some("audited")
            && f.get("scope").map(String::as_str) == Some(scope)
            && f.get("to").map(String::as_str) == Some(to)
    })
}

/// `read` again every 50 ms until it finds something.
///
/// # Panics
/// After [`PATIENCE`], naming `what`.
async fn found<T, F: Future<Output = Option<T>>>(what: &str, mut read: impl FnMut() -> F) -> T {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Some(found) = read().await {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {PATIENCE:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The `status --json` line of this scope's `audited` breaker, once it is listed.
async fn breaker_status(url: &str, namespace: &str, scope: &str) -> Value {
    found("the breaker, listed", || async {
        let listed = lines(
            &caracal(url, namespace, &["--json", "status"], &[])
                .await
                .ok(),
        );
        listed
            .into_iter()
            .find(|line| line["name"] == "audited" && line["scope"] == scope)
    })
    .await
}

/// A breaker forced open with a reason shows who and why in `status` (JSON and table) and in
/// the `state_changed` event of the process using it, which learnt of it from the feed; the
/// reset that ends it is announced with its own operator and leaves `status` showing none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_breaker_shows_who_forced_it_and_why_until_a_reset() {
    let log = EventLog::global();
    let server = RedisServer::start();
    let (url, namespace, scope) = (server.url(), unique("audit"), unique("scope"));
    let coordinator = Coordinator::redis(url.clone())
        .namespace(namespace.clone())
        .connect()
        .await
        .expect("connect");
    assert_eq!(code(&coordinator.scoped(audited(&scope)).await), "ok");
    let before = now_ms();
    let open = [
        "breaker",
        "open",
        "audited",
        "--scope",
        &scope,
        "--reason",
        "partner incident 4711",
        "--who",
        "alice@ops",
    ];
    caracal(&url, &namespace, &open, &[]).await.ok();
    let after = now_ms();

    eventually("the forced open, announced here", || {
        !changes(log, &scope, "forced_open").is_empty()
    })
    .await;
    for event in changes(log, &scope, "forced_open") {
        assert_eq!(event.field("origin"), Some("operator"), "{event:?}");
        assert_eq!(
            (event.field("who"), event.field("reason")),
            (Some("alice@ops"), Some("partner incident 4711")),
            "{event:?}"
        );
    }
    let status = breaker_status(&url, &namespace, &scope).await;
    assert_eq!(status["state"], "forced_open", "{status}");
    assert_operator(
        &status["operator"],
        "alice@ops",
        Some("partner incident 4711"),
        (before, after),
    );
    let table = caracal(&url, &namespace, &["status"], &[]).await.ok();
    let row = table
        .lines()
        .find(|line| line.contains(&scope))
        .unwrap_or_else(|| panic!("no row for {scope}: {table}"));
    assert!(
        row.contains(", forced by alice@ops at ") && row.ends_with(": partner incident 4711"),
        "{row}"
    );

    let reset = ["breaker", "reset", "audited", "--scope", &scope];
    let env = [("USER", "bob"), ("HOSTNAME", "ops-2")];
    caracal(&url, &namespace, &reset, &env).await.ok();
    eventually("the reset, announced here", || {
        !changes(log, &scope, "closed").is_empty()
    })
    .await;
    let reset = changes(log, &scope, "closed").remove(0);
    assert_eq!(
        (reset.field("who"), reset.field("reason")),
        (Some("bob@ops-2"), None),
        "the default operator, and no reason: {reset:?}"
    );
    let status = breaker_status(&url, &namespace, &scope).await;
    assert_eq!(status["state"], "closed", "{status}");
    assert_eq!(status.get("operator"), None, "{status}");
    coordinator.shutdown().await;
}

/// A force for a time that has passed is over, though nothing moved the breaker on yet: no
/// operator is shown for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_force_that_ended_shows_no_operator() {
    let server = RedisServer::start();
    let coordinator = crate::common::redis(&server.url()).await;
    let scope = unique("scope");
    assert_eq!(code(&coordinator.scoped(audited(&scope)).await), "ok");
    let admin = coordinator.admin();
    let breaker = BreakerId::new("audited").scope(scope.clone());
    let lasts = Some(Duration::from_millis(1));
    let who = Operator::new("alice@ops");
    let open = admin.breaker_by(&breaker, BreakerCommand::Open { lasts }, &who);
    open.await.expect("forced open");
    let shown = found("the breaker, listed", || async {
        let listed = admin.status().await.expect("status");
        listed.into_iter().find(|identity| identity.scope == scope)
    })
    .await;
    assert_eq!(
        shown.state.get("state"),
        Some(&caracal::admin::StatusValue::Text("forced_open")),
        "still stored as forced open: no call moved it on"
    );
    assert_eq!(shown.operator, None, "{shown:?}");
    coordinator.shutdown().await;
}

/// An override set with a reason shows who and why in `config get` (JSON and text) and in the
/// `config.applied` event of the process applying it; an unset is applied with its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_shows_who_set_it_and_why() {
    let log = EventLog::global();
    let server = RedisServer::start();
    let (url, namespace) = (server.url(), unique("audit"));
    let coordinator = Coordinator::redis(url.clone())
        .namespace(namespace.clone())
        .connect()
        .await
        .expect("connect");
    // config.applied names no namespace: this test's operator is its own.
    let who = unique("carol");
    let setting = "bulkhead.audited.limit";
    let before = now_ms();
    let set = [
        "config",
        "set",
        setting,
        "7",
        "--force",
        "--reason",
        "slow down",
        "--who",
        &who,
    ];
    caracal(&url, &namespace, &set, &[]).await.ok();
    let after = now_ms();
    let applied = |reason: &'static str| {
        let who = who.clone();
        move || {
            log.count_where("config.applied", |f| {
                f.get("who") == Some(&who) && f.get("reason").map(String::as_str) == Some(reason)
            }) > 0
        }
    };
    eventually(
        "the override applied here, by its operator",
        applied("slow down"),
    )
    .await;

    let got = lines(
        &caracal(&url, &namespace, &["--json", "config", "get"], &[])
            .await
            .ok(),
    );
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        (&got[0]["setting"], &got[0]["value"], &got[0]["source"]),
        (&json!(setting), &json!("7"), &json!("fleet"))
    );
    assert_operator(
        &got[0]["operator"],
        &who,
        Some("slow down"),
        (before, after),
    );
    let text = caracal(&url, &namespace, &["config", "get"], &[])
        .await
        .ok();
    assert!(
        text.starts_with(&format!("{setting} = 7 (fleet) by {who} at "))
            && text.ends_with(": slow down\n"),
        "{text}"
    );

    let unset = [
        "config", "unset", setting, "--force", "--reason", "over", "--who", &who,
    ];
    caracal(&url, &namespace, &unset, &[]).await.ok();
    eventually("the unset applied here, by its operator", applied("over")).await;
    assert_eq!(
        caracal(&url, &namespace, &["config", "get"], &[])
            .await
            .ok(),
        ""
    );
    coordinator.shutdown().await;
}

/// Without `--who`, the operator is `$USER@hostname`; a later command without one (through
/// the library) replaces the record: no earlier operator is named for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_operator_is_user_at_host() {
    let server = RedisServer::start();
    let (url, namespace) = (server.url(), unique("audit"));
    let setting = "circuit_breaker.audited.open";
    let set = ["config", "set", setting, "2s", "--force"];
    let env = [("USER", "dave"), ("HOSTNAME", "bastion-1")];
    caracal(&url, &namespace, &set, &env).await.ok();
    let got = lines(
        &caracal(&url, &namespace, &["--json", "config", "get"], &[])
            .await
            .ok(),
    );
    assert_eq!(
        (&got[0]["operator"]["who"], &got[0]["operator"]["reason"]),
        (&json!("dave@bastion-1"), &Value::Null),
        "{got:?}"
    );
    let coordinator = Coordinator::redis(url.clone())
        .namespace(namespace.clone())
        .connect()
        .await
        .expect("connect");
    let admin = coordinator.admin();
    admin.set_override(setting, "3s").await.expect("set");
    let values = admin.config(Some(setting)).await.expect("config");
    assert_eq!(
        (values[0].value.as_str(), &values[0].operator),
        ("3s", &None)
    );
    coordinator.shutdown().await;
}

/// A record that does not read (written by hand) is a typed error of the command that reads
/// it, never a panic: the library's `CoordinatorUnavailable` (a malformed reply), the
/// command's exit 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_record_is_an_error() {
    let server = RedisServer::start();
    let (url, namespace) = (server.url(), unique("audit"));
    let setting = "bulkhead.audited.limit";
    let set = ["config", "set", setting, "7", "--force", "--who", "eve"];
    caracal(&url, &namespace, &set, &[]).await.ok();
    let mut redis = server.connection();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("caracal:v1:*:operators")
        .query(&mut redis)
        .expect("KEYS");
    assert_eq!(
        keys.len(),
        1,
        "one namespace, one hash of records: {keys:?}"
    );
    let _: () = redis::cmd("HSET")
        .arg(&keys[0])
        .arg(format!("override:{setting}"))
        .arg("{\"who\":42}")
        .query(&mut redis)
        .expect("HSET");
    let coordinator = Coordinator::redis(url.clone())
        .namespace(namespace.clone())
        .connect()
        .await
        .expect("connect");
    let error = coordinator
        .admin()
        .config(None)
        .await
        .expect_err("a malformed record");
    assert!(
        matches!(&error, caracal::Error::CoordinatorUnavailable { cause, .. }
            if cause.kind() == FailureKind::MalformedReply),
        "{error:?}"
    );
    let line = caracal(&url, &namespace, &["config", "get"], &[])
        .await
        .failed(1);
    assert!(line.contains(&format!("override:{setting}")), "{line}");
    coordinator.shutdown().await;
}
