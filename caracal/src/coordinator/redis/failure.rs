//! How a command or a connection attempt failed, in caracal's terms: the server's own error
//! (whatever it says, `maxclients` reached included), a reply the client could not read, or a
//! connection that timed out or broke.

use redis::{RedisError, ServerErrorKind};

use crate::error::Error;
use crate::error::FailureKind;

/// How one command failed.
#[derive(Debug)]
pub(crate) enum RedisFailure {
    Timeout,
    Redis(RedisError),
}

impl RedisFailure {
    /// Whether the server did not know the script: it is sent whole, once.
    pub(crate) fn is_noscript(&self) -> bool {
        matches!(self, RedisFailure::Redis(e) if e.code() == Some("NOSCRIPT"))
    }

    /// The failure as the caller is told it (a timeout's outcome is unknown).
    pub(crate) fn into_error(self) -> Error {
        match self {
            RedisFailure::Timeout => Error::unavailable(
                FailureKind::Timeout,
                "no reply within the command timeout; the outcome is unknown",
            ),
            RedisFailure::Redis(e) => failure(&e),
        }
    }
}

/// How the server words its refusal of a connection when it has `maxclients` clients already.
const MAXCLIENTS_REPLY: &str = "max number of clients reached";

/// Whether `text` is the server's refusal for `maxclients`.
pub(super) fn is_maxclients(text: &str) -> bool {
    text.contains(MAXCLIENTS_REPLY)
}

/// The server refused a connection: it has `maxclients` clients already.
pub(super) fn maxclients() -> Error {
    Error::unavailable(
        FailureKind::Server,
        format!(
            "Redis refused the connection: {MAXCLIENTS_REPLY} (its `maxclients` setting); \
             raise it or close other clients"
        ),
    )
}

/// The server is a replica now (of `primary`, when it said): read-only, so its connection is
/// replaced.
pub(super) fn replica(primary: Option<&str>) -> Error {
    let of = primary
        .map(|primary| format!(" of {primary}"))
        .unwrap_or_default();
    Error::unavailable(
        FailureKind::Server,
        format!("the server is a read-only replica{of} now; reconnecting"),
    )
}

/// A Redis client's error in caracal's terms.
pub(super) fn failure(error: &RedisError) -> Error {
    use redis::ErrorKind;
    if error.detail().is_some_and(is_maxclients) {
        return maxclients();
    }
    let (kind, detail) = if error.is_timeout() {
        (FailureKind::Timeout, "the Redis client timed out")
    } else if error.code().is_some()
        || matches!(
            error.kind(),
            ErrorKind::Server(_) | ErrorKind::Extension | ErrorKind::AuthenticationFailed
        )
    {
        // Every error the server itself answered — WRONGTYPE, OOM, NOPERM, NOAUTH, WRONGPASS
        // included — not only those the client has a name for.
        (FailureKind::Server, "Redis answered with an error")
    } else if matches!(
        error.kind(),
        ErrorKind::Parse | ErrorKind::UnexpectedReturnType
    ) {
        (
            FailureKind::MalformedReply,
            "Redis replied something unreadable",
        )
    } else {
        (FailureKind::Disconnected, "the connection to Redis failed")
    };
    Error::unavailable_because(kind, detail, error.clone())
}

/// Whether a cluster command's failure may mean that the primary serving its slot restarted
/// or was replaced: it timed out, its link broke, the primary is loading its data, or the
/// slot is served elsewhere now (a failover, a replica answering).
pub(super) fn node_in_doubt(error: &RedisError) -> bool {
    error.is_timeout()
        || error.is_connection_dropped()
        || error.is_unrecoverable_error()
        || matches!(
            error.kind(),
            redis::ErrorKind::Server(
                ServerErrorKind::Moved
                    | ServerErrorKind::Ask
                    | ServerErrorKind::ReadOnly
                    | ServerErrorKind::BusyLoading
            )
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_the_server_answers_is_a_server_error() {
        for reply in [
            "WRONGTYPE Operation against a key holding the wrong kind of value",
            "OOM command not allowed when used memory > 'maxmemory'.",
            "NOAUTH Authentication required.",
            "WRONGPASS invalid username-password pair or user is disabled.",
            "NOPERM this user has no permissions to run the 'zrem' command",
            "ERR unknown command",
        ] {
            let parsed = redis::parse_redis_value(format!("-{reply}\r\n").as_bytes())
                .and_then(|value| value.extract_error());
            let error = parsed.expect_err("an error reply");
            assert_eq!(
                failure(&error).failure_kind(),
                Some(FailureKind::Server),
                "{reply}"
            );
        }
        let full = redis::parse_redis_value(b"-ERR max number of clients reached\r\n")
            .and_then(|value| value.extract_error())
            .expect_err("an error reply");
        assert_eq!(failure(&full).failure_kind(), Some(FailureKind::Server));
        assert!(failure(&full).to_string().contains("maxclients"), "{full}");
        let dropped = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(
            failure(&dropped).failure_kind(),
            Some(FailureKind::Disconnected)
        );
    }
}
