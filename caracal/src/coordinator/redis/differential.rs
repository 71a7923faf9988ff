//! The differential test: generated sequences of breaker commands (observe, admit a probe,
//! settle a probe, advance time, jump past every expiry, delete the state out of band) are
//! replayed against the Rust kernel (what the in-memory coordinator runs) and against the Lua
//! scripts in a real `redis-server`. Every reply and the final stored state must be identical,
//! and the runs together must reach every row of the transition table.
//!
//! Both run on one explicit clock: the scripts' clock lines are replaced by "now is the last
//! argument". The clock starts an hour ahead of the server's so key TTLs (real time) can never
//! expire anything before the scripts' own logical expiry decides.
//!
//! Replay a failure with `CARACAL_TEST_SEED=<seed printed on failure>`; set
//! `CARACAL_TEST_CASES` for a deeper run.

use std::collections::VecDeque;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use uuid::Uuid;

use super::breaker::{
    decode_admit, decode_observe, decode_settle, outcome_text, probe_outcome_text,
};
use super::scripts::{self, Script};
use crate::policy::breaker::kernel::{
    AdmitReply, Entry, ObserveReply, Outcomes, Phase, ProbeOutcome, Seen, Settings, State, Store,
};

const CLOCK: &str = "local clock = redis.call('TIME')\n\
                     local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)\n";
const FIXED_CLOCK: &str = "local now = tonumber(ARGV[#ARGV])\n";
const MINT: u64 = 0xABCDE;

/// `script` with its clock replaced by the last argument.
fn with_fixed_clock(script: &Script) -> redis::Script {
    assert_eq!(
        script.body.matches(CLOCK).count(),
        1,
        "{} reads the clock once",
        script.name
    );
    redis::Script::new(&script.body.replace(CLOCK, FIXED_CLOCK))
}

#[derive(Debug, Clone)]
enum Generation {
    Current,
    Previous,
    Zero,
    Minted,
}

#[derive(Debug, Clone, Copy)]
enum Boundary {
    Open,
    ProbeLease,
    Window,
}

#[derive(Debug, Clone)]
enum Command {
    Observe {
        generation: Generation,
        failures: Vec<bool>,
    },
    Admit,
    /// Settles the `probe`-th admitted probe (modulo how many there are), or a token nobody
    /// holds when `None`.
    Settle {
        probe: Option<usize>,
        outcome: ProbeOutcome,
        generation: Generation,
    },
    Advance {
        ms: u64,
    },
    /// Moves the clock to just before, exactly at, or just after the boundary a setting sets
    /// (`offset` -1, 0 or 1 ms), where off-by-one mistakes live.
    AdvanceTo {
        boundary: Boundary,
        offset: i8,
    },
    ExpireAll,
    DeleteState,
}

fn settings() -> impl Strategy<Value = Settings> {
    // Thresholds that totals of a few observations can meet exactly, besides any other.
    let threshold = prop_oneof![
        Just(500u32),
        Just(250),
        Just(750),
        Just(1),
        Just(999),
        1u32..1000
    ];
    (
        1u32..5,
        threshold,
        1u32..8,
        50u64..2_000,
        10u64..400,
        1u32..4,
        1u32..4,
        10u64..400,
    )
        .prop_map(
            |(
                minimum_throughput,
                threshold_permille,
                window_size,
                window_ms,
                open_ms,
                probes,
                successes,
                lease,
            )| {
                Settings {
                    minimum_throughput: minimum_throughput.min(window_size),
                    threshold_permille,
                    window_size,
                    window_ms,
                    open_ms,
                    half_open_probes: probes,
                    half_open_successes: successes,
                    probe_lease_ms: lease,
                    closed_expires: true,
                }
            },
        )
}

fn generation() -> impl Strategy<Value = Generation> {
    prop_oneof![
        6 => Just(Generation::Current),
        1 => Just(Generation::Previous),
        1 => Just(Generation::Zero),
        1 => Just(Generation::Minted),
    ]
}

