//! The breaker kernel's steps, row by row of its table.

use super::*;

const SETTINGS: Settings = Settings {
    minimum_throughput: 4,
    threshold_permille: 500,
    slow_threshold_permille: 0,
    window_size: 10,
    window_ms: 1_000,
    open_ms: 100,
    half_open_probes: 2,
    half_open_successes: 2,
    probe_lease_ms: 50,
    closed_expires: true,
};

/// Observations written as the window stores them: `s`, `f`, `w`, `x`.
fn observations(letters: &str) -> Vec<Observation> {
    letters
        .chars()
        .map(|letter| Observation::from_letter(letter).expect("a window letter"))
        .collect()
}

fn observe_with(
    store: &mut Store,
    now: u64,
    generation: u64,
    letters: &str,
    settings: &Settings,
) -> ObserveReply {
    let batch = observations(letters);
    store.observe(now, generation, &batch, 77, settings, &mut Seen::default())
}

fn observe(store: &mut Store, now: u64, generation: u64, letters: &str) -> ObserveReply {
    observe_with(store, now, generation, letters, &SETTINGS)
}

fn admit(store: &mut Store, now: u64, token: Token) -> AdmitReply {
    store.admit(now, token, &SETTINGS, &mut Seen::default())
}

fn settle(
    store: &mut Store,
    now: u64,
    token: Token,
    outcome: ProbeOutcome,
    generation: u64,
) -> SettleReply {
    let seen = &mut Seen::default();
    store.settle(now, token, outcome, generation, &SETTINGS, seen)
}

fn counts(total: u32, failures: u32, slow: u32) -> Counts {
    Counts {
        total,
        failures,
        slow,
    }
}

/// How far a server's clock is behind in the tests of a failover to it.
const HOUR_MS: u64 = 3_600_000;

fn recorded(generation: u64, window: Counts) -> ObserveReply {
    ObserveReply::Recorded { generation, window }
}

fn closed(generation: u64) -> AdmitReply {
    AdmitReply::Closed {
        generation,
        transitioned: false,
    }
}

fn open_store() -> Store {
    let mut store = Store::default();
    observe(&mut store, 0, 0, "ffff");
    store
}

#[test]
fn opens_exactly_at_the_threshold_once_throughput_is_reached() {
    let mut store = Store::default();
    assert_eq!(admit(&mut store, 0, 1), closed(0));
    assert_eq!(
        observe(&mut store, 1, 0, "fff"),
        recorded(0, counts(3, 3, 0))
    );
    assert_eq!(
        observe(&mut store, 2, 0, "s"),
        ObserveReply::Opened {
            generation: 1,
            window: counts(4, 3, 0)
        }
    );
    assert_eq!(
        admit(&mut store, 50, 1),
        AdmitReply::Open {
            generation: 1,
            retry_after_ms: 52
        }
    );
}

#[test]
fn slow_calls_open_it_only_with_a_slow_call_threshold() {
    let mut store = Store::default();
    assert_eq!(
        observe(&mut store, 1, 0, "wwws"),
        recorded(0, counts(4, 0, 3)),
        "no slow-call threshold: slow successes are successes"
    );
    let slow_half = Settings {
        slow_threshold_permille: 500,
        ..SETTINGS
    };
    let mut store = Store::default();
    assert_eq!(
        observe_with(&mut store, 1, 0, "wwsx", &slow_half),
        ObserveReply::Opened {
            generation: 1,
            window: counts(4, 1, 3)
        }
    );
}

#[test]
fn a_window_bounded_by_count_and_time_is_kept_in_totals() {
    let mut store = Store::default();
    observe(&mut store, 0, 0, "sss");
    observe(&mut store, 10, 0, "sssww");
    observe(&mut store, 10, 0, "ss");
    // 3 more push out the 3 oldest, trimming inside the second entry.
    assert_eq!(
        observe(&mut store, 20, 0, "ssf"),
        recorded(0, counts(10, 1, 2))
    );
    assert_eq!(store.window.len(), 2, "the batches of ms 10 share an entry");
    // Past the window, only the newest batch remains.
    assert_eq!(
        observe(&mut store, 1_015, 0, "s"),
        recorded(0, counts(4, 1, 0))
    );
}

