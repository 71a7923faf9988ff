//! The transitions: what each process, the server, the network and the faults may do next.
//!
//! Time moves by [`Action::Tick`]; everything else happens between ticks, in any order the
//! checker tries. A message may arrive in the tick it was sent or up to its delay later: a
//! tick is refused while a message is due (or a check, or a published notice), so nothing is
//! later than its bound. When time moves, each running process first fires its timers: a
//! holder past its trust deadline gives up (before it could take another step), a renewal that
//! is due joins the lane, a failed release is sent again. A frozen process fires nothing until
//! it resumes, and then everything at once, before any of its holders steps.
//!
//! Times are kept relative to now ([`Tick`]) and tokens relative to the server clock
//! ([`Fence`]); after every step the state is put in a canonical form (tokens and grant
//! orders renumbered keeping their order, epochs rebased), so the state space is finite with no
//! horizon: a run ends when every caller used its acquisitions and every fault happened.

use std::fmt;

use stateright::{Model, Property};

use crate::config::{Config, LossKind, TrustFrom};
use crate::properties;
use crate::state::{
    Caller, CallerId, Command, Downstream, Faults, Fence, Flight, Holder, Lane, Phase, Proc,
    ProcId, Renewal, Reply, Seen, Server, State, Tick,
};

/// The lease protocol under the faults of a [`Config`].
#[derive(Debug, Clone)]
pub struct LeaseModel {
    /// The run's parameters.
    pub config: Config,
}

/// One step of the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Time moves on by one tick.
    Tick,
    /// A caller asks for a lease.
    Start(CallerId),
    /// A body ends (returns, fails or is dropped) while it holds its lease.
    Finish(CallerId),
    /// A body takes a step: a write to the downstream, with its fencing token.
    Write(CallerId),
    /// A caller's write reaches the downstream.
    Land(CallerId),
    /// A process's lane call reaches the server, which runs it.
    Serve(ProcId),
    /// The server's reply to a lane call reaches its process.
    Answer(ProcId),
    /// A holder's renewal reaches the server, which runs it.
    ServeRenewal(CallerId),
    /// The reply to a holder's renewal reaches it.
    AnswerRenewal(CallerId),
    /// A process's periodic check notices a loss.
    Check(ProcId),
    /// A published notice of a loss reaches a process.
    Hear(ProcId),
    /// The server loses its data.
    Loss(LossKind),
    /// A process is stopped (SIGSTOP).
    Freeze(ProcId),
    /// A stopped process resumes.
    Thaw(ProcId),
    /// A process is cut off from the server.
    Cut(ProcId),
    /// A cut-off process reaches the server again.
    Heal(ProcId),
    /// A process shuts down: its pool of kept leases closes.
    Close(ProcId),
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Tick => write!(f, "tick"),
            Action::Start(c) => write!(f, "caller {c} asks for a lease"),
            Action::Finish(c) => write!(f, "caller {c}'s body ends"),
            Action::Write(c) => write!(f, "caller {c}'s body writes to the downstream"),
            Action::Land(c) => write!(f, "caller {c}'s write reaches the downstream"),
            Action::Serve(p) => write!(f, "process {p}'s lane call reaches the server"),
            Action::Answer(p) => write!(f, "the reply reaches process {p}"),
            Action::ServeRenewal(c) => write!(f, "caller {c}'s renewal reaches the server"),
            Action::AnswerRenewal(c) => write!(f, "the reply reaches caller {c}'s renewal"),
            Action::Check(p) => write!(f, "process {p}'s periodic check notices the loss"),
            Action::Hear(p) => write!(f, "process {p} hears of the loss"),
            Action::Loss(kind) => write!(f, "the server loses its data ({kind:?})"),
            Action::Freeze(p) => write!(f, "process {p} is frozen"),
            Action::Thaw(p) => write!(f, "process {p} resumes"),
            Action::Cut(p) => write!(f, "process {p} is cut off from the server"),
            Action::Heal(p) => write!(f, "process {p} reaches the server again"),
            Action::Close(p) => write!(f, "process {p} shuts down (its kept leases return)"),
        }
    }
}

/// Every id in `0..count`, as the state's index type.
fn ids(count: usize) -> impl Iterator<Item = u8> {
    (0..count).filter_map(|i| u8::try_from(i).ok())
}

/// A duration of the configuration, as a relative time.
pub(crate) fn ticks(duration: u8) -> Tick {
    Tick::try_from(duration).unwrap_or(Tick::MAX)
}

/// A deadline one tick closer (0: passed).
pub(crate) fn closer(deadline: Tick) -> Tick {
    (deadline - 1).max(0)
}

/// An age one tick older, no older than `oldest`.
fn older(at: Tick, oldest: u8) -> Tick {
    (at - 1).max(-ticks(oldest))
}

