//! Admission by priority class at a rate limit's sites: each class up to its share of the
//! burst, locally and through a coordinator.

use super::*;
use crate::__private::GLOBAL_SCOPE;
use crate::ctx::CallCtx;
use crate::priority::with_priority;

/// A call site of its own (its cell shared with no other test): 1 a second, a burst of 10,
/// `Normal` and `Sheddable` calls up to half of it.
fn site(name: &'static str, local: bool) -> &'static RateLimitSite {
    Box::leak(Box::new(RateLimitSite::new(RateLimitConfig {
        name,
        operation: name,
        rate: 1.0,
        burst: 10,
        local,
        shadow: false,
        thresholds: Thresholds::new(0.5, 0.5).expect("valid"),
        prefetch: 1,
    })))
}

/// What each call of `classes`, all at one instant, was told: admitted or not.
async fn arrivals(site: &'static RateLimitSite, classes: &[Priority]) -> Vec<bool> {
    let mut admitted = Vec::new();
    for &priority in classes {
        let (ctx, scope) = (CallCtx::new(), GLOBAL_SCOPE.clone());
        let call = rate_limit(site, &ctx, &scope, async { Ok::<_, Error>(()) });
        admitted.push(with_priority(priority, call).await.is_ok());
    }
    admitted
}

/// 5 `Normal` calls take half the burst; the 6th is refused, while `Critical` ones take the
/// rest, up to 10.
async fn each_class_up_to_its_share(site: &'static RateLimitSite) {
    let normal = arrivals(site, &[Priority::Normal; 6]).await;
    assert_eq!(normal, [true, true, true, true, true, false]);
    let critical = arrivals(site, &[Priority::Critical; 6]).await;
    assert_eq!(critical, [true, true, true, true, true, false]);
}

#[tokio::test(start_paused = true)]
async fn a_local_rate_admits_a_class_up_to_its_share_of_the_burst() {
    each_class_up_to_its_share(site("classes-rate-local", true)).await;
}

#[tokio::test(start_paused = true)]
async fn a_distributed_rate_admits_a_class_up_to_its_share_of_the_burst() {
    let coordinator = crate::coordinator::Coordinator::in_memory();
    coordinator
        .scoped(each_class_up_to_its_share(site(
            "classes-rate-distributed",
            false,
        )))
        .await;
}
