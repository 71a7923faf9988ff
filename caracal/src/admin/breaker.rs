//! The operators' commands on a circuit breaker: which breaker, what to do, and what it did.

use std::time::Duration;

use super::{Admin, Refusal};
use crate::coordinator::Coordinator;
use crate::error::Error;
use crate::identity::{Identity, PolicyKind, Scope, check_part};
use crate::policy::breaker::kernel::{Force, Phase};

/// A circuit breaker's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BreakerState {
    /// Calls pass and are observed.
    Closed,
    /// Calls are rejected until the open time passes.
    Open,
    /// A few probes are admitted; their results close or reopen it.
    HalfOpen,
    /// An operator forced it open: every call is rejected.
    ForcedOpen,
    /// An operator forced it closed: every call passes, nothing is recorded.
    ForcedClosed,
}

impl BreakerState {
    /// `closed`, `open`, `half_open`, `forced_open` or `forced_closed`.
    pub fn as_str(self) -> &'static str {
        self.phase().as_str()
    }

    /// The value of the `caracal_circuit_breaker_state` gauge: 0 to 4 in the order above.
    pub fn code(self) -> u8 {
        self.phase().code()
    }

    pub(super) fn phase(self) -> Phase {
        match self {
            BreakerState::Closed => Phase::Closed,
            BreakerState::Open => Phase::Open,
            BreakerState::HalfOpen => Phase::HalfOpen,
            BreakerState::ForcedOpen => Phase::ForcedOpen,
            BreakerState::ForcedClosed => Phase::ForcedClosed,
        }
    }

    pub(super) fn of(phase: Phase) -> Self {
        match phase {
            Phase::Closed => BreakerState::Closed,
            Phase::Open => BreakerState::Open,
            Phase::HalfOpen => BreakerState::HalfOpen,
            Phase::ForcedOpen => BreakerState::ForcedOpen,
            Phase::ForcedClosed => BreakerState::ForcedClosed,
        }
    }
}

/// Which breaker an operator's command is for: a name, and the operation (the name by
/// default) and scope (`global` by default) of the identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakerId {
    name: String,
    operation: Option<String>,
    scope: Option<String>,
}

impl BreakerId {
    /// The breaker `name`, with the default operation and scope.
    pub fn new(name: impl Into<String>) -> Self {
        BreakerId {
            name: name.into(),
            operation: None,
            scope: None,
        }
    }

    /// Its operation.
    pub fn operation(mut self, operation: impl Into<String>) -> Self {
        self.operation = Some(operation.into());
        self
    }

    /// Its scope.
    pub fn scope(mut self, scope: impl Into<String>) -> Self {
        self.scope = Some(scope.into());
        self
    }

    pub(super) fn identity(&self, coordinator: &Coordinator) -> Result<Identity, Error> {
        let operation = self.operation.clone().unwrap_or_else(|| self.name.clone());
        for (part, value) in [("name", &self.name), ("operation", &operation)] {
            check_part(value).map_err(|why| Error::config(format!("the {part} {why}")))?;
        }
        let scope = match &self.scope {
            Some(scope) => Scope::new(scope.clone())?,
            None => Scope::GLOBAL,
        };
        Ok(coordinator.identity(
            PolicyKind::CircuitBreaker,
            self.name.clone(),
            operation,
            &scope,
        ))
    }
}

/// An operator's command on a breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BreakerCommand {
    /// Reject every call, until `lasts` elapses (then half-open at the next call, as after
    /// an ordinary open) or a reset.
    Open {
        /// How long; `None` until a reset.
        lasts: Option<Duration>,
    },
    /// Admit every call, recording nothing, until `lasts` elapses (then closed) or a reset.
    Close {
        /// How long; `None` until a reset.
        lasts: Option<Duration>,
    },
    /// Closed, with an empty window and a new generation.
    Reset,
}

/// What a breaker command did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct BreakerChanged {
    /// The state it ended.
    pub from: BreakerState,
    /// The state it started.
    pub to: BreakerState,
    /// The new generation.
    pub generation: u64,
}

/// The longest a forced state may be asked to last.
const MAX_FORCED: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// How long a reset's closed state lasts without observations: the operator does not know
/// the breaker's window, and processes that use it keep it alive anyway.
const RESET_CLOSED_TTL_MS: u64 = 60_000;

/// What `command` has the breaker's state do, and the state it starts; an error for a
/// forced state asked to last too little or too long.
pub(super) fn forcing(command: BreakerCommand) -> Result<(Force, BreakerState), Error> {
    let lasts_ms = |lasts: Option<Duration>| -> Result<u64, Error> {
        match lasts {
            None => Ok(0),
            Some(lasts) if !lasts.is_zero() && lasts <= MAX_FORCED => {
                Ok(u64::try_from(lasts.as_millis()).unwrap_or(u64::MAX).max(1))
            }
            Some(lasts) => Err(Error::config(format!(
                "a forced state lasts from 1ms to a year, not {}",
                humantime::format_duration(lasts)
            ))),
        }
    };
    Ok(match command {
        BreakerCommand::Open { lasts } => (
            Force::Open {
                lasts_ms: lasts_ms(lasts)?,
            },
            BreakerState::ForcedOpen,
        ),
        BreakerCommand::Close { lasts } => (
            Force::Closed {
                lasts_ms: lasts_ms(lasts)?,
            },
            BreakerState::ForcedClosed,
        ),
        BreakerCommand::Reset => (
            Force::Reset {
                closed_ttl_ms: RESET_CLOSED_TTL_MS,
            },
            BreakerState::Closed,
        ),
    })
}

impl Admin {
    /// Whether `command` on `breaker` would reach a breaker some process uses: `None` when
    /// one reports it, else why not and what is in use under that name. An error for a
    /// command [`Admin::breaker`] would refuse as written.
    pub async fn check_breaker(
        &self,
        breaker: &BreakerId,
        command: BreakerCommand,
    ) -> Result<Option<Refusal>, Error> {
        let identity = breaker.identity(&self.coordinator)?;
        forcing(command)?;
        self.check_in_use(PolicyKind::CircuitBreaker, &identity)
            .await
    }
}

/// The `--json` shapes (feature `serde`), beside the admin types' others in `serialize.rs`.
#[cfg(feature = "serde")]
mod serialize {
    use serde::ser::{Serialize, SerializeMap, Serializer};

    use super::{BreakerChanged, BreakerState};

    /// Its name (`forced_open`).
    impl Serialize for BreakerState {
        fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            serializer.serialize_str(self.as_str())
        }
    }

    /// `from`, `to` and `generation`.
    impl Serialize for BreakerChanged {
        fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            let mut map = serializer.serialize_map(Some(3))?;
            map.serialize_entry("from", &self.from)?;
            map.serialize_entry("to", &self.to)?;
            map.serialize_entry("generation", &self.generation)?;
            map.end()
        }
    }
}