fn command() -> impl Strategy<Value = Command> {
    let outcome = prop_oneof![
        3 => Just(ProbeOutcome::Success),
        2 => Just(ProbeOutcome::Failure),
        1 => Just(ProbeOutcome::Ignored),
    ];
    prop_oneof![
        8 => (generation(), prop::collection::vec(prop::bool::weighted(0.6), 1..4))
            .prop_map(|(generation, failures)| Command::Observe { generation, failures }),
        4 => Just(Command::Admit),
        5 => (prop::option::weighted(0.9, 0usize..8), outcome, generation())
            .prop_map(|(probe, outcome, generation)| Command::Settle { probe, outcome, generation }),
        3 => (0u64..600).prop_map(|ms| Command::Advance { ms }),
        3 => (
            prop_oneof![Just(Boundary::Open), Just(Boundary::ProbeLease), Just(Boundary::Window)],
            -1i8..=1
        )
            .prop_map(|(boundary, offset)| Command::AdvanceTo { boundary, offset }),
        1 => Just(Command::ExpireAll),
        1 => Just(Command::DeleteState),
    ]
}

/// One case: the stored state on both sides, the shared clock, and what the test knows.
struct Case<'a, C> {
    conn: &'a mut C,
    keys: [String; 3],
    tag: String,
    settings: Settings,
    store: Store,
    seen: Seen,
    now: u64,
    current: u64,
    probes: Vec<u128>,
}

