//! A cluster's primaries, as this process has checked them.
//!
//! A cluster fails one node at a time: a primary stops answering, restarts without its data,
//! or is replaced by a replica. The cluster connection repairs its link to one node on its
//! own, so one node's failure must not take every identity down; but a node that may have lost
//! its data must not serve a lease before this process has noticed the loss. So:
//!
//! - a command that fails in a way that may mean its node restarted or was replaced (a
//!   timeout, a broken connection, a redirection) *suspects* the primary serving its slot;
//! - a suspected primary serves nothing (its identities fail at once, as disconnected) until a
//!   check started after the suspicion has read its `run_id`; the other primaries serve on;
//! - a check reads the slot map from whichever primary answers first, then `INFO` from every
//!   primary at once, each within the command timeout. The incarnation observes what answered
//!   before anything is served again (a primary gone or with a new `run_id` starts a new
//!   epoch); a primary that did not answer stays suspected, and checks go on until it does;
//! - a check also runs every [`CHECK_PERIOD`], suspecting nothing: it notices a failover that
//!   no command of this process ran into.
//!
//! Primaries are known by their cluster node id, which a replica promoted in a primary's place
//! does not share, and every request of a check is routed by slot, never by address: the
//! cluster client answers a request for a node it has no link to by rebuilding all its links
//! (every call on it waits meanwhile), whereas a request routed by slot goes to whichever
//! node it is linked to. So `INFO` goes out together with `CLUSTER MYID`, and an answer from
//! another node than the one asked counts as none.
//!
//! A cluster connection learns the slot map when it is made, and again only when a command
//! is redirected. A replica promoted in place of a dead primary is a node it may have no link
//! to, and calls on that shard are turned away before any could be redirected: through that
//! connection, the new primary's slots go to another node forever. So the map has a
//! [version](Shards::version), which moves on whenever it names a primary the map before did
//! not; when a check's question for a primary is answered by another node through a
//! connection older than that, every connection of the pool older than the map is replaced by
//! a new one, which reads the map afresh (the old ones serve on meanwhile).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use futures_util::Stream;
use futures_util::future::select_ok;
use futures_util::stream::FuturesUnordered;
use redis::Value;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};

use super::server::{self, ServerInfo};
use crate::error::Error;
use crate::error::FailureKind;
use crate::sync::lock;

/// How often the primaries are checked when nothing went wrong: a failover that no call ran
/// into ends the leases held on the old primary within about this long. Leases are set per
/// call site, unknown here; a second is a tenth of a 10 s lease, for a few commands a second
/// per primary and process.
pub(crate) const CHECK_PERIOD: Duration = Duration::from_secs(1);

/// Number of hash slots in a Redis Cluster.
const SLOTS: u16 = 16_384;

/// The cluster slot of `key`: CRC16/XMODEM of its hash tag (the first non-empty `{…}`), or of
/// the whole key without one, modulo 16384.
pub(crate) fn key_slot(key: &str) -> u16 {
    let key = key.as_bytes();
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    let crc = hashed.iter().fold(0u16, |crc, &byte| {
        (0..8).fold(crc ^ (u16::from(byte) << 8), |crc, _| {
            if crc & 0x8000 == 0 {
                crc << 1
            } else {
                (crc << 1) ^ 0x1021
            }
        })
    });
    crc % SLOTS
}

/// Which primary serves each slot, and which primaries may serve now.
#[derive(Debug, Default)]
pub(crate) struct Shards {
    state: std::sync::Mutex<State>,
}

/// `(first slot, last slot, node id of the primary)`, by first slot.
pub(crate) type Ranges = Vec<(u16, u16, String)>;

#[derive(Debug, Default)]
struct State {
    /// The slot map as last read.
    ranges: Ranges,
    /// Numbers the suspicions: a later one has a larger number.
    clock: u64,
    /// The last suspicion of each primary.
    suspected: HashMap<String, u64>,
    /// The last suspicion of a slot no known primary serves: it suspects them all.
    all_suspected: u64,
    /// For each primary, `clock` when the last check that read its `run_id` started.
    checked: HashMap<String, u64>,
    /// The pool slot whose connection saw the last suspicion: the next check goes through it,
    /// which also tells whether that connection still works at all.
    probe: Option<usize>,
    /// How many maps named a primary the map before did not (the first map included).
    version: u64,
}

impl State {
    fn primary(&self, slot: u16) -> Option<&str> {
        let index = self.ranges.partition_point(|&(first, _, _)| first <= slot);
        let (_, last, primary) = self.ranges.get(index.checked_sub(1)?)?;
        (slot <= *last).then_some(primary.as_str())
    }

