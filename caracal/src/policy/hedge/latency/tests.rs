//! The view on the in-memory coordinator, on paused time: two views of one identity on one
//! coordinator are two processes sharing its state.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::kernel::buckets::{self, BUCKETS};
use super::{FleetLatency, REFRESH, Views, WINDOW, fleet_latency};
use crate::coordinator::{Coordinator, FORGET_IDLE_AFTER, ForgetsIdle};
use crate::identity::{Identity, PolicyKind, Scope};

fn identity(coordinator: &Coordinator) -> Identity {
    coordinator.identity(PolicyKind::Bulkhead, "partner", "get", &Scope::GLOBAL)
}

/// What a quantile reads for latencies of `ms`: the upper bound of their bucket.
fn read_as(ms: u64) -> Option<Duration> {
    let bucket = buckets::bucket(ms * 1000);
    Some(Duration::from_micros(buckets::bounds(bucket).1))
}

fn observe(view: &Arc<FleetLatency>, n: u32, ms: u64) {
    for _ in 0..n {
        view.observe(Duration::from_millis(ms));
    }
}

/// Lets the batches due by now go out and be answered.
async fn one_batch() {
    tokio::time::sleep(REFRESH + Duration::from_millis(1)).await;
}

#[tokio::test(start_paused = true)]
async fn own_samples_count_at_once_and_once_sent() {
    let coordinator = Coordinator::in_memory();
    let view = fleet_latency(&coordinator, &identity(&coordinator));
    observe(&view, 94, 5);
    observe(&view, 5, 500);
    assert_eq!(view.quantile(500), None, "99 samples");
    observe(&view, 1, 5);
    assert_eq!(view.quantile(500), read_as(5));
    assert_eq!(view.quantile(950), read_as(5));
    assert_eq!(view.quantile(951), None, "four samples rank above");
    one_batch().await;
    assert!(!view.has_unsent(), "sent");
    // Now the fleet's: this process's samples, counted once.
    assert_eq!(view.quantile(950), read_as(5));
    observe(&view, 100, 500);
    // 95 samples at 5 ms, 105 at 500 ms: rank 95 is the last at 5 ms.
    assert_eq!(view.quantile(475), read_as(5));
    assert_eq!(view.quantile(476), read_as(500));
    one_batch().await;
    assert!(!view.has_unsent());
    assert_eq!(view.quantile(475), read_as(5));
    assert_eq!(view.quantile(476), read_as(500));
}

#[tokio::test(start_paused = true)]
async fn two_processes_converge_on_the_merged_histogram() {
    let coordinator = Coordinator::in_memory();
    let identity = identity(&coordinator);
    let fast = FleetLatency::new(&coordinator, identity.clone());
    let slow = FleetLatency::new(&coordinator, identity);
    observe(&fast, 900, 5);
    observe(&slow, 100, 500);
    assert_eq!(fast.quantile(950), read_as(5));
    assert_eq!(slow.quantile(950), read_as(500));
    one_batch().await;
    // Each hears the fleet when it sends: the second batch out heard both.
    observe(&fast, 9, 5);
    observe(&slow, 1, 500);
    one_batch().await;
    for view in [&fast, &slow] {
        // 909 fast and 101 slow samples: the slow tenth is p95, not p85.
        assert_eq!(view.quantile(950), read_as(500));
        assert_eq!(view.quantile(850), read_as(5));
    }
}

#[tokio::test(start_paused = true)]
async fn a_process_with_no_samples_reads_the_fleets_when_asked() {
    let coordinator = Coordinator::in_memory();
    let identity = identity(&coordinator);
    let busy = FleetLatency::new(&coordinator, identity.clone());
    let new = FleetLatency::new(&coordinator, identity);
    observe(&busy, 200, 5);
    one_batch().await;
    assert_eq!(new.quantile(500), None, "nothing heard yet: a read starts");
    one_batch().await;
    assert_eq!(
        new.quantile(500),
        read_as(5),
        "the fleet's, without a sample of its own"
    );
}

#[tokio::test(start_paused = true)]
async fn the_fleets_histogram_is_forgotten_a_window_after_it_was_heard() {
    let coordinator = Coordinator::in_memory();
    let view = fleet_latency(&coordinator, &identity(&coordinator));
    observe(&view, 200, 5);
    one_batch().await;
    assert!(!view.has_unsent());
    // Heard at REFRESH, and now 1 ms later.
    tokio::time::sleep(WINDOW - Duration::from_millis(2)).await;
    assert_eq!(
        view.quantile(500),
        read_as(5),
        "heard 1 ms under a window ago"
    );
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(view.quantile(500), None, "heard a window ago");
}

#[tokio::test(start_paused = true)]
async fn samples_in_flight_count_until_answered_and_a_failed_batch_is_dropped() {
    let coordinator = Coordinator::in_memory();
    let view = fleet_latency(&coordinator, &identity(&coordinator));
    observe(&view, 200, 5);
    let sent = view.take();
    assert_eq!(sent, [(buckets::bucket(5_000), 200)]);
    assert!(!view.has_unsent());
    assert_eq!(view.quantile(500), read_as(5), "in flight");
    view.answered(None);
    assert_eq!(view.quantile(500), None, "dropped, not sent again");
}

#[tokio::test(start_paused = true)]
async fn a_coordinator_shut_down_leaves_no_batch_due() {
    let coordinator = Coordinator::in_memory();
    let view = fleet_latency(&coordinator, &identity(&coordinator));
    observe(&view, 200, 5);
    coordinator.shutdown().await;
    one_batch().await;
    assert!(!view.due.load(Ordering::SeqCst));
    observe(&view, 1, 5);
    assert!(!view.due.load(Ordering::SeqCst), "nothing to send it");
    assert_eq!(
        view.quantile(500),
        read_as(5),
        "its own samples still count"
    );
}

#[tokio::test(start_paused = true)]
async fn idle_views_are_forgotten_held_ones_kept() {
    let coordinator = Coordinator::in_memory();
    let identity = identity(&coordinator);
    let held = fleet_latency(&coordinator, &identity);
    observe(&held, 1, 5);
    one_batch().await;
    let views = coordinator.kept_forgetting::<Views>();
    let count = || crate::sync::lock(&views.0).len();
    tokio::time::sleep(FORGET_IDLE_AFTER).await;
    views.forget_idle();
    assert_eq!(count(), 1, "held by a caller");
    drop(held);
    views.forget_idle();
    assert_eq!(count(), 0);
    // A view heard less than FORGET_IDLE_AFTER ago is kept.
    let view = fleet_latency(&coordinator, &identity);
    observe(&view, 1, 5);
    drop(view);
    one_batch().await;
    tokio::time::sleep(FORGET_IDLE_AFTER - REFRESH * 2).await;
    views.forget_idle();
    assert_eq!(count(), 1);
    assert_eq!(BUCKETS, fleet_latency(&coordinator, &identity).unsent.len());
}
