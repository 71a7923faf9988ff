//! The link to Redis that every command takes: the pool, the per-identity lanes that order and
//! batch the commands of batching kernels (see [`lanes`](super::lanes)), the commands sent
//! until a deadline (see [`until`](super::until)), the live fencing tokens of fenced kernels,
//! and the background tracker that finishes what callers do not wait for.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::{ToRedisArgs, Value};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::failure;
use super::lanes::{Admitted, Driven, Lanes, Queued, Request, answer};
use super::pool::Pool;
use super::redis_cause;
use super::route::{Queue, Route};
use crate::coordinator::background::Background;
use crate::coordinator::incarnation::{Incarnation, LossCause};
use crate::coordinator::timer;
use crate::error::Error;
use crate::error::FailureKind;
use crate::identity::KeyBase;
use crate::kernel::Script;
use crate::sync::lock;

pub(super) struct Link {
    pub(super) pool: Pool,
    pub(super) kernel_lanes: KernelLanes,
    /// Where publishing scripts publish, one channel per namespace.
    channel: String,
    /// The commands sent until a deadline, by route (see [`until`](super::until)).
    pub(super) until: Mutex<HashMap<Route, Queue>>,
    /// The fencing tokens this process knows to be live, by identity (see [`Live`]).
    live: Mutex<HashMap<KeyBase, Live>>,
    incarnation: Arc<Incarnation>,
    pub(super) background: Background,
}

/// The latest fencing token granted here for one identity, and until when the identity's
/// counter certainly holds at least it: the server keeps the counter at least as long past
/// the *send* of the last command here that granted or kept it as its kernel declares
/// ([`lasts_ns`](crate::kernel::Scripted::lasts_ns)). Known in one epoch only: a loss
/// forgets it.
#[derive(Debug, Clone, Copy)]
struct Live {
    fence: u64,
    until: Instant,
    epoch: u64,
}

/// How many identities' live tokens are kept before the stale ones are swept.
const LIVE_SWEEP_AT: usize = 4096;

/// The lanes of every batching kernel, one set per kernel type.
#[derive(Default)]
pub(super) struct KernelLanes(pub(super) Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>);

/// A request kind with a lane of its own, and how a batch of it is sent.
pub(super) trait Batched: Request + Sized {
    /// The lanes requests of this kind wait in.
    fn lanes(link: &Link) -> Arc<Lanes<Self>>;

    /// Sends `batch` as one script call: one reply per request, in order.
    fn call(
        link: &Arc<Link>,
        key: &KeyBase,
        batch: &[Queued<Self>],
    ) -> impl Future<Output = Result<Vec<Self::Reply>, Error>> + Send;

    /// Undoes what `reply` granted to `request`, whose caller gave up before it arrived.
    fn unheard(link: &Arc<Link>, key: &KeyBase, request: Self, reply: Self::Reply);
}

impl Link {
    pub(super) fn new(
        pool: Pool,
        incarnation: Arc<Incarnation>,
        background: Background,
        channel: String,
    ) -> Self {
        Link {
            pool,
            kernel_lanes: KernelLanes::default(),
            channel,
            until: Mutex::default(),
            live: Mutex::default(),
            incarnation,
            background,
        }
    }

    /// Where publishing scripts publish.
    pub(super) fn channel(&self) -> &str {
        &self.channel
    }

    /// What a failed call of a fenced script tells: its refusals are no outage.
    pub(super) fn fence_failed(&self, error: Error) -> Error {
        let Some(cause) = redis_cause(&error) else {
            return error;
        };
        let detail = cause.detail().unwrap_or_default().to_owned();
        match cause.code() {
            Some("CARACAL_LOST") => {
                self.incarnation.lost(LossCause::KeysLost);
                Error::unavailable(FailureKind::DataLost, detail)
            }
            Some("CARACAL_FENCE") => Error::unavailable(FailureKind::Server, detail),
            _ => error,
        }
    }

    /// Which incarnation of the server this link talks to.
    pub(super) fn incarnation(&self) -> &Incarnation {
        &self.incarnation
    }

    /// The live fencing token this process knows of for `key` (0 for none).
    pub(super) fn known(&self, key: &KeyBase) -> u64 {
        let epoch = self.incarnation.epoch();
        let now = Instant::now();
        lock(&self.live)
            .get(key)
            .filter(|live| live.epoch == epoch && now < live.until)
            .map_or(0, |live| live.fence)
    }

    /// Records that the counter of `key` holds at least `fence` until `until`: a command
    /// granted it, or (with the fence known already) kept it.
    pub(super) fn granted(&self, key: &KeyBase, fence: u64, until: Instant) {
        let epoch = self.incarnation.epoch();
        let mut live = lock(&self.live);
        if live.len() >= LIVE_SWEEP_AT {
            let now = Instant::now();
            live.retain(|_, known| known.epoch == epoch && now < known.until);
        }
        let entry = live.entry(key.clone()).or_insert(Live {
            fence,
            until,
            epoch,
        });
        if entry.epoch != epoch {
            *entry = Live {
                fence,
                until,
                epoch,
            };
        } else {
            entry.fence = entry.fence.max(fence);
            entry.until = entry.until.max(until);
        }
    }

    /// A command that keeps `key`'s counter, sent at `sent`, succeeded: the counter lives on
    /// for `ttl` past it.
    pub(super) fn kept(&self, key: &KeyBase, sent: Instant, ttl: Duration) {
        let known = self.known(key);
        if known > 0 {
            self.granted(key, known, sent + ttl);
        }
    }

