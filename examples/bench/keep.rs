//! `bench keep`: the distributed bulkhead with `keep` (a finished body's lease kept for the
//! next caller here) against the same bulkhead without it, in turns in one run: a lone caller's
//! latency against the socket floor, and 64 tasks' calls per second.

use std::sync::Arc;

use caracal::bulkhead;
use caracal_examples::emit;

use super::floor::SocketFloor;
use super::{
    BenchError, CONCURRENT_TASKS, LEASE_SCRIPT, SEQUENTIAL_CALLS, guarded, installed, latencies,
    load_script, raw_acquire, throughput,
};

#[bulkhead(name = "bench-keep", limit = 1000000, keep = "5ms")]
async fn kept() -> Result<(), BenchError> {
    Ok(())
}

pub(super) async fn alone(url: &str) -> Result<(), caracal::Error> {
    let (_coordinator, mut conn) = installed(url, "bench-keep").await?;
    let sha: Arc<str> = load_script(&mut conn, LEASE_SCRIPT).await.into();
    let raw_key: Arc<str> = format!("caracal:bench:{{{}}}:raw-keep", std::process::id()).into();
    let mut floor = SocketFloor::connect(url, &sha, &raw_key);
    let raw = move || raw_acquire(conn.clone(), Arc::clone(&sha), Arc::clone(&raw_key));
    let [floor_off, _, off] = latencies(SEQUENTIAL_CALLS, floor.as_mut(), &raw, || async {
        guarded().await.expect("admitted");
    })
    .await;
    let [floor_on, _, on] = latencies(SEQUENTIAL_CALLS, floor.as_mut(), &raw, || async {
        kept().await.expect("admitted");
    })
    .await;
    emit(
        "keep_1_task_us",
        &[
            ("off_median", off.p50),
            ("off_ratio_to_socket_floor", off.p50 / floor_off.p50),
            ("on_median", on.p50),
            ("on_p99", on.p99),
            ("on_ratio_to_socket_floor", on.p50 / floor_on.p50),
        ],
    );
    drop(floor);
    let off = throughput(CONCURRENT_TASKS, || async {
        guarded().await.expect("admitted");
    })
    .await;
    let on = throughput(CONCURRENT_TASKS, || async {
        kept().await.expect("admitted");
    })
    .await;
    emit(
        "keep_64_tasks_per_s",
        &[
            ("off", off.rate),
            ("on", on.rate),
            ("ratio_on_to_off", on.rate / off.rate),
        ],
    );
    Ok(())
}
