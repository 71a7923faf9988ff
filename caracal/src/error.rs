//! The one error type every caracal rejection and failure is reported with.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Why a call did not run (or did not finish) under a caracal policy.
///
/// A guarded function returns `Result<T, E>` with `E: From<caracal::Error>`; every rejection
/// reaches the caller as `Err(E::from(error))`. Errors produced by the function itself pass
/// through unchanged and never appear here.
///
/// ```
/// let err = caracal::Error::NotInstalled;
/// assert_eq!(err.code(), "not_installed");
/// ```
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The bulkhead had no free slot (and `max_wait`, if any, ran out).
    #[error("bulkhead `{policy}` is full for scope `{scope}` (limit {limit})")]
    #[non_exhaustive]
    BulkheadFull {
        /// The policy's `name`.
        policy: &'static str,
        /// The scope the call was admitted under.
        scope: String,
        /// The configured limit.
        limit: u32,
    },
    /// The bulkhead lease could not be kept (renewal failed, was denied or came too late, or
    /// the lease had expired before the body could start); the body was cancelled.
    #[error("bulkhead `{policy}` lost its lease for scope `{scope}`; the call was cancelled")]
    #[non_exhaustive]
    LeaseLost {
        /// The policy's `name`.
        policy: &'static str,
        /// The scope the lease was held under.
        scope: String,
    },
    /// The circuit breaker is open (or half-open with every probe slot taken).
    #[error("circuit `{policy}` is open for scope `{scope}`")]
    #[non_exhaustive]
    CircuitOpen {
        /// The policy's `name`.
        policy: &'static str,
        /// The breaker's scope.
        scope: String,
        /// How long until the next probe may be admitted, when known.
        retry_after: Option<Duration>,
    },
    /// The rate limit admitted no more calls for now.
    #[error("rate limit `{policy}` exceeded for scope `{scope}`; retry after {retry_after:?}")]
    #[non_exhaustive]
    RateLimited {
        /// The policy's `name`.
        policy: &'static str,
        /// The scope the call was charged to.
        scope: String,
        /// The earliest moment (from now) a call can be admitted.
        retry_after: Duration,
    },
    /// The `#[timeout]` elapsed; the body's future was dropped.
    #[error("timed out after {after:?}")]
    #[non_exhaustive]
    Timeout {
        /// The configured timeout.
        after: Duration,
    },
    /// The coordinator could not answer, or answered something that could not be trusted. The
    /// outcome of the command that failed is unknown.
    #[error("coordinator unavailable: {cause}")]
    #[non_exhaustive]
    CoordinatorUnavailable {
        /// What went wrong.
        #[source]
        cause: CoordinatorFailure,
    },
    /// A distributed policy ran before [`install`](crate::install).
    #[error("no caracal coordinator is installed; call caracal::install at start-up")]
    NotInstalled,
    /// [`install`](crate::install) was called a second time.
    #[error("a caracal coordinator is already installed")]
    AlreadyInstalled,
    /// The scope expression produced an unusable value (blank, or over 1024 bytes).
    #[error("invalid scope: {reason}")]
    #[non_exhaustive]
    InvalidScope {
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A configuration value cannot be used (malformed URL, blank namespace, bad option).
    #[error("invalid configuration: {reason}")]
    #[non_exhaustive]
    InvalidConfig {
        /// What is wrong with it.
        reason: String,
    },
}