#[test]
fn probes_are_bounded_then_close_the_breaker() {
    let mut store = open_store();
    assert_eq!(
        admit(&mut store, 100, 1),
        AdmitReply::Probe {
            generation: 1,
            transitioned: true
        }
    );
    assert_eq!(
        admit(&mut store, 101, 2),
        AdmitReply::Probe {
            generation: 1,
            transitioned: false
        }
    );
    assert_eq!(
        admit(&mut store, 102, 3),
        AdmitReply::ProbeLimit { generation: 1 }
    );
    assert_eq!(
        settle(&mut store, 103, 1, ProbeOutcome::Success, 1),
        SettleReply::Counted {
            generation: 1,
            successes: 1
        }
    );
    assert_eq!(
        settle(&mut store, 104, 2, ProbeOutcome::Success, 1),
        SettleReply::Closed { generation: 2 }
    );
    assert_eq!(admit(&mut store, 105, 4), closed(2));
}

#[test]
fn a_probe_failure_reopens_and_supersedes_other_probes() {
    let mut store = open_store();
    admit(&mut store, 100, 1);
    admit(&mut store, 100, 2);
    assert_eq!(
        settle(&mut store, 110, 1, ProbeOutcome::Failure, 1),
        SettleReply::Reopened { generation: 2 }
    );
    assert_eq!(
        settle(&mut store, 111, 2, ProbeOutcome::Success, 1),
        SettleReply::Stale {
            phase: Phase::Open,
            generation: 2
        }
    );
}

#[test]
fn an_expired_probe_frees_its_slot_and_its_result_is_stale() {
    let mut store = open_store();
    admit(&mut store, 100, 1);
    admit(&mut store, 100, 2);
    assert_eq!(
        admit(&mut store, 150, 3),
        AdmitReply::Probe {
            generation: 1,
            transitioned: false
        }
    );
    assert_eq!(
        settle(&mut store, 151, 1, ProbeOutcome::Success, 1),
        SettleReply::Stale {
            phase: Phase::HalfOpen,
            generation: 1
        }
    );
}

#[test]
fn ignored_probes_free_the_slot_without_advancing_recovery() {
    let mut store = open_store();
    admit(&mut store, 100, 1);
    assert_eq!(
        settle(&mut store, 101, 1, ProbeOutcome::Ignored, 1),
        SettleReply::Released { generation: 1 }
    );
    assert_eq!(store.state.as_ref().map(|s| s.probe_successes), Some(0));
    assert!(store.probes.is_empty());
}

#[test]
fn results_of_an_old_generation_change_nothing() {
    let mut store = open_store();
    let before = store.clone();
    assert_eq!(
        observe(&mut store, 1, 0, "ffff"),
        ObserveReply::Stale {
            phase: Phase::Open,
            generation: 1
        }
    );
    assert_eq!(store, before);
}

#[test]
fn a_lost_state_starts_a_fresh_epoch_that_fences_earlier_results() {
    let mut store = Store::default();
    observe(&mut store, 0, 0, "sss");
    store.state = None;
    // Window data survived the state: the new epoch gets the minted generation, and the
    // result admitted before the loss (generation 0) is stale.
    assert_eq!(
        observe(&mut store, 1, 0, "f"),
        ObserveReply::Stale {
            phase: Phase::Closed,
            generation: 77
        }
    );
    assert!(store.window.is_empty());
    assert_eq!(
        observe(&mut store, 2, 77, "f"),
        recorded(77, counts(1, 1, 0))
    );
}

#[test]
fn a_closed_state_expires_no_earlier_than_its_window() {
    let mut store = Store::default();
    observe(&mut store, 0, 0, "s");
    let until = store.state.as_ref().map(|s| s.closed_until);
    assert_eq!(until, Some(SETTINGS.closed_ttl_ms()));
    assert!(SETTINGS.closed_ttl_ms() >= SETTINGS.window_ms);
    assert_eq!(
        admit(&mut store, SETTINGS.closed_ttl_ms() - 1, 1),
        closed(0)
    );
    assert!(store.live_state(SETTINGS.closed_ttl_ms()).is_none());
}

#[test]
fn open_and_half_open_never_expire() {
    assert!(open_store().live_state(u64::MAX / 2).is_some());
}

fn force(store: &mut Store, now: u64, force: Force) -> ForceReply {
    store.force(now, force, &mut Seen::default())
}

