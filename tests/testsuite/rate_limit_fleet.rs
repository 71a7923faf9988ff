//! The rate limit across real OS processes: the fleet together is held to the rate and burst,
//! and no rejection makes it wait longer than the rate calls for.

use std::task::Poll;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use caracal::rate_limit;
use caracal_tests::{RedisCluster, RedisServer};

use crate::common::worker::Worker;
use crate::common::{self, TestError, code, unique};

/// 3 processes × 4 tasks call for 2 s at `rate` (burst `burst`), each task again right away
/// when admitted and after the hinted wait when not. Ordered by the clock the processes and
/// Redis share:
/// - admitted ≤ burst + rate × (last − first) + 1: the fleet is held to the rate;
/// - every hint ≤ one emission interval (1/rate): GCRA admits once per interval, so a correct
///   limiter never makes anyone wait longer; a rejection that charged the cell, or a hint that
///   overstates the wait, shows up as a longer one (whereas a share of the ceiling reached
///   would depend on how fast the machine lets the workers call);
/// - the fleet got past its burst: the rate refills it.
///
/// `function` names the worker's rate-limited function: its rate, and how it is set up.
fn fleet(url: &str, function: &str, burst: u64) {
    let rate: u64 = function
        .split('-')
        .next()
        .and_then(|rate| rate.parse().ok())
        .expect("a function named for its rate");
    let namespace = unique("rate-fleet");
    let start_at =
        SystemTime::now().duration_since(UNIX_EPOCH).expect("clock") + Duration::from_millis(1500);
    let args = [
        format!("scope={}", unique("rate")),
        format!("rate={function}"),
        "tasks=4".to_owned(),
        "millis=2000".to_owned(),
        format!("start_at_ms={}", start_at.as_millis()),
    ];
    let workers: Vec<_> = (0..3)
        .map(|_| Worker::spawn(url, &namespace, "rate-load", &args))
        .collect();
    let (mut admitted, mut first, mut last, mut longest_hint) = (0, u64::MAX, 0, 0);
    for worker in &workers {
        let line = worker.expect_line("result", Duration::from_secs(60));
        assert_eq!(Worker::field(&line, "errors"), 0, "{line}");
        admitted += Worker::field(&line, "admitted");
        first = first.min(Worker::field(&line, "first_ms"));
        last = last.max(Worker::field(&line, "last_ms"));
        longest_hint = longest_hint.max(Worker::field(&line, "longest_retry_after_ns"));
    }
    let elapsed = (last - first) as f64 / 1000.0;
    let ceiling = burst as f64 + rate as f64 * elapsed + 1.0;
    eprintln!(
        "{function}/s, burst {burst}: {admitted} admitted in {elapsed:.3} s (at most {ceiling:.1})"
    );
    assert!(
        admitted as f64 <= ceiling,
        "{admitted} admitted in {elapsed:.3} s at {rate}/s, burst {burst}: more than {ceiling:.1}"
    );
    // The limiter's interval: whole nanoseconds, rounded up from 1/rate.
    let interval_ns = 1_000_000_000_u64.div_ceil(rate);
    assert!(
        longest_hint <= interval_ns,
        "a rejection hinted a {longest_hint} ns wait at {rate}/s: longer than one interval ({interval_ns} ns)"
    );
    assert!(
        admitted > burst,
        "{admitted} admitted at {rate}/s, burst {burst}: the rate never refilled the burst"
    );
}

#[test]
fn a_fleet_is_held_to_50_per_second_with_a_burst_of_5() {
    let server = RedisServer::start();
    fleet(&server.url(), "50", 5);
}

#[test]
fn a_fleet_is_held_to_700_per_second_with_a_burst_of_5() {
    let server = RedisServer::start();
    fleet(&server.url(), "700", 5);
}

/// With `prefetch = 4` the processes admit some calls on emissions taken ahead: the fleet is
/// held to the same ceiling, and no hint is longer (a take never moves the TAT past what the
/// burst allows).
#[test]
fn a_fleet_prefetching_is_held_to_700_per_second_with_a_burst_of_5() {
    let server = RedisServer::start();
    fleet(&server.url(), "700-prefetch", 5);
}

#[test]
fn a_fleet_is_held_to_its_rate_on_a_cluster() {
    let cluster = RedisCluster::start(3);
    fleet(&cluster.seed_urls().join(","), "50", 5);
}

