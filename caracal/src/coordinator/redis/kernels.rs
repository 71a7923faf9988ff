//! Any [`Scripted`] kernel on Redis: its commands encoded into one script call, the call sent on
//! its identity's connection, its reply decoded strictly; and, for a kernel whose commands
//! batch, the lane that gathers the commands of one identity while a call is in flight.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use redis::{RedisWrite, ToRedisArgs, Value};
use tokio::time::Instant;

use super::lanes::{Lanes, Queued, Request};
use super::link::{Batched, Link};
use super::reply;
use crate::coordinator::feed;
use crate::error::Error;
use crate::identity::KeyBase;
use crate::kernel::{Publish, Scripted, Sink, Wire};
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

/// A [`Sink`] writing each argument into a Redis command.
pub(super) struct Writer<'a, W: ?Sized>(pub(super) &'a mut W);

impl<W: ?Sized + RedisWrite> Sink for Writer<'_, W> {
    fn int(&mut self, n: u64) {
        n.write_redis_args(self.0);
    }

    fn text(&mut self, text: &str) {
        text.write_redis_args(self.0);
    }
}

/// Decodes `count` replies of `K`, each [`Scripted::WIDTH`] integers, from one flat array.
pub(super) fn decode<K: Scripted>(value: Value, count: usize) -> Result<Vec<K::Reply>, Error> {
    let name = K::SCRIPT.name;
    let width = K::WIDTH;
    let expected = || match K::BATCHES {
        true => format!("{width} × {count}"),
        false => width.to_string(),
    };
    let run = reply::integer_run(name, value, width * count, expected)?;
    run.chunks_exact(width)
        .map(|group| K::decode(group).map_err(|detail| reply::malformed(name, detail)))
        .collect()
}

impl Link {
    /// Runs `K`'s script once for every command of `batch` (all of `key`'s identity) and
    /// decodes one reply per command. `known` is the live fencing token the caller knows of.
    pub(super) async fn script<K: Scripted>(
        &self,
        key: &KeyBase,
        batch: &[&K::Command],
        known: u64,
    ) -> Result<Vec<K::Reply>, Error> {
        Ok(self.script_sent::<K>(key, batch, known).await?.0)
    }

    /// [`script`](Self::script), with when the script that ran was sent (see
    /// [`eval_sent`](Self::eval_sent)).
    pub(super) async fn script_sent<K: Scripted>(
        &self,
        key: &KeyBase,
        batch: &[&K::Command],
        known: u64,
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
            known,
        };
        let (value, sent) = self
            .eval_sent(K::SCRIPT, key, &keys, Encoded::<K>::new(batch, wire))
            .await?;
        Ok((decode::<K>(value, batch.len())?, sent))
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
    type Reply = K::Reply;

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
    ) -> Result<Vec<K::Reply>, Error> {
        let commands: Vec<&K::Command> = batch.iter().map(|queued| &queued.request.0).collect();
        link.script::<K>(key, &commands, 0).await
    }

    /// A command answered after its caller gave up stays decided: the kernels that batch this
    /// way charge what they admit, and never refund it.
    fn unheard(_: &Arc<Link>, _: &KeyBase, _: Self, _: K::Reply) {}
}

/// The lanes of every batching kernel, one set per kernel type.
#[derive(Default)]
pub(super) struct KernelLanes(Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>);

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