/// Opened at a server time an hour after now (a failover to a replica whose clock is behind):
/// the open time runs from now, and the breaker probes after it, not an hour later.
#[test]
fn an_open_time_stored_after_now_runs_from_now() {
    let mut store = Store::default();
    observe(&mut store, HOUR_MS, 0, "ffff");
    assert_eq!(
        admit(&mut store, 10, 1),
        AdmitReply::Open {
            generation: 1,
            retry_after_ms: 100
        }
    );
    assert_eq!(
        admit(&mut store, 100, 2),
        AdmitReply::Open {
            generation: 1,
            retry_after_ms: 10
        },
        "from the first admission that saw it"
    );
    assert_eq!(
        admit(&mut store, 110, 3),
        AdmitReply::Probe {
            generation: 1,
            transitioned: true
        }
    );
}

/// Observations recorded an hour after now (a failover to a replica whose clock is behind):
/// they leave the window at the next record, so it slides on from now rather than holding
/// every later entry until the clock catches up.
#[test]
fn window_entries_stamped_after_now_leave_at_the_next_record() {
    let mut store = Store::default();
    observe(&mut store, HOUR_MS, 0, "ss");
    assert_eq!(
        observe(&mut store, 10, 0, "ss"),
        recorded(0, counts(2, 0, 0)),
        "the entry after now left"
    );
    assert_eq!(
        observe(&mut store, 1_010, 0, "s"),
        recorded(0, counts(1, 0, 0)),
        "the window slides from now"
    );
}

#[test]
fn forced_open_rejects_until_it_lapses_then_probes() {
    let mut store = Store::default();
    observe(&mut store, 0, 0, "ss");
    assert_eq!(
        force(&mut store, 10, Force::Open { lasts_ms: 100 }),
        ForceReply {
            from: Phase::Closed,
            generation: 1
        }
    );
    assert!(store.window.is_empty());
    assert_eq!(
        admit(&mut store, 60, 1),
        AdmitReply::ForcedOpen {
            generation: 1,
            retry_after_ms: Some(50)
        }
    );
    assert_eq!(
        observe(&mut store, 61, 1, "ffff"),
        ObserveReply::Stale {
            phase: Phase::ForcedOpen,
            generation: 1
        },
        "observations never change a forced state"
    );
    assert_eq!(
        admit(&mut store, 110, 2),
        AdmitReply::Probe {
            generation: 1,
            transitioned: true
        },
        "lapsed: half-open, as after an open time"
    );
}

#[test]
fn forced_states_hold_until_a_reset_without_an_end() {
    let mut store = Store::default();
    force(&mut store, 0, Force::Open { lasts_ms: 0 });
    assert_eq!(
        admit(&mut store, u64::MAX / 2, 1),
        AdmitReply::ForcedOpen {
            generation: 1,
            retry_after_ms: None
        }
    );
    assert_eq!(
        force(&mut store, 5, Force::Closed { lasts_ms: 0 }),
        ForceReply {
            from: Phase::ForcedOpen,
            generation: 2
        }
    );
    assert_eq!(
        admit(&mut store, 6, 2),
        AdmitReply::ForcedClosed {
            generation: 2,
            lapses_in_ms: None
        }
    );
    assert_eq!(
        force(&mut store, 7, Force::Reset { closed_ttl_ms: 100 }),
        ForceReply {
            from: Phase::ForcedClosed,
            generation: 3
        }
    );
    assert_eq!(admit(&mut store, 8, 3), closed(3));
    assert!(
        store.live_state(107).is_none(),
        "the reset's closed state expires"
    );
}

#[test]
fn forced_closed_admits_unrecorded_then_lapses_to_closed() {
    let mut store = open_store();
    force(&mut store, 0, Force::Closed { lasts_ms: 50 });
    assert_eq!(
        admit(&mut store, 49, 1),
        AdmitReply::ForcedClosed {
            generation: 2,
            lapses_in_ms: Some(1)
        }
    );
    assert_eq!(
        admit(&mut store, 50, 1),
        AdmitReply::Closed {
            generation: 2,
            transitioned: true
        }
    );
    assert_eq!(
        observe(&mut store, 51, 2, "ffff"),
        ObserveReply::Opened {
            generation: 3,
            window: counts(4, 4, 0)
        }
    );
}
