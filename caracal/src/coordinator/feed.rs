//! The messages of a namespace's pub/sub feed: every script that changes a kind's shared state
//! where other processes must hear of it publishes `"<process>:<origin>:<identity tag>:<payload>"`
//! (the payload: the kind's own text, e.g. a breaker's `<phase>:<generation>:<stamp>`), so
//! every process that uses the identity learns of the change — and of who made it — without
//! making a call; a change of the fleet's overrides publishes `"config:<version>"`; a process
//! that noticed that the server lost its data publishes `"lost:<process>"`.
//!
//! The coordinator reads the envelope only and hands the payload to the listener a kind
//! registered ([`Coordinator::listen`](super::Coordinator::listen)): the identity tag is a
//! hash that does not name its kind, and the wire format is the one every version publishes,
//! so a message belongs to the kind whose listener reads it.

use std::sync::{LazyLock, OnceLock};

use super::Coordinator;
use crate::identity::{KeyBase, PolicyKind};

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

/// What the scripts put before `:<payload>` in the messages they publish about `key`.
pub(crate) fn prefix(origin: Origin, key: &KeyBase) -> String {
    format!("{}:{}:{}", process_id(), origin.as_str(), key.tag())
}

/// A message about an identity's state, as a process reads its envelope: the payload is the
/// kind's to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Heard<'a> {
    /// Whether this process published it (it knows of the change already).
    pub(crate) own: bool,
    pub(crate) origin: Origin,
    pub(crate) key: KeyBase,
    pub(crate) payload: &'a str,
}

/// A message of the feed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Message<'a> {
    /// A change of an identity's state, for its kind's listener.
    Identity(Heard<'a>),
    /// The fleet's overrides changed.
    Config { version: u64 },
    /// A process noticed that the server lost its data; `own` when it was this one.
    Lost { own: bool },
}

/// How a kind reads a feed message about an identity (see
/// [`Coordinator::listen`](super::Coordinator::listen)): whether the payload was the kind's,
/// well-formed, and a change an operator sees (which wakes
/// [`Admin::changed`](crate::Admin::changed)). A message a kind only acts on (a bulkhead's
/// refusal) reads as `false`, and is handed on to the next kind's listener, which ignores it.
pub(crate) type Listener = fn(&Coordinator, &Heard<'_>) -> bool;

/// The listeners the kinds registered, one per kind: set once, read without a lock (a kind
/// registers on each call that relies on the feed).
#[derive(Debug, Default)]
pub(super) struct Listeners([OnceLock<Listener>; PolicyKind::ALL.len()]);

impl Listeners {
    /// Registers `listener` for `kind`, unless the kind has one.
    pub(super) fn add(&self, kind: PolicyKind, listener: Listener) {
        if let Some(at) = PolicyKind::ALL.iter().position(|known| *known == kind) {
            self.0[at].get_or_init(|| listener);
        }
    }

    /// Hands `heard` to the listeners until one reads it as a change an operator sees; whether
    /// one did.
    pub(super) fn hand(&self, coordinator: &Coordinator, heard: &Heard<'_>) -> bool {
        self.0
            .iter()
            .filter_map(OnceLock::get)
            .any(|listener| listener(coordinator, heard))
    }
}

/// What this process publishes when it noticed a loss of data.
pub(crate) fn lost_message() -> String {
    format!("lost:{}", process_id())
}

/// Reads a message's envelope; `None` for anything that is not well-formed.
pub(crate) fn parse(message: &str) -> Option<Message<'_>> {
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
    parse_heard(message).map(Message::Identity)
}

fn parse_heard(message: &str) -> Option<Heard<'_>> {
    let mut parts = message.splitn(4, ':');
    let (process, origin, tag, payload) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let origin = match origin {
        "call" => Origin::Call,
        "operator" => Origin::Operator,
        _ => return None,
    };
    Some(Heard {
        own: process == process_id(),
        origin,
        key: KeyBase::from_tag(tag)?,
        payload,
    })
}

#[cfg(test)]
mod tests {
    use tokio::sync::oneshot;

    use super::*;
    use crate::identity::{PolicyKind, Scope};

    #[test]
    fn envelopes_round_trip_and_anything_else_is_ignored() {
        let key = KeyBase::derive("ns", PolicyKind::CircuitBreaker, "b", "b", &Scope::GLOBAL);
        let message = format!("{}:3:7:1764536400123456", prefix(Origin::Operator, &key));
        assert_eq!(
            parse(&message),
            Some(Message::Identity(Heard {
                own: true,
                origin: Origin::Operator,
                key: key.clone(),
                payload: "3:7:1764536400123456",
            }))
        );
        let other = format!("0000000000000000:call:{}:1:2", key.tag());
        assert!(matches!(
            parse(&other),
            Some(Message::Identity(h)) if !h.own && h.origin == Origin::Call && h.payload == "1:2"
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
            "p:call:nothex:1:1",
            &format!("p:someone:{}:1:1", key.tag()),
            &format!("p:call:{}", key.tag()),
            "config:x",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }

    /// What a publisher hears of its message (an announcement reads it to know whether the
    /// fleet was told): a message the server took is reported sent, one it refused (here, a
    /// user no longer allowed to `PUBLISH`; a link down fails the same way) unsent.
    #[tokio::test]
    async fn a_publisher_hears_whether_its_message_went_out() {
        let server = caracal_tests::RedisServer::start();
        let coordinator = Coordinator::redis(server.url())
            .namespace("publish-outcome")
            .connect()
            .await
            .expect("connected");
        let key = coordinator
            .identity(PolicyKind::Bulkhead, "told", "call", &Scope::GLOBAL)
            .key;
        let publish = || {
            let (sent, heard) = oneshot::channel();
            coordinator.publish(&key, "told?", move |went_out| {
                let _ = sent.send(went_out);
            });
            heard
        };
        assert!(publish().await.expect("an outcome"), "the server took it");
        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg("default")
            .arg("-publish")
            .query(&mut server.connection())
            .expect("ACL SETUSER");
        assert!(
            !publish().await.expect("an outcome"),
            "the server refused it"
        );
        coordinator.shutdown().await;
    }
}
