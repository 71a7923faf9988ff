//! Kept leases across the wire: a refused acquire announces itself on the namespace's feed
//! (`lease-refused`), and a coordinator that hears it returns its kept leases of the identity
//! and keeps none for a while, whoever was refused: another process, another coordinator of
//! this one, a call site without `keep`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use caracal::{Coordinator, bulkhead};
use caracal_tests::{EventLog, RedisServer};
use tokio::sync::oneshot;

use crate::common::{PATIENCE, TestError, code, unique};

/// What a call's body does: return at once, or note that it runs and wait for its gate.
#[derive(Default)]
struct Hold(Option<(Arc<AtomicUsize>, oneshot::Receiver<()>)>);

impl Hold {
    async fn run(self) -> Result<(), TestError> {
        if let Some((running, gate)) = self.0 {
            running.fetch_add(1, Ordering::SeqCst);
            let _ = gate.await;
        }
        Ok(())
    }
}

/// Keeps its lease after the body (up to the 250 ms a kept lease's view of the fleet is fresh).
#[bulkhead(name = "contention", limit = 2, keep = "1s")]
async fn kept(hold: Hold) -> Result<(), TestError> {
    hold.run().await
}

/// The same identity, from a call site that keeps nothing.
#[bulkhead(name = "contention", limit = 2)]
async fn plain(hold: Hold) -> Result<(), TestError> {
    hold.run().await
}

async fn connect(server: &RedisServer, namespace: &str) -> Coordinator {
    Coordinator::redis(server.url())
        .namespace(namespace)
        .connect()
        .await
        .expect("connect")
}

