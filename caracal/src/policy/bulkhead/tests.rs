//! Policy-level checks that need paused time or internals; the behaviour shared by every
//! backend is exercised against memory, Redis and a cluster in the `caracal-tests` suites.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::*;
use crate::__private::{GLOBAL_SCOPE, static_scope};
use crate::coordinator::Coordinator;
use crate::priority::Priority;

const LEASE: Duration = Duration::from_secs(3);

static DISTRIBUTED: BulkheadSite = BulkheadSite::new(BulkheadConfig {
    name: "unit",
    operation: "unit",
    limit: 1,
    adaptive: None,
    lease: LEASE,
    max_wait: None,
    keep: None,
    local: false,
    shadow: false,
    thresholds: Thresholds::NONE,
});

static WAITING: BulkheadSite = BulkheadSite::new(BulkheadConfig {
    name: "unit-wait",
    operation: "unit-wait",
    limit: 1,
    adaptive: None,
    lease: LEASE,
    max_wait: Some(Duration::from_secs(10)),
    keep: None,
    local: false,
    shadow: false,
    thresholds: Thresholds::NONE,
});

static LOCAL_FIFO: BulkheadSite = BulkheadSite::new(BulkheadConfig {
    name: "unit-fifo",
    operation: "unit-fifo",
    limit: 1,
    adaptive: None,
    lease: LEASE,
    max_wait: Some(Duration::from_secs(10)),
    keep: None,
    local: true,
    shadow: false,
    thresholds: Thresholds::NONE,
});

const ADAPTIVE_CONFIG: BulkheadConfig = BulkheadConfig {
    name: "unit-adaptive",
    operation: "unit-adaptive",
    limit: 20,
    adaptive: Some(AdaptiveLimit::new(2, 20, 40)),
    lease: LEASE,
    max_wait: None,
    keep: None,
    local: false,
    shadow: false,
    thresholds: Thresholds::NONE,
};

static ADAPTIVE: BulkheadSite = BulkheadSite::new(ADAPTIVE_CONFIG);

/// An adaptive limit fixed at 2, whose refused calls wait.
static ADAPTIVE_WAITING: BulkheadSite = BulkheadSite::new(BulkheadConfig {
    name: "unit-adaptive-wait",
    operation: "unit-adaptive-wait",
    limit: 2,
    adaptive: Some(AdaptiveLimit::new(2, 2, 2)),
    max_wait: Some(Duration::from_secs(10)),
    ..ADAPTIVE_CONFIG
});

async fn guarded<F, T>(site: &'static BulkheadSite, body: F) -> Result<T, Error>
where
    F: Future<Output = Result<T, Error>>,
{
    bulkhead(site, &CallCtx::new(), &GLOBAL_SCOPE, body).await
}

/// Drops to `true` when the body's future is dropped.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test(start_paused = true)]
async fn renewals_keep_a_long_body_admitted() {
    let coordinator = Coordinator::in_memory();
    coordinator
        .scoped(async {
            let long = guarded(&DISTRIBUTED, async {
                tokio::time::sleep(LEASE * 5).await;
                Ok(())
            });
            let result = long.await;
            assert!(result.is_ok(), "{result:?}");
        })
        .await;
}

#[tokio::test(start_paused = true)]
async fn a_lease_that_cannot_be_renewed_cancels_the_body() {
    let coordinator = Coordinator::in_memory();
    let dropped = Arc::new(AtomicBool::new(false));
    let flag = DropFlag(Arc::clone(&dropped));
    let started = tokio::time::Instant::now();
    let result = coordinator
        .scoped(async {
            guarded(&DISTRIBUTED, async {
                let _flag = flag;
                // Renewals start failing from here on; the body would outlive the lease.
                coordinator.shutdown().await;
                tokio::time::sleep(LEASE * 10).await;
                Ok(())
            })
            .await
        })
        .await;
    assert!(matches!(result, Err(Error::LeaseLost { .. })), "{result:?}");
    assert!(dropped.load(Ordering::SeqCst), "the body was dropped");
    // Lost at the trust deadline (renewals were retried until then), not at the first
    // failure, and before the server could expire the lease. (Paused time: exact.)
    assert_eq!(started.elapsed(), LEASE - distributed::safety_margin(LEASE));
}

/// A process frozen past its lease (SIGSTOP, a starved runtime) resumes: the body must not take
/// another step, though every timer it waits for has fired.
#[tokio::test(start_paused = true)]
async fn a_holder_resumed_past_its_lease_never_takes_another_step() {
    let coordinator = Coordinator::in_memory();
    let stepped = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stepped);
    let mut call = Box::pin(coordinator.scoped(guarded(&DISTRIBUTED, async move {
        tokio::time::sleep(Duration::from_millis(10)).await;
        flag.store(true, Ordering::SeqCst);
        Ok(())
    })));
    assert!(
        futures_util::poll!(call.as_mut()).is_pending(),
        "admitted, body waiting"
    );
    // Frozen: the clock moves past the lease while nothing is polled.
    tokio::time::advance(LEASE * 2).await;
    let result = call.await;
    assert!(matches!(result, Err(Error::LeaseLost { .. })), "{result:?}");
    assert!(
        !stepped.load(Ordering::SeqCst),
        "the body took a step after the stall"
    );
}

