//! The breaker's scripts: their arguments and the strict decoding of their replies.

use redis::ToRedisArgs;
use uuid::Uuid;

use super::scripts::Script;
use super::{RedisBackend, reply, scripts, token_text};
use crate::Error;
use crate::coordinator::{BreakerTarget, Stamped, feed};
use crate::identity::KeyBase;
use crate::kernel::breaker::{
    AdmitReply, Counts, Force, ForceReply, Observation, ObserveReply, Phase, ProbeOutcome,
    Settings, SettleReply,
};

/// The three keys of a breaker identity.
fn keys(key: &KeyBase) -> [String; 3] {
    ["brk:state", "brk:window", "brk:probes"].map(|suffix| key.key(suffix))
}

/// ARGV 1..=11, shared by the admission, observation and settlement scripts: where transitions
/// are published (`""`: nowhere), the prefix of those messages, and the settings.
pub(crate) fn common_args(
    channel: &str,
    prefix: &str,
    settings: &Settings,
) -> impl ToRedisArgs + use<> {
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
    (
        channel.to_owned(),
        prefix.to_owned(),
        minimum_throughput,
        threshold_permille,
        slow_threshold_permille,
        window_size,
        window_ms,
        open_ms,
        (half_open_probes, half_open_successes, probe_lease_ms),
    )
}

fn phase(script: &str, code: i64) -> Result<Phase, Error> {
    Phase::from_code(code).ok_or_else(|| reply::malformed(script, format_args!("phase {code}")))
}

fn generation(script: &str, n: i64) -> Result<u64, Error> {
    u64::try_from(n).map_err(|_| reply::malformed(script, format_args!("generation {n}")))
}

/// `reply` stamped with the server time (microseconds) its script decided it at.
fn stamped<T>(script: &str, reply: T, stamp: i64) -> Result<Stamped<T>, Error> {
    let stamp = u64::try_from(stamp)
        .map_err(|_| reply::malformed(script, format_args!("stamp {stamp}")))?;
    Ok(Stamped { reply, stamp })
}

/// Observations as the window stores them: one letter each.
pub(crate) fn outcome_text(observations: &[Observation]) -> String {
    observations.iter().map(|o| o.letter()).collect()
}

pub(crate) fn probe_outcome_text(outcome: ProbeOutcome) -> &'static str {
    match outcome {
        ProbeOutcome::Success => "s",
        ProbeOutcome::Failure => "f",
        ProbeOutcome::Ignored => "i",
    }
}

/// The command and duration a force script takes.
pub(crate) fn force_args(force: Force) -> (&'static str, u64, u64) {
    match force {
        Force::Open { lasts_ms } => ("open", lasts_ms, 0),
        Force::Closed { lasts_ms } => ("closed", lasts_ms, 0),
        Force::Reset { closed_ttl_ms } => ("reset", 0, closed_ttl_ms),
    }
}

pub(crate) fn decode_admit(value: redis::Value) -> Result<Stamped<AdmitReply>, Error> {
    let name = scripts::BREAKER_ADMIT.name;
    let [kind, generation_n, retry_after, transitioned, stamp] = reply::integers::<5>(name, value)?;
    let generation = generation(name, generation_n)?;
    let retry_after = u64::try_from(retry_after)
        .map_err(|_| reply::malformed(name, format_args!("retry after {retry_after}")))?;
    let transitioned = reply::flag(name, transitioned)?;
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
        5 => AdmitReply::ForcedClosed { generation },
        other => {
            return Err(reply::malformed(
                name,
                format_args!("admission kind {other}"),
            ));
        }
    };
    stamped(name, admitted, stamp)
}

