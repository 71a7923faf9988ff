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

/// What a kind's status read is sent between to read a batch: its body becomes a function of
/// one identity's keys (a status read takes no `ARGV`), run on each identity's in turn.
const BEFORE: &str = "local function read_one(KEYS)\n";
const AFTER: &str = "
end
-- status batch: KEYS are the batch's identities' keys, ARGV[1] of them each, in the order
-- of the status read above; the reply is the read's replies end to end.
local per, reply = tonumber(ARGV[1]), {}
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
    /// scripts at once: per identity, in order, the server's time and the kind's figures.
    pub(in crate::coordinator) async fn identity_reads(
        &self,
        read: &StatusRead,
        keys: &[KeyBase],
    ) -> Result<Vec<Snapshot>, Error> {
        let mut groups: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
        for (at, key) in keys.iter().enumerate() {
            let slot = if self.is_cluster() {
                shards::key_slot(&key.key(""))
            } else {
                0
            };
            groups.entry(slot).or_default().push(at);
        }
        // Each batch's future made here, owning its keys: a stream's closure borrowing them
        // would not be `Send` for every lifetime, as a spawned `status` needs.
        let batches: Vec<_> = groups
            .values()
            .flat_map(|group| group.chunks(STATUS_BATCH))
            .map(|batch| {
                let batch_keys: Vec<KeyBase> = batch.iter().map(|&at| keys[at].clone()).collect();
                let batch = batch.to_vec();
                async move {
                    let read = self.identity_read_batch(read, &batch_keys).await?;
                    Ok::<_, Error>((batch, read))
                }
            })
            .collect();
        let batches: Vec<(Vec<usize>, Vec<Snapshot>)> = futures_util::stream::iter(batches)
            .buffer_unordered(BATCHES_IN_FLIGHT)
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
        let every: Vec<String> = keys
            .iter()
            .flat_map(|key| read.keys.iter().map(|suffix| key.key(suffix)))
            .collect();
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
