//! Any [`Scripted`] kernel on Redis: its commands encoded into one script call, the call sent on
//! its identity's connection, its reply decoded strictly; and, for a kernel whose commands
//! batch, the lane that gathers the commands of one identity while a call is in flight.

use std::any::TypeId;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use redis::{RedisWrite, ToRedisArgs, Value};
use tokio::time::Instant;

use super::lanes::{Lanes, Queued, Request};
use super::link::{Batched, KernelLanes, Link};
use super::reply;
use super::until::Undoing;
use super::writer::Writer;
use crate::coordinator::feed;
use crate::error::Error;
use crate::identity::KeyBase;
use crate::kernel::{Fence, Publish, Scripted, Wire};
use crate::sync::lock;

/// The arguments of one script call for `batch`, written straight into the command.
pub(super) struct Encoded<'a, K: Scripted> {
    batch: &'a [&'a K::Command],
    wire: Wire<'a>,
}

impl<'a, K: Scripted> Encoded<'a, K> {
    pub(super) fn new(batch: &'a [&'a K::Command], wire: Wire<'a>) -> Self {
        Encoded { batch, wire }
    }
}

impl<K: Scripted> ToRedisArgs for Encoded<'_, K> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        K::encode(self.batch, &self.wire, &mut Writer(out));
    }
}

/// Decodes `count` replies of `K`, each [`Scripted::WIDTH`] integers, from one flat array.
pub(super) fn decode<K: Scripted>(value: Value, count: usize) -> Result<Vec<K::Reply>, Error> {
    let name = K::SCRIPT.name;
    let width = K::WIDTH;
    let expected = || match K::BATCH_REPLY {
        true => format!("{width} × {count}"),
        false => width.to_string(),
    };
    let run = reply::integer_run(name, value, width * count, expected)?;
    run.chunks_exact(width)
        .map(|group| K::decode(group).map_err(|detail| reply::malformed(name, detail)))
        .collect()
}

impl Link {
    /// Runs a command of a batching kernel, batched with the commands of the same identity
    /// that queue while one is in flight: its reply, and when its batch was sent.
    pub(super) fn batched<K: Scripted>(
        self: &Arc<Self>,
        key: &KeyBase,
        command: K::Command,
    ) -> impl Future<Output = Result<(K::Reply, Instant), Error>> + Send + 'static {
        self.submit(key, Pending::<K>::new(command))
    }

    /// Runs `K`'s script once for every command of `batch` (all of `key`'s identity): one
    /// reply per command, and when the script that ran was sent (see
    /// [`eval_sent`](Self::eval_sent)). A [`FENCED`](Scripted::FENCED) kernel's call carries
    /// the live fencing token this process knows of (so that a set lost without a restart is
    /// noticed), and what its replies did to the counter is recorded; a refusal of the whole
    /// call as lost is a data loss, noticed here before the error is returned.
    pub(super) async fn script_sent<K: Scripted>(
        &self,
        key: &KeyBase,
        batch: &[&K::Command],
    ) -> Result<(Vec<K::Reply>, Instant), Error> {
        let prefix = match K::PUBLISHES {
            Publish::Nothing => String::new(),
            Publish::Calls => feed::prefix(feed::Origin::Call, key),
            Publish::Operator => feed::prefix(feed::Origin::Operator, key),
        };
        let channel = match K::PUBLISHES {
            Publish::Nothing => "",
            Publish::Calls | Publish::Operator => self.channel(),
        };
        let keys: Vec<String> = K::KEYS.iter().map(|suffix| key.key(suffix)).collect();
        let wire = Wire {
            channel,
            prefix: &prefix,
            known: if K::FENCED { self.known(key) } else { 0 },
        };
        let called = self
            .eval_sent(K::SCRIPT, key, &keys, Encoded::<K>::new(batch, wire))
            .await
            .and_then(|(value, sent)| Ok((decode::<K>(value, batch.len())?, sent)));
        if !K::FENCED {
            return called;
        }
        let (replies, sent) = called.map_err(|error| self.fence_failed(error))?;
        self.learn::<K>(key, batch, &replies, sent);
        Ok((replies, sent))
    }

    /// Records what the replies of a fenced `batch`, sent at `sent`, did to the counter of
    /// `key`: the highest token granted, else whether a renewal kept it.
    fn learn<K: Scripted>(
        &self,
        key: &KeyBase,
        batch: &[&K::Command],
        replies: &[K::Reply],
        sent: Instant,
    ) {
        let lasts_ns = K::lasts_ns(batch[0]);
        // A fenced kernel's default 0 would record a token already stale, silently sending
        // none from then on: fencing off. One value serves the batch, so its commands share it.
        debug_assert!(lasts_ns > 0, "a FENCED kernel declares lasts_ns");
        debug_assert!(
            batch.iter().all(|command| K::lasts_ns(command) == lasts_ns),
            "commands that batch share lasts_ns"
        );
        let lasts = || Duration::from_nanos(lasts_ns);
        let fences = replies.iter().map(K::fence);
        let granted = fences
            .clone()
            .filter_map(|fence| match fence {
                Fence::Granted(fence) => Some(fence),
                Fence::Untouched | Fence::Kept => None,
            })
            .max();
        if let Some(fence) = granted {
            self.granted(key, fence, sent + lasts());
        } else if fences.into_iter().any(|fence| fence == Fence::Kept) {
            self.kept(key, sent, lasts());
        }
    }
}

