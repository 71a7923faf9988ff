//! Commands sent until a deadline: a [`Resent`] kernel's commands go out
//! without their caller waiting, one plain Redis command per identity for all that queue while
//! one is in flight, and one whose outcome is unknown is sent again until it is answered or
//! its deadline passes. What waits goes out ahead of the next script call of its identity, on
//! the same connection (see [`Link::flush_until`]), so that call cannot overtake it.

use std::cell::RefCell;
use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::time::Duration;

use redis::ToRedisArgs;
use tokio::time::Instant;

use super::failure;
use super::link::Link;
use super::reply;
use super::route::{Queue, Resend, Route};
use super::writer::Writer;
use crate::coordinator::background::{Carry, Parked};
use crate::coordinator::timer;
use crate::error::{Error, FailureKind};
use crate::identity::KeyBase;
use crate::kernel::{Plain, Resent, Sink, Undo};
use crate::sync::lock;

/// How long a command whose outcome is unknown waits before it is sent again (unless a script
/// call of its identity sends it sooner): the pool's shortest reconnection interval, so a
/// retry finds the replacement connection.
const RETRY_PAUSE: Duration = super::slot::MIN_RECONNECT_INTERVAL;

/// One command's arguments, written by `encode`.
struct Encoded<'a>(&'a dyn Fn(&mut dyn Sink));

impl ToRedisArgs for Encoded<'_> {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        (self.0)(&mut Writer(out));
    }
}

/// Where a kernel undoes what a reply its caller never heard granted: a command sent until a
/// deadline on the identity of `key`, its outcome heard by no one.
pub(super) struct Undoing<'a> {
    pub(super) link: &'a Arc<Link>,
    pub(super) key: &'a KeyBase,
}

impl Undo for Undoing<'_> {
    fn send(&mut self, plain: Plain, encode: &dyn Fn(&mut dyn Sink), lasts_ns: u64) {
        let until = Instant::now() + Duration::from_nanos(lasts_ns);
        self.link
            .send_encoded(self.key, plain, encode, until, Box::new(|_| ()));
    }
}

impl Link {
    /// Sends `command` of `K` on `key`'s identity without the caller waiting: at once (queued
    /// on the identity's connection before this returns) unless a command of its route is in
    /// flight, in which case it goes out with the others that queue meanwhile as one. `done`
    /// hears whether it took effect, or the failure; one whose outcome is unknown is sent
    /// again until `until`.
    pub(super) fn send_until<K: Resent>(
        self: &Arc<Self>,
        key: &KeyBase,
        command: &K::Command,
        until: Instant,
        done: Box<dyn FnOnce(Result<bool, Error>) + Send>,
    ) {
        let encode = |sink: &mut dyn Sink| K::encode(command, sink);
        self.send_encoded(key, K::PLAIN, &encode, until, done);
    }

    /// [`send_until`](Self::send_until) of a `plain` command whose arguments `encode` writes.
    fn send_encoded(
        self: &Arc<Self>,
        key: &KeyBase,
        plain: Plain,
        encode: &dyn Fn(&mut dyn Sink),
        until: Instant,
        done: Box<dyn FnOnce(Result<bool, Error>) + Send>,
    ) {
        let route = Route::new(key, plain);
        let resend = Resend {
            args: Encoded(encode).to_redis_args(),
            until,
            done,
        };
        let mut queues = lock(&self.until);
        let queue = queues.entry(route.clone()).or_default();
        queue.waiting.push(resend);
        if queue.in_flight == 0 {
            self.send_waiting(&route, queue);
        }
    }

    /// Sends the `plain` commands queued for `key` now; returns the work of those whose
    /// replies have not been heard yet, for a script call on the same connection to carry.
    pub(super) fn flush_until(self: &Arc<Self>, key: &KeyBase, plain: Plain) -> Vec<Carry> {
        let route = Route::new(key, plain);
        let sent = {
            let mut queues = lock(&self.until);
            let Some(queue) = queues.get_mut(&route) else {
                return Vec::new();
            };
            self.send_waiting(&route, queue);
            std::mem::take(&mut queue.sent)
        };
        // Adopted (and their handles dropped) with the lock free: they are on the connection
        // already, so nothing sent after this can overtake them.
        sent.iter().filter_map(Parked::adopt).collect()
    }

    /// Takes what waits in `route`'s `queue` and queues its command on the identity's
    /// connection. Called with the queues' lock held: a batch taken out of the queue must be
    /// on the connection before a script call can find the queue empty and go out itself, or
    /// that call would overtake it. (The lock is taken again only after a real wait: see
    /// [`run_batch`](Self::run_batch).)
    fn send_waiting(self: &Arc<Self>, route: &Route, queue: &mut Queue) {
        if let Some(batch) = queue.take() {
            let starting = Starting::begin(self, route);
            let sent = self
                .background
                .start(Arc::clone(self).run_batch(route.clone(), batch));
            let unstarted = starting.end();
            if !unstarted.is_empty() {
                // Its work was dropped as it started (no runtime would run it, or it panicked):
                // back in the queue, for the route's next command or script call to send.
                queue.in_flight = queue.in_flight.saturating_sub(1);
                queue.waiting.splice(0..0, unstarted);
            }
            queue.sent.retain(Parked::shelved);
            if sent.shelved() {
                queue.sent.push(sent);
            }
        }
    }