    fn serving(&self, primary: &str) -> bool {
        let suspected = self.suspected.get(primary).copied().unwrap_or(0);
        self.checked
            .get(primary)
            .is_some_and(|&checked| checked >= suspected.max(self.all_suspected))
    }
}

/// What a check is to look at: when it started, through which pool slot, and the slot map as
/// known so far.
pub(crate) struct Begun {
    /// The suspicions' clock when it started: a later suspicion is not cleared by this check.
    pub(crate) start: u64,
    /// The pool slot whose connection saw the last suspicion, if any.
    pub(crate) probe: Option<usize>,
    /// The slot map as known so far.
    pub(crate) known: Ranges,
}

impl Shards {
    /// Whether the primary serving `slot` may serve now.
    pub(crate) fn serves(&self, slot: u16) -> bool {
        let state = lock(&self.state);
        state
            .primary(slot)
            .is_some_and(|primary| state.serving(primary))
    }

    /// A command for `slot`, sent through pool slot `probe`, failed in a way that may mean its
    /// primary restarted or was replaced.
    pub(crate) fn suspect(&self, slot: u16, probe: usize) {
        let mut state = lock(&self.state);
        state.clock += 1;
        let clock = state.clock;
        match state.primary(slot).map(str::to_owned) {
            Some(primary) => {
                state.suspected.insert(primary, clock);
            }
            None => state.all_suspected = clock,
        }
        state.probe = Some(probe);
    }

    /// Every primary may have restarted or been replaced (say, no node answered).
    pub(crate) fn suspect_all(&self) {
        let mut state = lock(&self.state);
        state.clock += 1;
        state.all_suspected = state.clock;
    }

    /// Starts a check.
    pub(crate) fn begin(&self) -> Begun {
        let mut state = lock(&self.state);
        Begun {
            start: state.clock,
            probe: state.probe.take(),
            known: state.ranges.clone(),
        }
    }

    /// Records a check started at `start`: the slot map it read (if any), and the primaries
    /// whose `run_id` it read, observed already. Returns whether a primary serves again that
    /// did not before.
    pub(crate) fn record<'a>(
        &self,
        start: u64,
        ranges: Option<Ranges>,
        answered: impl IntoIterator<Item = &'a String>,
    ) -> bool {
        let mut state = lock(&self.state);
        if let Some(ranges) = ranges {
            let known = primaries(&state.ranges);
            if ranges
                .iter()
                .any(|(_, _, primary)| !known.contains_key(primary))
            {
                state.version += 1;
            }
            state.ranges = ranges;
        }
        let mut revived = false;
        for primary in answered {
            let before = state.serving(primary);
            state.checked.insert(primary.clone(), start);
            revived |= !before && state.serving(primary);
        }
        let State {
            ranges,
            suspected,
            checked,
            ..
        } = &mut *state;
        let current = |primary: &String| ranges.iter().any(|(_, _, p)| p == primary);
        suspected.retain(|primary, _| current(primary));
        checked.retain(|primary, _| current(primary));
        revived
    }

    /// The version of the slot map: it moves on whenever a map names a primary the map
    /// before did not (a replica promoted, a primary added). A cluster connection made before
    /// that may have no link to it.
    pub(crate) fn version(&self) -> u64 {
        lock(&self.state).version
    }

    /// Whether every slot is served by a primary that may serve: no check is due before the
    /// next period.
    pub(crate) fn settled(&self) -> bool {
        let state = lock(&self.state);
        !state.ranges.is_empty()
            && state
                .ranges
                .iter()
                .all(|(_, _, primary)| state.serving(primary))
    }
}

/// How one primary answered `INFO`.
pub(crate) enum Answer {
    Info(ServerInfo),
    /// It answered, with an error or without a `run_id`.
    Refused(Error),
    /// Another node answered: the connection sends what is meant for this primary elsewhere,
    /// as it has no link to it (or has never heard of it).
    Elsewhere,
    /// No answer within the command timeout, or none that can be read.
    Silent,
}

/// One slot of each primary of `ranges`, by node id: where to route what is meant for it.
pub(crate) fn primaries(ranges: &[(u16, u16, String)]) -> BTreeMap<String, u16> {
    let mut primaries = BTreeMap::new();
    for (first, _, primary) in ranges {
        primaries.entry(primary.clone()).or_insert(*first);
    }
    primaries
}

