//! The layers on the in-memory coordinator, on paused time: what each admits and rejects, how
//! errors come out, scopes from the request, and the breaker's classification.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::sync::Semaphore;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt, service_fn};

use super::*;
use crate::Coordinator;

#[derive(Debug, Clone)]
struct Request {
    tenant: &'static str,
    status: u16,
}

fn request(tenant: &'static str, status: u16) -> Request {
    Request { tenant, status }
}

/// A downstream answering each request with its status; with a `gate`, each request waits
/// for a permit of it first.
fn downstream(
    gate: Option<Arc<Semaphore>>,
    calls: Arc<AtomicU32>,
) -> impl Service<Request, Response = u16, Error = BoxError, Future: Send> + Clone + Send {
    service_fn(move |req: Request| {
        let gate = gate.clone();
        calls.fetch_add(1, Ordering::SeqCst);
        async move {
            if let Some(gate) = gate {
                gate.acquire().await.expect("open gate").forget();
            }
            Ok::<_, BoxError>(req.status)
        }
    })
}

/// Waits (on paused time) until `calls` requests reached the downstream.
async fn admitted(calls: &AtomicU32, n: u32) {
    for _ in 0..1_000 {
        if calls.load(Ordering::SeqCst) >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("{n} requests never reached the downstream");
}

fn caracal_error(error: &BoxError) -> Option<&Error> {
    error.downcast_ref::<Error>()
}

#[tokio::test(start_paused = true)]
async fn the_bulkhead_layer_limits_per_scope_and_rejects_with_a_boxed_error() {
    let coordinator = Coordinator::in_memory();
    coordinator
        .clone()
        .scoped(async move {
            let gate = Arc::new(Semaphore::new(0));
            let calls = Arc::new(AtomicU32::new(0));
            let service = ServiceBuilder::new()
                .layer(
                    BulkheadLayer::new("tower-bulkhead")
                        .limit(1)
                        .scope(|req: &Request| req.tenant),
                )
                .service(downstream(Some(Arc::clone(&gate)), Arc::clone(&calls)));
            let spawn = |req| tokio::spawn(coordinator.scoped(service.clone().oneshot(req)));
            let held = spawn(request("a", 200));
            admitted(&calls, 1).await;
            let full = service.clone().oneshot(request("a", 200)).await;
            let error = full.expect_err("tenant a is full");
            assert!(
                matches!(
                    caracal_error(&error),
                    Some(Error::BulkheadFull { limit: 1, .. })
                ),
                "{error:?}"
            );
            // Another tenant has its own budget; it is held too, then both are let go.
            let other = spawn(request("b", 200));
            admitted(&calls, 2).await;
            gate.add_permits(2);
            assert_eq!(held.await.unwrap().unwrap(), 200);
            assert_eq!(other.await.unwrap().unwrap(), 200);
            gate.add_permits(1);
            assert_eq!(service.oneshot(request("a", 201)).await.unwrap(), 201);
        })
        .await;
}

#[tokio::test(start_paused = true)]
async fn the_breaker_layer_classifies_responses_and_opens_fleet_wide_state() {
    let coordinator = Coordinator::in_memory();
    coordinator
        .scoped(async {
            let calls = Arc::new(AtomicU32::new(0));
            let breaker = CircuitBreakerLayer::new("tower-breaker")
                .minimum_throughput(4)
                .open(Duration::from_secs(10))
                .classify(|result: &Result<u16, BoxError>| match result {
                    Ok(status) if *status >= 500 => Outcome::Failure,
                    Ok(_) => Outcome::Success,
                    Err(_) => Outcome::Failure,
                });
            let mut service = ServiceBuilder::new()
                .layer(breaker)
                .service(downstream(None, Arc::clone(&calls)));
            for _ in 0..4 {
                let status = service.ready().await.unwrap().call(request("a", 503)).await;
                assert_eq!(
                    status.unwrap(),
                    503,
                    "a 5xx response still reaches the caller"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let rejected = service.ready().await.unwrap().call(request("a", 200)).await;
            let error = rejected.expect_err("open after four 5xx responses");
            assert!(
                matches!(caracal_error(&error), Some(Error::CircuitOpen { .. })),
                "{error:?}"
            );
            assert_eq!(
                calls.load(Ordering::SeqCst),
                4,
                "no request reached the downstream"
            );
        })
        .await;
}

#[tokio::test(start_paused = true)]
async fn an_inner_layers_rejections_do_not_open_an_outer_breaker() {
    let coordinator = Coordinator::in_memory();
    coordinator
        .scoped(async {
            let calls = Arc::new(AtomicU32::new(0));
            let mut service = ServiceBuilder::new()
                .layer(CircuitBreakerLayer::new("tower-outer").minimum_throughput(2))
                .layer(RateLimitLayer::new("tower-inner").rate(0.001))
                .service(downstream(None, Arc::clone(&calls)));
            assert_eq!(
                service
                    .ready()
                    .await
                    .unwrap()
                    .call(request("a", 200))
                    .await
                    .unwrap(),
                200
            );
            for _ in 0..10 {
                let error = service
                    .ready()
                    .await
                    .unwrap()
                    .call(request("a", 200))
                    .await
                    .expect_err("rate limited");
                assert!(
                    matches!(caracal_error(&error), Some(Error::RateLimited { .. })),
                    "{error:?}: the breaker stayed closed"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
}

#[tokio::test(start_paused = true)]
async fn a_scope_the_request_makes_invalid_fails_that_request() {
    let coordinator = Coordinator::in_memory();
    coordinator
        .scoped(async {
            let service = ServiceBuilder::new()
                .layer(
                    RateLimitLayer::new("tower-scope")
                        .rate(10.0)
                        .scope(|req: &Request| req.tenant),
                )
                .service(downstream(None, Arc::new(AtomicU32::new(0))));
            let error = service.oneshot(request(" ", 200)).await.unwrap_err();
            assert!(
                matches!(caracal_error(&error), Some(Error::InvalidScope { .. })),
                "{error:?}"
            );
        })
        .await;
}

#[test]
#[should_panic(expected = "`limit` of `bulkhead`: must be an integer from 1 to 1000000, got 0")]
fn a_value_the_attribute_would_reject_panics() {
    let _ = BulkheadLayer::<Request>::new("bad").limit(0);
}

#[test]
#[should_panic(expected = "needs a limit")]
fn a_bulkhead_without_a_limit_panics_when_it_wraps_a_service() {
    let _ = BulkheadLayer::<Request>::new("no-limit").layer(downstream(None, Arc::default()));
}

#[test]
#[should_panic(
    expected = "`failure_threshold` of `circuit_breaker`: must be a number from 0.001 to 0.999"
)]
fn a_percentage_threshold_panics() {
    let _ = CircuitBreakerLayer::<Request, u16>::new("bad").failure_threshold(50.0);
}

#[test]
fn layers_take_the_attributes_defaults() {
    use caracal_spec::breaker as spec;
    let layer = CircuitBreakerLayer::<Request, u16>::new("defaults").open(Duration::from_secs(1));
    let config = layer.config.config("defaults", "defaults", false);
    assert_eq!(config.window, Duration::from_secs(60), "max(3 × open, 60s)");
    assert_eq!(config.probe_lease, Duration::from_secs(2), "2 × open");
    assert_eq!(
        (
            config.minimum_throughput,
            config.window_size,
            config.half_open_probes
        ),
        (
            spec::MINIMUM_THROUGHPUT.default.integer(),
            spec::WINDOW_SIZE.default.integer(),
            spec::HALF_OPEN_PROBES.default.integer()
        )
    );
}
