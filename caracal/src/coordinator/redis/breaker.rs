//! The breaker's three scripts: their arguments and the strict decoding of their replies.

use redis::ToRedisArgs;
use uuid::Uuid;

use super::scripts::Script;
use super::{RedisBackend, reply, scripts, token_text};
use crate::Error;
use crate::coordinator::BreakerTarget;
use crate::policy::breaker::kernel::{
    AdmitReply, ObserveReply, Phase, ProbeOutcome, Settings, SettleReply,
};

/// The three keys of a breaker identity.
fn keys(target: &BreakerTarget) -> [String; 3] {
    ["brk:state", "brk:window", "brk:probes"].map(|suffix| target.key.key(suffix))
}

/// ARGV 1..=10, shared by the three scripts.
fn common_args(channel: &str, target: &BreakerTarget) -> impl ToRedisArgs {
    let Settings {
        minimum_throughput,
        threshold_permille,
        window_size,
        window_ms,
        open_ms,
        half_open_probes,
        half_open_successes,
        probe_lease_ms,
        closed_expires: _,
    } = target.settings;
    (
        channel.to_owned(),
        target.key.tag().to_owned(),
        minimum_throughput,
        threshold_permille,
        window_size,
        window_ms,
        open_ms,
        half_open_probes,
        half_open_successes,
        probe_lease_ms,
    )
}

fn phase(script: &str, code: i64) -> Result<Phase, Error> {
    Phase::from_code(code).ok_or_else(|| reply::malformed(script, format_args!("phase {code}")))
}

fn generation(script: &str, n: i64) -> Result<u64, Error> {
    u64::try_from(n).map_err(|_| reply::malformed(script, format_args!("generation {n}")))
}

/// Outcomes as the window stores them: one `s` or `f` per observation.
pub(crate) fn outcome_text(failures: &[bool]) -> String {
    failures
        .iter()
        .map(|&failed| if failed { 'f' } else { 's' })
        .collect()
}

pub(crate) fn probe_outcome_text(outcome: ProbeOutcome) -> &'static str {
    match outcome {
        ProbeOutcome::Success => "s",
        ProbeOutcome::Failure => "f",
        ProbeOutcome::Ignored => "i",
    }
}

pub(crate) fn decode_admit(value: redis::Value) -> Result<AdmitReply, Error> {
    let name = scripts::BREAKER_ADMIT.name;
    let [kind, generation_n, retry_after, transitioned] = reply::integers::<4>(name, value)?;
    let generation = generation(name, generation_n)?;
    Ok(match kind {
        0 => AdmitReply::Closed { generation },
        1 => AdmitReply::Open {
            generation,
            retry_after_ms: u64::try_from(retry_after)
                .map_err(|_| reply::malformed(name, format_args!("retry after {retry_after}")))?,
        },
        2 => AdmitReply::ProbeLimit { generation },
        3 => AdmitReply::Probe {
            generation,
            transitioned: reply::flag(name, transitioned)?,
        },
        other => {
            return Err(reply::malformed(
                name,
                format_args!("admission kind {other}"),
            ));
        }
    })
}

pub(crate) fn decode_observe(value: redis::Value) -> Result<ObserveReply, Error> {
    let name = scripts::BREAKER_OBSERVE.name;
    let [kind, phase_code, generation_n, total, failures] = reply::integers::<5>(name, value)?;
    let generation = generation(name, generation_n)?;
    let (total, failures) = (reply::to_u32(name, total)?, reply::to_u32(name, failures)?);
    Ok(match kind {
        0 => ObserveReply::Stale {
            phase: phase(name, phase_code)?,
            generation,
        },
        1 => ObserveReply::Recorded {
            generation,
            total,
            failures,
        },
        2 => ObserveReply::Opened {
            generation,
            total,
            failures,
        },
        other => {
            return Err(reply::malformed(
                name,
                format_args!("observation kind {other}"),
            ));
        }
    })
}

pub(crate) fn decode_settle(value: redis::Value) -> Result<SettleReply, Error> {
    let name = scripts::BREAKER_SETTLE.name;
    let [kind, phase_code, generation_n, successes] = reply::integers::<4>(name, value)?;
    let generation = generation(name, generation_n)?;
    Ok(match kind {
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
    })
}

impl RedisBackend {
    /// Runs one breaker script on `target`'s three keys: the shared arguments, then `args`.
    async fn breaker_script(
        &self,
        script: &Script,
        target: &BreakerTarget,
        args: impl ToRedisArgs,
    ) -> Result<redis::Value, Error> {
        self.eval(
            script,
            &keys(target),
            (common_args(self.channel(), target), args),
        )
        .await
    }

    pub(in crate::coordinator) async fn breaker_admit(
        &self,
        target: &BreakerTarget,
        token: Uuid,
    ) -> Result<AdmitReply, Error> {
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
        failures: &[bool],
        mint: u64,
    ) -> Result<ObserveReply, Error> {
        let args = (generation, outcome_text(failures), mint);
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
    ) -> Result<SettleReply, Error> {
        let args = (token_text(token), probe_outcome_text(outcome), generation);
        decode_settle(
            self.breaker_script(&scripts::BREAKER_SETTLE, target, args)
                .await?,
        )
    }
}
