//! What `connect` says when it cannot give a working coordinator.

use std::time::{Duration, Instant};

use caracal::Coordinator;

fn code(result: Result<Coordinator, caracal::Error>) -> &'static str {
    result.map_or_else(|error| error.code(), |_| "connected")
}

#[tokio::test]
async fn a_malformed_url_is_invalid_config() {
    let result = Coordinator::redis("not a url").connect().await;
    assert_eq!(code(result), "invalid_config");
    let result = Coordinator::redis_cluster(["redis://127.0.0.1:1", "::"])
        .connect()
        .await;
    assert_eq!(code(result), "invalid_config");
}

#[tokio::test]
async fn bad_settings_are_invalid_config() {
    let server = caracal_tests::RedisServer::start();
    for builder in [
        Coordinator::redis(server.url()).namespace("  "),
        Coordinator::redis(server.url()).namespace("n".repeat(1025)),
        Coordinator::redis(server.url()).command_timeout(Duration::ZERO),
        Coordinator::redis(server.url()).command_timeout(Duration::MAX),
        Coordinator::redis(server.url()).pool_size(0),
    ] {
        assert_eq!(code(builder.connect().await), "invalid_config");
    }
}

#[tokio::test]
async fn an_unreachable_server_is_coordinator_unavailable_within_the_timeout() {
    // A port nothing listens on: reserve one by binding, then close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("free port")
        .port();
    let start = Instant::now();
    let result = Coordinator::redis(format!("redis://127.0.0.1:{port}"))
        .command_timeout(Duration::from_millis(300))
        .connect()
        .await;
    assert_eq!(code(result), "coordinator_unavailable");
    assert!(start.elapsed() < Duration::from_millis(400));
}
