//! The adaptive benchmark's downstream: a TCP server of known capacity that counts what it sees.
//!
//! It serves `capacity` requests at once, each in `service` time (a sleep: the server's cores
//! are not the bottleneck), and queues the rest first come, first served, so a request's latency
//! grows with the queue in front of it. A request is one byte from the client; the reply, the
//! same byte back, once the request has been served. A connection carries one request at a time.
//! Its [`Behaviour`] can make one request in ten take 200 ms and the others 5 ms (a slow class
//! of requests), or refuse a request finding every slot busy after a millisecond, replying `!`
//! (a downstream that fails fast past its capacity).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// A bimodal server's classes: one request in ten is slow, the others fast.
const BIMODAL_FAST: Duration = Duration::from_millis(5);
const BIMODAL_SLOW: Duration = Duration::from_millis(200);
/// Their mean service (24.5 ms): at most `capacity` over it answered a second.
pub(crate) const BIMODAL_MEAN: Duration = Duration::from_micros(
    (9 * BIMODAL_FAST.as_micros() as u64 + BIMODAL_SLOW.as_micros() as u64) / 10,
);

/// The server, listening on 127.0.0.1 until dropped.
pub(crate) struct Downstream {
    address: SocketAddr,
    shared: Arc<Shared>,
    accepting: JoinHandle<()>,
}

/// How the server departs from a plain queue.
#[derive(Clone, Copy, Default)]
pub(crate) struct Behaviour {
    /// One request in ten takes 200 ms, the others 5 ms.
    pub(crate) bimodal: bool,
    /// A request that finds every slot busy fails after a millisecond instead of queueing.
    pub(crate) fail_fast: bool,
}

struct Shared {
    service: Duration,
    behaviour: Behaviour,
    /// Requests served, for the bimodal one in ten.
    count: std::sync::atomic::AtomicU64,
    /// One permit per request served at once; tokio's semaphore is fair, so waiting requests
    /// are served in the order they arrived.
    slots: Semaphore,
    capacity: Mutex<Capacity>,
    tally: Mutex<Tally>,
}

/// The capacity in force, and the permits still to take out of service: lowering the
/// capacity while every slot is busy retires slots as their requests finish, never cuts one
/// short.
struct Capacity {
    now: usize,
    to_retire: usize,
}

/// What the server saw since the last [`Downstream::second`].
struct Tally {
    /// Requests inside the server: being served or queued.
    inside: u64,
    /// Since when `area` holds `inside`'s integral, and when it last integrated it.
    since: Instant,
    changed: Instant,
    /// ∫ inside dt, in request·seconds.
    area: f64,
    max: u64,
    latencies: Vec<Duration>,
    served: Duration,
}

/// What the server saw in one interval.
pub(crate) struct Interval {
    /// The most requests inside at once (served and queued).
    pub(crate) max: u64,
    /// The time-weighted mean of the requests inside.
    pub(crate) mean: f64,
    /// Each request answered in the interval: its time from arrival to reply.
    pub(crate) latencies: Vec<Duration>,
    /// Their service times, summed: the timer's granularity and the machine's load make each
    /// longer than `service`, which lowers the most the server can answer.
    pub(crate) served: Duration,
}

