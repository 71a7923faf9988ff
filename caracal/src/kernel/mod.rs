//! What every kind's state machine is: a [`Kernel`] (the pure step from stored state, command
//! and `now` to a reply) and, for the coordinator's Redis backend, a [`Scripted`] one (its Lua
//! script, keys, encoding and strict decoding). Each kind's kernels live in its own folder,
//! `policy/<kind>/kernel/`, with their scripts beside them.
//!
//! Nothing in a kernel reads a clock, does I/O or draws a random number: `now` and every value
//! that would be random (a token, a generation to mint) come in as plain integers. That is what
//! lets one piece of code serve three users — the local policies and the in-memory coordinator
//! run it on tokio's clock, and each script implements the same steps on Redis time — and lets
//! a differential test replay generated sequences against a kernel and its script and demand
//! identical replies and identical stored state.
//!
//! The kernels sit below both the policies and the coordinator backends and import neither
//! (`layers.rs` checks it).

mod wire;

pub(crate) use self::wire::{Malformed, Now, Publish, Sink, Stamped, Wire};
pub(crate) use crate::script::Script;

/// A kind's state machine for one command: what one identity stores, the command, the reply,
/// and the pure step between them. The in-memory coordinator keeps one map of
/// [`State`](Self::State)s per state type (the commands of one kind share it) and runs
/// [`step`](Self::step); the Redis backend runs the kernel's [`Scripted`] form instead.
pub(crate) trait Kernel: Send + Sync + 'static {
    /// What one identity keeps; `Default` is "no keys".
    type State: State;
    /// One command, as its caller asks it.
    type Command: Send + Sync + 'static;
    /// Its answer.
    type Reply: Send + 'static;

    /// Decides `command` at `now`, recording the branches it reached in `seen`.
    fn step(
        state: &mut Self::State,
        command: &Self::Command,
        now: Now,
        seen: &mut Seen,
    ) -> Self::Reply;
}

/// What one identity keeps in the in-memory coordinator.
pub(crate) trait State: Default + Send + 'static {
    /// Whether nothing is left that Redis would still hold at `now`, so the state can be
    /// forgotten (what key TTLs do in Redis).
    fn forgettable(&self, now: Now) -> bool;
}

/// A kernel as a Lua script: its keys, how a command goes on the wire and how its reply comes
/// back. The script implements [`Kernel::step`] on Redis time; a differential test demands that
/// both agree. A batching kernel's script decides a whole batch, which may differ from its
/// commands stepped one by one: its differential compares the script with the kernel's own
/// batch function (the rate limit's `decide`), of which `step` is the batch of one.
pub(crate) trait Scripted: Kernel {
    /// The script.
    const SCRIPT: &'static Script;
    /// The suffixes of the identity's keys the script takes, in `KEYS` order.
    const KEYS: &'static [&'static str];
    /// How many integers answer one command.
    const WIDTH: usize;
    /// Whether the script publishes what it decides, and for whom.
    const PUBLISHES: Publish = Publish::Nothing;
    /// Whether commands of one identity that queue while a call is in flight go out together
    /// as one call (see [`batches_with`](Self::batches_with)).
    const BATCHES: bool = false;
    /// Whether a malformed reply is named as a batch's (`WIDTH × count` integers): the replies
    /// of a batching kernel's script, also when another kernel shares it.
    const BATCH_REPLY: bool = Self::BATCHES;
    /// Whether the script keeps a fencing counter the backend follows: every call carries the
    /// highest token the backend knows to be live in the identity ([`Wire::known`]), the
    /// script refuses it whole when the counter is below (`CARACAL_LOST`: the keys were lost)
    /// or would pass its bound (`CARACAL_FENCE`), and each reply says what it did to the
    /// counter ([`fence`](Self::fence)).
    const FENCED: bool = false;
    /// The plain commands of a [`Resent`] kernel still waiting for the identity that go out
    /// just before a batch of this kernel, on the same connection, so the batch cannot
    /// overtake them (a release before the next acquire). Only a kernel that
    /// [`BATCHES`](Self::BATCHES) may declare any: its lane sends them (the Redis backend
    /// refuses to compile a non-batching kernel that declares some).
    const AFTER: &'static [Plain] = &[];

    /// Writes the arguments of one script call answering every command of `batch` (one
    /// command, unless [`batches_with`](Self::batches_with) lets several share a call).
    fn encode(batch: &[&Self::Command], wire: &Wire<'_>, sink: &mut dyn Sink);

    /// Decodes one command's [`WIDTH`](Self::WIDTH) integers.
    fn decode(reply: &[i64]) -> Result<Self::Reply, Malformed>;

    /// Whether `other` may go out in the same script call as `first` (a batch carries one set
    /// of settings); commands that never share a call say `false`.
    fn batches_with(first: &Self::Command, other: &Self::Command) -> bool {
        let _ = (first, other);
        false
    }

    /// What `reply` did to a [`FENCED`](Self::FENCED) kernel's counter.
    fn fence(reply: &Self::Reply) -> Fence {
        let _ = reply;
        Fence::Untouched
    }

    /// How long past its send (nanoseconds) the counter lives after `command` granted or
    /// kept it. Required of a [`FENCED`](Self::FENCED) kernel: the default 0 would make every
    /// token recorded stale at once, so no call would carry one and a loss would go unnoticed
    /// (debug builds assert it is above 0). Commands that [`batches_with`](Self::batches_with)
    /// lets share a call must share it too: one value serves the batch.
    fn lasts_ns(command: &Self::Command) -> u64 {
        let _ = command;
        0
    }

    /// Undoes through `undo` what `reply` granted to `command`, whose caller gave up before
    /// it arrived. Only a batched command's caller can (its reply comes through the lane):
    /// a kernel whose commands do not [batch](Self::BATCHES) is never asked. Most kernels leave it
    /// decided.
    fn unheard(command: &Self::Command, reply: &Self::Reply, undo: &mut dyn Undo) {
        let _ = (command, reply, undo);
    }
}