impl<C: redis::ConnectionLike> Case<'_, C> {
    fn pick(&self, generation: &Generation) -> u64 {
        match generation {
            Generation::Current => self.current,
            Generation::Previous => self.current.saturating_sub(1),
            Generation::Zero => 0,
            Generation::Minted => MINT,
        }
    }

    fn eval(
        &mut self,
        script: &Script,
        args: impl redis::ToRedisArgs,
    ) -> Result<redis::Value, TestCaseError> {
        let s = &self.settings;
        let invocation = with_fixed_clock(script);
        let mut invocation = invocation.prepare_invoke();
        for key in &self.keys {
            invocation.key(key);
        }
        invocation
            .arg("")
            .arg(&self.tag)
            .arg(s.minimum_throughput)
            .arg(s.threshold_permille)
            .arg(s.window_size)
            .arg(s.window_ms)
            .arg(s.open_ms)
            .arg(s.half_open_probes)
            .arg(s.half_open_successes)
            .arg(s.probe_lease_ms)
            .arg(args)
            .arg(self.now);
        invocation
            .invoke(self.conn)
            .map_err(|e| TestCaseError::fail(format!("{} failed: {e}", script.name)))
    }

    fn run(&mut self, command: &Command) -> Result<(), TestCaseError> {
        match command {
            Command::Observe {
                generation,
                failures,
            } => {
                let expected = self.pick(generation);
                let model = self.store.observe(
                    self.now,
                    expected,
                    failures,
                    MINT,
                    &self.settings,
                    &mut self.seen,
                );
                let value = self.eval(
                    &scripts::BREAKER_OBSERVE,
                    (expected, outcome_text(failures), MINT),
                )?;
                let lua = decode_observe(value).map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(model, lua, "observe {:?} under {}", failures, expected);
                self.current = match model {
                    ObserveReply::Recorded { generation, .. }
                    | ObserveReply::Opened { generation, .. }
                    | ObserveReply::Stale { generation, .. } => generation,
                };
            }
            Command::Admit => {
                let token = Uuid::new_v4().as_u128();
                let model = self
                    .store
                    .admit(self.now, token, &self.settings, &mut self.seen);
                let value = self.eval(
                    &scripts::BREAKER_ADMIT,
                    Uuid::from_u128(token).hyphenated().to_string(),
                )?;
                let lua = decode_admit(value).map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(model, lua, "admit");
                if let AdmitReply::Probe { .. } = model {
                    self.probes.push(token);
                }
                self.current = match model {
                    AdmitReply::Closed { generation }
                    | AdmitReply::Open { generation, .. }
                    | AdmitReply::ProbeLimit { generation }
                    | AdmitReply::Probe { generation, .. } => generation,
                };
            }
            Command::Settle {
                probe,
                outcome,
                generation,
            } => {
                let token = match probe {
                    Some(index) if !self.probes.is_empty() => {
                        self.probes[index % self.probes.len()]
                    }
                    _ => Uuid::new_v4().as_u128(),
                };
                let expected = self.pick(generation);
                let model = self.store.settle(
                    self.now,
                    token,
                    *outcome,
                    expected,
                    &self.settings,
                    &mut self.seen,
                );
                let token_text = Uuid::from_u128(token).hyphenated().to_string();
                let value = self.eval(
                    &scripts::BREAKER_SETTLE,
                    (token_text, probe_outcome_text(*outcome), expected),
                )?;
                let lua = decode_settle(value).map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(model, lua, "settle {:?} under {}", outcome, expected);
            }
            Command::Advance { ms } => self.now += ms,
            Command::AdvanceTo { boundary, offset } => {
                let span = match boundary {
                    Boundary::Open => self.settings.open_ms,
                    Boundary::ProbeLease => self.settings.probe_lease_ms,
                    Boundary::Window => self.settings.window_ms,
                };
                self.now += span.saturating_add_signed(i64::from(*offset));
            }
            Command::ExpireAll => {
                self.now += self.settings.closed_ttl_ms() + self.settings.probe_lease_ms + 1
            }
            Command::DeleteState => {
                self.store.state = None;
                redis::cmd("DEL")
                    .arg(&self.keys[0])
                    .query::<()>(self.conn)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
            }
        }
        Ok(())
    }

    /// What Redis holds, in the kernel's terms.
    fn stored(&mut self) -> Result<Store, TestCaseError> {
        let fail = |e: redis::RedisError| TestCaseError::fail(e.to_string());
        let fields: std::collections::HashMap<String, u64> = redis::cmd("HGETALL")
            .arg(&self.keys[0])
            .query(self.conn)
            .map_err(fail)?;
        let field = |name: &str| fields.get(name).copied().unwrap_or(u64::MAX);
        let state = (!fields.is_empty()).then(|| State {
            phase: Phase::from_code(field("phase") as i64).unwrap_or(Phase::Closed),
            generation: field("generation"),
            opened_at: field("opened_at"),
            probe_successes: field("successes") as u32,
            total: field("total") as u32,
            failures: field("failures") as u32,
            closed_until: field("closed_until"),
        });
        let entries: Vec<String> = redis::cmd("LRANGE")
            .arg(&self.keys[1])
            .arg(0)
            .arg(-1)
            .query(self.conn)
            .map_err(fail)?;
        let window: VecDeque<Entry> = entries
            .iter()
            .map(|entry| {
                let (at, outcomes) = entry.split_once(':').unwrap_or(("0", ""));
                let failures: Vec<bool> = outcomes.chars().map(|c| c == 'f').collect();
                Entry {
                    at: at.parse().unwrap_or(0),
                    outcomes: Outcomes::from_slice(&failures),
                }
            })
            .collect();
        let members: Vec<(String, f64)> = redis::cmd("ZRANGE")
            .arg(&self.keys[2])
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query(self.conn)
            .map_err(fail)?;
        let mut probes: Vec<(u128, u64)> = members
            .iter()
            .map(|(token, deadline)| {
                (
                    Uuid::parse_str(token).map_or(0, |t| t.as_u128()),
                    *deadline as u64,
                )
            })
            .collect();
        probes.sort_unstable();
        Ok(Store {
            state,
            window,
            probes,
        })
    }
}

