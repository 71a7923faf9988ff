//! The state of the modelled world: the server, each process and its lane, each caller, the
//! fencing downstream, the faults left, and the ghost facts the properties read (a ghost
//! field is one the protocol has no access to: marked so on each).

use crate::config::LossKind;

/// A caller's index.
pub type CallerId = u8;
/// A process's index.
pub type ProcId = u8;

/// A time, in ticks *relative to now* (no drift between clocks: the margin is slack here).
/// Every tick moves every time stored one tick into the past, so two situations that differ
/// only in when they happen are one state. A deadline that passed is kept at 0 (passed); an
/// age is kept no older than the oldest that still makes a difference.
pub type Tick = i8;

/// A fencing token, *relative to the server clock's term* (`server now × scale`, which is 0 by
/// this convention): a tick takes every token `scale` lower. Tokens far enough below the clock
/// that no failover left could bring the clock back below them are renumbered to consecutive
/// values, keeping their order (their distances no longer matter).
pub type Fence = i16;

/// The whole world.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// The Redis server (one identity's keys).
    pub server: Server,
    /// The processes.
    pub procs: Vec<Proc>,
    /// The callers of the bulkhead, each in one process.
    pub callers: Vec<Caller>,
    /// A downstream that refuses any fencing token lower than one it accepted.
    pub downstream: Downstream,
    /// The faults the run may still suffer.
    pub faults: Faults,
    /// Ghost: what the step into this state did, one bit per [`Seen`] (for the `sometimes`
    /// properties). Only the last step's: a history of every fact would multiply the states by
    /// every combination of facts.
    pub seen: u32,
    /// Ghost: every fact seen so far that breaks a property ([`Seen::breaks`]), one bit each.
    pub broken: u32,
}

/// Something a step did, for the properties.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Seen {
    /// A process noticed a loss.
    LossNoticed,
    /// A holder was cancelled because its process noticed a loss.
    CancelledByLoss,
    /// A caller was refused because its process noticed a loss less than a grace ago.
    RefusedForGrace,
    /// A caller was admitted by a process that had noticed a loss, after the grace.
    AdmittedAfterGrace,
    /// A process resumed from a freeze and cancelled a holder past its trust deadline.
    FrozenCaught,
    /// A command found the fencing counter below a token its process trusted.
    CounterBelowKnown,
    /// The downstream refused a write with a token lower than one it accepted.
    StaleWriteRefused,
    /// A caller was admitted on a command served after a loss its process had not noticed.
    AdmittedBlind,
    /// A process noticed a loss that had not happened (or that it had noticed already).
    FalseNotice,
    /// A holder gave up its lease at its trust deadline while the server still held it, with
    /// no loss: a needless `LeaseLost`.
    NeedlessLoss,
    /// A granted acquire arrived past its trust deadline (`AdmissionExpired`).
    AdmissionExpired,
    /// A release was sent again after a failed attempt.
    ReleaseRetried,
    /// A renewal denied for a lease still trusted was taken for a loss.
    DeniedRenewalNoticed,
    /// An acquire waited in its lane behind a call in flight.
    Queued,
    /// Two acquires of one lane went out as one batch.
    Batched,
    /// A process that could reach the server all along noticed a loss later than the check
    /// period after it.
    LateNotice,
    /// A process that could reach the server all along refused a caller for the grace later
    /// than the loss + the check period + the grace.
    LateRefusal,
    /// A finished body's lease was kept for the next caller of its process.
    Kept,
    /// A new body started on a kept lease, with no round trip.
    Reused,
    /// A kept lease was returned (released) by its timer.
    ReturnedByTimer,
    /// A kept lease was returned because its process shut down.
    ReturnedAtClose,
    /// A kept lease was returned by a caller that could not take it (the rules said no).
    ReturnedUnusable,
    /// A finished body's lease was released, not kept: the fleet was full at its latest reply.
    NotKeptFull,
    /// A body read a fencing token an earlier body had read.
    TokenReread,
}

impl Seen {
    /// Whether this fact breaks a property (so it is kept in [`State::broken`]).
    pub fn breaks(self) -> bool {
        matches!(
            self,
            Seen::FalseNotice | Seen::LateNotice | Seen::LateRefusal | Seen::TokenReread
        )
    }

    /// This fact's bit in [`State::seen`].
    pub fn bit(self) -> u32 {
        1 << self as u8
    }
}

impl State {
    /// Records that the step into this state did `fact`.
    pub fn saw(&mut self, fact: Seen) {
        self.seen |= fact.bit();
        if fact.breaks() {
            self.broken |= fact.bit();
        }
    }