/// Calls `f` on every fencing token in the state.
fn each_fence(s: &mut State, f: &mut impl FnMut(&mut Fence)) {
    s.server.counter.iter_mut().for_each(&mut *f);
    s.server.max_fence.iter_mut().for_each(&mut *f);
    s.downstream.max_fence.iter_mut().for_each(&mut *f);
    for proc in &mut s.procs {
        proc.highest_read.iter_mut().for_each(&mut *f);
        proc.kept
            .iter_mut()
            .for_each(|kept| f(&mut kept.lease.fence));
    }
    for caller in &mut s.callers {
        if let Phase::Holding(h) = &mut caller.phase {
            f(&mut h.fence);
            if let Some(renewal) = &mut h.renewing {
                renewal.command.known.iter_mut().for_each(&mut *f);
                renewal.command.trusted.iter_mut().for_each(&mut *f);
            }
        }
        if let Some(write) = &mut caller.write {
            f(&mut write.fence);
        }
    }
    for flight in s.procs.iter_mut().filter_map(|p| p.lane.flight.as_mut()) {
        flight.command.known.iter_mut().for_each(&mut *f);
        flight.command.trusted.iter_mut().for_each(&mut *f);
        for reply in flight.replies.iter_mut().flatten() {
            if let Reply::Granted { fence, .. } = reply {
                f(fence);
            }
        }
    }
}

/// Calls `f` on every grant order in the state (ghost).
fn each_order(s: &mut State, f: &mut impl FnMut(&mut u8)) {
    s.downstream.newest.iter_mut().for_each(&mut *f);
    for proc in &mut s.procs {
        proc.kept
            .iter_mut()
            .for_each(|kept| f(&mut kept.lease.order));
    }
    for caller in &mut s.callers {
        if let Phase::Holding(h) = &mut caller.phase {
            f(&mut h.order);
        }
        if let Some(write) = &mut caller.write {
            f(&mut write.order);
        }
    }
    for flight in s.procs.iter_mut().filter_map(|p| p.lane.flight.as_mut()) {
        for reply in flight.replies.iter_mut().flatten() {
            if let Reply::Granted { order, .. } = reply {
                f(order);
            }
        }
    }
}

impl LeaseModel {
    /// The process of caller `c`.
    pub(crate) fn proc_of(&self, c: CallerId) -> ProcId {
        self.config.callers[usize::from(c)]
    }