#[rate_limit(name = "fleet-burst-prefetch", rate = 1, burst = 4, prefetch = 4, scope = scope)]
async fn prefetching(scope: &str) -> Result<(), TestError> {
    Ok(())
}

#[rate_limit(name = "fleet-burst-plain", rate = 1, burst = 4, scope = scope)]
async fn plain(scope: &str) -> Result<(), TestError> {
    Ok(())
}

/// 4 calls at once on one process, rate 1/s, burst 4: how many are admitted. The first takes 4
/// while the other 3 queue behind it and go out as one batch, which the script refuses (the
/// first's take spent the burst); 1 s intervals dwarf any round trip, so the 3 emissions the
/// first holds are still due when the refusals come back.
async fn burst_of_4(prefetch: bool) -> usize {
    let server = RedisServer::start();
    let coordinator = common::connect(&server.url(), Duration::from_secs(5)).await;
    let scope = unique("burst");
    let call = || async {
        if prefetch {
            prefetching(&scope).await
        } else {
            plain(&scope).await
        }
    };
    let results = coordinator
        .scoped(async { tokio::join!(call(), call(), call(), call()) })
        .await;
    coordinator.shutdown().await;
    let results = [results.0, results.1, results.2, results.3];
    results.iter().filter(|result| code(result) == "ok").count()
}

/// A burst on one process is admitted as it is without prefetch: a caller is never refused
/// while its own process holds an emission due for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_on_one_process_is_admitted_with_prefetch_as_without() {
    assert_eq!(burst_of_4(false).await, 4, "without prefetch");
    assert_eq!(burst_of_4(true).await, 4, "with prefetch = 4");
}

#[rate_limit(name = "fleet-fast-prefetch", rate = 1_000_000, burst = 20, prefetch = 4, scope = scope)]
async fn fast_prefetching(scope: &str) -> Result<(), TestError> {
    Ok(())
}

#[rate_limit(name = "fleet-fast-plain", rate = 1_000_000, burst = 20, scope = scope)]
async fn fast_plain(scope: &str) -> Result<(), TestError> {
    Ok(())
}

/// 64 calls of `call` at once on one process, against a server of its own: how many are
/// admitted. The first goes out alone; the other 63 queue behind it and go out as one batch.
async fn sixty_four_at_once<F, C>(call: C) -> usize
where
    C: Fn(String) -> F,
    F: Future<Output = Result<(), TestError>>,
{
    let server = RedisServer::start();
    let coordinator = common::connect(&server.url(), Duration::from_secs(5)).await;
    let scope = unique("many");
    let results = coordinator
        .scoped(all((0..64).map(|_| call(scope.clone()))))
        .await;
    coordinator.shutdown().await;
    results.iter().filter(|result| code(result) == "ok").count()
}

/// 64 callers at once, burst 20, an emission every microsecond (shorter than any round trip:
/// an emission taken ahead expires before any caller here could be handed it, so a caller gets
/// in on its own emission or not at all). What the lone first call took has passed a round trip
/// later, when the batch of 63 arrives: it gets the whole burst with `prefetch = 4` as without,
/// 21 admitted in all (were extras handed out before the batch's own emissions were decided, 5
/// would take the burst, 58 be refused, and 6 be admitted in all). It needs the batch's script
/// to run at least 4 µs (the lone take's 4 emissions; Redis `TIME` counts microseconds) after
/// the lone call's: any real round trip is longer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_callers_at_once_are_admitted_with_prefetch_as_without() {
    let plain = sixty_four_at_once(|scope| async move { fast_plain(&scope).await }).await;
    let prefetching =
        sixty_four_at_once(|scope| async move { fast_prefetching(&scope).await }).await;
    assert_eq!(plain, 21, "without prefetch: the first, then the burst");
    assert_eq!(prefetching, plain, "with prefetch = 4 as without");
}

/// Runs `calls` together in this task, polling every one in turn at each wake (so each gets as
/// far as it can before any reply comes back): their outputs, in order.
async fn all<F: Future>(calls: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut calls: Vec<_> = calls.map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = calls.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        for (call, output) in calls.iter_mut().zip(&mut outputs) {
            if output.is_none()
                && let Poll::Ready(done) = call.as_mut().poll(cx)
            {
                *output = Some(done);
            }
        }
        if outputs.iter().all(Option::is_some) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}
