//! Prefetch at a distributed rate's site, on the in-memory coordinator and paused time: the
//! round trips it saves, the admissions it keeps exact, and the give-back's compare-and-set.

use std::time::Duration;

use tokio::time::{Instant, sleep};

use super::*;
use crate::__private::GLOBAL_SCOPE;
use crate::ctx::CallCtx;
use crate::identity::Identity;

/// 100 a second: one emission every 10 ms.
const INTERVAL: Duration = Duration::from_millis(10);

/// A call site of its own (its identity shared with no other test): 100 a second.
fn site(name: &'static str, burst: u32, prefetch: u32) -> &'static RateLimitSite {
    Box::leak(Box::new(RateLimitSite::new(RateLimitConfig {
        name,
        operation: name,
        rate: 100.0,
        burst,
        local: false,
        shadow: false,
        thresholds: Thresholds::NONE,
        prefetch,
    })))
}

/// One call at `site`: whether it was admitted.
async fn call(site: &RateLimitSite) -> bool {
    let (ctx, scope) = (CallCtx::new(), GLOBAL_SCOPE.clone());
    rate_limit(site, &ctx, &scope, async { Ok::<_, Error>(()) })
        .await
        .is_ok()
}

/// `site`'s identity on `coordinator`.
fn identity(coordinator: &Coordinator, site: &RateLimitSite) -> Identity {
    let scope = GLOBAL_SCOPE.clone().expect("the global scope");
    coordinator.identity(
        PolicyKind::RateLimit,
        site.config.name,
        site.config.name,
        &scope,
    )
}

/// An arrival of another process at `site`'s identity: what it took.
async fn elsewhere(coordinator: &Coordinator, site: &RateLimitSite) -> gcra::Taken {
    let arrival = gcra::Arrival {
        interval: gcra::interval_ns(site.config.rate),
        burst: site.config.burst,
        share: crate::priority::WHOLE,
        take: 1,
    };
    coordinator
        .run::<gcra::Gcra>(&identity(coordinator, site), arrival)
        .await
        .expect("the in-memory coordinator answers")
        .expect("admitted")
}

/// A lone caller calling once an interval, at its rate, for 20 calls: every call admitted, in 4
/// round trips with `prefetch = 5` (each emission handed out as its slot starts) where it takes
/// 20 without.
#[tokio::test(start_paused = true)]
async fn a_lone_caller_at_its_rate_pays_one_round_trip_per_k_calls() {
    let coordinator = Coordinator::in_memory();
    coordinator
        .scoped(async {
            let site = site("prefetch-lone", 10, 5);
            let before = coordinator.runs_in_memory();
            for _ in 0..20 {
                assert!(call(site).await, "under its rate");
                sleep(INTERVAL).await;
            }
            assert_eq!(coordinator.runs_in_memory() - before, 4);
        })
        .await;
}

/// Many tasks calling in bursts with pauses, some calls on emissions taken ahead: ordered by
/// the clock the coordinator decides on, no window of any length `w` holds more admissions than
/// a GCRA allows, `burst + floor(w / interval)`, and the tasks get past the burst.
#[tokio::test(start_paused = true)]
async fn admissions_with_prefetch_stay_within_the_rate_in_every_window() {
    let coordinator = Coordinator::in_memory();
    let admitted = coordinator
        .scoped(async {
            let site = site("prefetch-exact", 4, 4);
            let start = Instant::now();
            let tasks: Vec<_> = (0..3u64)
                .map(|task| {
                    tokio::spawn(coordinator.scoped(async move {
                        let mut admitted = Vec::new();
                        for round in 0..60u64 {
                            if call(site).await {
                                admitted.push(Instant::now());
                            }
                            // Bursts and pauses of several intervals: an emission handed out
                            // after its slot started would show as one too many.
                            let pause = [0, 3, 0, 27, 1, 55][((round + task) % 6) as usize];
                            sleep(Duration::from_millis(pause)).await;
                        }
                        admitted
                    }))
                })
                .collect();
            let mut admitted = Vec::new();
            for task in tasks {
                admitted.extend(task.await.expect("the task ran"));
            }
            admitted.sort();
            admitted
                .into_iter()
                .map(|at| at - start)
                .collect::<Vec<_>>()
        })
        .await;
    assert!(admitted.len() > 4 * 3, "{} admitted", admitted.len());
    for intervals in [0, 1, 2, 5, 20] {
        let window = INTERVAL * intervals;
        let allowed = 4 + intervals as usize;
        for (i, &from) in admitted.iter().enumerate() {
            let within = admitted[i..].iter().take_while(|&&at| at <= from + window);
            assert!(
                within.count() <= allowed,
                "more than {allowed} admitted within {window:?} of {from:?}: {admitted:?}"
            );
        }
    }
}

/// A take of 4 at 0 ms whose second and third emissions (due until 10 and 20 ms) expire unused,
/// no call coming for two intervals: its rest goes back — the next arrival finds the cell idle —
/// unless another process took an emission in between, when the TAT stays where that one left
/// it.
#[tokio::test(start_paused = true)]
async fn unused_emissions_go_back_only_while_nobody_took_one_since() {
    let coordinator = Coordinator::in_memory();
    coordinator
        .scoped(async {
            let alone = site("prefetch-give-back", 8, 4);
            assert!(call(alone).await);
            sleep(INTERVAL * 3).await;
            // Given back: the cell is idle, so the arrival's TAT is one interval ahead.
            assert_eq!(elsewhere(&coordinator, alone).await.ahead, 10_000_000);

            let shared = site("prefetch-give-back-moved", 8, 4);
            assert!(call(shared).await);
            // Another process takes the fifth emission: the TAT is 50 ms, not the 40 ms the
            // take left.
            assert_eq!(elsewhere(&coordinator, shared).await.ahead, 50_000_000);
            sleep(INTERVAL * 3).await;
            // Not given back: the arrival at 30 ms moves the TAT from 50 ms to 60 ms.
            assert_eq!(elsewhere(&coordinator, shared).await.ahead, 30_000_000);
        })
        .await;
}

/// Burst 4, `prefetch = 4`: a take at 0 ms holds emissions whose slots start at 10, 20 and 30 ms;
/// calls at 10 and 20 ms use two, and the third expires at 30 ms. At 40 ms the cell is idle, so
/// a burst of 5 calls gets the whole burst, 4, afresh: the third emission, handed out after its
/// slot started, would be a fifth at one instant.
#[tokio::test(start_paused = true)]
async fn an_emission_is_handed_out_only_until_its_slot_starts() {
    let coordinator = Coordinator::in_memory();
    coordinator
        .scoped(async {
            let site = site("prefetch-deadline", 4, 4);
            for _ in 0..3 {
                assert!(call(site).await);
                sleep(INTERVAL).await;
            }
            sleep(INTERVAL).await;
            let mut admitted = 0;
            for _ in 0..5 {
                admitted += usize::from(call(site).await);
            }
            assert_eq!(admitted, 4, "the burst at one instant");
        })
        .await;
}

/// A caller a little slower than the rate (every 12 ms at 10 ms an interval) skips an emission
/// now and then; the rest of its take stays for it: 20 calls cost 5 takes and no give-back, where
/// giving the rest back at each skip would cost more round trips than no prefetch.
#[tokio::test(start_paused = true)]
async fn a_caller_slower_than_the_rate_keeps_the_rest_of_its_take() {
    let coordinator = Coordinator::in_memory();
    coordinator
        .scoped(async {
            let site = site("prefetch-slower", 10, 5);
            let before = coordinator.runs_in_memory();
            for _ in 0..20 {
                assert!(call(site).await, "under its rate");
                sleep(Duration::from_millis(12)).await;
            }
            assert_eq!(coordinator.runs_in_memory() - before, 5);
        })
        .await;
}

/// Prefetch is off with thresholds and in shadow mode, whatever the knob says: 5 calls at one
/// instant make 5 round trips at either.
#[tokio::test(start_paused = true)]
async fn prefetch_is_off_with_thresholds_and_in_shadow_mode() {
    let coordinator = Coordinator::in_memory();
    coordinator
        .scoped(async {
            let classed = Box::leak(Box::new(RateLimitSite::new(RateLimitConfig {
                thresholds: Thresholds::new(0.8, 0.5).expect("valid"),
                ..site("prefetch-classed", 10, 5).config
            })));
            let shadow = Box::leak(Box::new(RateLimitSite::new(RateLimitConfig {
                shadow: true,
                ..site("prefetch-shadow", 10, 5).config
            })));
            for site in [&*classed, &*shadow] {
                let before = coordinator.runs_in_memory();
                for _ in 0..5 {
                    assert!(call(site).await);
                }
                assert_eq!(
                    coordinator.runs_in_memory() - before,
                    5,
                    "{}",
                    site.config.name
                );
            }
        })
        .await;
}

/// The `rate_limit.*` prefetch events this thread's caracal emits while `run` runs (paused
/// time: every task of the test runs on it), summed by event: `(prefetched, used, returned,
/// expired)` emissions.
async fn prefetch_events(run: impl Future<Output = ()>) -> [u64; 4] {
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Lines {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            lock(&self.0).extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);
    run.await;
    let text = String::from_utf8(lock(&lines.0).clone()).expect("UTF-8");
    let field = |line: &str, name: &str| -> u64 {
        let value = line.split(&format!(" {name}=")).nth(1).expect("the field");
        value
            .split(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .expect("a count")
    };
    let mut sums = [0; 4];
    for line in text.lines() {
        let (index, count) = if line.contains("rate_limit.prefetched") {
            (0, field(line, "extra"))
        } else if line.contains("rate_limit.prefetch_used") {
            (1, 1)
        } else if line.contains("rate_limit.prefetch_returned") {
            (2, field(line, "count"))
        } else if line.contains("rate_limit.prefetch_expired") {
            (3, field(line, "count"))
        } else {
            continue;
        };
        sums[index] += count;
    }
    sums
}

/// A take of 4 at burst 4 holds 3; the identity's burst then changes to 8, and its next call
/// drops them (a hand-out under other settings would mix two schedules): they are counted as
/// expired, so every emission taken ahead is accounted for — used, returned or expired.
#[tokio::test(start_paused = true)]
async fn emissions_dropped_after_a_change_of_settings_are_counted_as_expired() {
    let coordinator = Coordinator::in_memory();
    let [prefetched, used, returned, expired] = prefetch_events(coordinator.scoped(async {
        let before = site("prefetch-changed", 4, 4);
        let after = site("prefetch-changed", 8, 4);
        assert!(call(before).await);
        assert!(call(after).await);
        sleep(INTERVAL * 20).await;
    }))
    .await;
    assert_eq!(expired, 3, "the dropped take's 3");
    assert_eq!(prefetched, used + returned + expired);
}

/// At shutdown what is held expires unused, and is counted so.
#[tokio::test(start_paused = true)]
async fn emissions_held_at_shutdown_are_counted_as_expired() {
    let coordinator = Coordinator::in_memory();
    let [prefetched, used, returned, expired] = prefetch_events(async {
        assert!(
            coordinator
                .scoped(call(site("prefetch-shutdown", 4, 4)))
                .await
        );
        coordinator.shutdown().await;
    })
    .await;
    assert_eq!((prefetched, used, returned, expired), (3, 0, 0, 3));
}

/// Two takes held in the order their replies came, the first with extras due until 40 and
/// 50 ms, the second until 10 and 20 ms; a caller every 10 ms from 5 ms on gets the soonest due
/// first, so all four are handed out and none expires (the first pushed first would hand out
/// those due at 40 and 50 ms at 5 and 15 ms, and let the other two expire).
#[tokio::test(start_paused = true)]
async fn the_emission_handed_out_is_the_soonest_due() {
    let coordinator = Coordinator::in_memory();
    let site = site("prefetch-soonest", 8, 3);
    let interval = gcra::interval_ns(site.config.rate);
    let mut handed_out = 0;
    let [prefetched, used, _, expired] = prefetch_events(async {
        let pool = prefetch::Pool::of(&coordinator);
        let identity = identity(&coordinator, site);
        let sent = Instant::now();
        for ahead_ms in [60, 30] {
            let ahead = ahead_ms * 1_000_000;
            let taken = gcra::Taken {
                extra: 2,
                ahead,
                tat: 1_000_000_000 + ahead,
            };
            pool.hold(&coordinator, &identity, (interval, 8), sent, taken);
        }
        sleep(Duration::from_millis(5)).await;
        for _ in 0..5 {
            handed_out += usize::from(pool.hand_out(&identity, interval, 8));
            sleep(INTERVAL).await;
        }
        sleep(INTERVAL * 10).await;
    })
    .await;
    assert_eq!(handed_out, 4);
    assert_eq!((prefetched, used, expired), (4, 4, 0));
}

/// Over a link whose replies take 25 ms, a take of 2 sent at 0 ms holds an emission whose slot
/// starts at 10 ms by the coordinator's clock: at 25 ms, when the reply comes, it is past.
/// Another process then takes the whole burst, 4, at 25 ms, and a call here is refused:
/// counting the deadline from the reply (35 ms) would hand the emission out, a fifth admission
/// at one instant.
#[tokio::test(start_paused = true)]
async fn a_hand_out_deadline_counts_from_the_take_s_send_not_its_reply() {
    let coordinator = Coordinator::in_memory();
    coordinator
        .scoped(async {
            let site = site("prefetch-slow-link", 4, 2);
            let start = Instant::now();
            coordinator.delay_replies_in_memory(Duration::from_millis(25));
            assert!(call(site).await);
            assert_eq!(
                start.elapsed(),
                Duration::from_millis(25),
                "the reply's delay"
            );
            coordinator.delay_replies_in_memory(Duration::ZERO);
            for _ in 0..4 {
                elsewhere(&coordinator, site).await;
            }
            assert!(!call(site).await, "the burst is spent at 25 ms");
        })
        .await;
}

/// Two takes sent at 0 ms: the first with extras due until 10, 20, 30 and 40 ms, the second
/// until 45 and 55 ms. A caller every 10 ms from 5 ms on is handed the first's four (due
/// sooner), then stops; the second's first expires at 45 ms, only 10 ms after the last hand-out:
/// its callers were active, so nothing is given back (no round trip), both simply expire. Its
/// own idleness (45 ms since its send) would give them back.
#[tokio::test(start_paused = true)]
async fn a_take_never_picked_is_not_given_back_while_its_callers_are_served() {
    let coordinator = Coordinator::in_memory();
    let site = site("prefetch-never-picked", 8, 5);
    let interval = gcra::interval_ns(site.config.rate);
    let before = coordinator.runs_in_memory();
    let mut handed_out = 0;
    let [prefetched, used, returned, expired] = prefetch_events(async {
        let pool = prefetch::Pool::of(&coordinator);
        let identity = identity(&coordinator, site);
        let sent = Instant::now();
        for (extra, ahead_ms) in [(4, 50), (2, 65)] {
            let ahead = ahead_ms * 1_000_000;
            let taken = gcra::Taken {
                extra,
                ahead,
                tat: 1_000_000_000 + ahead,
            };
            pool.hold(&coordinator, &identity, (interval, 8), sent, taken);
        }
        sleep(Duration::from_millis(5)).await;
        for _ in 0..4 {
            handed_out += usize::from(pool.hand_out(&identity, interval, 8));
            sleep(INTERVAL).await;
        }
        sleep(INTERVAL * 10).await;
    })
    .await;
    assert_eq!(handed_out, 4);
    assert_eq!(coordinator.runs_in_memory() - before, 0, "no give-back");
    assert_eq!((prefetched, used, returned, expired), (6, 4, 0, 2));
}