pub(crate) fn decode_observe(value: redis::Value) -> Result<Stamped<ObserveReply>, Error> {
    let name = scripts::BREAKER_OBSERVE.name;
    let [kind, phase_code, generation_n, total, failures, slow, stamp] =
        reply::integers::<7>(name, value)?;
    let generation = generation(name, generation_n)?;
    let window = Counts {
        total: reply::to_u32(name, total)?,
        failures: reply::to_u32(name, failures)?,
        slow: reply::to_u32(name, slow)?,
    };
    let observed = match kind {
        0 => ObserveReply::Stale {
            phase: phase(name, phase_code)?,
            generation,
        },
        1 => ObserveReply::Recorded { generation, window },
        2 => ObserveReply::Opened { generation, window },
        other => {
            return Err(reply::malformed(
                name,
                format_args!("observation kind {other}"),
            ));
        }
    };
    stamped(name, observed, stamp)
}

pub(crate) fn decode_settle(value: redis::Value) -> Result<Stamped<SettleReply>, Error> {
    let name = scripts::BREAKER_SETTLE.name;
    let [kind, phase_code, generation_n, successes, stamp] = reply::integers::<5>(name, value)?;
    let generation = generation(name, generation_n)?;
    let settled = match kind {
        0 => SettleReply::Stale {
            phase: phase(name, phase_code)?,
            generation,
        },
        1 => SettleReply::Released { generation },
        2 => SettleReply::Counted {
            generation,
            successes: reply::to_u32(name, successes)?,
        },
        3 => SettleReply::Closed { generation },
        4 => SettleReply::Reopened { generation },
        other => return Err(reply::malformed(name, format_args!("settle kind {other}"))),
    };
    stamped(name, settled, stamp)
}

pub(crate) fn decode_force(value: redis::Value) -> Result<Stamped<ForceReply>, Error> {
    let name = scripts::BREAKER_FORCE.name;
    let [from, generation_n, stamp] = reply::integers::<3>(name, value)?;
    let forced = ForceReply {
        from: phase(name, from)?,
        generation: generation(name, generation_n)?,
    };
    stamped(name, forced, stamp)
}

impl RedisBackend {
    /// Runs one breaker script on `target`'s three keys: the shared arguments, then `args`.
    async fn breaker_script(
        &self,
        script: &Script,
        target: &BreakerTarget,
        args: impl ToRedisArgs,
    ) -> Result<redis::Value, Error> {
        let key = &target.identity.key;
        let prefix = feed::prefix(feed::Origin::Call, key);
        self.link
            .eval(
                script,
                key,
                &keys(key),
                (common_args(self.channel(), &prefix, &target.settings), args),
            )
            .await
    }

    pub(in crate::coordinator) async fn breaker_admit(
        &self,
        target: &BreakerTarget,
        token: Uuid,
    ) -> Result<Stamped<AdmitReply>, Error> {
        let args = token_text(token);
        decode_admit(
            self.breaker_script(&scripts::BREAKER_ADMIT, target, args)
                .await?,
        )
    }

    pub(in crate::coordinator) async fn breaker_observe(
        &self,
        target: &BreakerTarget,
        generation: u64,
        observations: &[Observation],
        mint: u64,
    ) -> Result<Stamped<ObserveReply>, Error> {
        let args = (generation, outcome_text(observations), mint);
        decode_observe(
            self.breaker_script(&scripts::BREAKER_OBSERVE, target, args)
                .await?,
        )
    }

    pub(in crate::coordinator) async fn breaker_settle(
        &self,
        target: &BreakerTarget,
        token: Uuid,
        outcome: ProbeOutcome,
        generation: u64,
    ) -> Result<Stamped<SettleReply>, Error> {
        let args = (token_text(token), probe_outcome_text(outcome), generation);
        decode_settle(
            self.breaker_script(&scripts::BREAKER_SETTLE, target, args)
                .await?,
        )
    }

    /// An operator's command on the breaker of `key`.
    pub(in crate::coordinator) async fn breaker_force(
        &self,
        key: &KeyBase,
        force: Force,
    ) -> Result<Stamped<ForceReply>, Error> {
        let script = &*scripts::BREAKER_FORCE;
        let prefix = feed::prefix(feed::Origin::Operator, key);
        let value = self
            .link
            .eval(
                script,
                key,
                &keys(key),
                (self.channel(), prefix, force_args(force)),
            )
            .await?;
        decode_force(value)
    }
}
