//! No credential is ever printed (design principle 7): a password written in a Redis URL never
//! appears in a builder's `Debug`, an error's `Display`, `Debug` or source chain, any event
//! down to TRACE, or the command's output — for a standalone URL, cluster seeds, a Sentinel URL
//! and a Unix socket's `pass=`, connecting or failing to.

use std::error::Error as _;
use std::time::Duration;

use caracal::{Coordinator, bulkhead};
use caracal_tests::events::EventLog;
use caracal_tests::server::RedisServer;

use crate::cli::{caracal, run};

/// Each connection's time: the failing ones fail at once (refused, unknown, malformed); the
/// others must not time out on a busy machine.
const PATIENT: Duration = Duration::from_secs(5);

/// Appears nowhere but in the URLs below.
const SECRET: &str = "Zq7-never-print-me";

/// Everything an error shows: `Display`, `Debug` and each source's `Display`.
fn everything(error: &caracal::Error) -> String {
    let mut text = format!("{error} {error:?}");
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(&format!(" {cause}"));
        source = cause.source();
    }
    text
}

fn assert_hidden(what: &str, text: &str) {
    assert!(
        !text.contains(SECRET),
        "{what} printed the password: {text}"
    );
}

#[bulkhead(name = "secrets-suite", limit = 2)]
async fn guarded() -> Result<(), caracal::Error> {
    Ok(())
}

#[tokio::test]
async fn no_password_is_printed_by_a_builder_an_error_or_an_event() {
    let (log, _guard) = EventLog::capture_thread_default();
    let server = RedisServer::start();
    let mut acl = redis::cmd("ACL");
    acl.arg("SETUSER")
        .arg("app")
        .arg("on")
        .arg(format!(">{SECRET}"));
    for rule in caracal::REDIS_ACL_RULES.split_whitespace() {
        acl.arg(rule);
    }
    acl.exec(&mut server.connection()).expect("ACL SETUSER");
    let port = server.port();
    let good = format!("redis://app:{SECRET}@127.0.0.1:{port}");
    let closed = RedisServer::start();
    let closed_port = closed.port();
    drop(closed);

    // Each fails to connect but one (a lone user-info part is a user name to the client: it
    // connects as the default user); what they print is checked either way.
    let builders = [
        Coordinator::redis(format!("redis://app:wrong-{SECRET}@127.0.0.1:{port}")),
        Coordinator::redis(format!("redis://{SECRET}@127.0.0.1:{port}")),
        Coordinator::redis(format!("redis://app:{SECRET}@127.0.0.1:{closed_port}")),
        Coordinator::redis(format!("redis://app:{SECRET}@127.0.0.1:not-a-port")),
        Coordinator::redis(format!(
            "redis+unix:///nonexistent/redis.sock?pass={SECRET}"
        )),
        Coordinator::redis_cluster(vec![
            format!("redis://app:{SECRET}@127.0.0.1:{closed_port}"),
            format!("redis://:{SECRET}@127.0.0.1:{closed_port}"),
        ]),
        Coordinator::redis(format!(
            "redis-sentinel://app:{SECRET}@127.0.0.1:{closed_port}/0#main"
        )),
    ];
    let mut failed = 0;
    for builder in builders {
        let shown = format!("{builder:?}");
        assert_hidden("a builder's Debug", &shown);
        match builder.command_timeout(PATIENT).connect().await {
            Ok(coordinator) => coordinator.shutdown().await,
            Err(error) => {
                failed += 1;
                assert_hidden(&format!("the error of {shown}"), &everything(&error));
            }
        }
    }
    assert_eq!(
        failed, 6,
        "each URL but the lone user-info's fails to connect"
    );

    let builder = Coordinator::redis(good.clone())
        .namespace("secrets-suite")
        .command_timeout(PATIENT);
    assert_hidden("a builder's Debug", &format!("{builder:?}"));
    assert!(format!("{builder:?}").contains("app:***@"), "{builder:?}");
    let coordinator = builder.connect().await.expect("connect with the password");
    assert_hidden("the coordinator's Debug", &format!("{coordinator:?}"));
    coordinator
        .scoped(async {
            for _ in 0..3 {
                guarded().await.expect("a guarded call");
            }
        })
        .await;
    coordinator.admin().status().await.expect("status");
    coordinator.shutdown().await;
    assert!(
        !log.is_empty(),
        "no event was captured: nothing was checked"
    );
    for event in log.snapshot() {
        assert_hidden("an event", &format!("{event:?}"));
    }

    let ran = caracal(&good, "secrets-suite", &["status", "--json"]);
    assert_eq!(ran.status, 0, "{ran:?}");
    assert_hidden("the command", &format!("{ran:?}"));
    for (args, env) in [
        (
            vec![
                "--url".to_owned(),
                format!("redis://app:wrong-{SECRET}@127.0.0.1:{port}"),
                "status".to_owned(),
            ],
            vec![],
        ),
        (
            vec!["status".to_owned()],
            vec![(
                "CARACAL_REDIS_URL",
                format!("redis://{SECRET}@127.0.0.1:{closed_port}"),
            )],
        ),
        (
            vec!["status".to_owned()],
            vec![(
                "CARACAL_REDIS_URL",
                format!("redis://a:{SECRET}@127.0.0.1:{port},"),
            )],
        ),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let ran = run(&args, &env);
        assert_ne!(ran.status, 0, "{ran:?}");
        assert_hidden("the command", &format!("{ran:?}"));
    }
}