/// One command of a kernel whose commands batch, waiting in its identity's lane.
pub(super) struct Pending<K: Scripted>(K::Command, PhantomData<fn() -> K>);

impl<K: Scripted> Pending<K> {
    pub(super) fn new(command: K::Command) -> Self {
        Pending(command, PhantomData)
    }
}

impl<K: Scripted> Request for Pending<K> {
    type Reply = (K::Reply, Instant);

    fn batches_with(&self, other: &Self) -> bool {
        K::batches_with(&self.0, &other.0)
    }
}

impl<K: Scripted> Batched for Pending<K> {
    fn lanes(link: &Link) -> Arc<Lanes<Self>> {
        link.kernel_lanes.of::<K>()
    }

    async fn call(
        link: &Arc<Link>,
        key: &KeyBase,
        batch: &[Queued<Self>],
    ) -> Result<Vec<(K::Reply, Instant)>, Error> {
        let commands: Vec<&K::Command> = batch.iter().map(|queued| &queued.request.0).collect();
        let (replies, sent) = if K::AFTER.is_empty() {
            link.script_sent::<K>(key, &commands).await?
        } else {
            // What waits to go out first goes now, on the same connection; its replies come
            // before this one's: carried here, they wake no task of their own.
            let waiting = K::AFTER
                .iter()
                .flat_map(|&plain| link.flush_until(key, plain))
                .collect();
            let call = link.script_sent::<K>(key, &commands);
            link.background.alongside(call, waiting).await?
        };
        Ok(replies.into_iter().map(|reply| (reply, sent)).collect())
    }

    /// A command answered after its caller gave up stays decided, unless its kernel undoes it
    /// (a lease acquired is released).
    fn unheard(link: &Arc<Link>, key: &KeyBase, request: Self, (reply, _): (K::Reply, Instant)) {
        K::unheard(&request.0, &reply, &mut Undoing { link, key });
    }
}

impl KernelLanes {
    fn of<K: Scripted>(&self) -> Arc<Lanes<Pending<K>>> {
        let mut lanes = lock(&self.0);
        let entry = lanes
            .entry(TypeId::of::<K>())
            .or_insert_with(|| Arc::new(Lanes::<Pending<K>>::default()));
        Arc::clone(entry)
            .downcast()
            .unwrap_or_else(|_| unreachable!("filed under its own type"))
    }
}