    /// Sends one command for `batch` and reports it, then sends what queued meanwhile.
    ///
    /// The command is idempotent, so one whose outcome is unknown (a timeout, a dropped
    /// connection) is sent again until it is answered or the last of its deadlines passes:
    /// back in the route's queue, it goes out just before the identity's next script call, on
    /// that call's connection, so that call cannot overtake it; and after a pause if no call
    /// comes first.
    fn run_batch(
        self: Arc<Self>,
        route: Route,
        batch: Vec<Resend>,
    ) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(async move {
            let args: Vec<Vec<u8>> = batch
                .iter()
                .flat_map(|resend| resend.args.iter().cloned())
                .collect();
            let commands = batch.len();
            let mut unsettled = Unsettled {
                link: &self,
                route: &route,
                batch: Some(batch),
            };
            let mut waited = false;
            let sent = {
                let mut call = pin!(self.send_batch(&route, &args, commands));
                poll_fn(|cx| {
                    let polled = call.as_mut().poll(cx);
                    waited |= polled.is_pending();
                    polled
                })
                .await
            };
            // Whoever started this holds the queues' lock until its first poll returns; a
            // command that failed at once (no connection) must not take the lock in that poll.
            // Only then: a task that yields is woken through the scheduler's queue, which on a
            // multi-thread runtime wakes a second worker.
            if !waited {
                tokio::task::yield_now().await;
            }
            let batch = unsettled.batch.take().unwrap_or_default();
            self.settle(&route, batch, sent);
        })
    }

    /// Reports how `batch`'s command ended and moves the route on: what may not have run goes
    /// back into the queue, to be sent again before the next script call or after a pause;
    /// what queued meanwhile goes out now.
    fn settle(self: &Arc<Self>, route: &Route, batch: Vec<Resend>, sent: Result<u64, Error>) {
        let again = match sent {
            Err(error) if outcome_unknown(&error) => {
                let retry_by = Instant::now() + RETRY_PAUSE;
                let (again, over): (Vec<_>, Vec<_>) = batch
                    .into_iter()
                    .partition(|resend| retry_by < resend.until);
                report(over, Err(error));
                again
            }
            result => {
                report(batch, result);
                Vec::new()
            }
        };
        let failed = !again.is_empty();
        let schedule = {
            let mut queues = lock(&self.until);
            let queue = queues.entry(route.clone()).or_default();
            queue.in_flight = queue.in_flight.saturating_sub(1);
            queue.waiting.splice(0..0, again);
            // After a failure the connection is likely still down: what waits goes out with
            // the retry, or before a script call.
            if !failed && queue.in_flight == 0 {
                self.send_waiting(route, queue);
            }
            let schedule = failed && !std::mem::replace(&mut queue.retry_scheduled, true);
            if queue.idle() {
                queues.remove(route);
            }
            schedule
        };
        if schedule {
            let retry = Retry {
                link: Arc::clone(self),
                route: route.clone(),
            };
            self.background.start(async move {
                timer::sleep_until(Instant::now() + RETRY_PAUSE).await;
                drop(retry);
            });
        }
    }

    /// `VERB key args…`, the `args` of `commands` commands, on the identity's connection
    /// (queued there at the first poll): how many of them took effect.
    async fn send_batch(
        &self,
        route: &Route,
        args: &[Vec<u8>],
        commands: usize,
    ) -> Result<u64, Error> {
        let mut cmd = redis::cmd(route.verb);
        cmd.arg(route.key.key(route.suffix));
        for arg in args {
            cmd.arg(arg);
        }
        let deadline = Instant::now() + self.pool.timeout();
        let mut conn = self.pool.ready(&route.key, deadline).await?;
        let value = conn
            .send(&cmd, deadline)
            .await
            .map_err(failure::RedisFailure::into_error)?;
        let commands = i64::try_from(commands).unwrap_or(i64::MAX);
        reply::integer_in(route.verb, value, 0..=commands).map(|n| n as u64)
    }
}

/// The scheduled retry of a route's commands, sent when this is dropped: after its pause, or
/// sooner if its work is dropped unfinished (no runtime is left to run it). It is the only
/// thing that clears `retry_scheduled`, so it must run however its work ends, or no command of
/// the route would be retried again.
struct Retry {
    link: Arc<Link>,
    route: Route,
}

