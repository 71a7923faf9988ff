//! Capture of caracal's `tracing` events (target `caracal`) for assertions.
//!
//! Two ways in:
//! * [`EventLog::capture_thread_default`] — a subscriber for the current thread only, right for
//!   `#[tokio::test]` (current-thread runtime) tests: nothing else lands in that log.
//! * [`EventLog::global`] — one process-wide subscriber, installed on first use, for
//!   multi-thread runtimes and spawned threads. Every test of the binary writes to it, so
//!   filter on something unique to your test (a policy `name`) with
//!   [`EventLog::count_where`] / [`EventLog::wait_for_where`]. A thread with a thread default
//!   set does not report to the global log.
//!
//! Logs keep every event until [`EventLog::clear`]; memory grows with the number of events.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use tracing::field::{Field, Visit};
use tracing::subscriber::{DefaultGuard, Interest};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// The target caracal emits its events under.
pub const TARGET: &str = "caracal";

/// One recorded event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapturedEvent {
    /// Its level.
    pub level: Level,
    /// Every field, formatted: strings as-is, numbers and booleans with `Display`, anything
    /// else with `Debug`; the message, if any, under `message`.
    pub fields: BTreeMap<String, String>,
}

impl CapturedEvent {
    /// The `event` field (e.g. `bulkhead.rejected`).
    pub fn event(&self) -> Option<&str> {
        self.field("event")
    }

    /// Any field by name.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

#[derive(Debug, Default)]
struct Inner {
    events: Mutex<Vec<CapturedEvent>>,
    grew: Condvar,
}

/// A shared, growing list of captured events; clones see the same list.
#[derive(Debug, Clone, Default)]
pub struct EventLog {
    inner: Arc<Inner>,
}

impl EventLog {
    /// An empty log not yet attached to any subscriber (see [`EventLog::layer`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// A new log capturing the `caracal` events of the current thread until the guard drops.
    pub fn capture_thread_default() -> (Self, DefaultGuard) {
        keep_dispatchers_apart();
        let log = Self::new();
        let subscriber = tracing_subscriber::registry().with(log.layer());
        let guard = tracing::subscriber::set_default(subscriber);
        (log, guard)
    }

    /// The process-wide log, installing a global subscriber on first call.
    ///
    /// # Panics
    /// When another global subscriber was installed first.
    pub fn global() -> &'static EventLog {
        static GLOBAL: OnceLock<EventLog> = OnceLock::new();
        GLOBAL.get_or_init(|| {
            let log = Self::new();
            let subscriber = tracing_subscriber::registry().with(log.layer());
            tracing::subscriber::set_global_default(subscriber).unwrap_or_else(|e| {
                panic!("EventLog::global: another global tracing subscriber is installed: {e}")
            });
            log
        })
    }

    /// A `tracing_subscriber` layer recording `caracal` events into this log, to compose
    /// with a subscriber of your own.
    pub fn layer(&self) -> CaptureLayer {
        CaptureLayer { log: self.clone() }
    }

    /// A copy of every event recorded so far, in order.
    pub fn snapshot(&self) -> Vec<CapturedEvent> {
        self.lock().clone()
    }

    /// Number of events recorded so far.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of events whose `event` field is `event`.
    pub fn count(&self, event: &str) -> usize {
        self.count_where(event, |_| true)
    }

    /// Number of events named `event` whose fields satisfy `filter`.
    pub fn count_where(
        &self,
        event: &str,
        filter: impl Fn(&BTreeMap<String, String>) -> bool,
    ) -> usize {
        self.lock()
            .iter()
            .filter(|e| e.event() == Some(event) && filter(&e.fields))
            .count()
    }

    /// The events named `event` whose fields satisfy `filter`, in order.
    pub fn matching(
        &self,
        event: &str,
        filter: impl Fn(&BTreeMap<String, String>) -> bool,
    ) -> Vec<CapturedEvent> {
        self.lock()
            .iter()
            .filter(|e| e.event() == Some(event) && filter(&e.fields))
            .cloned()
            .collect()
    }

    /// Forgets every event recorded so far.
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// Waits until an event named `event` has been recorded and returns the first one.
    ///
    /// # Panics
    /// After `timeout`, listing the event names seen.
    pub fn wait_for(&self, event: &str, timeout: Duration) -> CapturedEvent {
        self.wait_for_where(event, timeout, |_| true)
    }

    /// Waits until an event named `event` whose fields satisfy `filter` has been recorded
    /// and returns the first one.
    ///
    /// # Panics
    /// After `timeout`, listing the event names seen.
    pub fn wait_for_where(
        &self,
        event: &str,
        timeout: Duration,
        filter: impl Fn(&BTreeMap<String, String>) -> bool,
    ) -> CapturedEvent {
        let deadline = Instant::now() + timeout;
        let mut events = self.lock();
        loop {
            if let Some(found) = events
                .iter()
                .find(|e| e.event() == Some(event) && filter(&e.fields))
            {
                return found.clone();
            }
            let now = Instant::now();
            if now >= deadline {
                let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
                for e in events.iter() {
                    *seen
                        .entry(e.event().unwrap_or("<no event field>"))
                        .or_default() += 1;
                }
                panic!(
                    "no matching `{event}` event within {timeout:?}; {} events recorded, by name: {seen:?}",
                    events.len()
                );
            }
            events = self
                .inner
                .grew
                .wait_timeout(events, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<CapturedEvent>> {
        self.inner.events.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, event: CapturedEvent) {
        self.lock().push(event);
        self.inner.grew.notify_all();
    }
}

/// Keeps a second dispatcher registered for the life of the process.
///
/// While only one dispatcher is alive, tracing-core takes a shortcut: a callsite hit for the
/// first time asks only the *hitting thread's* default dispatcher whether it is interested,
/// and caches the answer for every thread. A test on another thread hitting a caracal
/// callsite first, with no subscriber of its own, would make the callsite "never" interesting
/// for the capture of this thread too (until the next dispatcher is registered anywhere): its
/// events would be lost. With two dispatchers registered, every one is asked.
fn keep_dispatchers_apart() {
    static SECOND: OnceLock<tracing::Dispatch> = OnceLock::new();
    SECOND.get_or_init(|| tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default()));
}

/// The layer behind [`EventLog`]: records events with target `caracal`, ignores the rest.
#[derive(Debug, Clone)]
pub struct CaptureLayer {
    log: EventLog,
}

impl<S: Subscriber> Layer<S> for CaptureLayer {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        if metadata.target() == TARGET {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, metadata: &Metadata<'_>, _: Context<'_, S>) -> bool {
        metadata.target() == TARGET
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        if event.metadata().target() != TARGET {
            return;
        }
        let mut visitor = FieldVisitor::default();
        event.record(&mut visitor);
        self.log.push(CapturedEvent {
            level: *event.metadata().level(),
            fields: visitor.0,
        });
    }
}

#[derive(Default)]
struct FieldVisitor(BTreeMap<String, String>);

impl Visit for FieldVisitor {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_owned(), value.to_string());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), value.to_string());
    }

    fn record_i128(&mut self, field: &Field, value: i128) {
        self.0.insert(field.name().to_owned(), value.to_string());
    }

    fn record_u128(&mut self, field: &Field, value: u128) {
        self.0.insert(field.name().to_owned(), value.to_string());
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().to_owned(), value.to_string());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_owned(), value.to_string());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}
