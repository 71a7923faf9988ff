//! Fencing tokens: what a distributed bulkhead's body can hand to a downstream so that the
//! downstream, not the lease, has the last word on a holder whose lease was lost.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// A body's fencing token, and where reading it is noted when its lease may be handed to a
/// later body (a kept lease): a token read is never handed on.
#[derive(Debug, Clone)]
pub(crate) struct Fence {
    pub(crate) token: u64,
    pub(crate) read: Option<Arc<AtomicBool>>,
    /// The highest token a body of the identity read in this process: a kept lease whose token
    /// is lower is not handed on (its body's writes would be refused downstream).
    pub(crate) highest: Option<Arc<AtomicU64>>,
}

tokio::task_local! {
    static FENCE: Option<Fence>;
}

/// Whether any body of the process ever ran with a token: until one has, no task can be inside
/// one, and a local bulkhead's every call skips the task-local read that would say so.
static EVER_FENCED: AtomicBool = AtomicBool::new(false);

/// The fencing token of the lease the current call holds, inside the body of a distributed
/// `#[bulkhead]`; `None` anywhere else (and inside a `local` bulkhead).
///
/// Tokens strictly increase with every lease granted for one identity across the fleet. A
/// downstream that remembers the highest token it has accepted and refuses lower ones shuts
/// out a holder whose lease expired while it was paused or partitioned — the one guarantee a
/// lease alone cannot give. Nested bulkheads give the innermost one's token. A body never
/// sees a token an earlier body saw: a bulkhead with `keep` hands a finished body's lease to
/// the next caller only if that body did not read its token, and only if no body of the
/// identity in this process has read a higher token. A body on a kept lease may still get a
/// token below one another *process* read meanwhile (granted after its lease was): its writes
/// are then refused downstream as a stale holder's would be. Where that matters, leave `keep`
/// unset on a bulkhead whose bodies write under their token.
///
/// How far that holds: each grant takes the identity's last token + 1, but never less than the
/// server's clock (`TIME`) in whole milliseconds × 1000. The last token lives in Redis, and
/// expires with the last lease granted; when it is gone — expired, or lost in a restart
/// without persistence, a failover to a replica that lacked it, an eviction — that clock is
/// all the next grant goes by. So tokens keep increasing across such a loss only if the clock
/// of the server granting after it reads later than the clock of the grants before it did,
/// and fewer than 1000 tokens a millisecond were granted for the identity (more would run
/// ahead of the clock). A clock that steps back (a correction, a failover to a host whose
/// clock lags) can hand a new holder a lower token than an old one: the downstream then
/// refuses the new holder and still accepts the old, whose lease was lost.
///
/// ```
/// use caracal::bulkhead;
///
/// # #[derive(Debug)] struct Error;
/// # impl From<caracal::Error> for Error { fn from(_: caracal::Error) -> Self { Error } }
/// #[bulkhead(limit = 1)]
/// async fn write(value: &str) -> Result<Option<u64>, Error> {
///     // Send it along with the write; the store rejects writes fenced below its highest.
///     Ok(caracal::fencing_token())
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let coordinator = caracal::Coordinator::in_memory();
/// let first = coordinator.scoped(write("a")).await.unwrap();
/// let second = coordinator.scoped(write("b")).await.unwrap();
/// assert!(second > first);
/// assert_eq!(caracal::fencing_token(), None, "outside a bulkhead");
/// # }
/// ```
pub fn fencing_token() -> Option<u64> {
    FENCE
        .try_with(|fence| {
            let fence = fence.as_ref()?;
            if let Some(read) = &fence.read {
                read.store(true, Ordering::Relaxed);
            }
            if let Some(highest) = &fence.highest {
                highest.fetch_max(fence.token, Ordering::AcqRel);
            }
            Some(fence.token)
        })
        .ok()
        .flatten()
}

/// Runs `body` with `fence` as its fencing token.
pub(crate) fn scope<F: Future>(fence: Option<Fence>, body: F) -> impl Future<Output = F::Output> {
    // Set before the body's future exists, so the task that polls it sees it set.
    if fence.is_some() {
        EVER_FENCED.store(true, Ordering::Relaxed);
    }
    FENCE.scope(fence, body)
}

/// Whether the current task runs inside a distributed bulkhead's body (a local bulkhead inside
/// it must hide the token).
#[inline]
pub(crate) fn inside_fenced_body() -> bool {
    EVER_FENCED.load(Ordering::Relaxed) && FENCE.try_with(|fence| fence.is_some()).unwrap_or(false)
}
