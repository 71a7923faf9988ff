//! Admission by priority class: each class up to its share of the limit, locally and through a
//! coordinator, and waiters served highest class first.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::*;
use crate::__private::GLOBAL_SCOPE;
use crate::coordinator::Coordinator;
use crate::priority::{Priority, Thresholds, with_priority};

/// The settings of a call site of its own (its budget or lease set shared with no other test).
fn config(
    name: &'static str,
    limit: u32,
    local: bool,
    max_wait: Option<Duration>,
    thresholds: Thresholds,
) -> BulkheadConfig {
    BulkheadConfig {
        name,
        operation: name,
        limit,
        adaptive: None,
        lease: Duration::from_secs(30),
        max_wait,
        keep: None,
        local,
        shadow: false,
        thresholds,
    }
}

fn site(
    name: &'static str,
    limit: u32,
    local: bool,
    max_wait: Option<Duration>,
    thresholds: Thresholds,
) -> &'static BulkheadSite {
    let config = config(name, limit, local, max_wait, thresholds);
    Box::leak(Box::new(BulkheadSite::new(config)))
}

/// A call of `priority` through `site`'s bulkhead, as a task can own it.
fn call(
    site: &'static BulkheadSite,
    priority: Priority,
    body: impl Future<Output = Result<(), Error>>,
) -> impl Future<Output = Result<(), Error>> {
    with_priority(priority, async move {
        bulkhead(site, &CallCtx::new(), &GLOBAL_SCOPE, body).await
    })
}

fn usual() -> Thresholds {
    Thresholds::new(0.8, 0.5).expect("valid")
}

/// Calls that hold their slot until the gate opens, counting themselves once running, and
/// those that run with a lease (a fencing token: not shadowed).
struct Holders {
    site: &'static BulkheadSite,
    coordinator: Option<Coordinator>,
    gate: watch::Sender<bool>,
    admitted: Arc<AtomicUsize>,
    leased: Arc<AtomicUsize>,
    calls: Vec<JoinHandle<Result<(), Error>>>,
}

impl Holders {
    fn new(site: &'static BulkheadSite, coordinator: Option<Coordinator>) -> Self {
        Holders {
            site,
            coordinator,
            gate: watch::channel(false).0,
            admitted: Arc::default(),
            leased: Arc::default(),
            calls: Vec::new(),
        }
    }

    /// Starts a call of `priority` that holds its slot; returns once it is admitted or
    /// refused.
    async fn hold(&mut self, priority: Priority) -> Result<(), Error> {
        let before = self.admitted.load(Ordering::SeqCst);
        let (admitted, mut gate) = (Arc::clone(&self.admitted), self.gate.subscribe());
        let leased = Arc::clone(&self.leased);
        let call = call(self.site, priority, async move {
            admitted.fetch_add(1, Ordering::SeqCst);
            if crate::fencing::fencing_token().is_some() {
                leased.fetch_add(1, Ordering::SeqCst);
            }
            let _ = gate.wait_for(|&open| open).await;
            Ok(())
        });
        let call = match &self.coordinator {
            Some(coordinator) => tokio::spawn(coordinator.scoped(call)),
            None => tokio::spawn(call),
        };
        // Sleeping, not yielding: paused time moves on, so a call that waits in line is
        // refused at its `max_wait` rather than waited for forever.
        while self.admitted.load(Ordering::SeqCst) == before && !call.is_finished() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        if call.is_finished() {
            return call.await.expect("the call");
        }
        self.calls.push(call);
        Ok(())
    }
}

