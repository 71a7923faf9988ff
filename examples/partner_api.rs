//! A flaky partner API behind all five attributes, and a timeline of what the breaker does.
//!
//! ```text
//! cargo run --example partner_api                                          # in-memory
//! CARACAL_REDIS_URL=redis://127.0.0.1:6379 cargo run --example partner_api # through Redis
//! ```
//!
//! The partner is healthy, then fails most calls, then recovers. The timeline shows the breaker
//! opening, probing (and re-opening while the partner is still down), then closing; each line
//! of counts covers 250 ms of calls from 8 concurrent clients.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use caracal::{bulkhead, circuit_breaker, rate_limit, retry, timeout};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};

#[derive(Debug)]
enum PartnerError {
    Resilience(caracal::Error),
    Unavailable,
}

impl From<caracal::Error> for PartnerError {
    fn from(error: caracal::Error) -> Self {
        PartnerError::Resilience(error)
    }
}

/// The simulated partner: succeeds, or fails `failure_percent` of its calls.
struct Partner {
    failure_percent: AtomicU32,
    calls: AtomicU64,
}

impl Partner {
    async fn get_order(&self, id: u64) -> Result<String, PartnerError> {
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(5)).await;
        if n % 100 < u64::from(self.failure_percent.load(Ordering::Relaxed)) {
            Err(PartnerError::Unavailable)
        } else {
            Ok(format!("order {id}"))
        }
    }
}

#[circuit_breaker(name = "partner-api", scope = format!("region:{region}"), minimum_throughput = 20,
                  failure_threshold = 0.5, window = "2s", open = "700ms", half_open_probes = 2,
                  half_open_successes = 3)]
#[timeout("500ms")]
#[retry(max_attempts = 2, backoff = "20ms")]
#[rate_limit(name = "partner-api", rate = 400, burst = 20, scope = format!("region:{region}"))]
#[bulkhead(name = "partner-api", limit = 6, max_wait = "50ms", scope = format!("region:{region}"))]
async fn get_order(partner: &Partner, region: &str, id: u64) -> Result<String, PartnerError> {
    partner.get_order(id).await
}

static START: OnceLock<Instant> = OnceLock::new();

fn elapsed_ms() -> u128 {
    START.get_or_init(Instant::now).elapsed().as_millis()
}

/// Prints the breaker's transitions and probes as they happen: caracal's `tracing` events.
struct Timeline;

#[derive(Default)]
struct Fields(Vec<(String, String)>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push((
            field.name().to_owned(),
            format!("{value:?}").trim_matches('"').to_owned(),
        ));
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Timeline {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let get = |name: &str| {
            fields
                .0
                .iter()
                .find(|(k, _)| k == name)
                .map_or("", |(_, v)| v.as_str())
        };
        match get("event") {
            "circuit_breaker.state_changed" => println!(
                "{:>6} ms   breaker {} -> {} (generation {}{})",
                elapsed_ms(),
                get("from"),
                get("to"),
                get("generation"),
                match (get("window_failures"), get("window_total")) {
                    ("", _) | (_, "") => String::new(),
                    (failed, total) => format!(", {failed} of {total} calls failed"),
                }
            ),
            "circuit_breaker.probe_started" => println!("{:>6} ms   probe admitted", elapsed_ms()),
            _ => {}
        }
    }
}

#[derive(Default)]
struct Counts {
    ok: AtomicU64,
    partner_failed: AtomicU64,
    circuit_open: AtomicU64,
    other: AtomicU64,
}

#[tokio::main]
async fn main() -> Result<(), caracal::Error> {
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Timeline))
        .expect("one global subscriber");
    let coordinator = caracal::Coordinator::from_env().await?;
    println!("coordinator: {}", coordinator.backend_name());
    caracal::install(coordinator.clone())?;

    let partner = Arc::new(Partner {
        failure_percent: AtomicU32::new(0),
        calls: AtomicU64::new(0),
    });
    let counts = Arc::new(Counts::default());
    let clients: Vec<_> = (0..8)
        .map(|client| {
            let (partner, counts) = (Arc::clone(&partner), Arc::clone(&counts));
            tokio::spawn(async move {
                for id in 0.. {
                    let counter = match get_order(&partner, "eu", id).await {
                        Ok(_) => &counts.ok,
                        Err(PartnerError::Unavailable) => &counts.partner_failed,
                        Err(PartnerError::Resilience(caracal::Error::CircuitOpen { .. })) => {
                            &counts.circuit_open
                        }
                        Err(PartnerError::Resilience(_)) => &counts.other,
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(10 + client)).await;
                }
            })
        })
        .collect();

    let phases = [
        (0, "partner healthy"),
        (90, "partner failing 90% of calls"),
        (0, "partner recovered"),
    ];
    let _ = elapsed_ms();
    for (failure_percent, label) in phases {
        partner
            .failure_percent
            .store(failure_percent, Ordering::Relaxed);
        println!("{:>6} ms   --- {label}", elapsed_ms());
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let take = |c: &AtomicU64| c.swap(0, Ordering::Relaxed);
            println!(
                "{:>6} ms   ok {:>3}  partner errors {:>3}  circuit open {:>3}  other rejections {:>3}",
                elapsed_ms(),
                take(&counts.ok),
                take(&counts.partner_failed),
                take(&counts.circuit_open),
                take(&counts.other),
            );
        }
    }
    for client in clients {
        client.abort();
    }
    coordinator.shutdown().await;
    Ok(())
}