    /// The callers of process `p`.
    fn callers_of(&self, p: ProcId) -> impl Iterator<Item = CallerId> + '_ {
        ids(self.config.callers.len()).filter(move |&c| self.proc_of(c) == p)
    }

    /// The lease token of caller `c`'s current acquisition (unique: its uses only go down).
    fn token_of(s: &State, c: CallerId) -> u8 {
        c * 8 + s.callers[usize::from(c)].uses
    }

    /// When trust (and the next renewal) is counted from, for a request that joined its lane
    /// at `joined` and went out in a batch sent at `sent` (both ages).
    fn trust_start(&self, sent: Tick, joined: Tick) -> Tick {
        match self.config.trust_from {
            TrustFrom::BatchSend => sent,
            TrustFrom::LaneJoin => joined,
            TrustFrom::Reply => 0,
        }
    }

    /// Whether something is due now that must happen before time moves on.
    fn overdue(&self, s: &State) -> bool {
        let silent = s
            .server
            .last_loss
            .is_some_and(|kind| kind != LossKind::Restart);
        let procs = s.procs.iter().any(|p| {
            let lane = p
                .lane
                .flight
                .as_ref()
                .is_some_and(|f| f.command.by == 0 && (f.replies.is_none() || !p.frozen));
            let check = silent
                && !p.frozen
                && !p.partitioned
                && p.knows < s.server.incarnation
                && p.check_by == Some(0);
            let hear = !p.frozen && p.hear.is_some_and(|(_, by)| by == 0);
            lane || check || hear
        });
        let callers = s.callers.iter().enumerate().any(|(c, caller)| {
            let frozen = s.procs[usize::from(self.config.callers[c])].frozen;
            let renewal = match &caller.phase {
                Phase::Holding(h) => h
                    .renewing
                    .as_ref()
                    .is_some_and(|r| r.command.by == 0 && (r.reply.is_none() || !frozen)),
                _ => false,
            };
            // A write a frozen process issued before the freeze may still sit in it.
            let write = !frozen && caller.write.as_ref().is_some_and(|w| w.by == 0);
            renewal || write
        });
        procs || callers
    }

    /// The highest fencing token that process `p` trusts a lease of (held or kept), and
    /// (ghost) the incarnation that granted that lease; whether or not commands carry it.
    fn trusted(&self, s: &State, p: ProcId) -> Option<(Fence, u8)> {
        let proc = &s.procs[usize::from(p)];
        let held = self
            .callers_of(p)
            .filter_map(|c| match &s.callers[usize::from(c)].phase {
                Phase::Holding(h) => Some(h),
                _ => None,
            });
        held.chain(proc.kept.iter().map(|kept| &kept.lease))
            .filter(|h| h.epoch == proc.epoch && h.trust > 0)
            .map(|h| (h.fence, h.incarnation))
            .max()
    }

    /// Whether process `p` sends over connections a restart closed: it has not noticed the
    /// restart (it would have, on reconnecting), so nothing it sends is served.
    fn dead(s: &State, p: ProcId) -> bool {
        s.server.last_loss == Some(LossKind::Restart)
            && s.procs[usize::from(p)].knows < s.server.incarnation
    }

    /// Puts caller `c`'s acquire in its process's lane: out at once if the lane is idle.
    fn enqueue(&self, s: &mut State, p: ProcId, c: CallerId) {
        if s.procs[usize::from(p)].lane.flight.is_some() {
            s.procs[usize::from(p)].lane.queue.push(c);
        } else {
            self.send(s, p, vec![c]);
        }
    }

    /// A command process `p` sends now.
    fn command(&self, s: &State, p: ProcId) -> Command {
        let trusted = self.trusted(s, p);
        let (known, known_incarnation) = match trusted {
            Some((fence, incarnation)) if self.config.carry_known => (Some(fence), incarnation),
            _ => (None, 0),
        };
        Command {
            sent: 0,
            known,
            known_incarnation,
            trusted: trusted.map(|(fence, _)| fence),
            by: ticks(self.config.net_delay),
            conn: s.procs[usize::from(p)].reconnections,
        }
    }

    /// Sends a batch of acquires from process `p`'s lane.
    fn send(&self, s: &mut State, p: ProcId, members: Vec<CallerId>) {
        let command = self.command(s, p);
        let replies = Self::dead(s, p).then(|| vec![Reply::Failed; members.len()]);
        s.procs[usize::from(p)].lane.flight = Some(Flight {
            members,
            command,
            replies,
        });
    }

    /// After a lane call was answered: every acquire that waited goes out as the next batch.
    fn next_batch(&self, s: &mut State, p: ProcId) {
        let queue = std::mem::take(&mut s.procs[usize::from(p)].lane.queue);
        if !queue.is_empty() {
            s.saw(Seen::Queued);
            if queue.len() > 1 {
                s.saw(Seen::Batched);
            }
            self.send(s, p, queue);
        }
    }

    /// Holder `c` of process `p` sends its renewal if one is due (the renewal loop: it sleeps
    /// until the due time, which may have passed already when an answer arrives late).
    pub(crate) fn renew_if_due(&self, s: &mut State, p: ProcId, c: CallerId) {
        if let Phase::Holding(h) = &s.callers[usize::from(c)].phase
            && h.renewing.is_none()
            && h.renew_at == 0
        {
            self.send_renewal(s, p, c);
        }
    }

    /// Holder `c` of process `p` sends a renewal (on its own: renewals take no lane).
    fn send_renewal(&self, s: &mut State, p: ProcId, c: CallerId) {
        let command = self.command(s, p);
        let reply = Self::dead(s, p).then_some(Reply::Failed);
        let keeping = self.config.keep > 0;
        if let Phase::Holding(h) = &mut s.callers[usize::from(c)].phase {
            h.renewing = Some(Renewal { command, reply });
            h.unanswered = keeping;
        }
    }

    /// Ends caller `c`'s hold on its lease: the release goes out in the background (a
    /// renewal in flight is then the same as one denied or lost: it changes nothing).
    pub(crate) fn cancel(&self, s: &mut State, c: CallerId) {
        let Phase::Holding(h) = &s.callers[usize::from(c)].phase else {
            return;
        };
        // Retried until the lease would have expired anyway: its send time + ttl.
        let (token, until) = (h.token, h.trust + ticks(self.config.margin));
        self.release(s, c, token, until);
    }

    /// Caller `c` releases lease `token`, to be retried until `until` if it fails. It lands at
    /// once: a release only frees a slot, and one that lands later is the same as a next
    /// caller that asks later, which the checker tries anyway.
    fn release(&self, s: &mut State, c: CallerId, token: u8, until: Tick) {
        s.callers[usize::from(c)].phase = if s.procs[usize::from(self.proc_of(c))].partitioned {
            Phase::Releasing { token, until }
        } else {
            s.server.leases.retain(|&(held, _)| held != token);
            Phase::Idle
        };
    }

    /// Process `p` notices that the server lost its data (incarnation `incarnation`): a new
    /// epoch, every holder cancelled before its next step, the grace begins, and (if it saw
    /// the loss itself and `publish`) the others are told. `forced`: the process cannot tell
    /// which loss it saw (a denied renewal), so it takes it for a new one.
    fn notice(&self, s: &mut State, p: ProcId, incarnation: u8, forced: bool, publish: bool) {
        let (knows, cut_off) = {
            let proc = &s.procs[usize::from(p)];
            (proc.knows, proc.cut_off)
        };
        if !forced && incarnation <= knows {
            return;
        }
        if incarnation <= knows {
            s.saw(Seen::FalseNotice);
        }
        let bound = ticks(self.config.notice_bound());
        if !cut_off
            && knows < s.server.incarnation
            && s.server.lost_at.is_some_and(|at| at < -bound)
        {
            s.saw(Seen::LateNotice);
        }
        let proc = &mut s.procs[usize::from(p)];
        proc.knows = proc.knows.max(incarnation);
        proc.epoch += 1;
        proc.lost_at = Some(0);
        proc.noticed_late = proc.cut_off;
        proc.cut_off = false;
        proc.check_by = None;
        s.saw(Seen::LossNoticed);
        for c in self.callers_of(p) {
            if matches!(s.callers[usize::from(c)].phase, Phase::Holding(_)) {
                s.saw(Seen::CancelledByLoss);
                self.cancel(s, c);
            }
        }
        self.forget_kept(s, p);
        if publish && self.config.broadcast {
            let by = ticks(self.config.notice_delay);
            for q in s.procs.iter_mut().filter(|q| q.knows < incarnation) {
                if q.hear.is_none_or(|(heard, _)| heard < incarnation) {
                    q.hear = Some((incarnation, by));
                }
            }
        }
    }

    /// Process `p`'s timers, as they fire when time moves on or when it resumes.
    fn timers(&self, s: &mut State, p: ProcId, resumed: bool) {
        let untouched = s.faults.losses == self.config.losses
            && s.faults.freezes == self.config.freezes
            && s.faults.partitions == self.config.partitions;
        for c in self.callers_of(p) {
            match s.callers[usize::from(c)].phase.clone() {
                Phase::Holding(h) if h.trust <= 0 => {
                    if resumed {
                        s.saw(Seen::FrozenCaught);
                    }
                    if untouched && s.server.leases.iter().any(|&(token, _)| token == h.token) {
                        s.saw(Seen::NeedlessLoss);
                    }
                    self.cancel(s, c);
                }
                Phase::Holding(_) => self.renew_if_due(s, p, c),
                Phase::Releasing { token, until } => {
                    if until > 0 {
                        s.saw(Seen::ReleaseRetried);
                        self.release(s, c, token, until);
                    } else {
                        s.callers[usize::from(c)].phase = Phase::Idle;
                    }
                }
                _ => {}
            }
        }
        self.kept_timers(s, p);
    }

    /// A command a tick older: its send no older than trust counted from it could last.
    fn age(&self, command: &mut Command) {
        command.sent = older(command.sent, self.config.ttl - self.config.margin);
        command.by = closer(command.by);
    }

    /// Time moves on: every time stored is a tick older, every token a tick's worth lower;
    /// the server forgets what expired; the running processes fire their timers.
    fn tick(&self, s: &mut State) {
        let cfg = &self.config;
        for caller in &mut s.callers {
            match &mut caller.phase {
                Phase::Idle => {}
                Phase::Acquiring { joined, .. } => *joined = older(*joined, cfg.ttl - cfg.margin),
                Phase::Holding(h) => {
                    h.trust = closer(h.trust);
                    h.renew_at = closer(h.renew_at);
                    if let Some(renewal) = &mut h.renewing {
                        self.age(&mut renewal.command);
                    }
                }
                Phase::Releasing { until, .. } => *until = closer(*until),
            }
            if let Some(write) = &mut caller.write {
                write.by = closer(write.by);
            }
        }
        for proc in &mut s.procs {
            if let Some(flight) = &mut proc.lane.flight {
                self.age(&mut flight.command);
            }
            for kept in &mut proc.kept {
                kept.lease.trust = closer(kept.lease.trust);
                kept.lease.renew_at = closer(kept.lease.renew_at);
                kept.until = closer(kept.until);
            }
            // One tick past the grace: a refusal in its last tick is still told from none.
            proc.lost_at = proc.lost_at.map(|at| older(at, cfg.effective_grace() + 1));
            proc.check_by = proc.check_by.map(closer);
            if let Some((_, by)) = &mut proc.hear {
                *by = closer(*by);
            }
        }
        let server = &mut s.server;
        server.lost_at = server
            .lost_at
            .map(|at| older(at, cfg.notice_bound() + cfg.effective_grace() + 1));
        for lease in &mut server.leases {
            lease.1 -= 1;
        }
        server.leases.retain(|&(_, deadline)| deadline > 0);
        each_fence(s, &mut |fence| *fence -= cfg.fence_scale);
        for p in ids(s.procs.len()) {
            if !s.procs[usize::from(p)].frozen {
                self.timers(s, p, false);
            }
        }
    }

    /// Caller `c` asks for a lease: refused during its process's grace, else into the lane.
    fn start(&self, s: &mut State, c: CallerId) {
        let p = self.proc_of(c);
        s.callers[usize::from(c)].uses -= 1;
        // The pool is looked at before anything else, as the library does.
        if self.reuse(s, c) {
            return;
        }
        let proc = &s.procs[usize::from(p)];
        let grace = ticks(self.config.effective_grace());
        if proc.lost_at.is_some_and(|at| at > -grace) {
            let bound = ticks(self.config.notice_bound()) + grace;
            let late = !proc.noticed_late && s.server.lost_at.is_some_and(|at| at <= -bound);
            s.saw(Seen::RefusedForGrace);
            if late {
                s.saw(Seen::LateRefusal);
            }
            return;
        }
        s.callers[usize::from(c)].phase = Phase::Acquiring {
            epoch: proc.epoch,
            joined: 0,
        };
        self.enqueue(s, p, c);
    }

    /// The server runs process `p`'s lane call (the script: one `TIME`, every token in order).
    fn serve(&self, s: &mut State, p: ProcId) {
        let cfg = &self.config;
        let Some(flight) = s.procs[usize::from(p)].lane.flight.clone() else {
            return;
        };
        let refused = Self::refused(s, p, &flight.command);
        let replies = if let Some(refusal) = refused {
            vec![refusal; flight.members.len()]
        } else {
            // Blind: served after a loss the process had not noticed, where even the token it
            // trusted, carried, would not have told (it trusted none, or the counter had been
            // rebuilt at or above it). Without the token carried, a grant the token would
            // have refused is no blind admission: it is what carrying it is for.
            let blind = s.server.incarnation > s.procs[usize::from(p)].knows
                && flight.command.trusted <= s.server.counter;
            let mut replies = Vec::new();
            for &c in &flight.members {
                replies.push(self.grant(s, c, blind));
            }
            replies
        };
        if let Some(flight) = s.procs[usize::from(p)].lane.flight.as_mut() {
            flight.replies = Some(replies);
            flight.command.by = ticks(cfg.net_delay);
        }
    }

    /// Why the server refuses a whole `command` of process `p`, if it does: no answer
    /// through a partition; a counter below the token the command carries means the set was
    /// lost without a restart, and is put back.
    fn refused(s: &mut State, p: ProcId, command: &Command) -> Option<Reply> {
        if s.procs[usize::from(p)].partitioned {
            return Some(Reply::Failed);
        }
        if command.known <= s.server.counter {
            return None;
        }
        s.server.counter = command.known;
        let incarnation = s.server.incarnation;
        s.saw(Seen::CounterBelowKnown);
        if command.known_incarnation == incarnation {
            s.saw(Seen::FalseNotice);
        }
        Some(Reply::Lost { incarnation })
    }

    /// The server runs caller `c`'s renewal.
    fn serve_renewal(&self, s: &mut State, c: CallerId) {
        let p = self.proc_of(c);
        let Phase::Holding(h) = &s.callers[usize::from(c)].phase else {
            return;
        };
        let (token, Some(renewal)) = (h.token, h.renewing.clone()) else {
            return;
        };
        let reply = Self::refused(s, p, &renewal.command)
            .unwrap_or_else(|| self.renew(s, token, self.config.server_ttl()));
        if let Phase::Holding(h) = &mut s.callers[usize::from(c)].phase
            && let Some(renewal) = &mut h.renewing
        {
            renewal.reply = Some(reply);
            renewal.command.by = ticks(self.config.net_delay);
        }
    }

    /// Acquire, for one token: a grant if fewer than `limit` leases are live.
    fn grant(&self, s: &mut State, c: CallerId, blind: bool) -> Reply {
        let cfg = &self.config;
        let token = Self::token_of(s, c);
        let server = &mut s.server;
        if server.leases.len() >= usize::from(cfg.limit) {
            return Reply::Denied;
        }
        let deadline = cfg.server_ttl();
        // max(last + 1, server now × scale), the clock's term being 0 here.
        let fence = server.counter.map_or(0, |last| (last + 1).max(0));
        server.counter = Some(fence);
        if Some(fence) <= server.max_fence {
            server.forgot = true;
        }
        server.max_fence = server.max_fence.max(Some(fence));
        let order = server.grants;
        server.grants += 1;
        server.leases.push((token, deadline));
        server.leases.sort_unstable();
        Reply::Granted {
            fence,
            order,
            incarnation: server.incarnation,
            blind,
            occupancy: self.occupancy(s),
        }
    }

    /// The occupancy a reply carries: the set's size, read only where leases are kept (else
    /// always 0, so that it adds no state).
    fn occupancy(&self, s: &State) -> u8 {
        if self.config.keep > 0 {
            u8::try_from(s.server.leases.len()).unwrap_or(u8::MAX)
        } else {
            0
        }
    }

    /// Renew, for one token: pushed to `now + ttl` if live, else denied.
    fn renew(&self, s: &mut State, token: u8, ttl: Tick) -> Reply {
        let server = &mut s.server;
        let Some(lease) = server.leases.iter_mut().find(|(held, _)| *held == token) else {
            return Reply::Denied;
        };
        lease.1 = ttl;
        Reply::Renewed {
            occupancy: self.occupancy(s),
        }
    }

    /// Process `p` reads its lane call's replies, answers each caller, and sends the next batch.
    fn answer(&self, s: &mut State, p: ProcId) {
        let Some(flight) = s.procs[usize::from(p)].lane.flight.take() else {
            return;
        };
        let replies = match flight.replies {
            Some(replies) if !s.procs[usize::from(p)].partitioned => replies,
            _ => vec![Reply::Failed; flight.members.len()],
        };
        for (&c, reply) in flight.members.iter().zip(replies) {
            self.answer_acquire(s, p, c, &flight.command, reply);
        }
        self.next_batch(s, p);
    }

    /// Holder `c` reads the reply to its renewal.
    fn answer_renewal(&self, s: &mut State, c: CallerId) {
        let cfg = &self.config;
        let p = self.proc_of(c);
        let Phase::Holding(mut h) = s.callers[usize::from(c)].phase.clone() else {
            return;
        };
        let Some(renewal) = h.renewing.take() else {
            return;
        };
        let reply = match renewal.reply {
            Some(reply) if !s.procs[usize::from(p)].partitioned => reply,
            _ => Reply::Failed,
        };
        match reply {
            Reply::Renewed { occupancy } => {
                let start = self.trust_start(renewal.command.sent, renewal.command.sent);
                h.trust = (start + ticks(cfg.ttl) - ticks(cfg.margin)).max(0);
                h.renew_at = (start + ticks(cfg.renew_every)).max(0);
                h.occupancy = occupancy;
                h.unanswered = false;
                h.conn = h.conn.max(renewal.command.conn);
                s.callers[usize::from(c)].phase = Phase::Holding(h);
                self.renew_if_due(s, p, c);
            }
            Reply::Denied => {
                self.cancel(s, c);
                let incarnation = s.server.incarnation;
                let proc = &mut s.procs[usize::from(p)];
                proc.told = proc.told.max(incarnation);
                if cfg.denied_renewal_is_loss {
                    s.saw(Seen::DeniedRenewalNoticed);
                    self.notice(s, p, incarnation, true, true);
                }
            }
            Reply::Lost { incarnation } => self.notice(s, p, incarnation, false, true),
            Reply::Failed | Reply::Granted { .. } => {
                // Tried again soon, while the lease is still trusted.
                h.renew_at = 1;
                s.callers[usize::from(c)].phase = Phase::Holding(h);
            }
        }
    }

    /// Caller `c` reads the reply to its acquire, sent in a batch by `command`.
    fn answer_acquire(
        &self,
        s: &mut State,
        p: ProcId,
        c: CallerId,
        command: &Command,
        reply: Reply,
    ) {
        let cfg = &self.config;
        let sent = command.sent;
        let Phase::Acquiring { epoch, joined } = s.callers[usize::from(c)].phase else {
            return;
        };
        let token = Self::token_of(s, c);
        let delay = ticks(cfg.net_delay);
        s.callers[usize::from(c)].phase = match reply {
            Reply::Granted {
                fence,
                order,
                incarnation,
                blind,
                occupancy,
            } => {
                let start = self.trust_start(sent, joined);
                let trust = start + ticks(cfg.ttl) - ticks(cfg.margin);
                let (proc_epoch, lost_at) = {
                    let proc = &s.procs[usize::from(p)];
                    (proc.epoch, proc.lost_at)
                };
                if trust <= 0 || epoch != proc_epoch {
                    if trust <= 0 {
                        s.saw(Seen::AdmissionExpired);
                    }
                    self.release(s, c, token, ticks(cfg.ttl));
                    return;
                } else {
                    if blind {
                        s.saw(Seen::AdmittedBlind);
                    }
                    if lost_at.is_some() {
                        s.saw(Seen::AdmittedAfterGrace);
                    }
                    Phase::Holding(Holder {
                        token,
                        fence,
                        trust,
                        renew_at: (start + ticks(cfg.renew_every)).max(0),
                        renewing: None,
                        epoch,
                        wrote: false,
                        incarnation,
                        order,
                        blind,
                        occupancy,
                        unanswered: false,
                        conn: command.conn,
                        read_before: false,
                    })
                }
            }
            Reply::Denied => Phase::Idle,
            Reply::Failed | Reply::Renewed { .. } => {
                // The acquire may have taken a lease nobody knows of.
                self.release(s, c, token, ticks(cfg.ttl) + delay);
                return;
            }
            Reply::Lost { incarnation } => {
                s.callers[usize::from(c)].phase = Phase::Idle;
                self.notice(s, p, incarnation, false, true);
                return;
            }
        };
        self.renew_if_due(s, p, c);
    }

    /// The server loses its data.
    fn lose(&self, s: &mut State, kind: LossKind) {
        let cfg = &self.config;
        s.faults.losses -= 1;
        let server = &mut s.server;
        server.incarnation += 1;
        server.last_loss = Some(kind);
        server.leases.clear();
        server.counter = None;
        server.lost_at = Some(0);
        for proc in &mut s.procs {
            proc.cut_off |= proc.frozen || proc.partitioned;
            proc.check_by = (kind != LossKind::Restart).then_some(ticks(cfg.check_period));
            if kind == LossKind::Restart {
                // Its connections broke: whatever was in flight has no answer.
                if let Some(flight) = &mut proc.lane.flight {
                    flight.replies = Some(vec![Reply::Failed; flight.members.len()]);
                }
            }
        }
        if kind == LossKind::Restart {
            for caller in &mut s.callers {
                if let Phase::Holding(h) = &mut caller.phase
                    && let Some(renewal) = &mut h.renewing
                {
                    renewal.reply = Some(Reply::Failed);
                }
            }
        }
        let mut shift = 0;
        if cfg.loss_takes_a_quantum {
            shift -= cfg.fence_scale;
        }
        if kind == LossKind::Failover {
            // The promoted server's clock is behind: every token is that much further ahead.
            shift += cfg.clock_back * cfg.fence_scale;
        }
        each_fence(s, &mut |fence| *fence += shift);
        if kind == LossKind::Restart {
            let incarnation = s.server.incarnation;
            for p in ids(s.procs.len()) {
                let proc = &s.procs[usize::from(p)];
                if !proc.frozen && !proc.partitioned {
                    self.notice(s, p, incarnation, false, true);
                }
            }
        }
    }

    /// Process `p` can talk to the server again (resumed, or `reconnected` after a
    /// partition): a restart, or on reconnecting a failover, is noticed (a new `run_id`);
    /// otherwise the periodic check is due within its period; and renewals go out at once
    /// after a reconnection.
    fn reconnect(&self, s: &mut State, p: ProcId, reconnected: bool) {
        let incarnation = s.server.incarnation;
        let unaware = s.procs[usize::from(p)].knows < incarnation;
        let revealed = s.server.last_loss.is_some_and(|kind| {
            kind == LossKind::Restart || (reconnected && kind.changes_run_id())
        });
        if unaware && revealed {
            self.notice(s, p, incarnation, false, true);
        } else if unaware {
            s.procs[usize::from(p)].check_by = Some(ticks(self.config.check_period));
        }
        if reconnected {
            if self.config.keep > 0 {
                s.procs[usize::from(p)].reconnections += 1;
            }
            for c in self.callers_of(p) {
                if let Phase::Holding(h) = &mut s.callers[usize::from(c)].phase
                    && h.renewing.is_none()
                {
                    h.renew_at = 0;
                }
            }
        }
    }

    /// Caller `c`'s write reaches the downstream, which takes it if its token is not below
    /// the highest it took.
    fn land(s: &mut State, c: CallerId) {
        let Some(write) = s.callers[usize::from(c)].write.take() else {
            return;
        };
        let downstream = &mut s.downstream;
        if Some(write.fence) >= downstream.max_fence {
            if downstream.newest.is_some_and(|newest| write.order < newest) {
                downstream.stale_accepted = true;
            }
            downstream.newest = downstream.newest.max(Some(write.order));
            downstream.max_fence = Some(write.fence);
        } else {
            s.saw(Seen::StaleWriteRefused);
        }
    }

    /// Puts `s` in its canonical form: tokens well below the clock renumbered (their order
    /// kept), grant orders renumbered from 0 (their order kept), epochs rebased to 1 per
    /// process (0 for anything older).
    fn canonical(&self, s: &mut State) {
        let cfg = &self.config;
        let failovers_left = if cfg.loss_kinds.contains(&LossKind::Failover) {
            i16::from(s.faults.losses)
        } else {
            0
        };
        let floor = -(cfg.clock_back * cfg.fence_scale * failovers_left);
        let mut low = Vec::new();
        each_fence(s, &mut |fence| {
            if *fence < floor {
                low.push(*fence);
            }
        });
        low.sort_unstable_by(|a, b| b.cmp(a));
        low.dedup();
        each_fence(s, &mut |fence| {
            if let Some(rank) = low.iter().position(|v| v == fence) {
                *fence = floor - 1 - i16::try_from(rank).unwrap_or(i16::MAX);
            }
        });
        let mut orders = Vec::new();
        each_order(s, &mut |order| orders.push(*order));
        orders.sort_unstable();
        orders.dedup();
        each_order(s, &mut |order| {
            *order = u8::try_from(orders.iter().position(|v| v == order).unwrap_or(0)).unwrap_or(0);
        });
        s.server.grants = u8::try_from(orders.len()).unwrap_or(u8::MAX);
        let incarnation = s.server.incarnation;
        let grace = ticks(self.config.effective_grace());
        if s.procs
            .iter()
            .all(|p| p.knows == incarnation && p.lost_at.is_none_or(|at| at < -grace))
        {
            // Every process noticed, and its grace is over: when and how the server lost its
            // data makes no difference any more.
            s.server.last_loss = None;
            s.server.lost_at = None;
        }
        for proc in &mut s.procs {
            if proc.hear.is_some_and(|(heard, _)| heard <= proc.knows) {
                proc.hear = None;
            }
        }
        if s.faults.partitions == 0 {
            // Every release lands now: until when it would be retried makes no difference.
            for c in ids(s.callers.len()) {
                let partitioned = s.procs[usize::from(self.proc_of(c))].partitioned;
                if let Phase::Releasing { until, .. } = &mut s.callers[usize::from(c)].phase
                    && !partitioned
                {
                    *until = 0;
                }
            }
        }
        if cfg.trust_from != TrustFrom::LaneJoin {
            // When a request joined its lane makes no difference then.
            for caller in &mut s.callers {
                if let Phase::Acquiring { joined, .. } = &mut caller.phase {
                    *joined = 0;
                }
            }
        }
        for p in ids(s.procs.len()) {
            let (current, conn) = {
                let proc = &s.procs[usize::from(p)];
                (proc.epoch, proc.reconnections)
            };
            let rebase = |epoch: &mut u8| *epoch = u8::from(*epoch == current);
            // Likewise, what a lease or a command compares of the reconnections is only
            // whether they are still the latest.
            let reconnected = |at: &mut u8| *at = u8::from(*at == conn);
            let lease = |h: &mut Holder| {
                rebase(&mut h.epoch);
                reconnected(&mut h.conn);
                if let Some(renewal) = &mut h.renewing {
                    reconnected(&mut renewal.command.conn);
                }
            };
            for c in self.callers_of(p) {
                match &mut s.callers[usize::from(c)].phase {
                    Phase::Acquiring { epoch, .. } => rebase(epoch),
                    Phase::Holding(h) => lease(h),
                    _ => {}
                }
            }
            let proc = &mut s.procs[usize::from(p)];
            proc.kept.iter_mut().for_each(|kept| lease(&mut kept.lease));
            if let Some(flight) = &mut proc.lane.flight {
                reconnected(&mut flight.command.conn);
            }
            proc.epoch = 1;
            proc.reconnections = 1;
        }
    }
}

