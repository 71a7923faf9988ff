//! What a run of the model is made of: the fleet, the timing (in ticks), the faults it may
//! suffer, and the protocol variants a test can switch to see what breaks.

/// How the server lost its data, which decides how a process can notice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LossKind {
    /// A restart without persistence: every connection breaks, so every process that can run
    /// and reach the server reconnects at once, reads a new `run_id` and notices before any
    /// command of its is served again.
    Restart,
    /// A replica promoted in the primary's place. Connections are not broken (a proxy, a
    /// virtual address): the `run_id` changes, noticed by the periodic check, by any
    /// reconnection, or by a command that finds the fencing counter below a live token. The
    /// promoted server's clock may be behind ([`Config::clock_back`]).
    Failover,
    /// `FLUSHALL` (or an eviction): same server, same `run_id`, same connections. Noticed by the
    /// periodic check (assumed to be able to see a flush), or by a command that finds the
    /// counter below a live token, or by a renewal that finds a trusted lease gone.
    Flush,
}

impl LossKind {
    /// Whether a reconnection reveals the loss (the `run_id` changed).
    pub fn changes_run_id(self) -> bool {
        matches!(self, LossKind::Restart | LossKind::Failover)
    }
}

/// From when a holder counts its trust (and its next renewal).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TrustFrom {
    /// From when the batch that carried the request was sent: the rule.
    BatchSend,
    /// From when the request joined its identity's lane, which may be a round trip earlier
    /// (the old code): earlier than needed, so never unsafe, but a holder gives up sooner.
    LaneJoin,
    /// From when the reply arrived: later than the server's decision, so a lease could be
    /// trusted past its expiry at the server. Wrong on purpose, for a test.
    Reply,
}

/// A rule of lease keeping ([`Config::keep`]) a test may switch off to see what breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeepRule {
    /// Kept and handed on only while the latest reply showed the fleet below its limit.
    Occupancy,
    /// Not kept once a body read its fencing token.
    Unread,
    /// Kept only when every renewal sent was answered.
    Answered,
    /// Handed on only in the epoch it was granted in (not once its process noticed a loss).
    Epoch,
    /// Handed on only while trusted with no renewal due (trusted as long as a lease just
    /// granted).
    Trusted,
    /// Handed on only if confirmed by a request sent since the latest reconnection.
    Confirmed,
    /// Handed on only if its token is not below one a body of its process read.
    HighestRead,
    /// Kept in the server's lease set, counted there like a running body's lease. Without it,
    /// keeping is the naive local cache: the slot goes back to the fleet and the process still
    /// hands the lease on.
    InSet,
}

/// The parameters of one run. Every duration is in ticks.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Config {
    /// How many processes share the identity.
    pub processes: u8,
    /// The process of each caller (two callers in one process share its lane, so they batch).
    pub callers: Vec<u8>,
    /// How many acquisitions each caller attempts at most.
    pub uses: u8,
    /// The bulkhead's limit.
    pub limit: u8,
    /// The lease's time to live.
    pub ttl: u8,
    /// The safety margin: a holder trusts its lease until `start + ttl - margin`.
    pub margin: u8,
    /// How far the server's clock may run ahead of a process's over one lease (clock rates
    /// differ): a lease lasts `ttl - drift` of the process's time at the server. What the
    /// margin is for: safe while `margin >= drift`.
    pub drift: u8,
    /// A renewal is due this long after the previous acquire or renewal was sent.
    pub renew_every: u8,
    /// How long a process admits no caller after it noticed a loss (`min(grace, ttl)` counts).
    pub grace: u8,
    /// The period of the checks that notice a failover or a flush: a loss is noticed by them
    /// at most this long after it happened (or after the process could reach the server again).
    pub check_period: u8,
    /// The most a message to or from the server (or the downstream) takes; a command's timeout.
    pub net_delay: u8,
    /// The most a published notice of a loss takes to reach the other processes.
    pub notice_delay: u8,
    /// Whether a process that notices a loss publishes it to the others.
    pub broadcast: bool,
    /// Fencing tokens granted per tick that the clock absorbs: a grant's token is
    /// `max(last + 1, server now × scale)` (caracal: 1000 per millisecond).
    pub fence_scale: i16,
    /// How far a failover turns the server clock back, in ticks.
    pub clock_back: i16,
    /// Whether the server clock's term moves on by at least a quantum (a tick's worth of
    /// tokens) across a loss. True of a restart or a failover (seconds), and of a flush unless
    /// it lands within the same quantum as a grant before it: caracal's quantum is a
    /// millisecond (the script takes `TIME` in ms × 1000), so a grant, a `FLUSHALL` and a
    /// grant within one millisecond repeat a token.
    pub loss_takes_a_quantum: bool,
    /// The kinds of loss the run may suffer.
    pub loss_kinds: Vec<LossKind>,
    /// How many losses, freezes (SIGSTOP) and partitions (from the server) the run may suffer.
    pub losses: u8,
    /// See [`Config::losses`].
    pub freezes: u8,
    /// See [`Config::losses`].
    pub partitions: u8,
    /// From when trust is counted.
    pub trust_from: TrustFrom,
    /// Whether bodies write to the fencing downstream (each once per lease): off where a run
    /// is not about fencing, since every write in flight multiplies the states.
    pub writes: bool,
    /// Whether a command carries the highest fencing token its process trusts, so a counter
    /// found below it reveals a loss and is put back (the rule).
    pub carry_known: bool,
    /// Whether a renewal denied for a lease still trusted counts as a loss noticed (the rule).
    pub denied_renewal_is_loss: bool,
    /// Whether the limit property excuses holders admitted blind (see
    /// [`crate::properties`]): a test turns it off to show the overlap it stands for.
    pub excuse_blind: bool,
    /// How long a finished body's lease may be kept for the next caller of its process
    /// (`keep`; 0: off, as by default).
    pub keep: u8,
    /// How old the latest reply about a kept lease may be for it to be handed on (caracal's
    /// `FRESH_OCCUPANCY`, 100 ms), counted from when the request it answered was sent.
    pub fresh: u8,
    /// How many shutdowns (a process's pool closed: every kept lease returned, none kept
    /// after) the run may see.
    pub closes: u8,
    /// The keeping rules switched off, for a test.
    pub skip: Vec<KeepRule>,
}

