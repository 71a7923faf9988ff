//! The breaker's four commands as kernels of one stored state, and their scripts: an
//! admission, a batch of closed-state observations, a probe's settlement, and an operator's
//! force. Every reply is [`Stamped`] with its place in the order of the breaker's decisions.

use super::{
    AdmitReply, Counts, Force, ForceReply, Observation, ObserveReply, Phase, ProbeOutcome,
    Settings, SettleReply, Store, Token,
};
use crate::kernel::{
    Kernel, Malformed, Now, Publish, Script, Scripted, Seen, Sink, Stamped, State, Wire,
};

/// One breaker identity's store, and when nothing in it can matter any more (what its keys'
/// TTLs are in Redis).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Stored {
    pub(crate) store: Store,
    pub(crate) matters_until: u64,
}

impl State for Stored {
    fn forgettable(&self, now: Now) -> bool {
        self.matters_until <= now.ms
    }
}

impl Stored {
    /// Runs `step` on the store, then moves what it matters until by the settings the command
    /// carried.
    fn decide<R>(
        &mut self,
        settings: &Settings,
        now: Now,
        step: impl FnOnce(&mut Store) -> R,
    ) -> Stamped<R> {
        let reply = step(&mut self.store);
        self.matters_until = self.store.matters_until(settings);
        Stamped {
            reply,
            stamp: now.order,
        }
    }
}

/// May a call run? `token` names the probe slot it takes if it becomes a probe.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Admit;

/// An admission's question.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AdmitCommand {
    pub(crate) token: Token,
    pub(crate) settings: Settings,
}

impl Kernel for Admit {
    type State = Stored;
    type Command = AdmitCommand;
    type Reply = Stamped<AdmitReply>;

    fn step(stored: &mut Stored, command: &AdmitCommand, now: Now, seen: &mut Seen) -> Self::Reply {
        stored.decide(&command.settings, now, |store| {
            store.admit(now.ms, command.token, &command.settings, seen)
        })
    }
}

/// Closed-state observations admitted under `generation`; `mint` is the generation an epoch
/// started after a lost state takes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Observe;

/// A batch of observations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ObserveCommand {
    pub(crate) generation: u64,
    pub(crate) observations: Vec<Observation>,
    pub(crate) mint: u64,
    pub(crate) settings: Settings,
}

impl Kernel for Observe {
    type State = Stored;
    type Command = ObserveCommand;
    type Reply = Stamped<ObserveReply>;

    fn step(
        stored: &mut Stored,
        command: &ObserveCommand,
        now: Now,
        seen: &mut Seen,
    ) -> Self::Reply {
        stored.decide(&command.settings, now, |store| {
            store.observe(
                now.ms,
                command.generation,
                &command.observations,
                command.mint,
                &command.settings,
                seen,
            )
        })
    }
}

/// The probe `token` admitted under `generation` ended with `outcome`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settle;

/// A probe's settlement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SettleCommand {
    pub(crate) token: Token,
    pub(crate) outcome: ProbeOutcome,
    pub(crate) generation: u64,
    pub(crate) settings: Settings,
}

impl Kernel for Settle {
    type State = Stored;
    type Command = SettleCommand;
    type Reply = Stamped<SettleReply>;

    fn step(
        stored: &mut Stored,
        command: &SettleCommand,
        now: Now,
        seen: &mut Seen,
    ) -> Self::Reply {
        stored.decide(&command.settings, now, |store| {
            store.settle(
                now.ms,
                command.token,
                command.outcome,
                command.generation,
                &command.settings,
                seen,
            )
        })
    }
}

/// An operator's command on the breaker.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Forcing;

impl Kernel for Forcing {
    type State = Stored;
    type Command = Force;
    type Reply = Stamped<ForceReply>;

    fn step(stored: &mut Stored, &force: &Force, now: Now, seen: &mut Seen) -> Self::Reply {
        let reply = stored.store.force(now.ms, force, seen);
        // A forced state matters until a reset; a reset's closed state until it expires.
        stored.matters_until = match force {
            Force::Reset { closed_ttl_ms } => now.ms.saturating_add(closed_ttl_ms),
            Force::Open { .. } | Force::Closed { .. } => u64::MAX,
        };
        Stamped {
            reply,
            stamp: now.order,
        }
    }
}

