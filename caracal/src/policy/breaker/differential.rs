//! The breaker scripts against [`Store`]: generated sequences of observations (failed or not,
//! slow or not), probe admissions and settlements, operators' commands, clock moves (plain, to just around the open time, probe lease
//! and window boundaries, and past every expiry) and out-of-band deletions of the state. The
//! cases must reach every row of the transition table.

use std::collections::VecDeque;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use uuid::Uuid;

use crate::coordinator::differential::{Connection, Env, differential, on_server_time};
use crate::kernel::{Scripted, Seen, Stamped, Wire};
use crate::policy::breaker::kernel::{
    Admit, AdmitCommand, AdmitReply, Counts, Entry, Force, Forcing, Observation, Observe,
    ObserveCommand, ObserveReply, Outcomes, Phase, ProbeOutcome, Settings, Settle, SettleCommand,
    State, Store, Stored, TRANSITIONS,
};

const MINT: u64 = 0xABCDE;

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
    /// The duration of the latest operator's command.
    Forced,
}

#[derive(Debug, Clone)]
enum Command {
    Observe {
        generation: Generation,
        observations: Vec<Observation>,
    },
    Force(Force),
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
    /// Moves the clock back (no earlier than the case's start), as a failover to a replica
    /// whose clock is behind does.
    Back {
        ms: u64,
    },
}