impl Config {
    /// The parameters every run starts from: two processes with a caller each, limit 1, a
    /// lease of 6 ticks trusted for 5, renewed every 2, a grace of 3, a check period of 2,
    /// messages of up to a tick; one loss of any kind, no freeze, no partition, no second
    /// acquisition. The bounded runs each add a fault or a caller to it (a few seconds each);
    /// [`Config::deep`] adds them all.
    pub fn base() -> Config {
        Config {
            processes: 2,
            callers: vec![0, 1],
            uses: 1,
            limit: 1,
            ttl: 6,
            margin: 1,
            drift: 0,
            renew_every: 2,
            grace: 3,
            check_period: 2,
            net_delay: 1,
            notice_delay: 1,
            broadcast: true,
            fence_scale: 4,
            clock_back: 0,
            loss_takes_a_quantum: true,
            loss_kinds: vec![LossKind::Restart, LossKind::Failover, LossKind::Flush],
            losses: 1,
            freezes: 0,
            partitions: 0,
            trust_from: TrustFrom::BatchSend,
            writes: true,
            carry_known: true,
            denied_renewal_is_loss: true,
            excuse_blind: true,
            keep: 0,
            fresh: 2,
            closes: 0,
            skip: Vec::new(),
        }
    }

    /// [`Config::base`] with lease keeping on: one process with two callers (one takes what
    /// the other kept), a limit of 2 (a lease is kept only while the fleet is below its limit,
    /// so at 1 none ever is), leases kept for up to 2 ticks (as long as one can be handed on
    /// here), bodies writing, a shutdown, no loss. The bounded runs with a loss swap the
    /// writes and the shutdown for a second process.
    pub fn keeping() -> Config {
        Config {
            processes: 1,
            limit: 2,
            callers: vec![0, 0],
            keep: 2,
            losses: 0,
            closes: 1,
            ..Config::base()
        }
    }

    /// Whether keeping rule `rule` is in force.
    pub fn keeps_by(&self, rule: KeepRule) -> bool {
        !self.skip.contains(&rule)
    }

    /// The deep runs (`#[ignore]`d in `cargo test`): a freeze and a partition on top of a loss
    /// of any kind, with bodies writing to the downstream; and the same with a second caller
    /// in one process (its lane) instead of the writes.
    pub fn deep() -> [Config; 2] {
        let faults = Config {
            freezes: 1,
            partitions: 1,
            ..Config::base()
        };
        let lane = Config {
            callers: vec![0, 0, 1],
            writes: false,
            ..faults.clone()
        };
        [faults, lane]
    }

    /// The grace as it acts: never longer than a lease, by when every lease granted before the
    /// loss has expired at its holder anyway.
    pub fn effective_grace(&self) -> u8 {
        self.grace.min(self.ttl)
    }

    /// How long a lease granted or renewed now lasts at the server, in the process's ticks.
    pub fn server_ttl(&self) -> i8 {
        i8::try_from(self.ttl.saturating_sub(self.drift)).unwrap_or(i8::MAX)
    }

    /// The latest a process that could run and reach the server all along notices a loss.
    pub fn notice_bound(&self) -> u8 {
        self.check_period
    }
}