#[tokio::test(start_paused = true)]
async fn the_body_sees_the_fencing_token_of_its_lease() {
    let coordinator = Coordinator::in_memory();
    coordinator
        .scoped(async {
            assert_eq!(crate::fencing_token(), None);
            let first = guarded(&DISTRIBUTED, async { Ok(crate::fencing_token()) }).await;
            let local_inside = guarded(&DISTRIBUTED, async {
                guarded(&LOCAL_FIFO, async { Ok(crate::fencing_token()) }).await
            })
            .await;
            let second = guarded(&DISTRIBUTED, async { Ok(crate::fencing_token()) }).await;
            let (first, second) = (first.expect("first"), second.expect("second"));
            assert!(
                first.is_some() && second > first,
                "{first:?} then {second:?}"
            );
            assert_eq!(
                local_inside.expect("nested"),
                None,
                "a local bulkhead has none"
            );
        })
        .await;
}

#[tokio::test(start_paused = true)]
async fn a_waiter_is_admitted_as_soon_as_the_holder_releases() {
    let coordinator = Coordinator::in_memory();
    coordinator
        .scoped(async {
            let (release, released) = tokio::sync::oneshot::channel::<()>();
            let holder = guarded(&WAITING, async {
                let _ = released.await;
                Ok(tokio::time::Instant::now())
            });
            let waiter = async {
                tokio::task::yield_now().await;
                guarded(&WAITING, async { Ok(tokio::time::Instant::now()) }).await
            };
            // Released once the waiter has backed off to its longest pause.
            let releaser = async {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let _ = release.send(());
            };
            let (held_until, admitted_at, ()) = tokio::join!(holder, waiter, releaser);
            let (held_until, admitted_at) =
                (held_until.expect("holder"), admitted_at.expect("waiter"));
            assert!(admitted_at >= held_until);
            assert!(admitted_at - held_until < Duration::from_millis(5));
        })
        .await;
}

#[tokio::test(start_paused = true)]
async fn local_waiters_are_served_in_arrival_order() {
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let holder = tokio::spawn(guarded(&LOCAL_FIFO, async {
        let _ = released.await;
        Ok(())
    }));
    tokio::task::yield_now().await;
    let mut waiters = Vec::new();
    for i in 0..3 {
        let order = Arc::clone(&order);
        waiters.push(tokio::spawn(guarded(&LOCAL_FIFO, async move {
            order.lock().expect("order").push(i);
            Ok(())
        })));
        tokio::task::yield_now().await;
    }
    let _ = release.send(());
    holder.await.expect("holder").expect("admitted");
    for waiter in waiters {
        waiter.await.expect("waiter").expect("admitted");
    }
    assert_eq!(*order.lock().expect("order"), [0, 1, 2]);
}

#[tokio::test]
async fn without_a_coordinator_a_distributed_bulkhead_refuses() {
    let result = guarded(&DISTRIBUTED, async { Ok(()) }).await;
    assert!(matches!(result, Err(Error::NotInstalled)), "{result:?}");
}

#[tokio::test]
async fn a_rejection_names_the_policy_and_scope() {
    let coordinator = Coordinator::in_memory();
    coordinator
        .scoped(async {
            let (release, released) = tokio::sync::oneshot::channel::<()>();
            let scope = static_scope("tenant-7");
            let ctx = CallCtx::new();
            let holder = bulkhead(&DISTRIBUTED, &ctx, &scope, async {
                let _ = released.await;
                Ok::<_, Error>(())
            });
            let rejected = async {
                tokio::task::yield_now().await;
                let result =
                    bulkhead(&DISTRIBUTED, &CallCtx::new(), &scope, async { Ok(()) }).await;
                let _ = release.send(());
                result
            };
            let (held, rejected) = tokio::join!(holder, rejected);
            assert!(held.is_ok());
            match rejected {
                Err(Error::BulkheadFull {
                    policy,
                    scope,
                    limit,
                }) => {
                    assert_eq!((policy, scope.as_str(), limit), ("unit", "tenant-7", 1));
                }
                other => panic!("expected BulkheadFull, got {other:?}"),
            }
        })
        .await;
}

const fn reloaded(name: &'static str, local: bool) -> BulkheadSite {
    BulkheadSite::new(BulkheadConfig {
        name,
        operation: name,
        limit: 2,
        adaptive: None,
        lease: LEASE,
        max_wait: None,
        keep: None,
        local,
        shadow: false,
        thresholds: Thresholds::NONE,
    })
}

static RELOADED_LOCAL: BulkheadSite = reloaded("unit-reload-local", true);
static RELOADED_SHARED: BulkheadSite = reloaded("unit-reload-shared", false);

