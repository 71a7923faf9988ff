//! `caracal::tower` under axum: a real HTTP server (a process of its own, `caracal-http-server`,
//! guarding `/hold` with `BulkheadLayer::new("shared-budget").limit(2)`) on a free port, a real
//! hyper client, and `#[bulkhead(name = "shared-budget", limit = 2)]` in this process: one
//! identity, so one budget, whichever side takes the slots.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use axum::body::Bytes;
use caracal::bulkhead;
use caracal_tests::RedisServer;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::sync::Semaphore;

use crate::common::{self, Leases, PATIENCE, TestError, code, eventually, unique};

const SERVER: &str = env!("CARGO_BIN_EXE_caracal-http-server");

/// The server process; killed when dropped.
struct HttpServer {
    child: Child,
    port: u16,
}

impl HttpServer {
    fn start(redis_url: &str, namespace: &str) -> Self {
        let mut child = Command::new(SERVER)
            .env("CARACAL_REDIS_URL", redis_url)
            .env("CARACAL_NAMESPACE", namespace)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the HTTP server");
        let stdout = child.stdout.take().expect("server stdout");
        let line = BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .find(|line| line.starts_with("listening"))
            .expect("the server says where it listens");
        let port = line
            .strip_prefix("listening port=")
            .and_then(|port| port.parse().ok())
            .unwrap_or_else(|| panic!("no port in {line:?}"));
        HttpServer { child, port }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// Sends a request; answers the status and the body.
async fn send(client: &HttpClient, method: &str, uri: String, tenant: &str) -> (u16, String) {
    let request = axum::http::Request::builder()
        .method(method)
        .uri(uri)
        .header("tenant", tenant)
        .body(Empty::new())
        .expect("a request");
    let response = client.request(request).await.expect("the server answers");
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("a body")
        .to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// Holds a slot of the same identity as the server's layer until `gate` gives a permit.
#[bulkhead(name = "shared-budget", limit = 2, scope = tenant)]
async fn hold(tenant: &str, gate: &Semaphore) -> Result<(), TestError> {
    gate.acquire().await.map(|permit| permit.forget()).ok();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tower_layer_and_an_attribute_share_one_budget() {
    let redis = RedisServer::start();
    let namespace = unique("ns");
    let server = HttpServer::start(&redis.url(), &namespace);
    let coordinator = caracal::Coordinator::redis(redis.url())
        .namespace(namespace.as_str())
        .connect()
        .await
        .expect("connect");
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let base = format!("http://127.0.0.1:{}", server.port);
    let tenant = unique("tenant");

    // Two requests take the budget through the layer...
    let held: Vec<_> = (0..2)
        .map(|_| {
            let (client, uri, tenant) = (client.clone(), format!("{base}/hold"), tenant.clone());
            tokio::spawn(async move { send(&client, "GET", uri, &tenant).await })
        })
        .collect();
    // ...so the attribute is refused once both are in. (Not probed before: an attribute call
    // in flight takes a slot, and would turn one of the two requests away.)
    let mut leases = Leases::on(&redis);
    eventually("both requests hold a slot", || leases.live() == 2).await;
    let open = Semaphore::new(Semaphore::MAX_PERMITS);
    assert_eq!(
        code(&coordinator.scoped(hold(&tenant, &open)).await),
        "bulkhead_full",
        "the attribute is refused"
    );
    assert_eq!(
        send(&client, "GET", format!("{base}/hold"), &tenant).await,
        (503, "bulkhead_full".to_owned()),
        "a third request is refused by the layer"
    );
    // Another tenant is another identity.
    let other = unique("tenant");
    assert_eq!(code(&coordinator.scoped(hold(&other, &open)).await), "ok");

    send(&client, "POST", format!("{base}/release?n=2"), &tenant).await;
    for request in held {
        assert_eq!(
            request.await.expect("request task"),
            (200, "done".to_owned())
        );
    }

    // The other way round: the attribute holds both slots, the layer refuses. (The server
    // releases its leases in the background: wait until they are gone.)
    eventually("the server released its slots", || leases.live() == 0).await;
    let gate = Arc::new(Semaphore::new(0));
    let holders: Vec<_> = (0..2)
        .map(|_| {
            let (coordinator, tenant, gate) =
                (coordinator.clone(), tenant.clone(), Arc::clone(&gate));
            tokio::spawn(async move { coordinator.scoped(hold(&tenant, &gate)).await })
        })
        .collect();
    eventually("the attribute holds both slots", || leases.live() == 2).await;
    assert_eq!(
        send(&client, "GET", format!("{base}/hold"), &tenant).await,
        (503, "bulkhead_full".to_owned()),
        "the layer refuses while the attribute holds both slots"
    );
    gate.add_permits(2);
    for holder in holders {
        assert_eq!(code(&holder.await.expect("holder task")), "ok");
    }
    coordinator.shutdown().await;
}

/// A request's class, chosen by `PriorityLayer` from its `x-priority` header, is the one the
/// bulkheads below it decide by — a local one deciding in its `call`, a distributed one in the
/// future it returns — and the inner service runs with.
#[tokio::test(flavor = "current_thread")]
async fn a_priority_layer_classes_requests_for_the_layers_and_service_below() {
    use axum::http::Request;
    use caracal::tower::{BulkheadLayer, PriorityLayer};
    use caracal::{Coordinator, Priority};
    use caracal_tests::EventLog;
    use tower::{Service, ServiceBuilder, ServiceExt, service_fn};

    let (log, _guard) = EventLog::capture_thread_default();
    let of = |req: &Request<()>| {
        req.headers()
            .get("x-priority")
            .and_then(|value| value.to_str().ok()?.parse().ok())
            .unwrap_or_default()
    };
    let mut service = ServiceBuilder::new()
        .layer(PriorityLayer::new(of))
        .layer(
            BulkheadLayer::new(&unique("tower-classed-local"))
                .limit(5)
                .local(),
        )
        .layer(BulkheadLayer::new(&unique("tower-classed")).limit(5))
        .service(service_fn(|_: Request<()>| async {
            Ok::<_, std::io::Error>(Priority::current())
        }));
    let coordinator = Coordinator::in_memory();
    for (header, class) in [(Some("critical"), "critical"), (None, "normal")] {
        let mut request = Request::new(());
        if let Some(header) = header {
            request
                .headers_mut()
                .insert("x-priority", header.parse().expect("a header value"));
        }
        let ready = service.ready().await.expect("ready");
        let seen = coordinator
            .scoped(ready.call(request))
            .await
            .expect("admitted");
        assert_eq!(seen.as_str(), class);
        for coordination in ["local", "distributed"] {
            let admitted = log.count_where("bulkhead.admitted", |fields| {
                fields.get("coordination").map(String::as_str) == Some(coordination)
                    && fields.get("priority").map(String::as_str) == Some(class)
            });
            assert_eq!(admitted, 1, "{coordination} {class}: {:?}", log.snapshot());
        }
    }
}

/// `.keep(…)` on the layer keeps a finished request's lease, and the next request starts on
/// it with no round trip, as `#[bulkhead(keep = …)]` does.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_bulkhead_layer_with_keep_hands_a_lease_to_the_next_request() {
    use std::time::Duration;

    use caracal::Coordinator;
    use caracal::tower::BulkheadLayer;
    use caracal_tests::EventLog;
    use tower::{Service, ServiceBuilder, ServiceExt, service_fn};

    let (log, _guard) = EventLog::capture_thread_default();
    let mut service = ServiceBuilder::new()
        .layer(
            BulkheadLayer::new(&unique("tower-keep"))
                .limit(2)
                .keep(Duration::from_millis(50)),
        )
        .service(service_fn(|(): ()| async { Ok::<_, std::io::Error>(()) }));
    let coordinator = Coordinator::in_memory();
    for _ in 0..2 {
        let ready = service.ready().await.expect("ready");
        coordinator.scoped(ready.call(())).await.expect("admitted");
    }
    assert_eq!(log.count("bulkhead.lease_kept"), 2, "{:?}", log.snapshot());
    assert_eq!(
        log.count("bulkhead.lease_reused"),
        1,
        "{:?}",
        log.snapshot()
    );
}

/// What a layer's service answers to `panics`: it panics (in its future, where a request's
/// work runs) or succeeds.
async fn panicking_service(panics: bool) -> Result<(), std::io::Error> {
    assert!(!panics, "the inner service panics");
    Ok(())
}

/// Sends `panics` through `service` on a task of its own: whether the request succeeded, or
/// `None` when it panicked (the panic caught by the task's `JoinHandle`, as a server's
/// per-connection task catches it).
async fn send_on_task<S>(
    coordinator: &caracal::Coordinator,
    service: &mut S,
    panics: bool,
) -> Option<bool>
where
    S: tower::Service<bool, Response = ()>,
    S::Future: Send + 'static,
    S::Error: std::fmt::Debug + Send + 'static,
{
    use tower::ServiceExt;

    let call = service.ready().await.expect("ready").call(panics);
    match tokio::spawn(coordinator.scoped(call)).await {
        Ok(result) => Some(result.is_ok()),
        Err(error) => {
            assert!(error.is_panic(), "{error}");
            None
        }
    }
}

/// A request whose inner future panics behind a `BulkheadLayer` that keeps leases gives its
/// lease back at once: the panic unwinds through the layer's future, and the lease, dropped on
/// the way, is released (only a body that returned is kept). The pool of kept leases is as it
/// was: the next requests are admitted and one starts on a lease the one before it kept; and a
/// kept lease goes back to the fleet after `keep`, so none is left at the server.
#[tokio::test(flavor = "current_thread")]
async fn a_panicking_service_behind_a_bulkhead_layer_with_keep_gives_its_lease_back() {
    use std::time::Duration;

    use caracal::tower::BulkheadLayer;
    use caracal_tests::EventLog;
    use tower::{ServiceBuilder, service_fn};

    let server = RedisServer::start();
    let coordinator = common::connect(&server.url(), Duration::from_secs(5)).await;
    let mut leases = Leases::on(&server);
    let (log, _guard) = EventLog::capture_thread_default();
    // A lease of 30 s: one the panic left behind would outlive the suite's patience.
    let mut service = ServiceBuilder::new()
        .layer(
            BulkheadLayer::new(&unique("tower-panic"))
                .limit(2)
                .keep(Duration::from_millis(100)),
        )
        .service(service_fn(panicking_service));
    assert_eq!(
        send_on_task(&coordinator, &mut service, false).await,
        Some(true)
    );
    assert_eq!(send_on_task(&coordinator, &mut service, true).await, None);
    eventually("the panicking request's lease released", || {
        leases.live() == 0
    })
    .await;
    // Pairs of requests until the second of a pair starts on the lease the first kept (within
    // the lease's reuse window, 250 ms, which a loaded machine may miss now and then).
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let reused = log.count("bulkhead.lease_reused");
    while log.count("bulkhead.lease_reused") == reused {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no request started on a kept lease after the panic: {:?}",
            log.snapshot()
        );
        for _ in 0..2 {
            assert_eq!(
                send_on_task(&coordinator, &mut service, false).await,
                Some(true)
            );
        }
    }
    eventually("the kept lease back in the fleet after keep", || {
        leases.live() == 0
    })
    .await;
    coordinator.shutdown().await;
}

/// A request whose inner future panics behind a `RateLimitLayer` that prefetches spends its
/// own admission and no more: the emissions its take held for the next requests (rate 0.1/s,
/// burst 4, `prefetch = 4`: three, due for 10, 20 and 30 s) admit the next three, and the
/// fifth is refused. A panic neither refunds an admission nor empties the pool.
#[tokio::test(flavor = "current_thread")]
async fn a_panicking_service_behind_a_rate_limit_layer_spends_only_its_own_admission() {
    use std::time::Duration;

    use caracal::tower::RateLimitLayer;
    use tower::{ServiceBuilder, service_fn};

    let server = RedisServer::start();
    let coordinator = common::connect(&server.url(), Duration::from_secs(5)).await;
    let mut service = ServiceBuilder::new()
        .layer(
            RateLimitLayer::new(&unique("tower-panic-rate"))
                .rate(0.1)
                .burst(4)
                .prefetch(4),
        )
        .service(service_fn(panicking_service));
    assert_eq!(send_on_task(&coordinator, &mut service, true).await, None);
    for held in 1..=3 {
        assert_eq!(
            send_on_task(&coordinator, &mut service, false).await,
            Some(true),
            "emission {held} of the panicking request's take"
        );
    }
    assert_eq!(
        send_on_task(&coordinator, &mut service, false).await,
        Some(false),
        "the burst is spent"
    );
    coordinator.shutdown().await;
}