    /// Runs `script` on the connection of `key`'s identity with `EVALSHA`, falling back once
    /// to `EVAL` when the server does not have it (restart, `SCRIPT FLUSH`, eviction) — safe,
    /// as the server ran nothing. Both share one deadline.
    pub(super) async fn eval(
        &self,
        script: &Script,
        key: &KeyBase,
        keys: &[String],
        args: impl ToRedisArgs,
    ) -> Result<Value, Error> {
        Ok(self.eval_sent(script, key, keys, args).await?.0)
    }

    /// [`eval`](Self::eval), with when the command that ran was sent: the `EVAL` of a
    /// fallback, not the `EVALSHA` the server refused unrun. What the command grants is
    /// trusted from then, so a first command on a server without the script (a round trip
    /// more) is trusted as long as any other.
    pub(super) async fn eval_sent(
        &self,
        script: &Script,
        key: &KeyBase,
        keys: &[String],
        args: impl ToRedisArgs,
    ) -> Result<(Value, Instant), Error> {
        let _round_trip = crate::metrics::round_trip(script.name);
        let deadline = Instant::now() + self.pool.timeout();
        let mut conn = self.pool.ready(key, deadline).await?;
        let call = |verb: &str, target: &str| {
            let mut cmd = redis::cmd(verb);
            cmd.arg(target).arg(keys.len()).arg(keys).arg(&args);
            cmd
        };
        let sent = Instant::now();
        match conn.send(&call("EVALSHA", script.sha()), deadline).await {
            Err(failure) if failure.is_noscript() => {
                let sent = Instant::now();
                conn.send(&call("EVAL", script.body()), deadline)
                    .await
                    .map(|value| (value, sent))
                    .map_err(failure::RedisFailure::into_error)
            }
            result => result
                .map(|value| (value, sent))
                .map_err(failure::RedisFailure::into_error),
        }
    }

    /// Enters `request` in its lane. If the lane was idle, this caller drives the call (its
    /// request is queued on the connection at the first poll); else it waits for the batch it
    /// joined, sent once the call in flight is answered.
    ///
    /// Every caller hears within one command timeout of entering: one queued behind a call
    /// that stalls gives up when its time is up, unsent (withdrawn from the lane) or, if its
    /// batch went out meanwhile, with what that batch granted it undone when the reply comes.
    pub(super) fn submit<R: Batched>(
        self: &Arc<Self>,
        key: &KeyBase,
        request: R,
    ) -> impl Future<Output = Result<R::Reply, Error>> + Send + 'static {
        let deadline = Instant::now() + self.pool.timeout();
        let (answer, answered) = oneshot::channel();
        let driven = match R::lanes(self).enter(key, Queued { request, answer }) {
            Admitted::Send(batch) => Some(Driven::new(
                Arc::clone(self).run(key.clone(), batch),
                &self.background,
            )),
            Admitted::Wait => None,
        };
        async move {
            // The driver's call is bounded by its own command timeout, and answers its batch.
            if let Some(driven) = driven {
                driven.await;
            }
            match timer::timeout_at(deadline, answered).await {
                Some(answer) => answer.unwrap_or_else(|_| {
                    Err(Error::unavailable(
                        FailureKind::Disconnected,
                        "the request was dropped with the runtime carrying it; the outcome is \
                         unknown",
                    ))
                }),
                None => Err(Error::unavailable(
                    FailureKind::Timeout,
                    "no answer within the command timeout: the request waited behind a call to \
                     Redis that did not end in time; it was withdrawn if still unsent",
                )),
            }
        }
    }

    /// Sends `batch`, answers it, then sends whatever queued meanwhile (in the background:
    /// the caller that drove this batch does not wait for the next).
    fn run<R: Batched>(
        self: Arc<Self>,
        key: KeyBase,
        batch: Vec<Queued<R>>,
    ) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(async move {
            let _lane = MoveOn::<R> {
                link: &self,
                key: &key,
                kind: PhantomData,
            };
            let replies = R::call(&self, &key, &batch).await;
            for (request, reply) in answer(batch, replies) {
                R::unheard(&self, &key, request, reply);
            }
        })
    }

    /// Publishes `message` on `channel`, from the connection of `key`'s identity, in the
    /// background and once; `sent` hears whether the server took it (`false`: no connection,
    /// a broken one, a timeout, an error reply), so a publisher that stays quiet after a
    /// message can speak again when it did not go out.
    pub(super) fn publish(
        &self,
        key: &KeyBase,
        channel: &str,
        message: &str,
        sent: impl FnOnce(bool) + Send + 'static,
    ) {
        let mut cmd = redis::cmd("PUBLISH");
        cmd.arg(channel).arg(message);
        let Ok(mut conn) = self.pool.checkout(key) else {
            sent(false);
            return;
        };
        let deadline = Instant::now() + self.pool.timeout();
        self.background.start(async move {
            sent(conn.send(&cmd, deadline).await.is_ok());
        });
    }
}

/// Moves a lane of `R` on when the call of its batch ends, however it ends: dropped unfinished
/// (the runtime carrying it stopped, and what it awaited could not be polled anywhere else),
/// its own callers hear that their requests were dropped, and those queued behind it still go
/// out. Else the lane would stay busy for good, and every later call of the identity would
/// queue behind nothing until it timed out.
struct MoveOn<'a, R: Batched> {
    link: &'a Arc<Link>,
    key: &'a KeyBase,
    kind: PhantomData<R>,
}

impl<R: Batched> Drop for MoveOn<'_, R> {
    fn drop(&mut self) {
        if let Some(next) = R::lanes(self.link).next(self.key) {
            self.link
                .background
                .hand_on(Arc::clone(self.link).run(self.key.clone(), next));
        }
    }
}