/// `limit = 30, thresholds(normal = 0.8, sheddable = 0.5)`: 15 `Sheddable`, then up to the 24th
/// `Normal`, then up to 30 `Critical`; the next of each class refused as full.
async fn each_class_up_to_its_share(site: &'static BulkheadSite, coordinator: Option<Coordinator>) {
    let mut holders = Holders::new(site, coordinator);
    let refused = |result: Result<(), Error>| matches!(result, Err(Error::BulkheadFull { .. }));
    for _ in 0..15 {
        holders.hold(Priority::Sheddable).await.expect("below 15");
    }
    assert!(refused(holders.hold(Priority::Sheddable).await), "16th");
    for _ in 15..24 {
        holders.hold(Priority::Normal).await.expect("below 24");
    }
    assert!(refused(holders.hold(Priority::Normal).await), "25th");
    for _ in 24..30 {
        holders.hold(Priority::Critical).await.expect("below 30");
    }
    assert!(refused(holders.hold(Priority::Critical).await), "31st");
    assert_eq!(holders.admitted.load(Ordering::SeqCst), 30);
    let _ = holders.gate.send(true);
    for call in holders.calls {
        call.await.expect("holder").expect("admitted");
    }
}

#[tokio::test(start_paused = true)]
async fn a_local_class_is_admitted_only_below_its_share() {
    let site = site("classes-local", 30, true, None, usual());
    each_class_up_to_its_share(site, None).await;
}

#[tokio::test(start_paused = true)]
async fn a_distributed_class_is_admitted_only_below_its_share() {
    let site = site("classes-distributed", 30, false, None, usual());
    each_class_up_to_its_share(site, Some(Coordinator::in_memory())).await;
}

/// Waiters of every class for one local slot: the freed slot goes to the highest class, each
/// class in arrival order.
#[tokio::test(start_paused = true)]
async fn local_waiters_are_served_highest_class_first() {
    let site = site(
        "classes-fifo",
        1,
        true,
        Some(Duration::from_secs(10)),
        Thresholds::NONE,
    );
    let mut holders = Holders::new(site, None);
    holders.hold(Priority::Sheddable).await.expect("the holder");
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let classes = [
        Priority::Sheddable,
        Priority::Normal,
        Priority::Critical,
        Priority::Normal,
    ];
    let mut waiters = Vec::new();
    for (i, priority) in classes.into_iter().enumerate() {
        let order = Arc::clone(&order);
        waiters.push(tokio::spawn(call(site, priority, async move {
            order.lock().expect("order").push(i);
            Ok(())
        })));
        tokio::task::yield_now().await;
    }
    let _ = holders.gate.send(true);
    for waiter in waiters {
        waiter.await.expect("waiter").expect("admitted");
    }
    assert_eq!(*order.lock().expect("order"), [2, 1, 3, 0]);
}

/// `limit = 4, thresholds(normal = 0.75, sheddable = 0.5)`: a `Sheddable` waiter is not handed
/// a slot while 2 are taken, though one is free; a `Normal` newcomer, whose cap is 3, takes it
/// past the waiter.
#[tokio::test(start_paused = true)]
async fn a_local_waiter_is_not_woken_above_its_share() {
    let thresholds = Thresholds::new(0.75, 0.5).expect("valid");
    let site = site(
        "classes-cap",
        4,
        true,
        Some(Duration::from_secs(10)),
        thresholds,
    );
    let mut critical = Vec::new();
    for _ in 0..3 {
        let mut holder = Holders::new(site, None);
        holder.hold(Priority::Critical).await.expect("below 4");
        critical.push(holder);
    }
    let sheddable = Arc::new(AtomicUsize::new(0));
    let waiter = {
        let sheddable = Arc::clone(&sheddable);
        tokio::spawn(call(site, Priority::Sheddable, async move {
            sheddable.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }))
    };
    let settle = || async {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    };
    settle().await;
    let _ = critical.remove(0).gate.send(true);
    settle().await;
    assert_eq!(sheddable.load(Ordering::SeqCst), 0, "2 taken: at its cap");
    let mut normal = Holders::new(site, None);
    normal.hold(Priority::Normal).await.expect("below 3");
    let _ = critical.remove(0).gate.send(true);
    settle().await;
    assert_eq!(sheddable.load(Ordering::SeqCst), 0, "2 taken again");
    let _ = critical.remove(0).gate.send(true);
    waiter
        .await
        .expect("waiter")
        .expect("admitted below its cap");
    assert_eq!(sheddable.load(Ordering::SeqCst), 1);
    let _ = normal.gate.send(true);
}

