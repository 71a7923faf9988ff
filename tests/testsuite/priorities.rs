//! A call's priority as the attributes carry it: from `caracal::with_priority` around the call,
//! or from `priority = expr` on the policy, through every `#[retry]` attempt, into the
//! admission and the body.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::common::{TestError, unique};
use caracal::{Coordinator, Priority, bulkhead, rate_limit, retry, with_priority};
use caracal_tests::EventLog;

/// What each attempt of a call saw, and how often its priority expression ran.
#[derive(Default)]
struct Attempts {
    seen: Mutex<Vec<Priority>>,
    evaluated: AtomicU32,
}

impl Attempts {
    /// Records the attempt's priority; fails the first two attempts, so a call makes three.
    fn attempt(&self) -> Result<(), TestError> {
        let mut seen = self.seen.lock().expect("not poisoned");
        seen.push(Priority::current());
        if seen.len() < 3 {
            return Err(TestError::Body("try again"));
        }
        Ok(())
    }

    /// The priority of a tenant's calls, counting each evaluation.
    fn of(&self, tenant: &str) -> Priority {
        self.evaluated.fetch_add(1, Ordering::SeqCst);
        match tenant {
            "checkout" => Priority::Critical,
            _ => Priority::Sheddable,
        }
    }

    fn seen(&self) -> Vec<Priority> {
        self.seen.lock().expect("not poisoned").clone()
    }
}

#[retry(max_attempts = 3)]
#[bulkhead(limit = 5, scope = scope)]
async fn inherits(scope: &str, attempts: &Attempts) -> Result<(), TestError> {
    attempts.attempt()
}

/// The task-local set around the call holds in every attempt: a retry runs its attempts in
/// the caller's task, and the backoff between them does not leave it.
#[tokio::test(flavor = "current_thread")]
async fn with_priority_holds_in_every_retry_attempt() {
    let attempts = Attempts::default();
    let scope = unique("inherits");
    let result = Coordinator::in_memory()
        .scoped(with_priority(
            Priority::Sheddable,
            inherits(&scope, &attempts),
        ))
        .await;
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(attempts.seen(), [Priority::Sheddable; 3]);
}

#[retry(max_attempts = 3)]
#[bulkhead(limit = 5, scope = tenant, priority = attempts.of(tenant))]
async fn chosen(tenant: &str, attempts: &Attempts) -> Result<(), TestError> {
    attempts.attempt()
}

/// `priority = expr` is evaluated once per call, from the arguments, and every attempt runs
/// with it, over whatever surrounds the call: each attempt's admission too, as its event says.
#[tokio::test(flavor = "current_thread")]
async fn a_priority_argument_is_evaluated_once_and_holds_in_every_attempt() {
    let (log, _guard) = EventLog::capture_thread_default();
    let attempts = Attempts::default();
    let result = Coordinator::in_memory()
        .scoped(with_priority(
            Priority::Sheddable,
            chosen("checkout", &attempts),
        ))
        .await;
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(attempts.seen(), [Priority::Critical; 3]);
    assert_eq!(attempts.evaluated.load(Ordering::SeqCst), 1);
    assert_eq!(
        Priority::current(),
        Priority::Normal,
        "only inside the call"
    );
    let admitted = log.matching("bulkhead.admitted", |_| true);
    let classes: Vec<_> = admitted
        .iter()
        .map(|event| event.field("priority"))
        .collect();
    assert_eq!(classes, [Some("critical"); 3]);
}

#[rate_limit(
    rate = 1000,
    burst = 10,
    scope = scope,
    thresholds(normal = 0.8, sheddable = 0.5),
    priority = Priority::Critical
)]
async fn limited(scope: &str) -> Result<Priority, TestError> {
    Ok(Priority::current())
}

#[tokio::test(flavor = "current_thread")]
async fn a_rate_limit_gives_its_priority_to_the_call() {
    let scope = unique("limited");
    let seen = Coordinator::in_memory().scoped(limited(&scope)).await;
    assert_eq!(seen.ok(), Some(Priority::Critical));
}

#[bulkhead(
    name = "priorities-shares",
    limit = 30,
    thresholds(normal = 0.8, sheddable = 0.5)
)]
async fn shared_out() -> Result<(), TestError> {
    Ok(())
}

/// The shares written on an attribute, and given to a layer, are the values in force the
/// fleet sees (`caracal config get`).
#[tokio::test(flavor = "current_thread")]
async fn thresholds_from_an_attribute_or_a_layer_are_the_values_in_force() {
    use caracal::Thresholds;
    use caracal::tower::{BulkheadLayer, RateLimitLayer};
    use tower::{Service, ServiceBuilder, ServiceExt, service_fn};

    let coordinator = Coordinator::in_memory();
    coordinator.scoped(shared_out()).await.expect("admitted");
    let layered = unique("priorities-layer");
    let mut service = ServiceBuilder::new()
        .layer(
            BulkheadLayer::new(&layered)
                .limit(10)
                .thresholds(Thresholds::new(0.7, 0.25).expect("valid")),
        )
        .service(service_fn(|(): ()| async { Ok::<_, std::io::Error>(()) }));
    let ready = service.ready().await.expect("ready");
    coordinator.scoped(ready.call(())).await.expect("admitted");
    let rated = unique("priorities-rate");
    let mut service = ServiceBuilder::new()
        .layer(
            RateLimitLayer::new(&rated)
                .rate(100.0)
                .burst(10)
                .thresholds(Thresholds::new(0.9, 0.6).expect("valid")),
        )
        .service(service_fn(|(): ()| async { Ok::<_, std::io::Error>(()) }));
    let ready = service.ready().await.expect("ready");
    coordinator.scoped(ready.call(())).await.expect("admitted");
    let values = |policy: String| {
        let admin = coordinator.admin();
        async move {
            let deadline = tokio::time::Instant::now() + crate::common::PATIENCE;
            loop {
                let values: Vec<(String, String)> = admin
                    .config(Some(&policy))
                    .await
                    .expect("config get")
                    .into_iter()
                    .filter(|value| value.setting.contains(".thresholds."))
                    .map(|value| (value.setting, value.value))
                    .collect();
                if !values.is_empty() {
                    return values;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{policy} never listed"
                );
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
    };
    let pair = |policy: &str, normal: &str, sheddable: &str| {
        vec![
            (format!("{policy}.thresholds.normal"), normal.to_owned()),
            (
                format!("{policy}.thresholds.sheddable"),
                sheddable.to_owned(),
            ),
        ]
    };
    assert_eq!(
        values("bulkhead.priorities-shares".to_owned()).await,
        pair("bulkhead.priorities-shares", "0.8", "0.5")
    );
    for (policy, normal, sheddable) in [
        (format!("bulkhead.{layered}"), "0.7", "0.25"),
        (format!("rate_limit.{rated}"), "0.9", "0.6"),
    ] {
        assert_eq!(
            values(policy.clone()).await,
            pair(&policy, normal, sheddable)
        );
    }
}