impl Model for LeaseModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let cfg = &self.config;
        let proc = Proc {
            epoch: 1,
            knows: 0,
            lost_at: None,
            frozen: false,
            partitioned: false,
            check_by: None,
            hear: None,
            lane: Lane::default(),
            cut_off: false,
            noticed_late: false,
            told: 0,
            kept: Vec::new(),
            highest_read: None,
            reconnections: 1,
            closed: false,
        };
        vec![State {
            server: Server {
                incarnation: 0,
                last_loss: None,
                leases: Vec::new(),
                counter: None,
                lost_at: None,
                grants: 0,
                max_fence: None,
                forgot: false,
            },
            procs: vec![proc; usize::from(cfg.processes)],
            callers: vec![
                Caller {
                    phase: Phase::Idle,
                    uses: cfg.uses,
                    write: None,
                };
                cfg.callers.len()
            ],
            downstream: Downstream::default(),
            faults: Faults {
                losses: cfg.losses,
                freezes: cfg.freezes,
                partitions: cfg.partitions,
                closes: cfg.closes,
            },
            seen: 0,
            broken: 0,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        if !self.overdue(s) {
            actions.push(Action::Tick);
        }
        for c in ids(s.callers.len()) {
            let caller = &s.callers[usize::from(c)];
            let running = !s.procs[usize::from(self.proc_of(c))].frozen;
            match &caller.phase {
                Phase::Idle if running && caller.uses > 0 => actions.push(Action::Start(c)),
                Phase::Holding(h) => {
                    match &h.renewing {
                        Some(renewal) if renewal.reply.is_none() => {
                            actions.push(Action::ServeRenewal(c));
                        }
                        Some(_) if running => actions.push(Action::AnswerRenewal(c)),
                        _ => {}
                    }
                    if running {
                        actions.push(Action::Finish(c));
                        if self.config.writes && !h.wrote && caller.write.is_none() {
                            actions.push(Action::Write(c));
                        }
                    }
                }
                _ => {}
            }
            if caller.write.is_some() {
                actions.push(Action::Land(c));
            }
        }
        let silent = s
            .server
            .last_loss
            .is_some_and(|kind| kind != LossKind::Restart);
        for p in ids(s.procs.len()) {
            let proc = &s.procs[usize::from(p)];
            match &proc.lane.flight {
                Some(flight) if flight.replies.is_none() => actions.push(Action::Serve(p)),
                Some(_) if !proc.frozen => actions.push(Action::Answer(p)),
                _ => {}
            }
            let reachable = !proc.frozen && !proc.partitioned;
            if silent && reachable && proc.knows < s.server.incarnation {
                actions.push(Action::Check(p));
            }
            if proc.hear.is_some() && !proc.frozen {
                actions.push(Action::Hear(p));
            }
            if proc.frozen {
                actions.push(Action::Thaw(p));
            } else if s.faults.freezes > 0 {
                actions.push(Action::Freeze(p));
            }
            if proc.partitioned {
                actions.push(Action::Heal(p));
            } else if s.faults.partitions > 0 {
                actions.push(Action::Cut(p));
            }
            if s.faults.closes > 0 && !proc.closed && !proc.frozen {
                actions.push(Action::Close(p));
            }
        }
        if s.faults.losses > 0 {
            actions.extend(
                self.config
                    .loss_kinds
                    .iter()
                    .map(|&kind| Action::Loss(kind)),
            );
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        s.seen = 0;
        match action {
            Action::Tick => self.tick(&mut s),
            Action::Start(c) => self.start(&mut s, c),
            Action::Finish(c) => self.finish(&mut s, c),
            Action::Write(c) => self.write(&mut s, c),
            Action::Land(c) => Self::land(&mut s, c),
            Action::Serve(p) => self.serve(&mut s, p),
            Action::ServeRenewal(c) => self.serve_renewal(&mut s, c),
            Action::AnswerRenewal(c) => self.answer_renewal(&mut s, c),
            Action::Answer(p) => self.answer(&mut s, p),
            Action::Check(p) => {
                let incarnation = s.server.incarnation;
                self.notice(&mut s, p, incarnation, false, true);
            }
            Action::Hear(p) => {
                if let Some((incarnation, _)) = s.procs[usize::from(p)].hear.take()
                    && !s.procs[usize::from(p)].partitioned
                {
                    self.notice(&mut s, p, incarnation, false, false);
                }
            }
            Action::Loss(kind) => self.lose(&mut s, kind),
            Action::Freeze(p) | Action::Cut(p) => {
                let proc = &mut s.procs[usize::from(p)];
                if action == Action::Freeze(p) {
                    s.faults.freezes -= 1;
                    proc.frozen = true;
                } else {
                    s.faults.partitions -= 1;
                    proc.partitioned = true;
                }
                proc.cut_off |= proc.knows < s.server.incarnation;
            }
            Action::Thaw(p) => {
                s.procs[usize::from(p)].frozen = false;
                self.timers(&mut s, p, true);
                if !s.procs[usize::from(p)].partitioned {
                    self.reconnect(&mut s, p, false);
                }
            }
            Action::Heal(p) => {
                s.procs[usize::from(p)].partitioned = false;
                if !s.procs[usize::from(p)].frozen {
                    self.reconnect(&mut s, p, true);
                    self.timers(&mut s, p, false);
                }
            }
            Action::Close(p) => self.close(&mut s, p),
        }
        self.canonical(&mut s);
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        properties::all()
    }
}
