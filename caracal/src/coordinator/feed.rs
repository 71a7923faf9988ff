//! The messages of a namespace's pub/sub feed: every script that changes a breaker's state
//! publishes `"<process>:<origin>:<identity tag>:<phase>:<generation>:<stamp>"` (the stamp:
//! the server time of the change, in microseconds), so every process that uses the breaker
//! learns of the change — and of who made it — without making a call; a change of the fleet's
//! overrides publishes `"config:<version>"`; a process that noticed that the server lost its
//! data publishes `"lost:<process>"`. Messages without a stamp (from a version that did not
//! write one) are still read.

use std::sync::LazyLock;

use crate::identity::KeyBase;
use crate::policy::breaker::kernel::Phase;

/// Who changed a state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// A call's admission, observation or settlement.
    Call,
    /// An operator's command.
    Operator,
}

impl Origin {
    fn as_str(self) -> &'static str {
        match self {
            Origin::Call => "call",
            Origin::Operator => "operator",
        }
    }
}

/// This process, as its messages name it: random, so two processes never share it.
pub(crate) fn process_id() -> &'static str {
    static ID: LazyLock<String> = LazyLock::new(|| format!("{:016x}", rand::random::<u64>()));
    &ID
}

/// What the scripts put before `:<phase>:<generation>:<stamp>` in the messages they publish about
/// `key`.
pub(crate) fn prefix(origin: Origin, key: &KeyBase) -> String {
    format!("{}:{}:{}", process_id(), origin.as_str(), key.tag())
}

/// A transition message, as a process reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Transition {
    /// Whether this process published it (it knows of the change already).
    pub(crate) own: bool,
    pub(crate) origin: Origin,
    pub(crate) key: KeyBase,
    pub(crate) phase: Phase,
    pub(crate) generation: u64,
    /// The server time (microseconds) the change was made at; absent from the messages of
    /// versions that did not stamp them.
    pub(crate) stamp: Option<u64>,
}

/// A message of the feed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Message {
    Transition(Transition),
    /// The fleet's overrides changed.
    Config {
        version: u64,
    },
    /// A process noticed that the server lost its data; `own` when it was this one.
    Lost {
        own: bool,
    },
}

/// What this process publishes when it noticed a loss of data.
pub(crate) fn lost_message() -> String {
    format!("lost:{}", process_id())
}

/// Reads a message; `None` for anything that is not well-formed.
pub(crate) fn parse(message: &str) -> Option<Message> {
    if let Some(version) = message.strip_prefix("config:") {
        return Some(Message::Config {
            version: version.parse().ok()?,
        });
    }
    if let Some(process) = message.strip_prefix("lost:") {
        return Some(Message::Lost {
            own: process == process_id(),
        });
    }
    parse_transition(message).map(Message::Transition)
}

fn parse_transition(message: &str) -> Option<Transition> {
    let mut parts = message.split(':');
    let (process, origin, tag, phase, generation, stamp) = (
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next().map(str::parse).transpose().ok()?,
    );
    if parts.next().is_some() {
        return None;
    }
    let origin = match origin {
        "call" => Origin::Call,
        "operator" => Origin::Operator,
        _ => return None,
    };
    Some(Transition {
        own: process == process_id(),
        origin,
        key: KeyBase::from_tag(tag)?,
        phase: Phase::from_code(phase.parse().ok()?)?,
        generation: generation.parse().ok()?,
        stamp,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{PolicyKind, Scope};

    #[test]
    fn messages_round_trip_and_anything_else_is_ignored() {
        let key = KeyBase::derive("ns", PolicyKind::CircuitBreaker, "b", "b", &Scope::GLOBAL);
        let message = format!("{}:3:7:1764536400123456", prefix(Origin::Operator, &key));
        assert_eq!(
            parse(&message),
            Some(Message::Transition(Transition {
                own: true,
                origin: Origin::Operator,
                key: key.clone(),
                phase: Phase::ForcedOpen,
                generation: 7,
                stamp: Some(1_764_536_400_123_456),
            }))
        );
        let other = format!("0000000000000000:call:{}:1:2", key.tag());
        assert!(matches!(
            parse(&other),
            Some(Message::Transition(t)) if !t.own && t.origin == Origin::Call && t.stamp.is_none()
        ));
        assert_eq!(parse("config:12"), Some(Message::Config { version: 12 }));
        assert_eq!(parse(&lost_message()), Some(Message::Lost { own: true }));
        assert_eq!(
            parse("lost:0000000000000000"),
            Some(Message::Lost { own: false })
        );
        for bad in [
            "",
            "a:b",
            &format!("x:call:{}:9:1", key.tag()),
            "p:call:nothex:1:1",
            &format!("0000000000000000:call:{}:1:2:x", key.tag()),
            &format!("0000000000000000:call:{}:1:2:3:4", key.tag()),
            "config:x",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }
}
