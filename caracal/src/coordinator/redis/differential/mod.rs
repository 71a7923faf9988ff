//! Differential tests, one per script: generated command sequences are replayed against a
//! kernel (what the in-memory coordinator and the local policies run) and against its Lua
//! script in a real `redis-server` (standalone, and a three-master cluster). Every reply and
//! the final stored state must be identical, and the cases together must reach every branch
//! of the kernel.
//!
//! Both sides run on one explicit clock: each script's single `redis.call('TIME')` is replaced
//! by "the last argument is the time" (server microseconds, as `TIME` gives them). The clock
//! starts an hour ahead of the server's, so key TTLs (which run on real time) never expire
//! anything during a case: what is compared is the scripts' own logic, and the TTLs they set
//! are compared as values.
//!
//! Replay a failure with `CARACAL_TEST_SEED=<seed printed on failure>`; set
//! `CARACAL_TEST_CASES` for a deeper run.

mod adaptive;
mod breaker;
mod lease;
mod rate_limit;
mod window;

use std::cell::{Cell, RefCell};
use std::fmt::Debug;

use proptest::prop_assert_eq;
use proptest::strategy::Strategy;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};

use super::kernels::{self, Encoded};
use crate::kernel::{Now, Script, Scripted, Seen, Wire};

/// What a script reads the clock with; each script does it exactly once.
const CLOCK_READ: &str = "redis.call('TIME')";
/// The substitute: `TIME`'s reply, `{seconds, microseconds}`, from the last argument, which
/// it removes, so the script sees the arguments it would see in production (every script reads
/// the clock first).
const FIXED_CLOCK: &str = "(function() local t = tonumber(table.remove(ARGV)) \
                           return {math.floor(t / 1000000), t % 1000000} end)()";

/// `script` reading its clock from its last argument.
fn with_fixed_clock(script: &Script) -> redis::Script {
    assert_eq!(
        script.body().matches(CLOCK_READ).count(),
        1,
        "{} reads the clock exactly once",
        script.name
    );
    redis::Script::new(&script.body().replace(CLOCK_READ, FIXED_CLOCK))
}

/// One case's connection, its keys' hash tag (unique per case) and the clock it starts at.
struct Env<'a, C> {
    conn: &'a mut C,
    tag: String,
    /// The case's starting time, in server microseconds.
    start_us: u64,
}

impl<C: redis::ConnectionLike> Env<'_, C> {
    /// The key `suffix` of this case's identity.
    fn key(&self, suffix: &str) -> String {
        format!("caracal:v1:{{{}}}:{suffix}", self.tag)
    }

    /// Runs `script` (clock substituted) on `keys` with `args`, then `now_us` as the clock; the
    /// script's error replies (its refusals) are handed back.
    fn eval_or_refusal(
        &mut self,
        script: &Script,
        keys: &[String],
        args: impl redis::ToRedisArgs,
        now_us: u64,
    ) -> redis::RedisResult<redis::Value> {
        let fixed = with_fixed_clock(script);
        let mut invocation = fixed.prepare_invoke();
        for key in keys {
            invocation.key(key);
        }
        invocation.arg(args).arg(now_us);
        invocation.invoke(self.conn)
    }

    /// Runs `batch` through `K`'s script at `now_us`, encoded and decoded exactly as the Redis
    /// backend does: one reply per command, or the script's error reply.
    fn script<K: Scripted>(
        &mut self,
        batch: &[&K::Command],
        wire: Wire<'_>,
        now_us: u64,
    ) -> Result<redis::RedisResult<Vec<K::Reply>>, TestCaseError> {
        let keys: Vec<String> = K::KEYS.iter().map(|suffix| self.key(suffix)).collect();
        let args = Encoded::<K>::new(batch, wire);
        match self.eval_or_refusal(K::SCRIPT, &keys, args, now_us) {
            Ok(value) => kernels::decode::<K>(value, batch.len())
                .map(Ok)
                .map_err(decode_failed),
            Err(error) => Ok(Err(error)),
        }
    }

    /// Runs `command` through `K`'s kernel on `state` and through its script, both at `now_us`:
    /// the replies (stamps included) must be equal. Returns the reply.
    fn step<K: Scripted>(
        &mut self,
        state: &mut K::State,
        command: &K::Command,
        wire: Wire<'_>,
        now_us: u64,
        seen: &mut Seen,
    ) -> Result<K::Reply, TestCaseError>
    where
        K::Command: Debug,
        K::Reply: PartialEq + Debug,
    {
        let model = K::step(state, command, clock(now_us), seen);
        let lua = self
            .script::<K>(&[command], wire, now_us)?
            .map_err(|e| TestCaseError::fail(format!("{} failed: {e}", K::SCRIPT.name)))?
            .remove(0);
        prop_assert_eq!(&model, &lua, "{:?} at {} µs", command, now_us);
        Ok(model)
    }

    /// Runs one plain command.
    fn query<T: redis::FromRedisValue>(&mut self, cmd: &redis::Cmd) -> Result<T, TestCaseError> {
        cmd.query(self.conn)
            .map_err(|e| TestCaseError::fail(format!("{cmd:?} failed: {e}")))
    }

    /// When `key` expires, in server milliseconds (`PEXPIRETIME`): `None` for no key, `Some(0)`
    /// for a key without a TTL.
    fn expiry(&mut self, key: &str) -> Result<Option<u64>, TestCaseError> {
        let at: i64 = self.query(redis::cmd("PEXPIRETIME").arg(key))?;
        Ok(match at {
            -2 => None,
            -1 => Some(0),
            at => Some(at as u64),
        })
    }
}

