//! `caracal status`'s reads of the identities' live states, many identities per script: one
//! script per identity made 10 000 round trips at the registry's bound (well past a second),
//! where a batch of [`STATUS_BATCH`] makes 625.

use std::collections::BTreeMap;
use std::sync::Mutex;

use futures_util::{StreamExt, TryStreamExt};

use super::{RedisBackend, reply, shards};
use crate::coordinator::registry::{Snapshot, StatusRead};
use crate::error::Error;
use crate::identity::KeyBase;
use crate::kernel::Script;
use crate::sync::lock;

/// The most identities one status script reads: each read is a few commands on one
/// identity's keys, so a batch holds the server a small fraction of a millisecond.
pub(crate) const STATUS_BATCH: usize = 16;

/// How many status scripts are in flight at once: enough to keep the server busy across the
/// round trips, few enough that other callers' commands are not queued behind a flood.
const BATCHES_IN_FLIGHT: usize = 32;

/// How many are in flight on a cluster, where each identity's keys carry a hash tag of their
/// own, so a script reads the few identities that share a slot (at the registry's bound of
/// 10 000, about 7 500 scripts of one to three): each holds the server a fraction of a full
/// batch's time, and as many were in flight before reads were batched, so a cluster's
/// `status` is no slower than it was.
const SINGLE_READS_IN_FLIGHT: usize = 64;

/// What a kind's status read is sent between to read a batch: its body becomes a function of
/// one identity's keys (a status read takes no `ARGV`), run on each identity's in turn.
const BEFORE: &str = "local function read_one(KEYS)\n";
const AFTER: &str = "
end
-- status batch: KEYS are the batch's identities' keys, ARGV[1] of them each, in the order
-- of the status read above; the reply is the read's replies end to end.
local per, reply = tonumber(ARGV[1]), {}
-- A step of 0 would never end the loop below (Lua 5.1 does not refuse it).
if not per or per < 1 or #KEYS % per ~= 0 then
  return redis.error_reply('status batch: ' .. #KEYS .. ' keys, not groups of '
    .. tostring(ARGV[1]))
