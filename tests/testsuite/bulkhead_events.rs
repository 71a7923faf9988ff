//! The bulkhead's `tracing` events: stable names, the fields that explain each decision.

use std::time::Duration;

use crate::common::{TestError, code};
use caracal::{Coordinator, bulkhead};
use caracal_tests::EventLog;

#[bulkhead(name = "events", limit = 1, lease = "300ms", scope = "tenant-1")]
async fn guarded(gate: Option<tokio::sync::oneshot::Receiver<()>>) -> Result<(), TestError> {
    if let Some(gate) = gate {
        let _ = gate.await;
    }
    Ok(())
}

#[bulkhead(name = "events-lost", limit = 1, lease = "300ms")]
async fn outlives_its_lease(coordinator: Coordinator) -> Result<(), TestError> {
    coordinator.shutdown().await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    Ok(())
}

fn assert_identity(event: &caracal_tests::CapturedEvent, name: &str, scope: &str) {
    assert_eq!(event.field("policy"), Some("bulkhead"), "{event:?}");
    assert_eq!(event.field("name"), Some(name), "{event:?}");
    assert_eq!(event.field("operation"), Some(name), "{event:?}");
    assert_eq!(event.field("scope"), Some(scope), "{event:?}");
    assert_eq!(
        event.field("coordination"),
        Some("distributed"),
        "{event:?}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn admitted_rejected_released() {
    let (log, _guard) = EventLog::capture_thread_default();
    let coordinator = Coordinator::in_memory();
    let (open, gate) = tokio::sync::oneshot::channel();
    let holder = coordinator.scoped(guarded(Some(gate)));
    let second = async {
        tokio::task::yield_now().await;
        let result = coordinator.scoped(guarded(None)).await;
        let _ = open.send(());
        result
    };
    let (held, rejected) = tokio::join!(holder, second);
    assert_eq!((code(&held), code(&rejected)), ("ok", "bulkhead_full"));

    let admitted = log.wait_for("bulkhead.admitted", Duration::from_secs(1));
    assert_identity(&admitted, "events", "tenant-1");
    assert_eq!(
        (admitted.field("occupancy"), admitted.field("limit")),
        (Some("1"), Some("1"))
    );
    let rejected = log.wait_for("bulkhead.rejected", Duration::from_secs(1));
    assert_identity(&rejected, "events", "tenant-1");
    assert_eq!(
        rejected.level,
        tracing::Level::DEBUG,
        "per call: an outage must not flood the logs"
    );
    assert_eq!(rejected.field("reason"), Some("capacity"));
    assert_eq!(rejected.field("occupancy"), Some("1"));
    let released = log.wait_for("bulkhead.released", Duration::from_secs(1));
    assert_identity(&released, "events", "tenant-1");
    assert!(released.field("held_ms").is_some(), "{released:?}");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn lease_lost_and_degraded() {
    let (log, _guard) = EventLog::capture_thread_default();
    let coordinator = Coordinator::in_memory();
    let result = coordinator
        .scoped(outlives_its_lease(coordinator.clone()))
        .await;
    assert_eq!(code(&result), "lease_lost");
    let lost = log.wait_for("bulkhead.lease_lost", Duration::from_secs(1));
    assert_identity(&lost, "events-lost", "global");
    assert!(lost.field("cause").is_some(), "{lost:?}");
    let uncertain = log.wait_for_where("bulkhead.degraded", Duration::from_secs(1), |f| {
        f.get("reason").map(String::as_str) == Some("lease_uncertain")
    });
    assert_eq!(uncertain.field("error"), Some("coordinator_unavailable"));

    // The coordinator is shut down: the next admission cannot be decided, so it fails closed.
    log.clear();
    let refused = coordinator.scoped(guarded(None)).await;
    assert_eq!(code(&refused), "coordinator_unavailable");
    let names: Vec<_> = log
        .snapshot()
        .iter()
        .filter_map(|e| e.event().map(str::to_owned))
        .collect();
    assert_eq!(
        names,
        ["bulkhead.degraded", "bulkhead.rejected"],
        "{:?}",
        log.snapshot()
    );
    let degraded = log.wait_for("bulkhead.degraded", Duration::from_secs(1));
    assert_eq!(degraded.field("reason"), Some("admission_unknown"));
    let rejected = log.wait_for("bulkhead.rejected", Duration::from_secs(1));
    assert_eq!(rejected.field("reason"), Some("coordinator_unavailable"));
}