/// A caller without `max_wait` (or a tower layer's, deciding at once) whose class is above
/// every waiter's takes a free slot under its cap: a `Sheddable` waiter held at its own cap
/// does not turn it away. One of the waiter's class still does not pass it.
#[tokio::test(start_paused = true)]
async fn a_caller_above_every_waiters_class_is_not_turned_away() {
    let thresholds = Thresholds::new(0.75, 0.5).expect("valid");
    // Two sites of one identity: one budget.
    let waits = site(
        "classes-past",
        4,
        true,
        Some(Duration::from_secs(10)),
        thresholds,
    );
    let at_once = site("classes-past", 4, true, None, thresholds);
    let mut critical = Holders::new(waits, None);
    for _ in 0..2 {
        critical.hold(Priority::Critical).await.expect("below 4");
    }
    let waiter = tokio::spawn(call(waits, Priority::Sheddable, async { Ok(()) }));
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(
        !waiter.is_finished(),
        "2 taken: the sheddable waits at its cap"
    );
    let mut above = Holders::new(at_once, None);
    above.hold(Priority::Normal).await.expect("3, its cap");
    above.hold(Priority::Critical).await.expect("4, the limit");
    let mut alike = Holders::new(at_once, None);
    assert!(
        alike.hold(Priority::Critical).await.is_err(),
        "the limit is the limit"
    );
    let _ = above.gate.send(true);
    let _ = critical.gate.send(true);
    waiter
        .await
        .expect("waiter")
        .expect("admitted once the slots are freed");
}

/// Waiters of every class for one distributed slot, in one process: the freed slot goes to the
/// highest class, the lower ones holding back their retries while it waits.
#[tokio::test(start_paused = true)]
async fn distributed_waiters_are_served_highest_class_first() {
    let coordinator = Coordinator::in_memory();
    let site = site(
        "classes-distributed-wait",
        1,
        false,
        Some(Duration::from_secs(10)),
        Thresholds::NONE,
    );
    let mut holders = Holders::new(site, Some(coordinator.clone()));
    holders.hold(Priority::Sheddable).await.expect("the holder");
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for (i, priority) in [Priority::Sheddable, Priority::Normal, Priority::Critical]
        .into_iter()
        .enumerate()
    {
        let order = Arc::clone(&order);
        let call = call(site, priority, async move {
            order.lock().expect("order").push(i);
            Ok(())
        });
        waiters.push(tokio::spawn(coordinator.scoped(call)));
        // Refused once, and waiting.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let _ = holders.gate.send(true);
    for waiter in waiters {
        waiter.await.expect("waiter").expect("admitted");
    }
    assert_eq!(*order.lock().expect("order"), [2, 1, 0]);
}

/// A shadow bulkhead runs a call its class's share refuses, without a lease: `limit = 2,
/// normal = 0.5` leases one `Normal` call; a second one runs unleased, and a `Critical` one
/// still finds the second slot free.
#[tokio::test(start_paused = true)]
async fn a_shadow_bulkhead_runs_a_class_above_its_share_without_a_lease() {
    let thresholds = Thresholds::new(0.5, 0.5).expect("valid");
    let config = BulkheadConfig {
        shadow: true,
        ..config("classes-shadow", 2, false, None, thresholds)
    };
    let site: &'static BulkheadSite = Box::leak(Box::new(BulkheadSite::new(config)));
    let mut holders = Holders::new(site, Some(Coordinator::in_memory()));
    let mut leased = Vec::new();
    for priority in [
        Priority::Normal,
        Priority::Normal,
        Priority::Critical,
        Priority::Critical,
    ] {
        holders
            .hold(priority)
            .await
            .expect("a shadow bulkhead runs");
        leased.push(holders.leased.load(Ordering::SeqCst));
    }
    assert_eq!(leased, [1, 1, 2, 2], "the shadowed ones without a lease");
    let _ = holders.gate.send(true);
}