    /// Whether `fact`, which breaks a property, ever happened.
    pub fn has_broken(&self, fact: Seen) -> bool {
        self.broken & fact.bit() != 0
    }

    /// Whether the step into this state did `fact`.
    pub fn has_seen(&self, fact: Seen) -> bool {
        self.seen & fact.bit() != 0
    }
}

/// One identity's keys on the server, and its clock.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Server {
    /// Ghost: how many times it lost its data (its incarnation; also what a `run_id`, or a
    /// check that can see a flush, tells a process).
    pub incarnation: u8,
    /// The kind of the last loss.
    pub last_loss: Option<LossKind>,
    /// The lease set: token → deadline. Expired leases are pruned at once (the script
    /// ignores them the same way).
    pub leases: Vec<(u8, Tick)>,
    /// The fencing counter (`None`: no key). It is never dropped but by a loss: the script
    /// keeps it a lease past every lease granted or renewed, so it outlives every lease that
    /// any process trusts, and a grant after it expired takes the clock's term, above every
    /// token then.
    pub counter: Option<Fence>,
    /// Ghost: when it last lost its data (an age, no older than the notice bound + the grace
    /// + 1), until every process noticed it and no grace of it is left.
    pub lost_at: Option<Tick>,
    /// Ghost: the next grant's order (orders are renumbered to the grants still in view).
    pub grants: u8,
    /// Ghost: the highest token ever granted.
    pub max_fence: Option<Fence>,
    /// Ghost: a grant got a token not above one granted before.
    pub forgot: bool,
}

/// One process: its view of the server, its faults, its lane.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Proc {
    /// Moves on when it notices a loss; every holder checks it before each step. Rebased to 1
    /// after every step (what a holder compares is only whether it is still the same).
    pub epoch: u8,
    /// The last incarnation it noticed.
    pub knows: u8,
    /// When it last noticed a loss (an age, no older than the grace + 1: the grace runs from
    /// there).
    pub lost_at: Option<Tick>,
    /// Stopped (SIGSTOP): it takes no step, its timers fire when it resumes.
    pub frozen: bool,
    /// Cut off from the server: its commands fail, it hears no published notice.
    pub partitioned: bool,
    /// By when its periodic check notices a failover or a flush it has not noticed.
    pub check_by: Option<Tick>,
    /// A published notice on its way to it: the incarnation, and by when it arrives.
    pub hear: Option<(u8, Tick)>,
    /// The identity's acquire lane: one call in flight at a time.
    pub lane: Lane,
    /// Ghost: it was frozen or partitioned at some moment since a loss it has not noticed.
    pub cut_off: bool,
    /// Ghost: it noticed its latest loss after a freeze or a partition, so its grace may end
    /// later than the loss + the check period + the grace.
    pub noticed_late: bool,
    /// Ghost: the latest incarnation of the server that a renewal of its revealed, by being
    /// denied for a lease still trusted (only a loss removes one), whether it noticed or not.
    pub told: u8,
    /// Its pool of kept leases, the most recently kept last (handed on first).
    pub kept: Vec<Kept>,
    /// The highest fencing token a body of the identity read here (kept only with `keep`).
    pub highest_read: Option<Fence>,
    /// How many times it reconnected to the server; rebased to 1 after every step like the
    /// epoch (a lease compares only whether it was confirmed since the latest).
    pub reconnections: u8,
    /// Shut down: its pool is closed, nothing is kept or handed on any more.
    pub closed: bool,
}

/// A kept lease: a finished body's, owned by its process until a new body takes it or it is
/// returned.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Kept {
    /// The lease as its last holder left it (no renewal in flight: a lease is kept only with
    /// every renewal answered).
    pub lease: Holder,
    /// Until when it waits for a caller (0: its timer returns it).
    pub until: Tick,
}

/// An identity's acquire lane in one process: the call in flight and what waits behind it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Lane {
    /// The call in flight.
    pub flight: Option<Flight>,
    /// Acquires waiting for it to be answered, oldest first.
    pub queue: Vec<CallerId>,
}

/// A lease command on its way: to the server, then (its reply) back.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Command {
    /// When it was sent (an age).
    pub sent: Tick,
    /// The highest fencing token its process trusted when it was sent.
    pub known: Option<Fence>,
    /// Ghost: the incarnation that granted the lease whose token `known` is.
    pub known_incarnation: u8,
    /// Ghost: the highest fencing token its process trusted when it was sent, carried or
    /// not (what `known` would be if it were carried).
    pub trusted: Option<Fence>,
    /// By when it reaches the server (request) or its process (reply).
    pub by: Tick,
    /// Its process's reconnections when it was sent.
    pub conn: u8,
}