impl Downstream {
    /// Starts a server serving `capacity` requests at once in `service` each.
    pub(crate) async fn start(
        capacity: usize,
        service: Duration,
        behaviour: Behaviour,
    ) -> std::io::Result<Downstream> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let now = Instant::now();
        let shared = Arc::new(Shared {
            service,
            behaviour,
            count: std::sync::atomic::AtomicU64::new(0),
            slots: Semaphore::new(capacity),
            capacity: Mutex::new(Capacity {
                now: capacity,
                to_retire: 0,
            }),
            tally: Mutex::new(Tally {
                inside: 0,
                changed: now,
                since: now,
                area: 0.0,
                max: 0,
                latencies: Vec::new(),
                served: Duration::ZERO,
            }),
        });
        let accepting = tokio::spawn({
            let shared = Arc::clone(&shared);
            async move {
                while let Ok((stream, _)) = listener.accept().await {
                    tokio::spawn(Arc::clone(&shared).serve(stream));
                }
            }
        });
        Ok(Downstream {
            address,
            shared,
            accepting,
        })
    }

    /// Where it listens.
    pub(crate) fn address(&self) -> SocketAddr {
        self.address
    }

    /// Serves `capacity` requests at once from now on.
    pub(crate) fn set_capacity(&self, capacity: usize) {
        let mut current = lock(&self.shared.capacity);
        if capacity < current.now {
            let cut = current.now - capacity;
            current.to_retire += cut - self.shared.slots.forget_permits(cut);
        } else {
            let added = capacity - current.now;
            let unretired = added.min(current.to_retire);
            current.to_retire -= unretired;
            self.shared.slots.add_permits(added - unretired);
        }
        current.now = capacity;
    }

    /// What it saw since the last call (or its start), and a fresh count from now.
    pub(crate) fn interval(&self) -> Interval {
        let mut tally = lock(&self.shared.tally);
        let now = Instant::now();
        tally.integrate(now);
        let elapsed = now.duration_since(tally.since).as_secs_f64();
        let interval = Interval {
            max: tally.max,
            mean: tally.area / elapsed,
            latencies: std::mem::take(&mut tally.latencies),
            served: std::mem::take(&mut tally.served),
        };
        tally.since = now;
        tally.area = 0.0;
        tally.max = tally.inside;
        interval
    }
}

impl Drop for Downstream {
    fn drop(&mut self) {
        // Open connections end when their clients (the workers, gone by now) close them.
        self.accepting.abort();
    }
}

impl Shared {
    /// Answers the requests of one connection until the client closes it.
    async fn serve(self: Arc<Self>, mut stream: TcpStream) {
        if stream.set_nodelay(true).is_err() {
            return;
        }
        let mut request = [0];
        while stream.read_exact(&mut request).await.is_ok() {
            let arrived = Instant::now();
            lock(&self.tally).arrive(arrived);
            let slot = match self.slots.try_acquire() {
                Ok(slot) => slot,
                Err(_) if self.behaviour.fail_fast => {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    let answered = stream.write_all(b"!").await;
                    lock(&self.tally).leave(arrived, None);
                    if answered.is_err() {
                        return;
                    }
                    continue;
                }
                Err(_) => self
                    .slots
                    .acquire()
                    .await
                    .expect("the semaphore is never closed"),
            };
            let served = Instant::now();
            let n = self
                .count
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let service = match self.behaviour.bimodal {
                true if n % 10 == 9 => BIMODAL_SLOW,
                true => BIMODAL_FAST,
                false => self.service,
            };
            tokio::time::sleep(service).await;
            let served = served.elapsed();
            self.free(slot);
            let answered = stream.write_all(&request).await;
            lock(&self.tally).leave(arrived, Some(served));
            if answered.is_err() {
                return;
            }
        }
    }

    /// Gives `slot` back, or retires it if the capacity was lowered meanwhile.
    fn free(&self, slot: SemaphorePermit<'_>) {
        let mut capacity = lock(&self.capacity);
        if capacity.to_retire > 0 {
            capacity.to_retire -= 1;
            slot.forget();
        }
    }
}

impl Tally {
    fn integrate(&mut self, now: Instant) {
        self.area += self.inside as f64 * now.duration_since(self.changed).as_secs_f64();
        self.changed = now;
    }

    fn arrive(&mut self, now: Instant) {
        self.integrate(now);
        self.inside += 1;
        self.max = self.max.max(self.inside);
    }

    /// A request leaves: answered after being served for `served`, or refused (`None`: not an
    /// answer, not goodput).
    fn leave(&mut self, arrived: Instant, served: Option<Duration>) {
        let now = Instant::now();
        self.integrate(now);
        self.inside -= 1;
        if let Some(served) = served {
            self.latencies.push(now.duration_since(arrived));
            self.served += served;
        }
    }
}

/// No code panics while holding these locks: a poisoned one still holds sound figures.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