impl Error {
    /// A stable, machine-readable code for logs and metrics.
    ///
    /// ```
    /// let err = caracal::Error::AlreadyInstalled;
    /// assert_eq!(err.code(), "already_installed");
    /// ```
    pub fn code(&self) -> &'static str {
        match self {
            Error::BulkheadFull { .. } => "bulkhead_full",
            Error::LeaseLost { .. } => "lease_lost",
            Error::CircuitOpen { .. } => "circuit_open",
            Error::RateLimited { .. } => "rate_limited",
            Error::Timeout { .. } => "timeout",
            Error::CoordinatorUnavailable { .. } => "coordinator_unavailable",
            Error::NotInstalled => "not_installed",
            Error::AlreadyInstalled => "already_installed",
            Error::InvalidScope { .. } => "invalid_scope",
            Error::InvalidConfig { .. } => "invalid_config",
        }
    }

    pub(crate) fn unavailable(kind: FailureKind, detail: impl Into<String>) -> Self {
        Error::CoordinatorUnavailable {
            cause: CoordinatorFailure {
                kind,
                detail: detail.into().into(),
                source: None,
            },
        }
    }

    /// A coordinator failure caused by `source` (the client's own error, kept whole so callers
    /// can inspect it through [`std::error::Error::source`]).
    pub(crate) fn unavailable_because(
        kind: FailureKind,
        detail: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error::CoordinatorUnavailable {
            cause: CoordinatorFailure {
                kind,
                detail: detail.into().into(),
                source: Some(Arc::new(source)),
            },
        }
    }

    pub(crate) fn config(reason: impl Into<String>) -> Self {
        Error::InvalidConfig {
            reason: reason.into(),
        }
    }

    /// What kind of refusal this is, as the layers outside the one that produced it judge it.
    pub(crate) fn refusal(&self) -> Refusal {
        match self {
            Error::BulkheadFull { .. } | Error::RateLimited { .. } => Refusal::Admission,
            Error::LeaseLost { .. } | Error::Timeout { .. } => Refusal::Cut,
            Error::CoordinatorUnavailable { .. } => Refusal::Coordinator,
            Error::CircuitOpen { .. } => Refusal::Protection,
            Error::NotInstalled
            | Error::AlreadyInstalled
            | Error::InvalidScope { .. }
            | Error::InvalidConfig { .. } => Refusal::Mistake,
        }
    }

    /// The failure kind when this is `CoordinatorUnavailable`.
    pub(crate) fn failure_kind(&self) -> Option<FailureKind> {
        match self {
            Error::CoordinatorUnavailable { cause } => Some(cause.kind),
            _ => None,
        }
    }
}

/// What an [`Error`] refused, in the terms the layers around a guarded call act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Not admitted (a full bulkhead, a rate): the call never started.
    Admission,
    /// Admitted, then cut short by caracal (a lost lease, a timeout).
    Cut,
    /// The coordinator failed: the admission or the call's fate is unknown.
    Coordinator,
    /// Refused to protect the downstream before anything was attempted (an open circuit).
    Protection,
    /// A mistake in the program (a blank scope, no coordinator installed, a bad setting).
    Mistake,
}

/// For functions returning `std::io::Result`: a rejection becomes an `io::Error` of kind
/// `Other` carrying the caracal error (recover it with `get_ref()` and `downcast_ref`).
///
/// ```
/// let io: std::io::Error = caracal::Error::NotInstalled.into();
/// let inner = io.get_ref().and_then(|e| e.downcast_ref::<caracal::Error>());
/// assert_eq!(inner.map(caracal::Error::code), Some("not_installed"));
/// ```
impl From<Error> for std::io::Error {
    fn from(error: Error) -> Self {
        std::io::Error::other(error)
    }
}

/// Why the coordinator could not be used, carried by [`Error::CoordinatorUnavailable`].
///
/// When the Redis client reported the failure, its error is this one's
/// [`source`](std::error::Error::source).
///
/// ```
/// # async fn f() {
/// use std::error::Error as _;
/// let unreachable = caracal::Coordinator::redis("redis://127.0.0.1:1").connect().await;
/// if let Err(caracal::Error::CoordinatorUnavailable { cause, .. }) = unreachable {
///     println!("{cause}, because: {:?}", cause.source().map(ToString::to_string));
/// }
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct CoordinatorFailure {
    kind: FailureKind,
    detail: Arc<str>,
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

impl CoordinatorFailure {
    /// The class of failure.
    pub fn kind(&self) -> FailureKind {
        self.kind
    }
}

impl fmt::Display for CoordinatorFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.as_str(), self.detail)
    }
}