/// The fixed clock runs ahead of the server's so key TTLs never fire during a case; this
/// checks what happens when they do: with a window shorter than twice the open time, the
/// window list must not expire before the state whose totals count it.
#[test]
fn key_expiry_never_leaves_totals_behind() {
    let server = caracal_tests::RedisServer::start();
    let mut conn = server.connection();
    let settings = Settings {
        minimum_throughput: 4,
        threshold_permille: 500,
        window_size: 100,
        window_ms: 200,
        open_ms: 1_000,
        half_open_probes: 1,
        half_open_successes: 1,
        probe_lease_ms: 1_000,
        closed_expires: true,
    };
    let keys = ["brk:state", "brk:window", "brk:probes"].map(|s| format!("caracal:v1:{{ttl}}:{s}"));
    let mut observe = |outcomes: &str| {
        let value = redis::Script::new(scripts::BREAKER_OBSERVE.body)
            .key(&keys[0])
            .key(&keys[1])
            .key(&keys[2])
            .arg((
                "",
                "ttl",
                settings.minimum_throughput,
                settings.threshold_permille,
            ))
            .arg((settings.window_size, settings.window_ms, settings.open_ms))
            .arg((
                settings.half_open_probes,
                settings.half_open_successes,
                settings.probe_lease_ms,
            ))
            .arg((0, outcomes, MINT))
            .invoke(&mut conn)
            .expect("observe");
        decode_observe(value).expect("observe reply")
    };
    observe("fff");
    std::thread::sleep(std::time::Duration::from_millis(400));
    assert_eq!(
        observe("s"),
        ObserveReply::Recorded {
            generation: 0,
            total: 1,
            failures: 0
        },
        "the three failures left the window with their time"
    );
}

/// A window as its observations: (time, failed), oldest first.
fn flatten(store: &Store) -> Vec<(u64, bool)> {
    store
        .window
        .iter()
        .flat_map(|entry| entry.outcomes.iter().map(move |failed| (entry.at, failed)))
        .collect()
}

fn server_now_ms(conn: &mut impl redis::ConnectionLike) -> u64 {
    let (seconds, micros): (u64, u64) = redis::cmd("TIME").query(conn).expect("TIME");
    seconds * 1000 + micros / 1000
}

#[test]
fn lua_and_kernel_agree_on_every_reply_and_state() {
    let server = caracal_tests::RedisServer::start();
    differential(server.connection(), 300);
}

#[test]
fn lua_and_kernel_agree_on_a_cluster() {
    let cluster = caracal_tests::RedisCluster::start(3);
    differential(
        cluster
            .client()
            .get_connection()
            .expect("cluster connection"),
        200,
    );
}

/// Replays generated cases over `conn`; `CARACAL_TEST_CASES` overrides `default_cases`.
fn differential(conn: impl redis::ConnectionLike, default_cases: u32) {
    let conn = std::cell::RefCell::new(conn);
    let seed: u64 = std::env::var("CARACAL_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| (Uuid::new_v4().as_u128() >> 64) as u64);
    let cases: u32 = std::env::var("CARACAL_TEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default_cases);
    let mut seed_bytes = [0u8; 32];
    seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let mut runner = TestRunner::new_with_rng(
        Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        },
        TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes),
    );
    let coverage = std::cell::RefCell::new(Seen::default());
    let case_number = std::cell::Cell::new(0u64);
    let start = server_now_ms(&mut conn.borrow_mut()) + 3_600_000;
    let result = runner.run(
        &(settings(), prop::collection::vec(command(), 1..60)),
        |(settings, commands)| {
            case_number.set(case_number.get() + 1);
            let tag = format!("differential-{seed}-{}", case_number.get());
            let keys = ["brk:state", "brk:window", "brk:probes"]
                .map(|s| format!("caracal:v1:{{{tag}}}:{s}"));
            let mut conn = conn.borrow_mut();
            let mut case = Case {
                conn: &mut conn,
                keys,
                tag,
                settings,
                store: Store::default(),
                seen: Seen::default(),
                now: start,
                current: 0,
                probes: Vec::new(),
            };
            for command in &commands {
                case.run(command)?;
            }
            let mut expected = case.store.clone();
            expected.probes.sort_unstable();
            let stored = case.stored()?;
            // The kernel may keep batches of one millisecond in one window entry where the
            // list keeps one per batch: compare what the windows hold, observation by
            // observation.
            prop_assert_eq!(flatten(&expected), flatten(&stored), "final window");
            prop_assert_eq!(
                (expected.state, expected.probes),
                (stored.state, stored.probes),
                "final state"
            );
            coverage.borrow_mut().merge(&case.seen);
            Ok(())
        },
    );
    if let Err(failure) = result {
        panic!("differential test failed (replay with CARACAL_TEST_SEED={seed}): {failure}");
    }
    let missing = coverage.borrow().missing();
    assert!(
        missing.is_empty(),
        "transitions never reached in {cases} cases (seed {seed}): {missing:?}"
    );
}
