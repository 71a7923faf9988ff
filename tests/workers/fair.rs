//! The `bulkhead-fair` scenario: a bursting process and a steady one on a bulkhead of limit 4,
//! on two identities at once, one plain and one with `keep = "5ms"`, so that the steady
//! process's refusals with kept leases and without come from the same run, under the same
//! load.
//!
//! `role=burst`: on each identity, bursts of `tasks` calls at once (each body holding
//! `hold_ms`), `gap_ms` apart, until a line comes on stdin. `role=steady`: on each identity,
//! `tasks` tasks making `calls` calls each (holding `hold_ms`, pausing `gap_ms` after each,
//! refused or not). `limit=` sets both identities' limit in this process (4 otherwise).
//! Either prints `result plain_admitted=… plain_rejected=… kept_admitted=…
//! kept_rejected=… errors=…`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use caracal::bulkhead;

use crate::{WorkerError, read_line, say};

#[bulkhead(name = "mp-fair", limit = 4, scope = scope)]
async fn plain(scope: &str, hold: Duration) -> Result<(), WorkerError> {
    tokio::time::sleep(hold).await;
    Ok(())
}

#[bulkhead(name = "mp-fair-keep", limit = 4, keep = "5ms", scope = scope)]
async fn kept(scope: &str, hold: Duration) -> Result<(), WorkerError> {
    tokio::time::sleep(hold).await;
    Ok(())
}

/// Sets both identities' limit to `limit` in this process: a process whose limit is above the
/// others' is never refused where they are, so its kept leases are all that can hold them off.
pub(crate) fn limit(coordinator: &caracal::Coordinator, limit: &str) {
    let text =
        format!("[bulkhead.mp-fair]\nlimit = {limit}\n[bulkhead.mp-fair-keep]\nlimit = {limit}");
    coordinator.set_config(caracal::Config::from_toml_str(&text).expect("a valid limit"));
}

/// How the calls on one identity ended.
#[derive(Default)]
struct Counts {
    admitted: AtomicU64,
    rejected: AtomicU64,
    errors: AtomicU64,
}

impl Counts {
    fn count(&self, result: Result<(), WorkerError>) {
        let counter = match result {
            Ok(()) => &self.admitted,
            Err(WorkerError::Caracal(caracal::Error::BulkheadFull { .. })) => &self.rejected,
            Err(other) => {
                eprintln!("worker: unexpected error: {other:?}");
                &self.errors
            }
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// One identity's calls: which bulkhead, how they ended.
struct Side {
    keep: bool,
    counts: Counts,
}

impl Side {
    async fn call(&self, scope: &str, hold: Duration) {
        let result = if self.keep {
            kept(scope, hold).await
        } else {
            plain(scope, hold).await
        };
        self.counts.count(result);
    }
}

/// The shape of one role's load.
#[derive(Clone, Copy)]
pub(crate) struct Shape {
    pub(crate) tasks: usize,
    pub(crate) calls: u64,
    pub(crate) hold: Duration,
    pub(crate) gap: Duration,
}

/// Bursts of `shape.tasks` calls at once on `side`, `shape.gap` apart, until `stop`.
async fn bursts(side: Arc<Side>, scope: Arc<str>, shape: Shape, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        let burst: Vec<_> = (0..shape.tasks)
            .map(|_| {
                let (side, scope) = (Arc::clone(&side), Arc::clone(&scope));
                tokio::spawn(async move { side.call(&scope, shape.hold).await })
            })
            .collect();
        for call in burst {
            call.await.expect("a burst's call");
        }
        tokio::time::sleep(shape.gap).await;
    }
}

/// `shape.tasks` tasks on `side`, each making `shape.calls` calls `shape.gap` apart.
async fn steady(side: Arc<Side>, scope: Arc<str>, shape: Shape) {
    let tasks: Vec<_> = (0..shape.tasks)
        .map(|_| {
            let (side, scope) = (Arc::clone(&side), Arc::clone(&scope));
            tokio::spawn(async move {
                for _ in 0..shape.calls {
                    side.call(&scope, shape.hold).await;
                    tokio::time::sleep(shape.gap).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a steady task");
    }
}

/// Runs `role` (`burst` or `steady`) on both identities at once and prints the result line.
pub(crate) async fn run(role: &str, scope: &str, shape: Shape) {
    let scope: Arc<str> = Arc::from(scope);
    let sides = [false, true].map(|keep| {
        Arc::new(Side {
            keep,
            counts: Counts::default(),
        })
    });
    let runs: Vec<_> = match role {
        "burst" => {
            let stop = Arc::new(AtomicBool::new(false));
            let runs = sides
                .iter()
                .map(|side| {
                    let run = bursts(
                        Arc::clone(side),
                        Arc::clone(&scope),
                        shape,
                        Arc::clone(&stop),
                    );
                    tokio::spawn(run)
                })
                .collect();
            tokio::task::spawn_blocking(read_line)
                .await
                .expect("wait for stop");
            stop.store(true, Ordering::Relaxed);
            runs
        }
        "steady" => sides
            .iter()
            .map(|side| tokio::spawn(steady(Arc::clone(side), Arc::clone(&scope), shape)))
            .collect(),
        other => panic!("unknown role {other}"),
    };
    for run in runs {
        run.await.expect("a side's run");
    }
    let [plain, kept] = sides.map(|side| {
        let counts = &side.counts;
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        (
            load(&counts.admitted),
            load(&counts.rejected),
            load(&counts.errors),
        )
    });
    say(&format!(
        "result plain_admitted={} plain_rejected={} kept_admitted={} kept_rejected={} errors={}",
        plain.0,
        plain.1,
        kept.0,
        kept.1,
        plain.2 + kept.2
    ));
}