/// Sends `pipeline` through `conn` to the node `route` leads to, within `timeout`: its
/// replies, or `Err(None)` when none came in time.
async fn ask(
    conn: &ClusterConnection,
    pipeline: redis::Pipeline,
    route: SingleNodeRoutingInfo,
    timeout: Duration,
) -> Result<Vec<Value>, Option<redis::RedisError>> {
    let mut conn = conn.clone();
    let count = pipeline.len();
    let sent = conn.route_pipeline(pipeline, 0, count, route);
    match tokio::time::timeout(timeout, sent).await {
        Ok(Ok(values)) => Ok(values),
        Ok(Err(error)) => Err(Some(error)),
        Err(_) => Err(None),
    }
}

/// Routed to the primary serving `slot`, or to whichever node the client is linked to if it
/// has no link to that one.
fn to_slot(slot: u16) -> SingleNodeRoutingInfo {
    SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master))
}

/// Reads the slot map from whichever of the `known` primaries answers first (any node when
/// none is known yet), within `timeout`.
pub(crate) async fn read_map(
    conn: &ClusterConnection,
    known: &[(u16, u16, String)],
    timeout: Duration,
) -> Option<Ranges> {
    let routes: Vec<SingleNodeRoutingInfo> = if known.is_empty() {
        vec![SingleNodeRoutingInfo::Random]
    } else {
        primaries(known).into_values().map(to_slot).collect()
    };
    let asks = routes.into_iter().map(|route| {
        let mut pipeline = redis::pipe();
        pipeline.cmd("CLUSTER").arg("SLOTS");
        Box::pin(async move {
            let values = ask(conn, pipeline, route, timeout).await.map_err(drop)?;
            values.first().and_then(parse_slots).ok_or(())
        })
    });
    select_ok(asks).await.ok().map(|(ranges, _)| ranges)
}

/// Asks every one of `primaries` (node id → a slot it serves) for its `INFO` at once, within
/// `timeout` each: their answers, as they come.
pub(crate) fn ask_info(
    conn: &ClusterConnection,
    primaries: &BTreeMap<String, u16>,
    timeout: Duration,
) -> impl Stream<Item = (String, Answer)> {
    let asks = primaries.iter().map(|(node, &slot)| {
        let conn = conn.clone();
        let node = node.clone();
        async move {
            let mut pipeline = redis::pipe();
            pipeline.cmd("CLUSTER").arg("MYID");
            pipeline.add_command(server::info_command());
            let answer = match ask(&conn, pipeline, to_slot(slot), timeout).await {
                Ok(values) => match values.as_slice() {
                    [Value::BulkString(id), info] if *id == node.as_bytes() => {
                        match ServerInfo::parse(&node, info) {
                            Ok(info) => Answer::Info(info),
                            Err(error) => Answer::Refused(error),
                        }
                    }
                    // Another node answered: the client has no link to this one now.
                    [Value::BulkString(_), _] => Answer::Elsewhere,
                    _ => Answer::Silent,
                },
                Err(Some(error)) if error.code().is_some() => {
                    Answer::Refused(Error::unavailable_because(
                        FailureKind::Server,
                        "`INFO` was answered with an error",
                        error,
                    ))
                }
                Err(_) => Answer::Silent,
            };
            (node, answer)
        }
    });
    asks.collect::<FuturesUnordered<_>>()
}