impl Drop for Retry {
    fn drop(&mut self) {
        let mut queues = lock(&self.link.until);
        if let Some(queue) = queues.get_mut(&self.route) {
            queue.retry_scheduled = false;
            self.link.send_waiting(&self.route, queue);
            if queue.idle() {
                queues.remove(&self.route);
            }
        }
    }
}

/// A batch whose command has not been settled: dropped unfinished, its outcome is unknown, and
/// it is settled so (sent again, unless its deadlines would have passed by then).
struct Unsettled<'a> {
    link: &'a Arc<Link>,
    route: &'a Route,
    batch: Option<Vec<Resend>>,
}

thread_local! {
    /// While a batch is started here (see [`Link::send_waiting`]), with the queues' lock held:
    /// the batch, if its work is dropped as it starts, for the starter to put back in its
    /// queue (settling it here would take the lock again).
    static STARTING: RefCell<Option<Unstarted>> = const { RefCell::new(None) };
}

/// The batch of one route of one link dropped as it started.
struct Unstarted {
    link: *const Link,
    route: Route,
    batch: Vec<Resend>,
}

/// A start of a batch in progress on this thread (see [`STARTING`]); what was there before (a
/// start further up the stack) is put back when it ends, even by a panic.
struct Starting(Option<Option<Unstarted>>);

impl Starting {
    fn begin(link: &Arc<Link>, route: &Route) -> Self {
        let here = Unstarted {
            link: Arc::as_ptr(link),
            route: route.clone(),
            batch: Vec::new(),
        };
        Starting(Some(STARTING.replace(Some(here))))
    }

    /// The batch dropped as it started, if it was.
    fn end(mut self) -> Vec<Resend> {
        let outer = self.0.take().flatten();
        STARTING
            .replace(outer)
            .map(|unstarted| unstarted.batch)
            .unwrap_or_default()
    }
}

impl Drop for Starting {
    fn drop(&mut self) {
        if let Some(outer) = self.0.take() {
            STARTING.set(outer);
        }
    }
}

impl Drop for Unsettled<'_> {
    fn drop(&mut self) {
        let Some(batch) = self.batch.take() else {
            return;
        };
        let batch = STARTING.with_borrow_mut(|starting| match starting {
            Some(unstarted)
                if std::ptr::eq(unstarted.link, Arc::as_ptr(self.link))
                    && unstarted.route == *self.route =>
            {
                unstarted.batch.extend(batch);
                None
            }
            _ => Some(batch),
        });
        if let Some(batch) = batch {
            let dropped = Error::unavailable(
                FailureKind::Disconnected,
                "the command was dropped unfinished with the runtime carrying it",
            );
            self.link.settle(self.route, batch, Err(dropped));
        }
    }
}

/// Tells each command how its batch ended. The reply counts the commands that took effect,
/// not which: so many of them hear that theirs did, the rest that it did not.
fn report(batch: Vec<Resend>, result: Result<u64, Error>) {
    match result {
        Ok(took) => {
            for (index, resend) in batch.into_iter().enumerate() {
                (resend.done)(Ok((index as u64) < took));
            }
        }
        Err(error) => {
            for resend in batch {
                (resend.done)(Err(error.clone()));
            }
        }
    }
}

/// Whether a failed command may not have run (or not been sent at all): worth sending again
/// when it is idempotent. A server error, a malformed reply or a shut-down coordinator would
/// only fail again.
fn outcome_unknown(error: &Error) -> bool {
    matches!(
        error.failure_kind(),
        Some(FailureKind::Timeout | FailureKind::Disconnected)
    )
}

#[cfg(test)]
mod tests {
    use redis::ToRedisArgs;

    use super::{Encoded, Route};
    use crate::identity::{Identity, PolicyKind, Scope};
    use crate::kernel::{Plain, Sink};

    /// A batch goes on the wire as one command: the verb, the identity's key, then each
    /// command's arguments in turn, each its own argument.
    #[test]
    fn a_batch_is_one_command_of_every_argument() {
        let identity = Identity::new("ns", PolicyKind::Bulkhead, "p", "op", &Scope::GLOBAL);
        let plain = Plain {
            verb: "ZREM",
            key: "leases",
        };
        let route = Route::new(&identity.key, plain);
        let texts = ["one", "two"];
        let mut ours = redis::cmd(route.verb);
        ours.arg(route.key.key(route.suffix));
        for text in texts {
            let encode = |sink: &mut dyn Sink| sink.text(text);
            for arg in &Encoded(&encode).to_redis_args() {
                ours.arg(arg);
            }
        }
        let mut plain = redis::cmd("ZREM");
        plain.arg(identity.key.key("leases"));
        for text in texts {
            plain.arg(text.to_owned());
        }
        assert_eq!(ours.get_packed_command(), plain.get_packed_command());
    }
}