/// A reload lowers a running limit: calls already admitted run on, new ones see the new limit
/// as the running ones end; clearing the configuration restores the attribute's.
async fn a_reload_changes_a_running_limit(site: &'static BulkheadSite, coordinator: Coordinator) {
    let name = site.config.name;
    let gates: Vec<_> = (0..2)
        .map(|_| Arc::new(tokio::sync::Semaphore::new(0)))
        .collect();
    let held: Vec<_> = gates
        .iter()
        .map(|gate| {
            let gate = Arc::clone(gate);
            tokio::spawn(coordinator.scoped(guarded(site, async move {
                gate.acquire().await.map(|permit| permit.forget()).ok();
                Ok(())
            })))
        })
        .collect();
    let quick = || coordinator.scoped(guarded(site, async { Ok(()) }));
    let full = |result: &Result<(), Error>| matches!(result, Err(Error::BulkheadFull { .. }));
    // Both admitted (limit 2).
    for _ in 0..100 {
        if full(&quick().await) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(full(&quick().await), "two held at limit 2");
    let config = crate::Config::from_toml_str(&format!("[bulkhead.{name}]\nlimit = 1")).unwrap();
    coordinator.set_config(config);
    let mut held = held.into_iter();
    gates[0].add_permits(1);
    let first = held.next().expect("two held");
    assert!(
        first.await.unwrap().is_ok(),
        "a running call is not disturbed"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    match quick().await {
        Err(Error::BulkheadFull { limit, .. }) => assert_eq!(limit, 1, "the new limit"),
        other => panic!("one still runs at the new limit of 1: {other:?}"),
    }
    gates[1].add_permits(1);
    let second = held.next().expect("two held");
    assert!(
        second.await.unwrap().is_ok(),
        "a running call is not disturbed"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(quick().await.is_ok(), "none running: one may run");
    coordinator.set_config(crate::Config::default());
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let again: Vec<_> = (0..2)
        .map(|_| {
            let gate = Arc::clone(&gate);
            tokio::spawn(coordinator.scoped(guarded(site, async move {
                gate.acquire().await.map(|permit| permit.forget()).ok();
                Ok(())
            })))
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(full(&quick().await), "back to the attribute's limit of 2");
    gate.add_permits(2);
    for call in again {
        assert!(call.await.unwrap().is_ok(), "both admitted under limit 2");
    }
}

#[tokio::test(start_paused = true)]
async fn a_reload_changes_a_running_local_limit() {
    a_reload_changes_a_running_limit(&RELOADED_LOCAL, Coordinator::in_memory()).await;
}

#[tokio::test(start_paused = true)]
async fn a_reload_changes_a_running_distributed_limit() {
    a_reload_changes_a_running_limit(&RELOADED_SHARED, Coordinator::in_memory()).await;
}

static CONTENDED: BulkheadSite = BulkheadSite::new(BulkheadConfig {
    name: "unit-contended",
    operation: "unit-contended",
    limit: 3,
    adaptive: None,
    lease: LEASE,
    max_wait: Some(Duration::from_millis(2)),
    keep: None,
    local: true,
    shadow: false,
    thresholds: Thresholds::NONE,
});

/// Counts a body as running until it ends or is dropped.
struct Running<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The local budget's lock-free path and its queue under real threads: callers that take a
/// slot at once, wait in line, time out in line, or give up while in line or running. No
/// more than `limit` bodies ever run at once, and no slot is lost: afterwards, `limit`
/// holders fit at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contended_local_slots_never_exceed_the_limit_and_none_are_lost() {
    use std::sync::atomic::AtomicUsize;
    static RUNNING: AtomicUsize = AtomicUsize::new(0);
    static MOST: AtomicUsize = AtomicUsize::new(0);
    let callers: Vec<_> = (0..32usize)
        .map(|caller| {
            tokio::spawn(async move {
                for call in 0..1000usize {
                    let body = async move {
                        let now = RUNNING.fetch_add(1, Ordering::SeqCst) + 1;
                        let _running = Running(&RUNNING);
                        MOST.fetch_max(now, Ordering::SeqCst);
                        if (caller + call) % 3 == 0 {
                            tokio::task::yield_now().await;
                        }
                        Ok(())
                    };
                    let attempt = guarded(&CONTENDED, body);
                    if (caller + call) % 5 == 0 {
                        let _ = tokio::time::timeout(Duration::from_micros(50), attempt).await;
                    } else {
                        let _ = attempt.await;
                    }
                }
            })
        })
        .collect();
    for caller in callers {
        caller.await.expect("caller");
    }
    assert!(
        MOST.load(Ordering::SeqCst) <= 3,
        "{} ran at once",
        MOST.load(Ordering::SeqCst)
    );
    assert_eq!(RUNNING.load(Ordering::SeqCst), 0);

    static HOLDING: AtomicUsize = AtomicUsize::new(0);
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let holders: Vec<_> = (0..3)
        .map(|_| {
            let gate = Arc::clone(&gate);
            tokio::spawn(async move {
                // Patient: the holders may reach the budget together, and only its line
                // decides who goes first.
                for _ in 0..1000 {
                    let gate = Arc::clone(&gate);
                    let held = guarded(&CONTENDED, async move {
                        HOLDING.fetch_add(1, Ordering::SeqCst);
                        gate.acquire().await.map(|permit| permit.forget()).ok();
                        Ok(())
                    })
                    .await;
                    if held.is_ok() {
                        return true;
                    }
                }
                false
            })
        })
        .collect();
    for _ in 0..10_000 {
        if HOLDING.load(Ordering::SeqCst) == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(HOLDING.load(Ordering::SeqCst), 3, "a slot was lost");
    assert!(
        matches!(
            guarded(&CONTENDED, async { Ok(()) }).await,
            Err(Error::BulkheadFull { .. })
        ),
        "a fourth call fits beside three holders"
    );
    gate.add_permits(3);
    for holder in holders {
        assert!(holder.await.expect("holder"), "a holder was never admitted");
    }
}

static PER_USER: BulkheadSite = BulkheadSite::new(BulkheadConfig {
    name: "unit-per-user",
    operation: "unit-per-user",
    limit: 1,
    adaptive: None,
    lease: LEASE,
    max_wait: None,
    keep: None,
    local: false,
    shadow: false,
    thresholds: Thresholds::NONE,
});

/// A scope per user on the in-memory coordinator: once the users stop calling, their lease
/// sets, fencing counters and registry entries go as their keys would expire in Redis, though
/// no command comes to sweep them.
#[tokio::test(start_paused = true)]
async fn an_in_memory_coordinator_lets_idle_identities_expire() {
    const USERS: usize = 200;
    let coordinator = Coordinator::in_memory();
    let call_as = |n: usize| {
        coordinator.scoped(async move {
            let scope = Scope::new(format!("user-{n}"));
            bulkhead(&PER_USER, &CallCtx::new(), &scope, async {
                Ok::<(), Error>(())
            })
            .await
        })
    };
    for n in 0..USERS {
        call_as(n).await.expect("admitted");
    }
    tokio::time::sleep(crate::coordinator::registry::REPORT_EVERY * 2).await;
    assert!(
        coordinator.held_in_memory() >= USERS,
        "every user held: {}",
        coordinator.held_in_memory()
    );
    // One user goes on calling, far fewer times than would sweep on their own.
    let started = tokio::time::Instant::now();
    while started.elapsed()
        < crate::FORGET_IDLE_AFTER + 3 * crate::coordinator::registry::REPORT_EVERY
    {
        call_as(0).await.expect("admitted");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(
        coordinator.held_in_memory() <= 3,
        "only the user still calling is held: {}",
        coordinator.held_in_memory()
    );
}

/// The in-memory backend keeps lease sets by the rules Redis keeps their keys by.
mod in_memory {
    use uuid::Uuid;

    use super::*;
    use crate::error::FailureKind;
    use crate::identity::{Identity, PolicyKind};
    use crate::policy::bulkhead::kernel::{Lease, LeaseAction, LeaseReply, LeaseStep, Release};

    fn identity(coordinator: &Coordinator) -> Identity {
        coordinator.identity(PolicyKind::Bulkhead, "p", "op", &Scope::GLOBAL)
    }

    async fn acquire(
        coordinator: &Coordinator,
        identity: &Identity,
        token: Uuid,
    ) -> Result<LeaseReply, Error> {
        let step = LeaseStep {
            action: LeaseAction::Acquire,
            token: token.as_u128(),
            ttl: 1000,
            limit: 2,
            known: 0,
            share: crate::priority::WHOLE,
        };
        coordinator
            .run::<Lease>(identity, step)
            .await
            .map(|reply| reply.expect("not refused"))
    }

    async fn release(coordinator: &Coordinator, identity: &Identity, token: Uuid) -> bool {
        let (done, answer) = tokio::sync::oneshot::channel();
        let until = tokio::time::Instant::now() + Duration::from_secs(1);
        coordinator.send_until::<Release>(identity, &token.as_u128(), until, move |released| {
            let _unheard = done.send(released);
        });
        answer.await.expect("answered").expect("released")
    }

    #[tokio::test(start_paused = true)]
    async fn an_expired_lease_set_is_gone() {
        let coordinator = Coordinator::in_memory();
        let identity = identity(&coordinator);
        acquire(&coordinator, &identity, Uuid::new_v4())
            .await
            .expect("acquire");
        tokio::time::advance(Duration::from_secs(2)).await;
        // Not full, so nothing would prune the expired lease; but Redis would have expired the
        // key, and the reply counts nothing left over.
        let reply = acquire(&coordinator, &identity, Uuid::new_v4())
            .await
            .expect("acquire");
        assert_eq!((reply.allowed, reply.occupancy), (true, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn an_emptied_lease_set_keeps_its_fencing_counter_until_it_expires() {
        let coordinator = Coordinator::in_memory();
        let identity = identity(&coordinator);
        let token = Uuid::new_v4();
        let first = acquire(&coordinator, &identity, token)
            .await
            .expect("acquire")
            .fence;
        assert!(release(&coordinator, &identity, token).await);
        let second = acquire(&coordinator, &identity, Uuid::new_v4())
            .await
            .expect("acquire")
            .fence;
        assert!(
            second > first,
            "{second} after {first} in the same millisecond"
        );
        // The counter outlives the last lease by one ttl.
        tokio::time::advance(Duration::from_secs(3)).await;
        release(&coordinator, &identity, Uuid::new_v4()).await;
        assert_eq!(coordinator.held_in_memory(), 0, "forgotten once expired");
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_backend_refuses_commands() {
        let coordinator = Coordinator::in_memory();
        coordinator.shutdown().await;
        let err = acquire(&coordinator, &identity(&coordinator), Uuid::new_v4())
            .await
            .expect_err("closed");
        assert_eq!(err.failure_kind(), Some(FailureKind::ShutDown));
    }
}

static SHARED_OUT: BulkheadSite = BulkheadSite::new(BulkheadConfig {
    name: "unit-thresholds",
    operation: "unit-thresholds",
    limit: 30,
    adaptive: None,
    lease: LEASE,
    max_wait: None,
    keep: None,
    local: true,
    shadow: false,
    thresholds: Thresholds::from_thousandths(800, 500),
});

/// A configured share replaces the attribute's alone; both lowered apply together (`normal`
/// first, below the attribute's `sheddable`, must not get the pair refused); a `sheddable`
/// above `normal` has `normal`'s share.
#[tokio::test]
async fn configured_thresholds_apply_and_sheddable_never_gets_more_than_normal() {
    let coordinator = Coordinator::in_memory();
    let configure = |text: &str| {
        coordinator.set_config(crate::config::Config::from_toml_str(text).expect("valid"));
    };
    configure("[bulkhead.unit-thresholds]\nthresholds.normal = 0.6");
    let resolved = SHARED_OUT.resolve(Some(&coordinator));
    assert_eq!(
        resolved.values.thresholds,
        Thresholds::new(0.6, 0.5).expect("valid")
    );
    assert!(
        resolved
            .values_text()
            .ends_with("thresholds.normal=0.6 thresholds.sheddable=0.5")
    );
    configure("[bulkhead.unit-thresholds]\nthresholds.normal = 0.4\nthresholds.sheddable = 0.3");
    let resolved = SHARED_OUT.resolve(Some(&coordinator));
    assert_eq!(
        resolved.values.thresholds,
        Thresholds::new(0.4, 0.3).expect("valid")
    );
    assert!(resolved.ignored.is_empty(), "{:?}", resolved.ignored);
    configure("[bulkhead.unit-thresholds]\nthresholds.sheddable = 0.9");
    let resolved = SHARED_OUT.resolve(Some(&coordinator));
    assert_eq!(resolved.values.thresholds.cap(Priority::Sheddable, 30), 24);
    assert!(resolved.ignored.is_empty(), "{:?}", resolved.ignored);
}

/// `keep`: a finished body's lease stays in the lease set, serves the next call here without
/// an acquire, and goes back to the fleet when `keep` passes, when the fleet is full, or once a
/// body read its token. Probes acquire straight from the lease kernel, as another process
/// would, to see the set.
mod kept {
    use uuid::Uuid;

    use super::*;
    use crate::identity::{Identity, PolicyKind};
    use crate::policy::bulkhead::kernel::{Lease, LeaseAction, LeaseReply, LeaseStep};

    const KEEP: Duration = Duration::from_secs(1);

    static KEEPING: BulkheadSite = BulkheadSite::new(BulkheadConfig {
        name: "unit-keep",
        operation: "unit-keep",
        limit: 2,
        adaptive: None,
        lease: LEASE,
        max_wait: None,
        keep: Some(KEEP),
        local: false,
        shadow: false,
        thresholds: Thresholds::NONE,
    });

    fn identity(coordinator: &Coordinator) -> Identity {
        coordinator.identity(
            PolicyKind::Bulkhead,
            "unit-keep",
            "unit-keep",
            &Scope::GLOBAL,
        )
    }

    /// Another process's acquire of `token`.
    async fn probe(coordinator: &Coordinator, token: Uuid) -> LeaseReply {
        let step = LeaseStep {
            action: LeaseAction::Acquire,
            token: token.as_u128(),
            ttl: 60_000,
            limit: 2,
            known: 0,
            share: crate::priority::WHOLE,
        };
        let identity = identity(coordinator);
        let reply = coordinator.run::<Lease>(&identity, step).await;
        reply.expect("answered").expect("not refused")
    }

    async fn quiet() -> Result<(), Error> {
        Ok(())
    }

    async fn reads_its_token() -> Result<u64, Error> {
        Ok(crate::fencing_token().expect("inside the bulkhead"))
    }

    #[tokio::test(start_paused = true)]
    async fn a_kept_lease_serves_the_next_call_without_an_acquire() {
        let coordinator = Coordinator::in_memory();
        coordinator
            .scoped(async {
                guarded(&KEEPING, quiet()).await.expect("admitted");
                let first = probe(&coordinator, Uuid::new_v4()).await;
                assert_eq!(first.occupancy, 2, "the kept lease is in the set");
                // Granted before the probe's: the call took no lease of its own.
                let token = guarded(&KEEPING, reads_its_token()).await.expect("reused");
                assert!(token < first.fence, "{token} {}", first.fence);
                // Its token was read: released, not kept, so another process finds room.
                let second = probe(&coordinator, Uuid::new_v4()).await;
                assert!(second.allowed, "the read lease was released");
            })
            .await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_kept_lease_goes_back_to_the_fleet_after_keep() {
        let coordinator = Coordinator::in_memory();
        coordinator
            .scoped(async {
                guarded(&KEEPING, quiet()).await.expect("admitted");
                tokio::time::sleep(KEEP + Duration::from_millis(1)).await;
                let probe = probe(&coordinator, Uuid::new_v4()).await;
                assert_eq!(probe.occupancy, 1, "returned once `keep` passed");
            })
            .await;
    }

    /// The occupancy another process's acquire finds on a fresh coordinator that heard of
    /// another process's refusal, where a call of `KEEPING` ended just before it was heard
    /// (`before`) and one ended `after` it (`None`: none).
    async fn occupancy_after_a_refusal(before: bool, after: Option<Duration>) -> u32 {
        use crate::coordinator::feed::{Heard, Origin};
        use crate::policy::bulkhead::distributed::contention::on_feed;

        let coordinator = Coordinator::in_memory();
        let refusal = Heard {
            own: false,
            origin: Origin::Call,
            key: identity(&coordinator).key,
            payload: "lease-refused",
        };
        coordinator
            .scoped(async {
                if before {
                    guarded(&KEEPING, quiet()).await.expect("admitted");
                }
                assert!(
                    !on_feed(&coordinator, &refusal),
                    "a refusal is no change an operator sees"
                );
                if let Some(after) = after {
                    tokio::time::sleep(after).await;
                    guarded(&KEEPING, quiet()).await.expect("admitted");
                }
                probe(&coordinator, Uuid::new_v4()).await.occupancy
            })
            .await
    }

    /// Another process refused a lease of the identity (the message its refusal publishes on
    /// the feed): the kept lease goes back at once, a body that ends within
    /// `CONTENDED` after leaves its lease to the fleet too, and one
    /// that ends later is kept again.
    #[tokio::test(start_paused = true)]
    async fn another_process_s_refusal_returns_kept_leases_and_stops_keeping_a_while() {
        use crate::policy::bulkhead::keep::CONTENDED;

        let ms = Duration::from_millis;
        assert_eq!(
            occupancy_after_a_refusal(true, None).await,
            1,
            "the kept lease went back at once"
        );
        assert_eq!(
            occupancy_after_a_refusal(false, Some(CONTENDED - ms(1))).await,
            1,
            "not kept right after a refusal"
        );
        assert_eq!(
            occupancy_after_a_refusal(false, Some(CONTENDED + ms(1))).await,
            2,
            "kept again once the refusal is past"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_granted_in_a_full_fleet_is_not_kept() {
        let coordinator = Coordinator::in_memory();
        coordinator
            .scoped(async {
                probe(&coordinator, Uuid::new_v4()).await;
                guarded(&KEEPING, quiet())
                    .await
                    .expect("admitted, filling the fleet");
                let probe = probe(&coordinator, Uuid::new_v4()).await;
                assert!(probe.allowed, "released at once: another process needs it");
            })
            .await;
    }

    /// A kept lease serves a new body only under the limit it was granted under: after the
    /// limit changes, the next call takes a fresh lease (a token above the probe's).
    #[tokio::test(start_paused = true)]
    async fn a_lease_kept_under_another_limit_is_not_reused() {
        let coordinator = Coordinator::in_memory();
        let configure = |text: &str| {
            coordinator.set_config(crate::config::Config::from_toml_str(text).expect("valid"));
        };
        coordinator
            .scoped(async {
                configure("[bulkhead.unit-keep]\nlimit = 3");
                guarded(&KEEPING, quiet())
                    .await
                    .expect("admitted at occupancy 1");
                configure("[bulkhead.unit-keep]\nlimit = 2");
                let probe = probe(&coordinator, Uuid::new_v4()).await;
                assert!(probe.allowed);
                let token = guarded(&KEEPING, reads_its_token())
                    .await
                    .expect("admitted");
                assert!(token > probe.fence, "{token} {}: reused", probe.fence);
            })
            .await;
    }

    /// A lease kept before a reconnection is not handed on: its next caller takes a fresh one.
    #[tokio::test(start_paused = true)]
    async fn a_lease_kept_before_a_reconnection_is_not_reused() {
        let coordinator = Coordinator::in_memory();
        coordinator
            .scoped(async {
                guarded(&KEEPING, quiet()).await.expect("admitted");
                coordinator.incarnation().reconnected();
                let probe = probe(&coordinator, Uuid::new_v4()).await;
                assert!(probe.allowed);
                let token = guarded(&KEEPING, reads_its_token())
                    .await
                    .expect("admitted");
                assert!(token > probe.fence, "{token} {}: reused", probe.fence);
            })
            .await;
    }

    /// A reconnection while the body runs, just before it returns: its renewal loop never sends
    /// the confirming renewal, so the lease is not handed on unconfirmed.
    #[tokio::test(start_paused = true)]
    async fn a_lease_unconfirmed_since_a_reconnection_is_not_reused() {
        let coordinator = Coordinator::in_memory();
        coordinator
            .scoped(async {
                let body = async {
                    coordinator.incarnation().reconnected();
                    Ok(())
                };
                guarded(&KEEPING, body).await.expect("admitted");
                let probe = probe(&coordinator, Uuid::new_v4()).await;
                assert!(probe.allowed);
                let token = guarded(&KEEPING, reads_its_token())
                    .await
                    .expect("admitted");
                assert!(token > probe.fence, "{token} {}: reused", probe.fence);
            })
            .await;
    }

    /// A lease whose latest reply (its view of the fleet) is older than 250 ms is not handed
    /// on, even within `keep`: it goes back to the fleet and the next call acquires afresh.
    #[tokio::test(start_paused = true)]
    async fn a_lease_with_a_stale_occupancy_is_not_reused() {
        let coordinator = Coordinator::in_memory();
        coordinator
            .scoped(async {
                guarded(&KEEPING, quiet()).await.expect("admitted");
                tokio::time::sleep(Duration::from_millis(300)).await;
                let probe = probe(&coordinator, Uuid::new_v4()).await;
                assert!(probe.allowed);
                let token = guarded(&KEEPING, reads_its_token())
                    .await
                    .expect("admitted");
                assert!(token > probe.fence, "{token} {}: reused", probe.fence);
            })
            .await;
    }

    /// A kept lease whose latest reply is 200 ms old is still handed on: its view of the fleet
    /// is fresh for 250 ms, so a busy fleet acquires each lease afresh every 250 ms, not more.
    #[tokio::test(start_paused = true)]
    async fn a_lease_with_a_reply_younger_than_250_ms_is_reused() {
        let coordinator = Coordinator::in_memory();
        coordinator
            .scoped(async {
                guarded(&KEEPING, quiet()).await.expect("admitted");
                tokio::time::sleep(Duration::from_millis(200)).await;
                let probe = probe(&coordinator, Uuid::new_v4()).await;
                let token = guarded(&KEEPING, reads_its_token())
                    .await
                    .expect("admitted");
                assert!(token < probe.fence, "{token} {}: not reused", probe.fence);
            })
            .await;
    }

    /// A body ending after shutdown does not keep its lease: the next call is not served from
    /// the pool past shutdown, it is refused.
    #[tokio::test(start_paused = true)]
    async fn nothing_is_kept_after_shutdown() {
        let coordinator = Coordinator::in_memory();
        coordinator
            .scoped(async {
                let (started, finish) = (
                    Arc::new(tokio::sync::Notify::new()),
                    Arc::new(tokio::sync::Notify::new()),
                );
                let holder = tokio::spawn(coordinator.scoped({
                    let (started, finish) = (Arc::clone(&started), Arc::clone(&finish));
                    async move {
                        let body = async {
                            started.notify_one();
                            finish.notified().await;
                            Ok(())
                        };
                        guarded(&KEEPING, body).await
                    }
                }));
                started.notified().await;
                coordinator.shutdown().await;
                finish.notify_one();
                holder
                    .await
                    .expect("no panic")
                    .expect("admitted before shutdown");
                let after = guarded(&KEEPING, quiet()).await;
                assert!(after.is_err(), "served from the pool after shutdown");
            })
            .await;
    }

    /// A kept lease goes back to the fleet once it could no longer be handed on (here, its
    /// latest reply grew older than 250 ms), before `keep` runs out.
    #[tokio::test(start_paused = true)]
    async fn a_kept_lease_goes_back_once_it_could_not_be_reused() {
        let coordinator = Coordinator::in_memory();
        coordinator
            .scoped(async {
                guarded(&KEEPING, quiet()).await.expect("admitted");
                tokio::time::sleep(Duration::from_millis(300)).await;
                assert!(Duration::from_millis(300) < KEEP);
                let probe = probe(&coordinator, Uuid::new_v4()).await;
                assert_eq!(
                    probe.occupancy, 1,
                    "returned once it could not be handed on"
                );
            })
            .await;
    }

    /// A kept lease whose token is below one a body here read is not handed on: the next body
    /// would be refused downstream. The next call takes a fresh lease instead.
    #[tokio::test(start_paused = true)]
    async fn a_lease_below_a_token_read_here_is_not_reused() {
        let coordinator = Coordinator::in_memory();
        coordinator
            .scoped(async {
                let (started, finish) = (
                    Arc::new(tokio::sync::Notify::new()),
                    Arc::new(tokio::sync::Notify::new()),
                );
                let lower = tokio::spawn(coordinator.scoped({
                    let (started, finish) = (Arc::clone(&started), Arc::clone(&finish));
                    async move {
                        let body = async {
                            started.notify_one();
                            finish.notified().await;
                            Ok(())
                        };
                        guarded(&KEEPING, body).await
                    }
                }));
                started.notified().await;
                let read = guarded(&KEEPING, reads_its_token())
                    .await
                    .expect("admitted");
                finish.notify_one();
                lower.await.expect("no panic").expect("admitted, then kept");
                let token = guarded(&KEEPING, reads_its_token())
                    .await
                    .expect("admitted");
                assert!(token > read, "{token} {read}: a lower kept lease reused");
            })
            .await;
    }

    static KEEPING_WAITS: BulkheadSite = BulkheadSite::new(BulkheadConfig {
        name: "unit-keep",
        operation: "unit-keep",
        limit: 2,
        adaptive: None,
        lease: LEASE,
        max_wait: Some(Duration::from_millis(500)),
        keep: Some(KEEP),
        local: false,
        shadow: false,
        thresholds: Thresholds::NONE,
    });

    /// A call waiting here gets the lease a finished body leaves: it is released (which wakes
    /// the waiter), not kept for the next newcomer.
    #[tokio::test(start_paused = true)]
    async fn a_lease_is_not_kept_while_a_call_waits_for_it() {
        let coordinator = Coordinator::in_memory();
        coordinator
            .scoped(async {
                let (started, finish) = (
                    Arc::new(tokio::sync::Notify::new()),
                    Arc::new(tokio::sync::Notify::new()),
                );
                let holder = tokio::spawn(coordinator.scoped({
                    let (started, finish) = (Arc::clone(&started), Arc::clone(&finish));
                    async move {
                        let body = async {
                            started.notify_one();
                            finish.notified().await;
                            Ok(())
                        };
                        guarded(&KEEPING_WAITS, body).await
                    }
                }));
                started.notified().await;
                // Another process fills the fleet after the holder's acquire (occupancy 1).
                assert!(probe(&coordinator, Uuid::new_v4()).await.allowed);
                let waiter = tokio::spawn(
                    coordinator.scoped(async { guarded(&KEEPING_WAITS, quiet()).await }),
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
                finish.notify_one();
                holder.await.expect("no panic").expect("admitted");
                waiter
                    .await
                    .expect("no panic")
                    .expect("admitted within max_wait");
            })
            .await;
    }

    /// However many callers share the kept leases, each lease runs one body at a time: the
    /// bodies at once never exceed the limit.
    #[tokio::test(start_paused = true)]
    async fn kept_leases_never_run_more_bodies_than_the_limit() {
        let coordinator = Coordinator::in_memory();
        let running = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let most = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let mut tasks = Vec::new();
        for task in 0..8u64 {
            let (running, most) = (Arc::clone(&running), Arc::clone(&most));
            tasks.push(tokio::spawn(coordinator.scoped(async move {
                let mut admitted = 0;
                for call in 0..20u64 {
                    let body = async {
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis((task + call) % 3)).await;
                        running.fetch_sub(1, Ordering::SeqCst);
                        Ok(())
                    };
                    admitted += u32::from(guarded(&KEEPING, body).await.is_ok());
                    tokio::task::yield_now().await;
                }
                admitted
            })));
        }
        let mut admitted = 0;
        for task in tasks {
            admitted += task.await.expect("no panic");
        }
        assert!(admitted > 0);
        assert!(most.load(Ordering::SeqCst) <= 2, "{most:?}");
    }
}

/// The view of [`ADAPTIVE`]'s limit in `coordinator`.
fn adaptive_view(coordinator: &Coordinator) -> Arc<adaptive::View> {
    view_of(coordinator, &ADAPTIVE)
}

/// A call through `site` whose body waits until the sender is used or dropped: admitted, and
/// counted as running, once this returns.
async fn running_on(
    site: &'static BulkheadSite,
) -> (
    tokio::sync::oneshot::Sender<()>,
    std::pin::Pin<Box<impl Future<Output = Result<(), Error>>>>,
) {
    let (end, ended) = tokio::sync::oneshot::channel::<()>();
    let mut running = Box::pin(guarded(site, async {
        ended.await.map_err(|_| Error::NotInstalled)
    }));
    let waiting = tokio::time::timeout(Duration::from_millis(10), running.as_mut()).await;
    assert!(waiting.is_err(), "{waiting:?}");
    (end, running)
}

/// The view of `site`'s adaptive limit in `coordinator`.
fn view_of(coordinator: &Coordinator, site: &BulkheadSite) -> Arc<adaptive::View> {
    let config = &site.config;
    let identity = coordinator.identity(
        crate::identity::PolicyKind::Bulkhead,
        config.name,
        config.operation,
        GLOBAL_SCOPE.as_ref().expect("the global scope"),
    );
    adaptive::Views::of(coordinator, &identity)
}

/// A call refused and waiting for a slot (within `max_wait`) holds none: counted against its
/// process's share, a process with calls waiting would read as holding the fleet's slots, and
/// be held to its share (see `Share::learn`).
#[tokio::test(start_paused = true)]
async fn a_call_waiting_for_a_slot_is_not_counted_as_holding_one() {
    let coordinator = Coordinator::in_memory();
    coordinator
        .scoped(async {
            let (end, ended) = tokio::sync::watch::channel(false);
            let body = || {
                let mut ended = ended.clone();
                async move {
                    ended
                        .wait_for(|&ended| ended)
                        .await
                        .map_err(|_| Error::NotInstalled)?;
                    Ok(())
                }
            };
            let mut running = std::pin::pin!(futures_util::future::join(
                guarded(&ADAPTIVE_WAITING, body()),
                guarded(&ADAPTIVE_WAITING, body()),
            ));
            let filled = tokio::time::timeout(Duration::from_millis(10), running.as_mut()).await;
            assert!(filled.is_err(), "both bodies run: {filled:?}");
            let mut waiting = std::pin::pin!(guarded(&ADAPTIVE_WAITING, body()));
            let refused = tokio::time::timeout(Duration::from_millis(10), waiting.as_mut()).await;
            assert!(refused.is_err(), "the third waits: {refused:?}");
            assert_eq!(view_of(&coordinator, &ADAPTIVE_WAITING).held(), 2);
            end.send(true).expect("the bodies wait");
            let (first, second) = running.await;
            first.and(second).expect("the running bodies");
            waiting.await.expect("admitted once a slot was freed");
        })
        .await;
}

/// A process the fleet's answer held to its share (one process of several, holding each slot
/// longer than the fleet's calls take, the fleet at its limit) is refused at its share without
/// asking, though the fleet has slots free; and admitted again once a body of its own ends.
/// The refusal is noted as asking for a slot of the fleet the last lease reply showed, so that
/// its next report counts it and keeps the bound while that reply read full: a report without
/// an occupancy read as a fleet below its limit, and the bound lifted every other report.
#[tokio::test(start_paused = true)]
async fn a_process_at_its_share_of_a_saturated_fleet_is_refused_until_a_body_of_its_own_ends() {
    let coordinator = Coordinator::in_memory();
    coordinator
        .scoped(async {
            let (end, running) = running_on(&ADAPTIVE).await;
            let view = adaptive_view(&coordinator);
            // A report carries the admission's occupancy away.
            tokio::time::sleep(adaptive::REPORT_EVERY + Duration::from_millis(10)).await;
            assert_eq!(view.peak(), 0, "reported");
            view.hold_to(1);
            let refused = guarded(&ADAPTIVE, async { Ok(()) }).await;
            assert!(
                matches!(refused, Err(Error::BulkheadFull { .. })),
                "{refused:?}"
            );
            assert_eq!(view.peak(), 1, "the refusal, at the last reply's occupancy");
            assert_eq!(view.refused(), 1, "a call the fleet was full for");
            end.send(()).expect("the body waits");
            running.await.expect("the running body");
            guarded(&ADAPTIVE, async { Ok(()) })
                .await
                .expect("admitted once its body ended");
        })
        .await;
}

/// A call a lease reply refuses is noted as one the fleet was full for, beside the occupancy
/// the reply showed: with `thresholds` a class is refused under the limit, and a fleet whose
/// calls are refused is cut on its period whatever its occupancy.
#[tokio::test(start_paused = true)]
async fn a_call_the_fleet_refuses_is_noted_as_refused() {
    static ONE: BulkheadSite = BulkheadSite::new(BulkheadConfig {
        name: "unit-adaptive-one",
        operation: "unit-adaptive-one",
        limit: 1,
        adaptive: Some(AdaptiveLimit::new(1, 1, 1)),
        ..ADAPTIVE_CONFIG
    });
    let coordinator = Coordinator::in_memory();
    coordinator
        .scoped(async {
            let (end, running) = running_on(&ONE).await;
            let view = view_of(&coordinator, &ONE);
            assert_eq!((view.peak(), view.refused()), (1, 0), "admitted");
            let refused = guarded(&ONE, async { Ok(()) }).await;
            assert!(
                matches!(refused, Err(Error::BulkheadFull { .. })),
                "{refused:?}"
            );
            assert_eq!((view.peak(), view.refused()), (1, 1), "refused");
            end.send(()).expect("the body waits");
            running.await.expect("the running body");
        })
        .await;
}

/// Calls admitted together (a paused process's tasks resuming at once) do not pass a share
/// together: each counts against it from before its acquire is sent, not from its body's start.
#[tokio::test(start_paused = true)]
async fn calls_admitted_together_do_not_pass_the_share_together() {
    let coordinator = Coordinator::in_memory();
    coordinator
        .scoped(async {
            guarded(&ADAPTIVE, async { Ok(()) })
                .await
                .expect("a first call learns the limit");
            adaptive_view(&coordinator).hold_to(1);
            let body = || async {
                tokio::time::sleep(Duration::from_millis(10)).await;
                Ok(())
            };
            let calls = [guarded(&ADAPTIVE, body()), guarded(&ADAPTIVE, body())];
            let results = futures_util::future::join_all(calls).await;
            let refused = results
                .iter()
                .filter(|result| matches!(result, Err(Error::BulkheadFull { .. })))
                .count();
            assert_eq!(refused, 1, "{results:?}");
        })
        .await;
}
