//! The view's ordering rule and its bounds.

use super::view::{Applied, Lapse};
use super::*;
use crate::coordinator::feed::Origin;
use crate::identity::{PolicyKind, Scope};
use crate::policy::breaker::kernel::Observation;

fn identity() -> Identity {
    Identity::new("ns", PolicyKind::CircuitBreaker, "p", "op", &Scope::GLOBAL)
}

/// A test's clock: instants `ms` after its start.
struct Clock(Instant);

impl Clock {
    fn at(&self, ms: u64) -> Instant {
        self.0 + Duration::from_millis(ms)
    }

    /// An answer asked at `asked` and received at `received` (ms).
    fn answer(
        &self,
        (phase, generation): (Phase, u64),
        (asked, received): (u64, u64),
        stamp: Option<u64>,
    ) -> Learned {
        Learned {
            phase,
            generation,
            probe_due: None,
            lapse: Lapse::Unknown,
            asked: self.at(asked),
            received: self.at(received),
            stamp,
            answers_question: true,
        }
    }
}

fn state(views: &HashMap<KeyBase, View>, key: &KeyBase) -> (Phase, u64) {
    (views[key].phase, views[key].generation)
}

/// The race behind a failure storm running past its threshold: this process's batch that
/// opened the breaker was asked first but reached the server last (it is sent from a
/// background task), and an admission asked after it was decided by the server before
/// it. Its late answer must not close the view again; a later decision still may, even
/// under a lower generation (a lost state's new epoch).
#[test]
fn an_answer_the_server_gave_earlier_does_not_roll_the_view_back() {
    let (identity, clock) = (identity(), Clock(Instant::now()));
    let key = &identity.key;
    let mut views = HashMap::new();
    let closed = (Phase::Closed, 0);
    learn_in(
        &mut views,
        key,
        Some(&identity),
        clock.answer(closed, (0, 1), Some(10)),
    );
    let opened = clock.answer((Phase::Open, 1), (1, 5), Some(30));
    let change = learn_in(&mut views, key, Some(&identity), opened).change();
    assert_eq!(change.map(|change| change.to), Some(Phase::Open));
    let late = clock.answer(closed, (2, 6), Some(20));
    assert_eq!(
        learn_in(&mut views, key, Some(&identity), late),
        Applied::Dropped
    );
    assert_eq!(state(&views, key), (Phase::Open, 1));

    let new_epoch = clock.answer(closed, (3, 7), Some(40));
    let change = learn_in(&mut views, key, Some(&identity), new_epoch).change();
    assert_eq!(change.map(|change| change.to), Some(Phase::Closed));
    assert_eq!(views[key].stamp, Some(40));
}

/// A message without a stamp (from a version that wrote none) leaves nothing to compare
/// a late stamped answer with: the answer is judged by its generation and by when it was
/// asked.
#[test]
fn after_an_unstamped_message_a_late_answer_is_still_dropped() {
    let (identity, clock) = (identity(), Clock(Instant::now()));
    let key = &identity.key;
    let mut views = HashMap::new();
    let closed = (Phase::Closed, 4);
    learn_in(
        &mut views,
        key,
        Some(&identity),
        clock.answer(closed, (0, 1), Some(100)),
    );
    let opened = clock.answer((Phase::Open, 5), (3, 3), None);
    assert!(learn_in(&mut views, key, None, opened).change().is_some());
    let late = clock.answer(closed, (2, 4), Some(150));
    assert_eq!(
        learn_in(&mut views, key, Some(&identity), late),
        Applied::Dropped
    );
    assert_eq!(state(&views, key), (Phase::Open, 5));
}

/// Making room among a full map of views keeps the one whose batch is still in flight,
/// though it is the oldest closed view: forgetting it would let the admissions waiting for
/// that batch's verdict ask the coordinator before the batch reaches it.
#[test]
fn a_view_with_a_batch_in_flight_is_not_forgotten() {
    let clock = Clock(Instant::now());
    let mut views = HashMap::new();
    let identities: Vec<_> = (0..MAX_VIEWS)
        .map(|i| {
            let scope = Scope::new(format!("s{i}")).expect("scope");
            Identity::new("ns", PolicyKind::CircuitBreaker, "p", "op", &scope)
        })
        .collect();
    for (i, identity) in (0u64..).zip(&identities) {
        let answer = clock.answer((Phase::Closed, 0), (i, i), Some(i));
        learn_in(&mut views, &identity.key, Some(identity), answer);
    }
    let oldest = &identities[0].key;
    let in_flight = views.get_mut(oldest).expect("the oldest view");
    in_flight.sent(0, &[Observation::default()]);
    let newcomer = identity();
    let answer = clock.answer((Phase::Closed, 0), (0, 0), Some(0));
    learn_in(&mut views, &newcomer.key, Some(&newcomer), answer);
    assert!(views.len() <= MAX_VIEWS);
    assert!(
        views.contains_key(oldest),
        "the view with a batch in flight was forgotten"
    );
    assert!(!views.contains_key(&identities[1].key));
}