/// What every breaker script shares (the clock, the keys, publishing, the settings by name),
/// sent in front of each: Redis runs one text, so the prelude's locals are the script's.
const PRELUDE: &str = include_str!("prelude.lua");

/// `static NAME: Script` called `name`, of `file` (beside this one) sent after the prelude.
macro_rules! breaker_script {
    ($static:ident, $name:literal, $file:literal) => {
        static $static: Script = Script::new($name, &[PRELUDE, include_str!($file)]);
    };
}

breaker_script!(ADMIT, "breaker_admit", "admit.lua");
breaker_script!(OBSERVE, "breaker_observe", "observe.lua");
breaker_script!(SETTLE, "breaker_settle", "settle.lua");
breaker_script!(FORCE, "breaker_force", "force.lua");

/// The three keys of a breaker identity.
const KEYS: &[&str] = &["brk:state", "brk:window", "brk:probes"];

/// ARGV 1..=11, shared by the admission, observation and settlement scripts: where transitions
/// are published (`""`: nowhere), the prefix of those messages, and the settings.
fn common(wire: &Wire<'_>, settings: &Settings, sink: &mut dyn Sink) {
    let Settings {
        minimum_throughput,
        threshold_permille,
        slow_threshold_permille,
        window_size,
        window_ms,
        open_ms,
        half_open_probes,
        half_open_successes,
        probe_lease_ms,
        closed_expires: _,
    } = *settings;
    sink.text(wire.channel);
    sink.text(wire.prefix);
    for n in [
        minimum_throughput,
        threshold_permille,
        slow_threshold_permille,
        window_size,
    ] {
        sink.int(n.into());
    }
    sink.int(window_ms);
    sink.int(open_ms);
    sink.int(half_open_probes.into());
    sink.int(half_open_successes.into());
    sink.int(probe_lease_ms);
}

/// A token as @gkoos/caracal writes it: a hyphenated lowercase UUID.
fn token(token: Token, sink: &mut dyn Sink) {
    let mut text = uuid::Uuid::encode_buffer();
    sink.text(
        uuid::Uuid::from_u128(token)
            .hyphenated()
            .encode_lower(&mut text),
    );
}

fn phase(code: i64) -> Result<Phase, Malformed> {
    Phase::from_code(code).ok_or_else(|| Malformed::new(format_args!("phase {code}")))
}

fn generation(n: i64) -> Result<u64, Malformed> {
    Malformed::natural("generation", n)
}

/// `reply` stamped with the server time (microseconds) its script decided it at.
fn stamped<T>(reply: T, stamp: i64) -> Result<Stamped<T>, Malformed> {
    Ok(Stamped {
        reply,
        stamp: Malformed::natural("stamp", stamp)?,
    })
}

impl Scripted for Admit {
    const SCRIPT: &'static Script = &ADMIT;
    const KEYS: &'static [&'static str] = KEYS;
    const WIDTH: usize = 5;
    const PUBLISHES: Publish = Publish::Calls;

    fn encode(batch: &[&AdmitCommand], wire: &Wire<'_>, sink: &mut dyn Sink) {
        common(wire, &batch[0].settings, sink);
        token(batch[0].token, sink);
    }

    fn decode(reply: &[i64]) -> Result<Self::Reply, Malformed> {
        let &[kind, generation_n, retry_after, transitioned, stamp] = reply else {
            unreachable!("decoded in groups of WIDTH")
        };
        let generation = generation(generation_n)?;
        let retry_after = Malformed::natural("retry after", retry_after)?;
        let transitioned = Malformed::flag(transitioned)?;
        let admitted = match kind {
            0 => AdmitReply::Closed {
                generation,
                transitioned,
            },
            1 => AdmitReply::Open {
                generation,
                retry_after_ms: retry_after,
            },
            2 => AdmitReply::ProbeLimit { generation },
            3 => AdmitReply::Probe {
                generation,
                transitioned,
            },
            4 => AdmitReply::ForcedOpen {
                generation,
                retry_after_ms: (retry_after > 0).then_some(retry_after),
            },
            5 => AdmitReply::ForcedClosed {
                generation,
                lapses_in_ms: (retry_after > 0).then_some(retry_after),
            },
            other => return Err(Malformed::new(format_args!("admission kind {other}"))),
        };
        stamped(admitted, stamp)
    }
}

