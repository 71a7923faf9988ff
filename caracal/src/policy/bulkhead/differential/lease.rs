//! `bulkhead_lease.lua` (and the release, a bare `ZREM`) against [`LeaseSet`]: generated
//! acquires (single and batched), renewals and releases of a few tokens, with ttls of their
//! own and clock moves to just before, at and after lease deadlines; callers that know a live
//! fencing token (the counter's, or one above it: a lost set), and counters moved next to
//! 2^53 − 1. Every acquired token has its priority class's share (the whole limit, the usual
//! thresholds' or any; batches of mixed shares), and an acquire may come with a limit of its
//! own (an adaptive limit that moved). Fencing tokens, refusals, the lease set, the counter
//! and both keys' expiries are compared.

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use uuid::Uuid;

use crate::coordinator::differential::{Connection, Env, differential, token_text};
use crate::kernel::{Seen, Wire};
use crate::policy::bulkhead::kernel::{
    Branch, Lease, LeaseAction, LeaseReply, LeaseSet, LeaseStep, MAX_FENCE, Refusal, Terms, Token,
};

/// A token by its index among those used so far (modulo how many), or a new one.
type Pick = Option<usize>;

/// The live fencing token a caller says it knows, relative to the counter.
#[derive(Debug, Clone, Copy)]
enum Known {
    /// None (0).
    Nothing,
    /// The counter itself: no loss.
    Counter,
    /// This much above the counter: the set was lost.
    Above(u64),
}

impl Known {
    fn of(self, counter: u64) -> u64 {
        match self {
            Known::Nothing => 0,
            Known::Counter => counter,
            Known::Above(by) => (counter + by).min(MAX_FENCE),
        }
    }
}

#[derive(Debug, Clone)]
enum Command {
    /// One script call acquiring every token, each with its share of the limit.
    Acquire {
        tokens: Vec<(Pick, u16)>,
        ttl_ms: u64,
        known: Known,
        /// Added to the case's limit for this call: an adaptive limit that moved.
        grown: u32,
    },
    Renew {
        token: Pick,
        ttl_ms: u64,
        known: Known,
    },
    /// Sets the counter this far below 2^53 − 1 (as an operator, or years of grants, could).
    NearTheEnd {
        below: u64,
    },
    Release {
        token: Pick,
    },
    Advance {
        ms: u64,
    },
    /// To the `lease`-th lease's deadline, offset by -1, 0 or 1 ms (where off-by-ones live).
    ToDeadline {
        lease: usize,
        offset: i8,
    },
}

fn command() -> impl Strategy<Value = Command> {
    let token = || prop::option::weighted(0.7, 0usize..6);
    let ttl = prop_oneof![Just(100u64), 100u64..2_000];
    let share = crate::priority::any_share;
    let grown = prop_oneof![3 => Just(0u32), 1 => 1u32..4];
    let known = || {
        prop_oneof![
            6 => Just(Known::Nothing),
            3 => Just(Known::Counter),
            1 => (1u64..3).prop_map(Known::Above),
        ]
    };
    prop_oneof![
        5 => ((token(), share()), ttl.clone(), known(), grown.clone())
            .prop_map(|(token, ttl_ms, known, grown)| Command::Acquire { tokens: vec![token], ttl_ms, known, grown }),
        2 => (prop::collection::vec((token(), share()), 2..6), ttl, known(), grown)
            .prop_map(|(tokens, ttl_ms, known, grown)| Command::Acquire { tokens, ttl_ms, known, grown }),
        3 => (token(), 100u64..2_000, known())
            .prop_map(|(token, ttl_ms, known)| Command::Renew { token, ttl_ms, known }),
        1 => (0u64..4).prop_map(|below| Command::NearTheEnd { below }),
        2 => token().prop_map(|token| Command::Release { token }),
        2 => (0u64..700).prop_map(|ms| Command::Advance { ms }),
        2 => (0usize..6, -1i8..=1).prop_map(|(lease, offset)| Command::ToDeadline { lease, offset }),
    ]
}

/// One case: the limit every caller uses, and what they do.
fn case() -> impl Strategy<Value = (u32, Vec<Command>)> {
    (1u32..6, prop::collection::vec(command(), 1..50))
}

/// A case's tokens: every one used so far, so later commands can pick them again.
#[derive(Default)]
struct Tokens(Vec<Token>);

impl Tokens {
    fn pick(&mut self, pick: Pick) -> Token {
        match pick {
            Some(i) if !self.0.is_empty() => self.0[i % self.0.len()],
            _ => {
                let token = Uuid::new_v4().as_u128();
                self.0.push(token);
                token
            }
        }
    }
}

/// What one command answers: a reply per token, or the refusal of the whole command.
type Answer = Result<Vec<LeaseReply>, Refusal>;

