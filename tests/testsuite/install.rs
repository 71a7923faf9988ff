//! The process-wide coordinator: before `install`, after it, and installing twice. One test, as
//! the installed coordinator is the whole process's: it is the only test of the binary that
//! installs one (every other passes its coordinator with `Coordinator::scoped`, which also
//! overrides an installed one), and the only one calling distributed policies outside `scoped`.

use crate::common::{TestError, code};
use caracal::{Coordinator, bulkhead, circuit_breaker, rate_limit, retry, retry_budget};

#[bulkhead(limit = 1)]
async fn bulkhead_call() -> Result<(), TestError> {
    Ok(())
}

#[rate_limit(rate = 1000)]
async fn rate_call() -> Result<(), TestError> {
    Ok(())
}

#[circuit_breaker(on_coordinator_error = "fail_open")]
async fn breaker_call() -> Result<(), TestError> {
    Ok(())
}

#[retry_budget(percent = 20)]
#[retry(max_attempts = 2)]
async fn budget_call() -> Result<(), TestError> {
    Ok(())
}

#[bulkhead(limit = 1, local)]
async fn local_call() -> Result<(), TestError> {
    Ok(())
}

#[tokio::test]
async fn distributed_policies_refuse_to_run_uncoordinated_until_installed() {
    // Not installed: never silently uncoordinated, whatever the breaker's fail-open setting.
    // (`already_installed` below, or `ok` here, would mean another test of this binary
    // installed a coordinator.)
    assert_eq!(code(&bulkhead_call().await), "not_installed");
    assert_eq!(code(&rate_call().await), "not_installed");
    assert_eq!(code(&breaker_call().await), "not_installed");
    assert_eq!(code(&budget_call().await), "not_installed");
    assert_eq!(
        code(&local_call().await),
        "ok",
        "local policies need no coordinator"
    );
    assert_eq!(
        code(&crate::fallback::needs_coordinator().await),
        "not_installed",
        "a fallback never hides a missing coordinator"
    );

    caracal::install(Coordinator::in_memory()).expect("first install");
    assert_eq!(code(&bulkhead_call().await), "ok");
    assert_eq!(code(&rate_call().await), "ok");
    assert_eq!(code(&breaker_call().await), "ok");
    assert_eq!(code(&budget_call().await), "ok");
    assert!(matches!(
        caracal::install(Coordinator::in_memory()),
        Err(caracal::Error::AlreadyInstalled)
    ));
}