/// The namespace's feed channel, once some coordinator listens to it.
async fn feed_channel(server: &RedisServer) -> String {
    let mut conn = server.connection();
    let deadline = Instant::now() + PATIENCE;
    loop {
        let channels: Vec<String> = redis::cmd("PUBSUB")
            .arg("CHANNELS")
            .arg("caracal:v1:breaker-transitions:*")
            .query(&mut conn)
            .expect("PUBSUB CHANNELS");
        if let Some(channel) = channels.into_iter().next() {
            return channel;
        }
        assert!(Instant::now() < deadline, "nobody listens to the feed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The identity's tag, read off its lease set's key.
fn tag(server: &RedisServer) -> String {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("caracal:v1:*:leases")
        .query(&mut server.connection())
        .expect("KEYS");
    assert_eq!(keys.len(), 1, "{keys:?}");
    let start = keys[0].find('{').expect("a tag") + 1;
    let end = keys[0].find('}').expect("a tag");
    keys[0][start..end].to_owned()
}

/// Waits until `log` has more than `seen` events named `event`.
async fn more(log: &EventLog, event: &str, seen: usize) {
    let deadline = Instant::now() + PATIENCE;
    while log.count(event) <= seen {
        assert!(Instant::now() < deadline, "no new {event}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Makes a call on `keeper`; whether its lease stayed kept after it (`lease_kept` is said
/// before the pool takes the lease: one refused on a contended identity goes back at once).
async fn keeps(keeper: &Coordinator, log: &EventLog) -> bool {
    let (kept, returned) = (
        log.count("bulkhead.lease_kept"),
        log.count("bulkhead.lease_returned"),
    );
    assert_eq!(code(&keeper.scoped(kept_call()).await), "ok");
    log.count("bulkhead.lease_kept") > kept && log.count("bulkhead.lease_returned") == returned
}

/// Whether `keeper`'s lease went back on a refusal (`refuse`) and its next call kept none: a
/// lease the refusal did not reach goes back only when its freshness runs out, and the next
/// call keeps its lease again. A few rounds, so that a round stalled past the contention
/// window by a loaded machine does not count as a miss.
async fn a_refusal_returns_the_kept_lease<F: Future<Output = ()>>(
    keeper: &Coordinator,
    log: &EventLog,
    mut refuse: impl FnMut() -> F,
) -> bool {
    for _ in 0..5 {
        // A kept lease to return (none is kept while a past round's refusal is recent).
        let deadline = Instant::now() + PATIENCE;
        while !keeps(keeper, log).await {
            assert!(Instant::now() < deadline, "no lease kept");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let returned = log.count("bulkhead.lease_returned");
        refuse().await;
        more(log, "bulkhead.lease_returned", returned).await;
        if !keeps(keeper, log).await {
            return true;
        }
    }
    false
}

fn kept_call() -> impl Future<Output = Result<(), TestError>> {
    kept(Hold::default())
}

/// A raw `lease-refused` message about the identity, as another process publishes it: the
/// coordinator returns its kept lease and keeps none right after.
#[tokio::test(flavor = "current_thread")]
async fn a_heard_refusal_returns_the_kept_lease() {
    let (log, _guard) = EventLog::capture_thread_default();
    let server = RedisServer::start();
    let keeper = connect(&server, &unique("heard")).await;
    assert_eq!(code(&keeper.scoped(kept_call()).await), "ok");
    let channel = feed_channel(&server).await;
    let message = format!("0000000000000000:call:{}:lease-refused", tag(&server));
    let returned = a_refusal_returns_the_kept_lease(&keeper, &log, || async {
        let _: i64 = redis::cmd("PUBLISH")
            .arg(&channel)
            .arg(&message)
            .query(&mut server.connection())
            .expect("PUBLISH");
    })
    .await;
    assert!(returned, "the heard refusal did not return the kept lease");
    keeper.shutdown().await;
}

/// A heard refusal is no change an operator sees: [`caracal::Admin::changed`] does not wake
/// (`caracal watch` would redraw up to 20 times a second per identity under contention).
#[tokio::test(flavor = "current_thread")]
async fn a_heard_refusal_does_not_wake_admin_changed() {
    let (log, _guard) = EventLog::capture_thread_default();
    let server = RedisServer::start();
    let keeper = connect(&server, &unique("quiet")).await;
    assert!(keeps(&keeper, &log).await, "a kept lease");
    let channel = feed_channel(&server).await;
    let admin = keeper.admin();
    let mut changed = std::pin::pin!(admin.changed(Duration::from_secs(3600)));
    // Polled once: subscribed to the changes from here on.
    assert!(
        tokio::time::timeout(Duration::ZERO, &mut changed)
            .await
            .is_err()
    );
    let returned = log.count("bulkhead.lease_returned");
    let message = format!("0000000000000000:call:{}:lease-refused", tag(&server));
    let _: i64 = redis::cmd("PUBLISH")
        .arg(&channel)
        .arg(&message)
        .query(&mut server.connection())
        .expect("PUBLISH");
    // Returned by the feed's listener, which wakes the changes (or not) right after.
    more(&log, "bulkhead.lease_returned", returned).await;
    assert!(
        tokio::time::timeout(Duration::ZERO, &mut changed)
            .await
            .is_err(),
        "a heard refusal woke Admin::changed"
    );
    keeper.shutdown().await;
}

/// A refused acquire publishes `<process>:call:<tag>:lease-refused` on the namespace's feed.
#[tokio::test(flavor = "current_thread")]
async fn a_refused_acquire_announces_itself_on_the_feed() {
    let server = RedisServer::start();
    let coordinator = connect(&server, &unique("announce")).await;
    assert_eq!(
        code(&coordinator.scoped(plain(Hold::default())).await),
        "ok"
    );
    let tag = tag(&server);
    let mut subscriber = server.connection();
    let mut pubsub = subscriber.as_pubsub();
    pubsub
        .psubscribe("caracal:v1:breaker-transitions:*")
        .expect("PSUBSCRIBE");
    // Read in short turns: the message goes out from this thread's runtime.
    pubsub
        .set_read_timeout(Some(Duration::from_millis(5)))
        .expect("timeout");
    refuse_on(&coordinator, kept).await;
    let wanted = format!(":call:{tag}:lease-refused");
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Ok(message) = pubsub.get_message() {
            let message: String = message.get_payload().expect("text");
            if message.ends_with(&wanted) {
                break;
            }
        }
        assert!(Instant::now() < deadline, "no {wanted} on the feed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    coordinator.shutdown().await;
}

/// Has `refused` refused a lease on `call`: two calls held (the second refused if a kept lease
/// elsewhere holds a slot), or one more once they fill the identity; then lets them go.
async fn refuse_on<F: Future<Output = Result<(), TestError>> + Send + 'static>(
    refused: &Coordinator,
    call: impl Fn(Hold) -> F,
) {
    let running = Arc::new(AtomicUsize::new(0));
    let (opens, gates): (Vec<_>, Vec<_>) = (0..2).map(|_| oneshot::channel()).unzip();
    let holders: Vec<_> = gates
        .into_iter()
        .map(|gate| {
            let hold = Hold(Some((Arc::clone(&running), gate)));
            tokio::spawn(refused.scoped(call(hold)))
        })
        .collect();
    let deadline = Instant::now() + PATIENCE;
    let finished = |holders: &[tokio::task::JoinHandle<_>]| {
        holders.iter().filter(|holder| holder.is_finished()).count()
    };
    while running.load(Ordering::SeqCst) + finished(&holders) < 2 {
        assert!(Instant::now() < deadline, "the holders never started");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // A holder that finished was refused; otherwise the two fill the identity.
    while finished(&holders) == 0
        && code(&refused.scoped(call(Hold::default())).await) != "bulkhead_full"
    {
        assert!(Instant::now() < deadline, "never refused");
        tokio::task::yield_now().await;
    }
    for open in opens {
        let _ = open.send(());
    }
    for holder in holders {
        let _ = holder.await.expect("no panic");
    }
}

/// Two coordinators in one process: one's refusal returns the other's kept lease.
#[tokio::test(flavor = "current_thread")]
async fn a_refusal_on_another_coordinator_of_this_process_returns_the_kept_lease() {
    let (log, _guard) = EventLog::capture_thread_default();
    let server = RedisServer::start();
    let namespace = unique("sibling");
    let keeper = connect(&server, &namespace).await;
    let refused = connect(&server, &namespace).await;
    assert_eq!(code(&keeper.scoped(kept_call()).await), "ok");
    feed_channel(&server).await;
    let returned =
        a_refusal_returns_the_kept_lease(&keeper, &log, || refuse_on(&refused, kept)).await;
    assert!(
        returned,
        "the sibling's refusal did not return the kept lease"
    );
    refused.shutdown().await;
    keeper.shutdown().await;
}

/// A call site without `keep` refused on the identity still announces it: the keeping
/// coordinator returns its kept lease.
#[tokio::test(flavor = "current_thread")]
async fn a_refusal_where_nothing_is_kept_returns_the_kept_lease() {
    let (log, _guard) = EventLog::capture_thread_default();
    let server = RedisServer::start();
    let namespace = unique("plain");
    let keeper = connect(&server, &namespace).await;
    let refused = connect(&server, &namespace).await;
    assert_eq!(code(&keeper.scoped(kept_call()).await), "ok");
    feed_channel(&server).await;
    let returned =
        a_refusal_returns_the_kept_lease(&keeper, &log, || refuse_on(&refused, plain)).await;
    assert!(
        returned,
        "a plain site's refusal did not return the kept lease"
    );
    refused.shutdown().await;
    keeper.shutdown().await;
}