/// What a reply of a [`FENCED`](Scripted::FENCED) kernel did to its identity's counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fence {
    /// Nothing the backend follows.
    Untouched,
    /// Granted this token: the counter holds at least it for [`Scripted::lasts_ns`] past the
    /// send.
    Granted(u64),
    /// Kept the counter for [`Scripted::lasts_ns`] past the send (a renewal).
    Kept,
}

/// Where a kernel sends what undoes a reply its caller never heard (see
/// [`Scripted::unheard`]).
pub(crate) trait Undo {
    /// Sends `plain`'s command with the arguments `encode` writes, until `lasts_ns`
    /// nanoseconds from now.
    fn send(&mut self, plain: Plain, encode: &dyn Fn(&mut dyn Sink), lasts_ns: u64);
}

impl dyn Undo + '_ {
    /// Sends `command` of `K` until `lasts_ns` nanoseconds from now.
    pub(crate) fn resend<K: Resent>(&mut self, command: &K::Command, lasts_ns: u64) {
        self.send(K::PLAIN, &|sink| K::encode(command, sink), lasts_ns);
    }
}

/// A kernel whose command goes out as one plain Redis command on one of its identity's keys
/// (no script), and may be sent again: the Redis backend sends one whose outcome is unknown
/// until a deadline (see the coordinator's `send_until`). Commands of one identity that queue
/// meanwhile go out together as one command, whose integer reply counts the commands that took
/// effect: so many of them hear `true`, in order, the rest `false`.
pub(crate) trait Resent: Kernel<Reply = bool> {
    /// The Redis command and the key it takes.
    const PLAIN: Plain;

    /// Writes one command's arguments, after the key (a batch writes each in turn): exactly one
    /// argument per command, whose effect the integer reply counts once, as the reply of a
    /// batch is checked against the number of its commands.
    fn encode(command: &Self::Command, sink: &mut dyn Sink);
}

/// A plain Redis command on one of an identity's keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Plain {
    /// The command, e.g. `ZREM`.
    pub(crate) verb: &'static str,
    /// The suffix of the identity's key it takes, its first argument.
    pub(crate) key: &'static str,
}

/// Which branches of a kernel a run reached, one bit per branch: the coverage a differential
/// test asserts. Recording is a single OR; callers that do not measure coverage pass a
/// throwaway value.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Seen(u64);

impl Seen {
    /// Marks branch `index` (below 64) as reached.
    pub(crate) fn record(&mut self, index: usize) {
        self.0 |= 1 << index;
    }

    /// Adds what `other` reached.
    #[cfg(test)]
    pub(crate) fn merge(&mut self, other: Seen) {
        self.0 |= other.0;
    }

    /// The branches of `all` (indexed as recorded) never reached.
    #[cfg(test)]
    pub(crate) fn missing<'a, T>(&self, all: &'a [T]) -> Vec<&'a T> {
        all.iter()
            .enumerate()
            .filter(|&(index, _)| self.0 & (1 << index) == 0)
            .map(|(_, branch)| branch)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::Seen;

    #[test]
    fn seen_reports_what_was_not_reached() {
        let mut seen = Seen::default();
        seen.record(0);
        let mut other = Seen::default();
        other.record(2);
        seen.merge(other);
        assert_eq!(seen.missing(&["a", "b", "c", "d"]), [&"b", &"d"]);
    }
}
