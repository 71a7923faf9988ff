//! The queues of commands sent until a deadline (see [`until`](super::until)), one per route:
//! what the link holds, below the sending that fills and drains them.

use tokio::time::Instant;

use crate::coordinator::background::Parked;
use crate::error::Error;
use crate::identity::KeyBase;
use crate::kernel::Plain;

/// Where commands sent until a deadline queue: one identity, and the plain command they go out
/// together as.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(super) struct Route {
    pub(super) key: KeyBase,
    pub(super) verb: &'static str,
    pub(super) suffix: &'static str,
}

impl Route {
    /// The route of `plain` commands for `key`'s identity.
    pub(super) fn new(key: &KeyBase, plain: Plain) -> Self {
        Route {
            key: key.clone(),
            verb: plain.verb,
            suffix: plain.key,
        }
    }
}

/// The commands of one route: how many calls are in flight, the commands waiting to go out
/// together (new ones, and those whose call may not have run), and whether a retry of the
/// latter is scheduled.
#[derive(Default)]
pub(super) struct Queue {
    pub(super) in_flight: u32,
    pub(super) waiting: Vec<Resend>,
    pub(super) retry_scheduled: bool,
    /// The batches sent, while their work may be on its shelf: the identity's next script call
    /// carries them (see [`Background::alongside`](crate::coordinator::background::Background::alongside)).
    pub(super) sent: Vec<Parked>,
}

impl Queue {
    /// Takes everything waiting as the next batch to send, counted in flight.
    pub(super) fn take(&mut self) -> Option<Vec<Resend>> {
        if self.waiting.is_empty() {
            return None;
        }
        self.in_flight += 1;
        Some(std::mem::take(&mut self.waiting))
    }

    pub(super) fn idle(&self) -> bool {
        self.in_flight == 0 && self.waiting.is_empty() && !self.retry_scheduled
    }
}

/// One command: its arguments as encoded, until when it is worth sending, and who hears how
/// it ended.
pub(super) struct Resend {
    pub(super) args: Vec<Vec<u8>>,
    pub(super) until: Instant,
    pub(super) done: Box<dyn FnOnce(Result<bool, Error>) + Send>,
}
