//! How many lines a replica writes: per-call events are `DEBUG`, and events that repeat on
//! every call while a condition lasts are said once, then summarised with `suppressed = N`.
//! A replica under 300 calls/s through a 5 s Redis outage writes at most 20 lines at `INFO`
//! and above.

use std::time::Duration;

use caracal::{Coordinator, bulkhead, circuit_breaker, fallback, rate_limit, retry};
use caracal_tests::{CapturedEvent, EventLog, FaultProxy, RedisServer};
use tracing::Level;

use crate::common::{self, TestError};

/// An orders service's call to its partner, with every attribute stacked as a real service
/// would: at 300 calls/s the rate limit turns some away, the bulkhead some more, one call in
/// ten fails twice (its retry is exhausted), and every rejection is answered by the fallback.
/// Each region is an identity of its own for every policy. Names of their own: the events of
/// an outage are summarised per policy, across scopes, for the whole process.
#[fallback(stale_order)]
#[retry(max_attempts = 2, backoff = "1ms")]
#[circuit_breaker(name = "volume-breaker", scope = format!("region-{region}"))]
#[bulkhead(name = "volume-bulkhead", limit = 4, scope = format!("region-{region}"))]
#[rate_limit(name = "volume-rate", rate = 250, burst = 10, scope = format!("region-{region}"))]
async fn order(region: u64, fail: bool) -> Result<&'static str, TestError> {
    partner(fail).await
}

#[fallback(stale_order)]
#[retry(max_attempts = 2, backoff = "1ms")]
#[circuit_breaker(name = "volume-regional-breaker", scope = format!("region-{region}"))]
#[bulkhead(name = "volume-regional-bulkhead", limit = 4, scope = format!("region-{region}"))]
#[rate_limit(name = "volume-regional-rate", rate = 250, burst = 10, scope = format!("region-{region}"))]
async fn regional_order(region: u64, fail: bool) -> Result<&'static str, TestError> {
    partner(fail).await
}

/// The partner: 15 ms, failing when told to.
async fn partner(fail: bool) -> Result<&'static str, TestError> {
    tokio::time::sleep(Duration::from_millis(15)).await;
    if fail {
        Err(TestError::Body("partner failed"))
    } else {
        Ok("fresh")
    }
}

async fn stale_order(
    _region: u64,
    _fail: bool,
    _rejection: caracal::Error,
) -> Result<&'static str, TestError> {
    Ok("stale")
}

/// How a load's calls ended.
#[derive(Debug, Default)]
struct Ran {
    /// The body ran and succeeded.
    fresh: usize,
    /// Answered by the fallback.
    stale: usize,
    /// Failed (the body failed twice).
    failed: usize,
}

impl Ran {
    fn calls(&self) -> usize {
        self.fresh + self.stale + self.failed
    }
}

/// Calls [`order`] (over ten regions: [`regional_order`]) 300 times a second for `run`, each
/// in a task of its own, spread over `regions`; how they ended.
async fn load(coordinator: &Coordinator, run: Duration, regions: u64) -> Ran {
    let mut tick = tokio::time::interval(Duration::from_micros(3_333));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let end = tokio::time::Instant::now() + run;
    let mut calls = tokio::task::JoinSet::new();
    for n in 0u64.. {
        if tokio::time::Instant::now() >= end {
            break;
        }
        tick.tick().await;
        let (region, fail) = (n % regions, n % 10 == 0);
        if regions == 1 {
            calls.spawn(coordinator.scoped(order(region, fail)));
        } else {
            calls.spawn(coordinator.scoped(regional_order(region, fail)));
        }
    }
    let mut ran = Ran::default();
    while let Some(ended) = calls.join_next().await {
        match ended.expect("a call's task") {
            Ok("fresh") => ran.fresh += 1,
            Ok(_) => ran.stale += 1,
            Err(_) => ran.failed += 1,
        }
    }
    ran
}

/// The load ran: at least half its planned calls (a tick skipped on a busy machine is not
/// made up), bodies ran and succeeded, and rejections were answered. A line count is a
/// claim only about a load that ran.
fn assert_ran(ran: &Ran, planned: usize) {
    assert!(
        ran.calls() * 2 >= planned,
        "{planned} calls planned: {ran:?}"
    );
    assert!(ran.fresh > 0 && ran.stale > 0 && ran.failed > 0, "{ran:?}");
}

/// What an operator's log at `INFO` shows: the events at `INFO` and above.
fn shown(events: &[CapturedEvent]) -> Vec<&CapturedEvent> {
    events.iter().filter(|e| e.level <= Level::INFO).collect()
}