/// Runs the lease script for `tokens` at `now_ms`, encoded and decoded as the backend does:
/// one reply per token, or its refusal.
fn script(
    env: &mut Env<'_>,
    action: LeaseAction,
    tokens: &[(Token, u16)],
    terms: Terms,
    now_ms: u64,
) -> Result<Answer, TestCaseError> {
    let steps: Vec<LeaseStep> = tokens
        .iter()
        .map(|&(token, share)| LeaseStep {
            action,
            token,
            ttl: terms.ttl,
            limit: terms.limit,
            known: terms.known,
            share,
        })
        .collect();
    let batch: Vec<&LeaseStep> = steps.iter().collect();
    let wire = Wire {
        known: terms.known,
        ..Wire::default()
    };
    match env.script::<Lease>(&batch, wire, now_ms * 1000)? {
        Ok(replies) => Ok(replies.into_iter().collect()),
        Err(error) => match error.code() {
            Some("CARACAL_LOST") => Ok(Err(Refusal::Lost)),
            Some("CARACAL_FENCE") => Ok(Err(Refusal::Exhausted)),
            _ => Err(TestCaseError::fail(format!(
                "bulkhead_lease failed: {error}"
            ))),
        },
    }
}

pub(crate) fn run(conn: Connection, cases: u32) {
    differential(
        conn,
        cases,
        case(),
        &Branch::ALL,
        |env, (limit, commands)| {
            let mut model = LeaseSet::default();
            let mut seen = Seen::default();
            let mut tokens = Tokens::default();
            let mut now_ms = env.start_us / 1000;
            for command in commands {
                match command {
                    Command::Acquire {
                        tokens: picks,
                        ttl_ms,
                        known,
                        grown,
                    } => {
                        let batch: Vec<(Token, u16)> = picks
                            .into_iter()
                            .map(|(pick, share)| (tokens.pick(pick), share))
                            .collect();
                        let terms = Terms {
                            ttl: ttl_ms,
                            limit: limit + grown,
                            known: known.of(model.fence),
                        };
                        let expected =
                            model.command(LeaseAction::Acquire, now_ms, &batch, terms, &mut seen);
                        let got = script(env, LeaseAction::Acquire, &batch, terms, now_ms)?;
                        prop_assert_eq!(expected, got, "acquire of {:?} at {}", batch, now_ms);
                    }
                    Command::Renew {
                        token,
                        ttl_ms,
                        known,
                    } => {
                        // A renewal's share is not read: any will do.
                        let token = [(tokens.pick(token), 500)];
                        let terms = Terms {
                            ttl: ttl_ms,
                            limit,
                            known: known.of(model.fence),
                        };
                        let expected =
                            model.command(LeaseAction::Renew, now_ms, &token, terms, &mut seen);
                        let got = script(env, LeaseAction::Renew, &token, terms, now_ms)?;
                        prop_assert_eq!(expected, got, "renewal of {:?} at {}", token, now_ms);
                    }
                    Command::NearTheEnd { below } => {
                        let fences = env.key("fence");
                        if model.fence == 0 {
                            model.fence_expires_at = now_ms + 1000;
                        }
                        model.fence = MAX_FENCE - below;
                        env.set_until(&fences, model.fence, model.fence_expires_at)?;
                    }
                    Command::Release { token } => {
                        let token = tokens.pick(token);
                        let expected = model.release(token, &mut seen);
                        let removed = env.remove_member(
                            &env.key("leases"),
                            &token_text(Uuid::from_u128(token)),
                        )?;
                        prop_assert_eq!(expected, removed, "release of {}", token);
                    }
                    Command::Advance { ms } => now_ms += ms,
                    Command::ToDeadline { lease, offset } => {
                        if !model.leases.is_empty() {
                            let deadline = model.leases[lease % model.leases.len()].1;
                            now_ms = now_ms.max(deadline.saturating_add_signed(i64::from(offset)));
                        }
                    }
                }
            }
            compare_final_state(env, &model)?;
            Ok(seen)
        },
    );
}

/// The sorted set, the counter and their expiries in Redis against the model's.
fn compare_final_state(env: &mut Env<'_>, model: &LeaseSet) -> Result<(), TestCaseError> {
    let (leases, fences) = (env.key("leases"), env.key("fence"));
    let members: Vec<(String, u64)> = env.members(&leases)?;
    let mut stored: Vec<(Token, u64)> = members
        .iter()
        .map(|(token, deadline)| {
            let token = Uuid::parse_str(token).map_or(0, |token| token.as_u128());
            (token, *deadline)
        })
        .collect();
    stored.sort_unstable();
    let mut expected = model.leases.clone();
    expected.sort_unstable();
    prop_assert_eq!(&expected, &stored, "final lease set");
    let expiry = env.expiry(&leases)?;
    let expected_expiry = (!model.leases.is_empty()).then_some(model.expires_at);
    prop_assert_eq!(expected_expiry, expiry, "the lease set's expiry");
    let fence: Option<u64> = env.get(&fences)?;
    let granted = model.fence > 0;
    prop_assert_eq!(granted.then_some(model.fence), fence, "the fencing counter");
    let expiry = env.expiry(&fences)?;
    prop_assert_eq!(
        granted.then_some(model.fence_expires_at),
        expiry,
        "the counter's expiry"
    );
    Ok(())
}

#[test]
fn bulkhead_lease_agrees_with_the_kernel() {
    let server = caracal_tests::RedisServer::start();
    run(Box::new(server.connection()), 300);
}