end
for first = 0, #KEYS - per, per do
  local keys = {}
  for i = 1, per do
    keys[i] = KEYS[first + i]
  end
  local figures = read_one(keys)
  for i = 1, #figures do
    reply[#reply + 1] = figures[i]
  end
end
return reply
";

/// The scripts that read the identities of `slots` (each identity's slot, in order), as
/// indexes into it: at most [`STATUS_BATCH`] to a script, all of one slot; and how many
/// scripts to keep in flight ([`SINGLE_READS_IN_FLIGHT`] on a `cluster`, whose scripts read
/// few identities each, [`BATCHES_IN_FLIGHT`] otherwise).
fn plan(slots: &[u16], cluster: bool) -> (Vec<Vec<usize>>, usize) {
    let mut groups: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
    for (at, &slot) in slots.iter().enumerate() {
        groups.entry(slot).or_default().push(at);
    }
    let batches: Vec<Vec<usize>> = groups
        .values()
        .flat_map(|group| group.chunks(STATUS_BATCH))
        .map(<[usize]>::to_vec)
        .collect();
    let in_flight = if cluster {
        SINGLE_READS_IN_FLIGHT
    } else {
        BATCHES_IN_FLIGHT
    };
    (batches, in_flight)
}

/// The `KEYS` of a batch of `read` on the identities at `keys`: each identity's, in the
/// read's order. Every kind's read names keys (a unit test checks each descriptor): the
/// batch could not tell one identity's keys from the next otherwise, and its script would
/// step through them by 0 (the script refuses that, as Lua 5.1 would loop for ever).
fn batch_keys(read: &StatusRead, keys: &[KeyBase]) -> Vec<String> {
    debug_assert!(
        !read.keys.is_empty(),
        "the status read {} names no keys",
        read.script.name
    );
    keys.iter()
        .flat_map(|key| read.keys.iter().map(|suffix| key.key(suffix)))
        .collect()
}

/// `read`'s batch form ([`BEFORE`], its body, [`AFTER`]): made on first use and kept for the
/// life of the process, one per kind with a status read.
fn batched(read: &'static Script) -> &'static Script {
    static MADE: Mutex<Vec<(&'static str, &'static Script)>> = Mutex::new(Vec::new());
    let mut made = lock(&MADE);
    if let Some((_, script)) = made.iter().find(|(name, _)| *name == read.name) {
        return script;
    }
    let name: &'static str = Box::leak(format!("{}_batch", read.name).into_boxed_str());
    let parts: &'static [&'static str] = Box::leak(Box::new([BEFORE, read.body(), AFTER]));
    let script: &'static Script = Box::leak(Box::new(Script::new(name, parts)));
    made.push((read.name, script));
    script
}

impl RedisBackend {
    /// Runs a kind's status read on the identities at `keys`, [`STATUS_BATCH`] to a script
    /// (on a cluster, only identities of one slot share one) and [`BATCHES_IN_FLIGHT`]
    /// scripts at once ([`SINGLE_READS_IN_FLIGHT`] on a cluster, of a few identities each):
    /// per identity, in order, the server's time and the kind's figures.
    pub(in crate::coordinator) async fn identity_reads(
        &self,
        read: &StatusRead,
        keys: &[KeyBase],
    ) -> Result<Vec<Snapshot>, Error> {
        let cluster = self.is_cluster();
        let slots: Vec<u16> = keys
            .iter()
            .map(|key| {
                if cluster {
                    shards::key_slot(&key.key(""))
                } else {
                    0
                }
            })
            .collect();
        let (batches, in_flight) = plan(&slots, cluster);
        // Each batch's future made here, owning its keys: a stream's closure borrowing them
        // would not be `Send` for every lifetime, as a spawned `status` needs.
        let batches: Vec<_> = batches
            .into_iter()
            .map(|batch| {
                let batch_keys: Vec<KeyBase> = batch.iter().map(|&at| keys[at].clone()).collect();
                async move {
                    let read = self.identity_read_batch(read, &batch_keys).await?;
                    Ok::<_, Error>((batch, read))
                }
            })
            .collect();
        let batches: Vec<(Vec<usize>, Vec<Snapshot>)> = futures_util::stream::iter(batches)
            .buffer_unordered(in_flight)
            .try_collect()
            .await?;
        let mut snapshots = vec![Snapshot::NOTHING; keys.len()];
        for (batch, read) in batches {
            for (at, snapshot) in batch.into_iter().zip(read) {
                snapshots[at] = snapshot;
            }
        }
        Ok(snapshots)
    }

    /// One script of [`identity_reads`](Self::identity_reads), on identities of one slot.
    async fn identity_read_batch(
        &self,
        read: &StatusRead,
        keys: &[KeyBase],
    ) -> Result<Vec<Snapshot>, Error> {
        let Some(first) = keys.first() else {
            return Ok(Vec::new());
        };
        let script = batched(read.script);
        let every = batch_keys(read, keys);
        let value = self
            .link
            .eval(script, first, &every, read.keys.len())
            .await?;
        let each = read.figures + 1;
        let run = reply::integer_run(script.name, value, each * keys.len(), || {
            format!("{each} × {}", keys.len())
        })?;
        run.chunks_exact(each)
            .map(|figures| {
                let now_ms = u64::try_from(figures[0]).map_err(|_| {
                    reply::malformed(script.name, format_args!("{} as the time", figures[0]))
                })?;
                Ok(Snapshot {
                    script: script.name,
                    now_ms,
                    figures: figures[1..].to_vec(),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordinator::redis::scripts;
    use crate::coordinator::registry::MemoryRead;
    use crate::identity::{Identity, PolicyKind, Scope};

    /// The identities of one kind at the registry's bound (10 000), each of its own scope.
    fn at_the_bound() -> Vec<KeyBase> {
        (0..10_000)
            .map(|n| {
                let scope = Scope::new(format!("s{n}")).expect("a scope");
                Identity::new("ns", PolicyKind::Bulkhead, "b", "b", &scope).key
            })
            .collect()
    }

    /// On a cluster at the registry's bound, the identities' real slots (many shared by two
    /// or three: the birthday bound) are read 64 scripts in flight, as before batching, each
    /// of one slot; on one server, batches of [`STATUS_BATCH`] fewer in flight.
    #[test]
    fn reads_group_by_slot_and_a_cluster_keeps_more_in_flight() {
        let keys = at_the_bound();
        let slots: Vec<u16> = keys
            .iter()
            .map(|key| shards::key_slot(&key.key("")))
            .collect();
        let (batches, in_flight) = plan(&slots, true);
        assert!(
            batches.iter().any(|batch| batch.len() > 1),
            "no shared slot"
        );
        assert!(
            batches
                .iter()
                .all(|batch| batch.iter().all(|&at| slots[at] == slots[batch[0]]))
        );
        assert_eq!(batches.iter().map(Vec::len).sum::<usize>(), keys.len());
        assert_eq!(
            in_flight, 64,
            "a cluster's status slower than before batching"
        );

        let (batches, in_flight) = plan(&[0; 40], false);
        let sizes: Vec<usize> = batches.iter().map(Vec::len).collect();
        assert_eq!(sizes, [16, 16, 8]);
        assert_eq!(in_flight, BATCHES_IN_FLIGHT);

        // Two slots, interleaved: each script holds one slot's identities, every one read once.
        let (batches, _) = plan(&[7, 9, 7, 9, 7], true);
        assert_eq!(batches, [vec![0, 2, 4], vec![1, 3]]);
    }

    /// A batch lists each identity's keys, in the read's order, so the script can tell one
    /// identity's from the next.
    #[test]
    fn a_batch_lists_each_identitys_keys_in_the_reads_order() {
        let read = StatusRead {
            script: &scripts::PROCESSES_READ,
            keys: &["first", "second"],
            figures: 1,
            memory: MemoryRead {
                states: &[],
                figures: |_, _| Vec::new(),
            },
        };
        let keys: Vec<KeyBase> = ["a", "b"]
            .iter()
            .map(|&name| Identity::new("ns", PolicyKind::Bulkhead, name, name, &Scope::GLOBAL).key)
            .collect();
        let every = batch_keys(&read, &keys);
        assert_eq!(
            every,
            [
                keys[0].key("first"),
                keys[0].key("second"),
                keys[1].key("first"),
                keys[1].key("second"),
            ]
        );
    }
}