fn suppressed(event: &CapturedEvent) -> u64 {
    event
        .field("suppressed")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a repeating event carries `suppressed`: {event:?}"))
}

/// 2 s of ordinary traffic over `regions`, a 5 s outage, 4 s to recover (11 s, 3 300 calls),
/// logged in `log`: every event logged so far, once it is checked that the load ran and that
/// the lines at `INFO` and above are at most 20 and say the outage.
async fn through_an_outage(
    log: &EventLog,
    coordinator: &Coordinator,
    proxy: &FaultProxy,
    regions: u64,
) -> Vec<CapturedEvent> {
    let outage = async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        proxy.cut();
        tokio::time::sleep(Duration::from_secs(5)).await;
        proxy.restore();
    };
    let (ran, ()) = tokio::join!(load(coordinator, Duration::from_secs(11), regions), outage);
    assert_ran(&ran, 3_300);
    let events = log.snapshot();
    let lines = shown(&events);
    let listing: Vec<_> = lines
        .iter()
        .map(|e| format!("{} {:?}", e.level, e.fields))
        .collect();
    println!(
        "{} calls ({ran:?}) over {regions} regions, {} lines at INFO and above:\n{}",
        ran.calls(),
        lines.len(),
        listing.join("\n")
    );
    assert!(
        lines.len() <= 20,
        "{} lines at INFO and above:\n{}",
        lines.len(),
        listing.join("\n")
    );
    // The outage was noticed and said, not hidden.
    for event in ["coordinator.connection_lost", "bulkhead.degraded"] {
        assert!(
            lines.iter().any(|e| e.event() == Some(event)),
            "no {event}:\n{}",
            listing.join("\n")
        );
    }
    events
}

#[tokio::test(flavor = "current_thread")]
async fn a_replica_under_load_writes_a_handful_of_lines_through_an_outage() {
    // The thread's subscriber sees every task: the runtime runs on this thread alone.
    let (log, _guard) = EventLog::capture_thread_default();
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let coordinator = common::redis(&proxy.url()).await;
    let first = through_an_outage(&log, &coordinator, &proxy, 1).await;
    assert!(first.iter().any(|e| e.event() == Some("fallback.invoked")));

    // More traffic, and a second, short outage more than 10 s after the first began: each
    // condition is said once, then summarised with the count it suppressed meanwhile.
    let again = async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        proxy.cut();
        tokio::time::sleep(Duration::from_secs(1)).await;
        proxy.restore();
    };
    let (ran, ()) = tokio::join!(load(&coordinator, Duration::from_secs(4), 1), again);
    assert_ran(&ran, 1_200);
    let all = log.snapshot();
    let second = shown(&all[first.len()..]);
    assert!(
        second.len() <= 20,
        "a second outage is said in a handful of lines too: {second:?}"
    );
    for event in [
        "bulkhead.rejected",
        "bulkhead.degraded",
        "circuit_breaker.degraded",
        "retry.exhausted",
        "coordinator.connection_lost",
    ] {
        let said: Vec<_> = all.iter().filter(|e| e.event() == Some(event)).collect();
        let firsts = said.iter().filter(|e| suppressed(e) == 0).count();
        let summarised: u64 = said.iter().map(|e| suppressed(e)).sum();
        assert!(firsts > 0, "no {event}");
        // 15 s: a first and at most one summary per condition (a second is due after 20 s).
        assert!(said.len() <= 2 * firsts, "once per condition: {said:?}");
        assert!(
            summarised > 0,
            "{event}'s summary counts what it suppressed: {said:?}"
        );
    }
    coordinator.shutdown().await;
}

/// The same outage with the load spread over ten regions, each an identity of its own for
/// every policy: what the log says of an outage is bounded per process, not per identity and
/// reason (ten identities used to write 24-33 lines for a 3 s stall), and the releases that find
/// their leases gone after it are part of its summary, not a warning per identity.
#[tokio::test(flavor = "current_thread")]
async fn ten_identities_through_an_outage_write_a_handful_of_lines() {
    let (log, _guard) = EventLog::capture_thread_default();
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let coordinator = common::redis(&proxy.url()).await;
    let events = through_an_outage(&log, &coordinator, &proxy, 10).await;
    coordinator.shutdown().await;
    let regions: std::collections::BTreeSet<_> = events
        .iter()
        .filter(|e| e.event() == Some("bulkhead.admitted"))
        .filter_map(|e| e.field("scope"))
        .collect();
    assert_eq!(regions.len(), 10, "every region was used");
}