/// A failover to a server whose clock is behind (or a clock step) makes every new stamp
/// lower than the one the view holds; answers to questions asked after the view's last
/// answer arrived are later all the same, and the view moves on.
#[test]
fn a_server_clock_turned_back_does_not_freeze_the_view() {
    let (identity, clock) = (identity(), Clock(Instant::now()));
    let key = &identity.key;
    let mut views = HashMap::new();
    let opened = clock.answer((Phase::Open, 2), (0, 1), Some(5_000_000));
    learn_in(&mut views, key, Some(&identity), opened);
    let probe = clock.answer((Phase::HalfOpen, 2), (2, 3), Some(1_000_000));
    let change = learn_in(&mut views, key, Some(&identity), probe).change();
    assert_eq!(change.map(|change| change.to), Some(Phase::HalfOpen));
    let closed = clock.answer((Phase::Closed, 3), (4, 5), Some(1_000_100));
    learn_in(&mut views, key, Some(&identity), closed);
    assert_eq!(state(&views, key), (Phase::Closed, 3));
    assert_eq!(views[key].confirmed, clock.at(4));
}

/// Another process's probe closed generation 7; then this process's batch opened
/// generation 8, and its reply arrived before the pub/sub message about the close (the
/// subscription has no order with the command connections). The late message must not
/// roll the view back to closed: a message answers no question of this process, so only
/// its stamp says when it was decided. One decided later is still taken, also after a
/// server clock turned back once a reply has brought the view onto the new clock.
#[test]
fn a_late_message_does_not_roll_an_open_view_back() {
    let identity = identity();
    let key = &identity.key;
    let breakers = Breakers::default();
    // This answer arrived before the messages, which are taken at `Instant::now()`.
    let clock = Clock(Instant::now() - Duration::from_secs(1));
    let message = |phase, generation, stamp| Transition {
        own: false,
        origin: Origin::Call,
        key: key.clone(),
        phase,
        generation,
        stamp: Some(stamp),
    };
    let opened = clock.answer((Phase::Open, 8), (0, 1), Some(2_000));
    learn_in(&mut lock(&breakers.views), key, Some(&identity), opened);
    let _ = breakers.on_message(message(Phase::Closed, 7, 1_000));
    assert_eq!(state(&lock(&breakers.views), key), (Phase::Open, 8));

    let _ = breakers.on_message(message(Phase::HalfOpen, 8, 3_000));
    assert_eq!(state(&lock(&breakers.views), key), (Phase::HalfOpen, 8));

    // Asked after the messages arrived: decided later, whatever its stamp says.
    let after_them = Clock(Instant::now() + Duration::from_millis(1));
    let turned_back = after_them.answer((Phase::HalfOpen, 8), (0, 0), Some(500));
    learn_in(
        &mut lock(&breakers.views),
        key,
        Some(&identity),
        turned_back,
    );
    let _ = breakers.on_message(message(Phase::Closed, 9, 400));
    assert_eq!(state(&lock(&breakers.views), key), (Phase::HalfOpen, 8));
    let _ = breakers.on_message(message(Phase::Closed, 9, 600));
    assert_eq!(state(&lock(&breakers.views), key), (Phase::Closed, 9));
}

/// A breaker's payload, as the scripts publish it (with or without a stamp), reads; anything
/// else is no breaker's.
#[test]
fn transition_messages_read_and_anything_else_is_ignored() {
    use crate::coordinator::feed::{self, Message};

    let key = identity().key;
    let read = |message: &str| match feed::parse(message) {
        Some(Message::Identity(heard)) => Transition::read(&heard),
        _ => None,
    };
    let message = format!(
        "{}:3:7:1764536400123456",
        feed::prefix(Origin::Operator, &key)
    );
    assert_eq!(
        read(&message),
        Some(Transition {
            own: true,
            origin: Origin::Operator,
            key: key.clone(),
            phase: Phase::ForcedOpen,
            generation: 7,
            stamp: Some(1_764_536_400_123_456),
        })
    );
    let other = format!("0000000000000000:call:{}:1:2", key.tag());
    assert!(matches!(
        read(&other),
        Some(t) if !t.own && t.origin == Origin::Call && t.stamp.is_none()
    ));
    for bad in [
        format!("x:call:{}:9:1", key.tag()),
        format!("0000000000000000:call:{}:1", key.tag()),
        format!("0000000000000000:call:{}:1:x", key.tag()),
        format!("0000000000000000:call:{}:1:2:x", key.tag()),
        format!("0000000000000000:call:{}:1:2:3:4", key.tag()),
    ] {
        assert_eq!(read(&bad), None, "{bad:?}");
    }
}
