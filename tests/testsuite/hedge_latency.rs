//! `#[hedge(delay = p95)]` learns its delay from the fleet: a process none of whose own
//! attempts ever ended hedges at the p95 the other processes' attempts make, not at
//! `max_delay`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use caracal::{Coordinator, hedge};
use caracal_tests::RedisServer;
use tokio::time::Instant;

use crate::common::{TestError, unique};

/// Answers at once with its attempt's index, but for a held first attempt, which never does.
#[hedge(delay = p95, max_delay = "1h", scope = scope)]
async fn fetch(scope: &str, attempts: &AtomicU32, hold_first: bool) -> Result<u32, TestError> {
    let index = attempts.fetch_add(1, Ordering::SeqCst);
    if hold_first && index == 0 {
        std::future::pending::<()>().await;
    }
    Ok(index)
}

#[tokio::test]
async fn a_new_process_hedges_at_the_fleets_p95() {
    let server = RedisServer::start();
    let namespace = unique("hedge-latency");
    let connect = || {
        Coordinator::redis(server.url())
            .namespace(namespace.clone())
            .connect()
    };
    let busy = connect().await.expect("connected");
    let new = connect().await.expect("connected");
    let scope = unique("scope");
    // The busy process's quick attempts make the fleet's p95 a few microseconds (the delay
    // then is `min_delay`, 1 ms).
    busy.scoped(async {
        for _ in 0..200 {
            let attempts = AtomicU32::new(0);
            assert_eq!(fetch(&scope, &attempts, false).await.expect("answered"), 0);
        }
    })
    .await;
    // The new process's first attempts never end: a call ends only if it is hedged, which at
    // `max_delay` (an hour) never happens here. A call given up is dropped and another made,
    // until one ends (the view reads the fleet once asked, and again a window later).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let attempts = AtomicU32::new(0);
        let call = new.scoped(fetch(&scope, &attempts, true));
        if let Ok(result) = tokio::time::timeout(Duration::from_secs(1), call).await {
            assert_eq!(result.expect("answered"), 1, "the hedge's attempt answered");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new process never hedged at the fleet's p95"
        );
    }
    busy.shutdown().await;
    new.shutdown().await;
}
