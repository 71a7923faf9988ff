//! A model of caracal's distributed bulkhead lease protocol (`caracal/docs/leases.md`),
//! checked exhaustively by [stateright]: every interleaving of a few processes, their callers,
//! the server and the network, in ticks, under data losses, freezes and partitions. Times are
//! kept relative to now, so the state space is finite with no horizon: a run ends when every
//! caller used its acquisitions and every fault happened.
//!
//! What is modelled, in the terms of the library:
//!
//! - **The server** ([`state::Server`]): one identity's lease set (token → deadline in server
//!   time) and fencing counter, as the lease script (`policy/bulkhead/kernel/lease.lua`) runs them: an acquire admits while
//!   fewer than `limit` leases are live and grants `max(last + 1, server now × scale)`; a
//!   renewal pushes a live lease to `now + ttl` and is denied for one gone; a release removes;
//!   the counter lives a lease past the latest deadline; a command carrying a token its process
//!   trusts that finds the counter below it is refused whole and puts the counter back.
//! - **Holders**: the acquire's request is sent, decided at the server up to a network delay
//!   later, answered up to a delay after that. A holder trusts its lease until its *start* +
//!   ttl − margin, where the start is when its batch was sent ([`TrustFrom`]); renews every
//!   `renew_every` from the previous successful send (at once after a reconnection, or when
//!   the reply that set the due time came late); retries a failed renewal while trusted;
//!   gives up (its body cancelled, taking no further step) at its trust deadline, on a denied
//!   renewal, or when its process notices a loss. However the body ends, the release is sent in
//!   the background and retried until it lands or the lease would be over.
//! - **Lanes**: a process sends one acquire call of the identity at a time; acquires that
//!   arrive meanwhile wait, and go out as one batch when the call in flight is answered.
//!   Renewals go out on their own at once, as the library sends them.
//! - **Losses** ([`LossKind`]): a restart (noticed at once by every process that can run and
//!   reach the server), a failover and a flush (noticed by the periodic check within the check
//!   period, by a command that finds the counter below a live token, by a renewal denied for a
//!   trusted lease, by a reconnection for a failover). A process that notices publishes it;
//!   the others hear within the notice delay, unless cut off. Noticing moves the process's epoch
//!   on (its holders are cancelled) and starts the grace: no caller admitted for
//!   `min(grace, ttl)`.
//! - **Faults**: a process frozen (its timers fire late, when it resumes, before any holder
//!   steps; what it sent still lands), a process cut off from the server (its commands fail,
//!   it hears no notice), the network's delays.
//! - **A fencing downstream** ([`state::Downstream`]): each body writes once with its token;
//!   the downstream refuses a token lower than one it accepted.
//! - **Kept leases** ([`Config::keep`], off in the runs above it): a finished body's lease
//!   stays in the set, owned by its process, and a new body of that process takes it with no
//!   round trip; it is returned by its timer, at shutdown, when its process notices a loss, or
//!   when a caller finds it unusable. The steps and their rules are in `keep.rs`; a run can
//!   switch a rule off ([`KeepRule`]).
//!
//! The properties, and the named exceptions of the limit, are in [`properties`].

pub mod config;
mod keep;
pub mod model;
pub mod properties;
pub mod state;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use stateright::{Checker, Model, Path};

pub use config::{Config, KeepRule, LossKind, TrustFrom};
pub use model::{Action, LeaseModel};
pub use state::State;

/// What one exhaustive check found.
#[derive(Debug)]
pub struct Outcome {
    /// States generated (with repeats).
    pub states: usize,
    /// Distinct states.
    pub unique_states: usize,
    /// The longest path explored, in actions.
    pub max_depth: usize,
    /// How long the check took.
    pub elapsed: Duration,
    /// Every property with a discovery (a counterexample of an `always`, an example of a
    /// `sometimes`): the shortest path to it.
    pub discoveries: BTreeMap<&'static str, Path<State, Action>>,
}

impl Outcome {
    /// Whether `property` has a discovery.
    pub fn found(&self, property: &str) -> bool {
        self.discoveries.contains_key(property)
    }
}

/// Checks every state reachable under `config`, with `threads` threads.
pub fn check(config: Config, threads: usize) -> Outcome {
    let model = LeaseModel { config };
    let started = Instant::now();
    let checker = model.checker().threads(threads).spawn_bfs().join();
    Outcome {
        states: checker.state_count(),
        unique_states: checker.unique_state_count(),
        max_depth: checker.max_depth(),
        elapsed: started.elapsed(),
        discoveries: checker.discoveries().into_iter().collect(),
    }
}

/// A path as a story: one line per action, with the tick it happened at and the holders that
/// believe they hold after it.
pub fn narrate(model: &LeaseModel, path: &Path<State, Action>) -> String {
    let mut story = String::new();
    let mut now = 0;
    for (state, action) in path.clone().into_vec() {
        let Some(action) = action else {
            continue;
        };
        if action == Action::Tick {
            now += 1;
        }
        let after = model
            .next_state(&state, action)
            .unwrap_or_else(|| state.clone());
        let holding: Vec<String> = after
            .callers
            .iter()
            .enumerate()
            .filter_map(|(c, caller)| match &caller.phase {
                state::Phase::Holding(h) => Some(format!(
                    "{c}@p{} (fence {}, trusted {} more)",
                    model.config.callers[c], h.fence, h.trust
                )),
                _ => None,
            })
            .collect();
        let _ = writeln!(
            story,
            "t={now:>2}  {:<52} holding: {}",
            action.to_string(),
            if holding.is_empty() {
                "-".to_owned()
            } else {
                holding.join(", ")
            }
        );
    }
    story
}