/// One acquire script call: a batch of tokens.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Flight {
    /// The callers it asks for, in order.
    pub members: Vec<CallerId>,
    /// The call.
    pub command: Command,
    /// The server's replies, once it was served.
    pub replies: Option<Vec<Reply>>,
}

/// The answer to one request of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reply {
    /// A lease was granted.
    Granted {
        /// Its fencing token.
        fence: Fence,
        /// Ghost: its order among all grants.
        order: u8,
        /// Ghost: the server's incarnation when it granted.
        incarnation: u8,
        /// Ghost: granted after a loss the process had not noticed.
        blind: bool,
        /// How many leases the set holds with it (kept only with `keep`).
        occupancy: u8,
    },
    /// The lease was renewed.
    Renewed {
        /// How many leases the set holds (kept only with `keep`).
        occupancy: u8,
    },
    /// Refused: full (acquire) or gone (renew).
    Denied,
    /// The whole command was refused: the counter was below the process's live token.
    Lost {
        /// The incarnation the process learns of.
        incarnation: u8,
    },
    /// No answer: a timeout, a broken connection, a partition.
    Failed,
}

/// A caller of the bulkhead, and its traffic outside the lane.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Caller {
    /// Where it is.
    pub phase: Phase,
    /// How many acquisitions it may still attempt.
    pub uses: u8,
    /// A write of its body on its way to the downstream.
    pub write: Option<Write>,
}

/// A caller's phase.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Not in the bulkhead.
    Idle,
    /// Its acquire waits in the lane or is in flight.
    Acquiring {
        /// Its process's epoch when it asked.
        epoch: u8,
        /// When it joined the lane (an age; kept only when trust counts from there).
        joined: Tick,
    },
    /// Its body runs under a lease.
    Holding(Holder),
    /// Its body ended and its release failed (cut off from the server): it is sent again at
    /// every tick until it lands or the lease is over.
    Releasing {
        /// The lease's token.
        token: u8,
        /// Until when to retry.
        until: Tick,
    },
}

/// A held lease, as its holder sees it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Holder {
    /// The lease's token in the set.
    pub token: u8,
    /// Its fencing token.
    pub fence: Fence,
    /// Its trust deadline: trusted while it is ahead (0: passed).
    pub trust: Tick,
    /// When the next renewal is due (0: due).
    pub renew_at: Tick,
    /// Its renewal in flight.
    pub renewing: Option<Renewal>,
    /// Its process's epoch when the acquire was asked.
    pub epoch: u8,
    /// Whether the body already wrote to the downstream (one write per lease).
    pub wrote: bool,
    /// Ghost: the server's incarnation that granted it.
    pub incarnation: u8,
    /// Ghost: its order among all grants.
    pub order: u8,
    /// Ghost: granted after a loss its process had not noticed, on a command whose trusted
    /// token, carried, would not have revealed it (see `LeaseModel::serve`).
    pub blind: bool,
    /// The occupancy the latest reply about the lease showed (kept only with `keep`).
    pub occupancy: u8,
    /// A renewal was sent that no reply confirmed yet (a failed one stays unanswered until a
    /// later one is confirmed).
    pub unanswered: bool,
    /// Its process's reconnections when the latest request the server confirmed was sent.
    pub conn: u8,
    /// Ghost: an earlier body on this lease read its fencing token.
    pub read_before: bool,
}

/// A renewal in flight: renewals go out on their own, not through the lane.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Renewal {
    /// The call.
    pub command: Command,
    /// The server's reply, once it ran it.
    pub reply: Option<Reply>,
}

/// A write of a body to the downstream, in flight.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Write {
    /// The writer's fencing token.
    pub fence: Fence,
    /// Ghost: the writer's lease's order among all grants.
    pub order: u8,
    /// By when it lands.
    pub by: Tick,
}

/// A downstream that remembers the highest fencing token it accepted.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Downstream {
    /// The highest token accepted.
    pub max_fence: Option<Fence>,
    /// Ghost: the latest-granted lease whose write it accepted (its order).
    pub newest: Option<u8>,
    /// Ghost: it accepted a write of a lease granted before one whose write it had accepted.
    pub stale_accepted: bool,
}

/// The faults the run may still suffer.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Faults {
    /// Losses of the server's data left.
    pub losses: u8,
    /// Freezes left.
    pub freezes: u8,
    /// Partitions left.
    pub partitions: u8,
    /// Shutdowns left.
    pub closes: u8,
}