fn settings() -> impl Strategy<Value = Settings> {
    // Thresholds that totals of a few observations can meet exactly, besides any other.
    let threshold = || {
        prop_oneof![
            Just(500u32),
            Just(250),
            Just(750),
            Just(1),
            Just(999),
            1u32..1000
        ]
    };
    let slow_threshold = prop_oneof![1 => Just(0u32), 2 => threshold()];
    (
        (1u32..5, threshold(), slow_threshold),
        1u32..8,
        50u64..2_000,
        10u64..400,
        1u32..4,
        1u32..4,
        10u64..400,
    )
        .prop_map(
            |(
                (minimum_throughput, threshold_permille, slow_threshold_permille),
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
                    slow_threshold_permille,
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
    let observation = (prop::bool::weighted(0.6), prop::bool::weighted(0.3))
        .prop_map(|(failed, slow)| Observation { failed, slow });
    let lasts_ms = prop_oneof![1 => Just(0u64), 3 => 1u64..400];
    let force = prop_oneof![
        (lasts_ms.clone()).prop_map(|lasts_ms| Force::Open { lasts_ms }),
        lasts_ms.prop_map(|lasts_ms| Force::Closed { lasts_ms }),
        (1u64..2_000).prop_map(|closed_ttl_ms| Force::Reset { closed_ttl_ms }),
    ];
    prop_oneof![
        8 => (generation(), prop::collection::vec(observation, 1..4))
            .prop_map(|(generation, observations)| Command::Observe { generation, observations }),
        2 => force.prop_map(Command::Force),
        4 => Just(Command::Admit),
        5 => (prop::option::weighted(0.9, 0usize..8), outcome, generation())
            .prop_map(|(probe, outcome, generation)| Command::Settle { probe, outcome, generation }),
        3 => (0u64..600).prop_map(|ms| Command::Advance { ms }),
        3 => (
            prop_oneof![
                Just(Boundary::Open),
                Just(Boundary::ProbeLease),
                Just(Boundary::Window),
                Just(Boundary::Forced)
            ],
            -1i8..=1
        )
            .prop_map(|(boundary, offset)| Command::AdvanceTo { boundary, offset }),
        1 => Just(Command::ExpireAll),
        1 => Just(Command::DeleteState),
        1 => (0u64..5_000).prop_map(|ms| Command::Back { ms }),
    ]
}

/// One case: the stored state on both sides, the shared clock, and what the test knows.
struct Case<'e, 'c> {
    env: &'e mut Env<'c>,
    keys: [String; 3],
    settings: Settings,
    stored: Stored,
    seen: Seen,
    now: u64,
    current: u64,
    probes: Vec<u128>,
    forced_ms: u64,
}

impl Case<'_, '_> {
    fn pick(&self, generation: &Generation) -> u64 {
        match generation {
            Generation::Current => self.current,
            Generation::Previous => self.current.saturating_sub(1),
            Generation::Zero => 0,
            Generation::Minted => MINT,
        }
    }

    /// Runs `command` through `K`'s kernel and its script, and checks the stamp is the clock
    /// the script ran at.
    fn step<K, T>(&mut self, command: &K::Command) -> Result<T, TestCaseError>
    where
        K: Scripted<State = Stored, Reply = Stamped<T>>,
        K::Command: std::fmt::Debug,
        T: PartialEq + std::fmt::Debug,
    {
        let wire = Wire {
            prefix: &self.env.tag.clone(),
            ..Wire::default()
        };
        let now_us = self.now * 1000;
        let Stamped { reply, stamp } =
            self.env
                .step::<K>(&mut self.stored, command, wire, now_us, &mut self.seen)?;
        prop_assert_eq!(stamp, now_us, "the stamp is the script's clock");
        Ok(reply)
    }

    fn run(&mut self, command: &Command) -> Result<(), TestCaseError> {
        match command {
            Command::Observe {
                generation,
                observations,
            } => {
                let model = self.step::<Observe, _>(&ObserveCommand {
                    generation: self.pick(generation),
                    observations: observations.clone(),
                    mint: MINT,
                    settings: self.settings,
                })?;
                self.current = match model {
                    ObserveReply::Recorded { generation, .. }
                    | ObserveReply::Opened { generation, .. }
                    | ObserveReply::Stale { generation, .. } => generation,
                };
            }
            Command::Admit => {
                let token = Uuid::new_v4().as_u128();
                let model = self.step::<Admit, _>(&AdmitCommand {
                    token,
                    settings: self.settings,
                })?;
                if let AdmitReply::Probe { .. } = model {
                    self.probes.push(token);
                }
                self.current = match model {
                    AdmitReply::Closed { generation, .. }
                    | AdmitReply::Open { generation, .. }
                    | AdmitReply::ProbeLimit { generation }
                    | AdmitReply::Probe { generation, .. }
                    | AdmitReply::ForcedOpen { generation, .. }
                    | AdmitReply::ForcedClosed { generation, .. } => generation,
                };
            }
            Command::Force(force) => {
                let model = self.step::<Forcing, _>(force)?;
                self.current = model.generation;
                if let Force::Open { lasts_ms } | Force::Closed { lasts_ms } = force {
                    self.forced_ms = *lasts_ms;
                }
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
                self.step::<Settle, _>(&SettleCommand {
                    token,
                    outcome: *outcome,
                    generation: self.pick(generation),
                    settings: self.settings,
                })?;
            }
            Command::Advance { ms } => self.now += ms,
            Command::AdvanceTo { boundary, offset } => {
                let span = match boundary {
                    Boundary::Open => self.settings.open_ms,
                    Boundary::ProbeLease => self.settings.probe_lease_ms,
                    Boundary::Window => self.settings.window_ms,
                    Boundary::Forced => self.forced_ms,
                };
                self.now += span.saturating_add_signed(i64::from(*offset));
            }
            Command::ExpireAll => {
                self.now += self.settings.closed_ttl_ms() + self.settings.probe_lease_ms + 1
            }
            Command::DeleteState => {
                self.stored.store.state = None;
                self.env.delete(&self.keys[0])?;
            }
            Command::Back { ms } => {
                self.now = self.now.saturating_sub(*ms).max(self.env.start_us / 1000);
            }
        }
        Ok(())
    }

    /// What Redis holds, in the kernel's terms.
    fn stored(&mut self) -> Result<Store, TestCaseError> {
        let fields = self.env.hash::<u64>(&self.keys[0])?;
        let field = |name: &str| fields.get(name).copied().unwrap_or(u64::MAX);
        let state = (!fields.is_empty()).then(|| State {
            phase: Phase::from_code(field("phase") as i64).unwrap_or(Phase::Closed),
            generation: field("generation"),
            opened_at: field("opened_at"),
            probe_successes: field("successes") as u32,
            counts: Counts {
                total: field("total") as u32,
                failures: field("failures") as u32,
                slow: field("slow") as u32,
            },
            closed_until: field("closed_until"),
            forced_until: field("forced_until"),
        });
        let entries = self.env.list(&self.keys[1])?;
        let window: VecDeque<Entry> = entries
            .iter()
            .map(|entry| {
                let (at, outcomes) = entry.split_once(':').unwrap_or(("0", ""));
                // An unknown letter must fail the comparison, not vanish.
                let observations: Vec<Observation> = outcomes
                    .chars()
                    .map(|c| {
                        Observation::from_letter(c).unwrap_or(Observation {
                            failed: true,
                            slow: true,
                        })
                    })
                    .collect();
                Entry {
                    at: at.parse().unwrap_or(0),
                    outcomes: Outcomes::from_slice(&observations),
                }
            })
            .collect();
        let members = self.env.members::<f64>(&self.keys[2])?;
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
    let mut conn: Connection = Box::new(server.connection());
    let settings = Settings {
        minimum_throughput: 4,
        threshold_permille: 500,
        slow_threshold_permille: 0,
        window_size: 100,
        window_ms: 200,
        open_ms: 1_000,
        half_open_probes: 1,
        half_open_successes: 1,
        probe_lease_ms: 1_000,
        closed_expires: true,
    };
    let mut observe = |outcomes: &str| {
        let command = ObserveCommand {
            generation: 0,
            observations: outcomes
                .chars()
                .filter_map(Observation::from_letter)
                .collect(),
            mint: MINT,
            settings,
        };
        let wire = Wire {
            prefix: "ttl",
            ..Wire::default()
        };
        on_server_time::<Observe>(&mut conn, "ttl", &[&command], wire)
            .remove(0)
            .reply
    };
    observe("fff");
    std::thread::sleep(std::time::Duration::from_millis(400));
    assert_eq!(
        observe("s"),
        ObserveReply::Recorded {
            generation: 0,
            window: Counts {
                total: 1,
                failures: 0,
                slow: 0
            }
        },
        "the three failures left the window with their time"
    );
}

/// A window as its observations, with their time, oldest first.
fn flatten(store: &Store) -> Vec<(u64, Observation)> {
    store
        .window
        .iter()
        .flat_map(|entry| entry.outcomes.iter().map(move |o| (entry.at, o)))
        .collect()
}

pub(crate) fn run(conn: Connection, cases: u32) {
    let strategy = (settings(), prop::collection::vec(command(), 1..60));
    differential(
        conn,
        cases,
        strategy,
        &TRANSITIONS,
        |env, (settings, commands)| {
            let keys = ["brk:state", "brk:window", "brk:probes"].map(|suffix| env.key(suffix));
            let now = env.start_us / 1000;
            let mut case = Case {
                env,
                keys,
                settings,
                stored: Stored::default(),
                seen: Seen::default(),
                now,
                current: 0,
                probes: Vec::new(),
                forced_ms: 0,
            };
            for command in &commands {
                case.run(command)?;
            }
            let mut expected = case.stored.store.clone();
            expected.probes.sort_unstable();
            let stored = case.stored()?;
            // The kernel may keep batches of one millisecond in one window entry where the list
            // keeps one per batch: compare what the windows hold, observation by observation.
            prop_assert_eq!(flatten(&expected), flatten(&stored), "final window");
            prop_assert_eq!(
                (expected.state, expected.probes),
                (stored.state, stored.probes),
                "final state"
            );
            Ok(case.seen)
        },
    );
}

#[test]
fn breaker_scripts_agree_with_the_kernel() {
    let server = caracal_tests::RedisServer::start();
    run(Box::new(server.connection()), 300);
}
