//! What this process knows of each fleet-wide window of deposits and withdrawals, so that
//! neither costs an awaited round trip.
//!
//! A view holds the fleet's totals as the coordinator last answered them, and this process's
//! own counts since: those sent and not yet answered, and those not yet sent. A withdrawal is
//! decided from their sum at once. Counts go out in the background, at most one batch per
//! identity in flight: [`REFRESH`] after the first count a batch holds, or as soon as it holds
//! [`MAX_UNSENT`]; each answer is the fleet's new totals. What a view cannot see is what the
//! other processes counted since its last answer: that is the staleness the module docs of the
//! kind bound.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::kernel::{Allowance, Record, Slide, Totals, allows};
use crate::Error;
use crate::coordinator::Coordinator;
use crate::identity::{Identity, KeyBase};
use crate::sync::lock;

/// How long counts wait to be sent together.
pub(crate) const REFRESH: Duration = Duration::from_millis(100);
/// The most counts a batch waits with: past it the batch goes out at once.
pub(crate) const MAX_UNSENT: u64 = 256;

/// A coordinator's views, one per identity.
#[derive(Debug, Default)]
pub(crate) struct Views(Mutex<HashMap<KeyBase, View>>);

#[derive(Debug, Default)]
struct View {
    /// The fleet's totals as last answered, and when.
    learnt: Totals,
    learnt_at: Option<Instant>,
    /// Sent, not yet answered.
    in_flight: Option<Totals>,
    unsent: Totals,
    /// Whether a send is due (its timer runs, or a batch is in flight and sends on its answer).
    due: bool,
    /// Whether the last batch failed: decisions are then made from a view not refreshed.
    failing: bool,
}

impl View {
    /// What the view says the window holds at `now`: the fleet's last totals (none once they
    /// are a window old) and every own count since.
    fn totals(&self, now: Instant, window: Duration) -> Totals {
        let learnt = match self.learnt_at {
            Some(at) if now.duration_since(at) < window => self.learnt,
            _ => Totals::default(),
        };
        learnt
            .plus(self.in_flight.unwrap_or_default())
            .plus(self.unsent)
    }
}

/// A withdrawal's decision: whether it was made, what the view said, and whether the view was
/// refreshed by its last batch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Decided {
    pub(crate) allowed: bool,
    pub(crate) seen: Totals,
    pub(crate) stale: bool,
}

/// A batch's answer, handed to whoever reports failures.
pub(crate) type OnFailure = fn(&Identity, &Error);

impl Views {
    /// Counts `counts` into `identity`'s view (a deposit, or a withdrawal if `allowance`
    /// allows it), and sends what is due.
    pub(crate) fn count(
        coordinator: &Coordinator,
        identity: &Identity,
        window: Duration,
        withdrawal: Option<&Allowance>,
        on_failure: OnFailure,
    ) -> Decided {
        let views = coordinator.kept::<Views>();
        let (decided, send) = {
            let mut views = lock(&views.0);
            let view = views.entry(identity.key.clone()).or_default();
            let seen = view.totals(Instant::now(), window);
            let allowed = withdrawal.is_none_or(|allowance| allows(seen, allowance));
            if allowed {
                let added = match withdrawal {
                    Some(_) => Totals {
                        deposits: 0,
                        withdrawals: 1,
                    },
                    None => Totals {
                        deposits: 1,
                        withdrawals: 0,
                    },
                };
                view.unsent = view.unsent.plus(added);
            }
            let decided = Decided {
                allowed,
                seen,
                stale: view.failing,
            };
            let full = view.unsent.deposits + view.unsent.withdrawals >= MAX_UNSENT;
            let send = if view.in_flight.is_none() && full {
                Send::Now(take(view))
            } else if !view.due && allowed {
                view.due = true;
                Send::Later
            } else {
                Send::Nothing
            };
            (decided, send)
        };
        send.start(coordinator, identity, window, on_failure);
        decided
    }
}

/// Moves a view's unsent counts in flight.
fn take(view: &mut View) -> Totals {
    let counts = std::mem::take(&mut view.unsent);
    view.in_flight = Some(counts);
    counts
}

/// What is to be sent after a count.
enum Send {
    Now(Totals),
    Later,
    Nothing,
}

impl Send {
    fn start(
        self,
        coordinator: &Coordinator,
        identity: &Identity,
        window: Duration,
        on_failure: OnFailure,
    ) {
        match self {
            Send::Nothing => {}
            Send::Now(counts) => send(coordinator, identity.clone(), window, counts, on_failure),
            Send::Later => {
                let later = coordinator.clone();
                let identity = identity.clone();
                coordinator.in_background(async move {
                    tokio::time::sleep(REFRESH).await;
                    flush(&later, &identity, window, on_failure);
                });
            }
        }
    }
}

/// Sends `identity`'s unsent counts, unless a batch is in flight (its answer sends them).
fn flush(coordinator: &Coordinator, identity: &Identity, window: Duration, on_failure: OnFailure) {
    let views = coordinator.kept::<Views>();
    let counts = {
        let mut views = lock(&views.0);
        let Some(view) = views.get_mut(&identity.key) else {
            return;
        };
        // A batch in flight sends these on its answer.
        if view.in_flight.is_some() {
            return;
        }
        view.due = false;
        if view.unsent == Totals::default() {
            return;
        }
        take(view)
    };
    send(coordinator, identity.clone(), window, counts, on_failure);
}

/// Sends `counts` in the background; the answer refreshes the view and sends what gathered
/// meanwhile.
fn send(
    coordinator: &Coordinator,
    identity: Identity,
    window: Duration,
    counts: Totals,
    on_failure: OnFailure,
) {
    let window_ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX);
    let sender = coordinator.clone();
    coordinator.in_background(async move {
        let reply = sender
            .run::<Slide>(&identity, Record::new(counts, window_ms))
            .await;
        if let Err(error) = &reply {
            on_failure(&identity, error);
        }
        let views = sender.kept::<Views>();
        let next = {
            let mut views = lock(&views.0);
            let Some(view) = views.get_mut(&identity.key) else {
                return;
            };
            view.in_flight = None;
            match reply {
                Ok(totals) => {
                    view.learnt = totals;
                    view.learnt_at = Some(Instant::now());
                    view.failing = false;
                }
                // Whether the server counted them is unknown: dropped, as a lost batch would
                // be, so a retried batch never counts twice.
                Err(_) => view.failing = true,
            }
            let pending = view.unsent.deposits + view.unsent.withdrawals;
            if pending >= MAX_UNSENT {
                Send::Now(take(view))
            } else if pending > 0 {
                view.due = true;
                Send::Later
            } else {
                view.due = false;
                Send::Nothing
            }
        };
        next.start(&sender, &identity, window, on_failure);
    });
}
