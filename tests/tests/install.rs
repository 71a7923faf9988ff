//! The process-wide coordinator: before `install`, after it, and installing twice. One test, as
//! the installed coordinator is the whole process's.

mod common;

use caracal::{Coordinator, bulkhead, circuit_breaker, rate_limit};
use common::{TestError, code};

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

#[bulkhead(limit = 1, local)]
async fn local_call() -> Result<(), TestError> {
    Ok(())
}

#[tokio::test]
async fn distributed_policies_refuse_to_run_uncoordinated_until_installed() {
    // Not installed: never silently uncoordinated, whatever the breaker's fail-open setting.
    assert_eq!(code(&bulkhead_call().await), "not_installed");
    assert_eq!(code(&rate_call().await), "not_installed");
    assert_eq!(code(&breaker_call().await), "not_installed");
    assert_eq!(
        code(&local_call().await),
        "ok",
        "local policies need no coordinator"
    );

    caracal::install(Coordinator::in_memory()).expect("first install");
    assert_eq!(code(&bulkhead_call().await), "ok");
    assert_eq!(code(&rate_call().await), "ok");
    assert_eq!(code(&breaker_call().await), "ok");
    assert!(matches!(
        caracal::install(Coordinator::in_memory()),
        Err(caracal::Error::AlreadyInstalled)
    ));
}
