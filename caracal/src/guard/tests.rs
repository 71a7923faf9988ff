//! The layers on the in-memory coordinator, on paused time: what each admits and rejects, how
//! errors come out, scopes from the request, and the breaker's classification. Each kind's own
//! module tests what is particular to it; the helpers here are shared with them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::sync::Semaphore;
use tower::{BoxError, Layer, Service, ServiceBuilder, ServiceExt, service_fn};

use crate::coordinator::Coordinator;
use crate::error::Error;
use crate::outcome::Outcome;
use crate::policy::layers::*;

/// A request with a tenant (its scope, where a layer is scoped) and the status to answer.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    pub(crate) tenant: &'static str,
    status: u16,
}

/// A request of `tenant`, answered with `status`.
pub(crate) fn request(tenant: &'static str, status: u16) -> Request {
    Request { tenant, status }
}

/// A downstream answering each request with its status; with a `gate`, each request waits
/// for a permit of it first.
pub(crate) fn downstream(
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
pub(crate) async fn admitted(calls: &AtomicU32, n: u32) {
    for _ in 0..1_000 {
        if calls.load(Ordering::SeqCst) >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("{n} requests never reached the downstream");
}

/// The caracal error a layer rejected with, if it is one.
pub(crate) fn caracal_error(error: &BoxError) -> Option<&Error> {
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

#[tokio::test]
async fn a_local_bulkhead_answers_with_the_inner_future_and_frees_its_slot() {
    let calls = Arc::new(AtomicU32::new(0));
    let mut service = ServiceBuilder::new()
        .layer(BulkheadLayer::new("tower-local-bulkhead").limit(1).local())
        .service(downstream(None, Arc::clone(&calls)));
    let held = service.ready().await.unwrap().call(request("a", 200));
    assert!(
        format!("{held:?}").contains("admitted"),
        "{held:?}: not boxed"
    );
    let full = service.ready().await.unwrap().call(request("a", 200)).await;
    assert!(
        matches!(
            caracal_error(&full.expect_err("the slot is held")),
            Some(Error::BulkheadFull { limit: 1, .. })
        ),
        "rejected at once"
    );
    assert_eq!(held.await.unwrap(), 200);
    let next = service.ready().await.unwrap().call(request("a", 201));
    assert_eq!(
        next.await.unwrap(),
        201,
        "the slot was freed with the response"
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "the rejected request never ran"
    );
}