impl Scripted for Observe {
    const SCRIPT: &'static Script = &OBSERVE;
    const KEYS: &'static [&'static str] = KEYS;
    const WIDTH: usize = 7;
    const PUBLISHES: Publish = Publish::Calls;

    /// The observations as the window stores them: one letter each.
    fn encode(batch: &[&ObserveCommand], wire: &Wire<'_>, sink: &mut dyn Sink) {
        let command = batch[0];
        common(wire, &command.settings, sink);
        sink.int(command.generation);
        let letters: String = command.observations.iter().map(|o| o.letter()).collect();
        sink.text(&letters);
        sink.int(command.mint);
    }

    fn decode(reply: &[i64]) -> Result<Self::Reply, Malformed> {
        let &[kind, phase_code, generation_n, total, failures, slow, stamp] = reply else {
            unreachable!("decoded in groups of WIDTH")
        };
        let generation = generation(generation_n)?;
        let window = Counts {
            total: Malformed::count(total)?,
            failures: Malformed::count(failures)?,
            slow: Malformed::count(slow)?,
        };
        let observed = match kind {
            0 => ObserveReply::Stale {
                phase: phase(phase_code)?,
                generation,
            },
            1 => ObserveReply::Recorded { generation, window },
            2 => ObserveReply::Opened { generation, window },
            other => return Err(Malformed::new(format_args!("observation kind {other}"))),
        };
        stamped(observed, stamp)
    }
}

impl Scripted for Settle {
    const SCRIPT: &'static Script = &SETTLE;
    const KEYS: &'static [&'static str] = KEYS;
    const WIDTH: usize = 5;
    const PUBLISHES: Publish = Publish::Calls;

    fn encode(batch: &[&SettleCommand], wire: &Wire<'_>, sink: &mut dyn Sink) {
        let command = batch[0];
        common(wire, &command.settings, sink);
        token(command.token, sink);
        sink.text(match command.outcome {
            ProbeOutcome::Success => "s",
            ProbeOutcome::Failure => "f",
            ProbeOutcome::Ignored => "i",
        });
        sink.int(command.generation);
    }

    fn decode(reply: &[i64]) -> Result<Self::Reply, Malformed> {
        let &[kind, phase_code, generation_n, successes, stamp] = reply else {
            unreachable!("decoded in groups of WIDTH")
        };
        let generation = generation(generation_n)?;
        let settled = match kind {
            0 => SettleReply::Stale {
                phase: phase(phase_code)?,
                generation,
            },
            1 => SettleReply::Released { generation },
            2 => SettleReply::Counted {
                generation,
                successes: Malformed::count(successes)?,
            },
            3 => SettleReply::Closed { generation },
            4 => SettleReply::Reopened { generation },
            other => return Err(Malformed::new(format_args!("settle kind {other}"))),
        };
        stamped(settled, stamp)
    }
}

impl Scripted for Forcing {
    const SCRIPT: &'static Script = &FORCE;
    const KEYS: &'static [&'static str] = KEYS;
    const WIDTH: usize = 3;
    const PUBLISHES: Publish = Publish::Operator;

    /// Where the change is published, then the command and its durations.
    fn encode(batch: &[&Force], wire: &Wire<'_>, sink: &mut dyn Sink) {
        sink.text(wire.channel);
        sink.text(wire.prefix);
        let (command, lasts_ms, closed_ttl_ms) = match *batch[0] {
            Force::Open { lasts_ms } => ("open", lasts_ms, 0),
            Force::Closed { lasts_ms } => ("closed", lasts_ms, 0),
            Force::Reset { closed_ttl_ms } => ("reset", 0, closed_ttl_ms),
        };
        sink.text(command);
        sink.int(lasts_ms);
        sink.int(closed_ttl_ms);
    }

    fn decode(reply: &[i64]) -> Result<Self::Reply, Malformed> {
        let &[from, generation_n, stamp] = reply else {
            unreachable!("decoded in groups of WIDTH")
        };
        let forced = ForceReply {
            from: phase(from)?,
            generation: generation(generation_n)?,
        };
        stamped(forced, stamp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_breaker_script_is_sent_after_the_prelude() {
        for script in [
            Admit::SCRIPT,
            Observe::SCRIPT,
            Settle::SCRIPT,
            Forcing::SCRIPT,
        ] {
            let file = script
                .body()
                .strip_prefix(PRELUDE)
                .expect("the prelude first");
            assert!(
                file.starts_with(&format!("-- {}:", script.name)),
                "{}",
                script.name
            );
        }
    }
}