/// The kernel's reading of the script's clock at `now_us`: what a script stamps its replies
/// with is its time in microseconds.
fn clock(now_us: u64) -> Now {
    Now {
        ms: now_us / 1000,
        ns: now_us * 1000,
        order: now_us,
    }
}

/// Fails the case with a decoding error.
fn decode_failed(error: crate::error::Error) -> TestCaseError {
    TestCaseError::fail(format!("reply not decoded: {error}"))
}

/// Rounds of cases a differential test may run to reach every branch.
const MAX_ROUNDS: u32 = 20;

/// Replays `CARACAL_TEST_CASES` (else `default_cases`) cases drawn from `strategy` over
/// `conn`, each through `case`, which returns the kernel branches it reached, and more such
/// rounds while a branch of `branches` is unreached. Panics, naming the seed, on a failed
/// case or on a branch that no case of `MAX_ROUNDS` rounds reached.
fn differential<C, V, B>(
    conn: C,
    default_cases: u32,
    strategy: impl Strategy<Value = V>,
    branches: &[B],
    case: impl Fn(&mut Env<'_, C>, V) -> Result<Seen, TestCaseError>,
) where
    C: redis::ConnectionLike,
    V: Debug,
    B: Debug,
{
    let env_number = |name: &str| std::env::var(name).ok().and_then(|s| s.parse::<u64>().ok());
    let seed = env_number("CARACAL_TEST_SEED").unwrap_or_else(rand::random);
    let cases = env_number("CARACAL_TEST_CASES").map_or(default_cases, |n| n as u32);
    // Round `round` of `seed` draws from its own stream, so a seed replays every round.
    let runner = |round: u32| {
        let mut seed_bytes = [0u8; 32];
        seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
        seed_bytes[8..12].copy_from_slice(&round.to_le_bytes());
        TestRunner::new_with_rng(
            Config {
                cases,
                failure_persistence: None,
                ..Config::default()
            },
            TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes),
        )
    };
    let conn = RefCell::new(conn);
    let (seconds, micros): (u64, u64) = redis::cmd("TIME")
        .query(&mut *conn.borrow_mut())
        .expect("TIME");
    let start_us = seconds * 1_000_000 + micros + 3_600_000_000;
    let coverage = Cell::new(Seen::default());
    let number = Cell::new(0u64);
    // Coverage is a property of the generator, not of one draw: a rare branch may be missed
    // by the first `cases` cases of some seed, so further rounds run until every branch is
    // reached, up to a bound that only a generator unable to reach a branch hits.
    let mut missing = Vec::new();
    for round in 0..MAX_ROUNDS {
        let result = runner(round).run(&strategy, |value| {
            number.set(number.get() + 1);
            let mut conn = conn.borrow_mut();
            let mut env = Env {
                conn: &mut *conn,
                tag: format!("differential-{seed}-{}", number.get()),
                start_us,
            };
            let seen = case(&mut env, value)?;
            let mut all = coverage.get();
            all.merge(seen);
            coverage.set(all);
            Ok(())
        });
        if let Err(failure) = result {
            panic!("differential test failed (replay with CARACAL_TEST_SEED={seed}): {failure}");
        }
        missing = coverage.get().missing(branches);
        if missing.is_empty() {
            return;
        }
    }
    panic!(
        "branches never reached in {} cases (seed {seed}): {missing:?}",
        number.get()
    );
}

/// A server per suite, and one cluster shared by every script's cluster run (it is the
/// slowest thing to start).
#[test]
fn every_script_agrees_with_its_kernel_on_a_cluster() {
    let cluster = caracal_tests::RedisCluster::start(3);
    let connection = || {
        cluster
            .client()
            .get_connection()
            .expect("cluster connection")
    };
    lease::run(connection(), 100);
    rate_limit::run(connection(), 100);
    breaker::run(connection(), 150);
    window::run(connection(), 100);
    adaptive::run(connection(), 100);
}