impl std::error::Error for CoordinatorFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|source| source as &(dyn std::error::Error + 'static))
    }
}

/// The class of a [`CoordinatorFailure`].
///
/// ```
/// use caracal::{Error, FailureKind};
///
/// // Worth trying again soon: the connection failed, not the server or caracal's settings.
/// fn transient(error: &Error) -> bool {
///     match error {
///         Error::CoordinatorUnavailable { cause, .. } => {
///             matches!(cause.kind(), FailureKind::Timeout | FailureKind::Disconnected)
///         }
///         _ => false,
///     }
/// }
/// assert!(!transient(&Error::NotInstalled));
/// assert_eq!(FailureKind::Timeout.as_str(), "timeout");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FailureKind {
    /// No reply within `command_timeout`; the command may or may not have run.
    Timeout,
    /// The connection is down or broke while the command was in flight.
    Disconnected,
    /// The server answered with an error (permissions, out of memory, read-only replica, …).
    Server,
    /// The reply did not have the shape the script promises.
    MalformedReply,
    /// The coordinator was shut down.
    ShutDown,
    /// The server lost its data (restarted without persistence, or failed over): bulkheads
    /// admit nothing until every lease granted before has expired at its holder.
    DataLost,
}

impl FailureKind {
    /// A stable snake_case name, used in events.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Timeout => "timeout",
            FailureKind::Disconnected => "disconnected",
            FailureKind::Server => "server_error",
            FailureKind::MalformedReply => "malformed_reply",
            FailureKind::ShutDown => "shut_down",
            FailureKind::DataLost => "data_lost",
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// One error of every variant.
    pub(crate) fn one_of_each() -> Vec<Error> {
        vec![
            Error::BulkheadFull {
                policy: "p",
                scope: "s".into(),
                limit: 1,
            },
            Error::LeaseLost {
                policy: "p",
                scope: "s".into(),
            },
            Error::CircuitOpen {
                policy: "p",
                scope: "s".into(),
                retry_after: None,
            },
            Error::RateLimited {
                policy: "p",
                scope: "s".into(),
                retry_after: Duration::from_millis(1),
            },
            Error::Timeout {
                after: Duration::from_millis(1),
            },
            Error::unavailable(FailureKind::Timeout, "x"),
            Error::NotInstalled,
            Error::AlreadyInstalled,
            Error::InvalidScope { reason: "blank" },
            Error::config("x"),
        ]
    }

    #[test]
    fn every_error_is_one_refusal() {
        let refusals: Vec<_> = one_of_each()
            .iter()
            .map(|error| (error.code(), error.refusal()))
            .collect();
        assert_eq!(
            refusals,
            [
                ("bulkhead_full", Refusal::Admission),
                ("lease_lost", Refusal::Cut),
                ("circuit_open", Refusal::Protection),
                ("rate_limited", Refusal::Admission),
                ("timeout", Refusal::Cut),
                ("coordinator_unavailable", Refusal::Coordinator),
                ("not_installed", Refusal::Mistake),
                ("already_installed", Refusal::Mistake),
                ("invalid_scope", Refusal::Mistake),
                ("invalid_config", Refusal::Mistake),
            ]
        );
    }

    #[test]
    fn codes_are_distinct_and_snake_case() {
        let all = one_of_each();
        let codes: std::collections::HashSet<_> = all.iter().map(Error::code).collect();
        assert_eq!(codes.len(), all.len());
        assert!(
            codes
                .iter()
                .all(|c| c.chars().all(|ch| ch.is_ascii_lowercase() || ch == '_'))
        );
    }

    #[test]
    fn error_is_send_sync_static() {
        fn check<E: std::error::Error + Send + Sync + 'static>() {}
        check::<Error>();
    }
}