/// Parses a `CLUSTER SLOTS` reply into `(first, last, node id of the primary)` by first slot.
fn parse_slots(value: &Value) -> Option<Ranges> {
    let Value::Array(entries) = value else {
        return None;
    };
    let mut ranges = Vec::with_capacity(entries.len());
    for entry in entries {
        let Value::Array(parts) = entry else {
            return None;
        };
        let [
            Value::Int(first),
            Value::Int(last),
            Value::Array(primary),
            ..,
        ] = parts.as_slice()
        else {
            return None;
        };
        let Some(Value::BulkString(id)) = primary.get(2) else {
            return None;
        };
        let slot = |n: i64| u16::try_from(n).ok().filter(|&n| n < SLOTS);
        let id = String::from_utf8(id.clone()).ok()?;
        ranges.push((slot(*first)?, slot(*last)?, id));
    }
    ranges.sort_unstable();
    Some(ranges)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_slots_follow_the_cluster_spec() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(key_slot("123456789"), 0x31C3 % SLOTS);
        assert_eq!(key_slot("foo"), 12182);
        assert_eq!(key_slot("{user1000}.following"), key_slot("user1000"));
        assert_eq!(key_slot("foo{}{bar}"), key_slot("foo{}{bar}"));
        assert_ne!(key_slot("foo{}{bar}"), key_slot("bar"));
    }

    fn shards(ranges: &[(u16, u16, &str)]) -> Shards {
        let shards = Shards::default();
        let ranges = ranges
            .iter()
            .map(|&(first, last, primary)| (first, last, primary.to_owned()))
            .collect();
        let begun = shards.begin();
        let all: Vec<String> = ["a", "b"].map(str::to_owned).into();
        shards.record(begun.start, Some(ranges), &all);
        shards
    }

    #[test]
    fn a_suspected_primary_serves_again_once_a_later_check_reads_it() {
        let shards = shards(&[(0, 99, "a"), (100, SLOTS - 1, "b")]);
        assert!(shards.serves(5) && shards.serves(500) && shards.settled());
        let during = shards.begin();
        shards.suspect(5, 0);
        assert!(!shards.serves(5), "a suspected primary serves nothing");
        assert!(shards.serves(500), "the others serve on");
        assert!(!shards.settled());
        // A check begun before the suspicion confirms nothing about it.
        shards.record(during.start, None, &["a".to_owned()]);
        assert!(!shards.serves(5));
        let after = shards.begin();
        assert_eq!(
            after.probe,
            Some(0),
            "the check goes through the suspicious connection"
        );
        assert!(
            !shards.record(after.start, None, &["b".to_owned()]),
            "a did not answer"
        );
        assert!(!shards.serves(5));
        assert!(shards.record(after.start, None, &["a".to_owned()]));
        assert!(shards.serves(5) && shards.settled());
    }

    #[test]
    fn an_unmapped_slot_or_a_doubt_about_all_serves_nothing() {
        let shards = shards(&[(0, 99, "a"), (200, SLOTS - 1, "b")]);
        assert!(!shards.serves(150), "no primary known for it");
        shards.suspect(150, 1);
        assert!(!shards.serves(5) && !shards.serves(500));
        let begun = shards.begin();
        shards.record(begun.start, None, &["a".to_owned(), "b".to_owned()]);
        assert!(shards.serves(5) && shards.serves(500));
        shards.suspect_all();
        assert!(!shards.serves(5) && !shards.serves(500));
    }

    #[test]
    fn a_primary_that_left_the_map_is_forgotten() {
        let shards = shards(&[(0, 99, "a"), (100, SLOTS - 1, "b")]);
        let begun = shards.begin();
        let moved = vec![(0, 99, "c".to_owned()), (100, SLOTS - 1, "b".to_owned())];
        shards.record(begun.start, Some(moved), &["c".to_owned()]);
        assert!(shards.serves(5));
        let known = shards.begin().known;
        assert_eq!(
            primaries(&known).into_keys().collect::<Vec<_>>(),
            ["b", "c"]
        );
    }

    #[test]
    fn the_map_version_moves_when_it_names_a_new_primary() {
        let shards = Shards::default();
        assert_eq!(shards.version(), 0, "no map yet");
        let map = |[low, high]: [&str; 2]| {
            let (low, high) = (low.to_owned(), high.to_owned());
            Some(vec![(0, 99, low), (100, SLOTS - 1, high)])
        };
        let start = shards.begin().start;
        shards.record(start, map(["a", "b"]), []);
        assert_eq!(shards.version(), 1, "the first map");
        shards.record(start, map(["a", "b"]), []);
        shards.record(start, map(["b", "a"]), []);
        shards.record(start, None, &["a".to_owned()]);
        assert_eq!(
            shards.version(),
            1,
            "slots moved between known primaries, or none read"
        );
        shards.record(start, map(["c", "b"]), []);
        assert_eq!(shards.version(), 2, "a replica promoted in a's place");
    }

    #[test]
    fn parses_cluster_slots() {
        let node = |port: i64, id: &str| {
            Value::Array(vec![
                Value::BulkString(b"10.0.0.1".to_vec()),
                Value::Int(port),
                Value::BulkString(id.as_bytes().to_vec()),
            ])
        };
        let reply = |last: i64| {
            Value::Array(vec![
                Value::Array(vec![Value::Int(100), Value::Int(last), node(7001, "b")]),
                Value::Array(vec![
                    Value::Int(0),
                    Value::Int(99),
                    node(7000, "a"),
                    node(7003, "a-replica"),
                ]),
            ])
        };
        assert_eq!(
            parse_slots(&reply(SLOTS.into())),
            None,
            "slot 16384 does not exist"
        );
        let ranges = parse_slots(&reply(i64::from(SLOTS) - 1)).expect("a slot map");
        assert_eq!(
            ranges,
            [(0, 99, "a".to_owned()), (100, SLOTS - 1, "b".to_owned())]
        );
        assert_eq!(
            primaries(&ranges),
            BTreeMap::from([("a".to_owned(), 0), ("b".to_owned(), 100)])
        );
    }
}
