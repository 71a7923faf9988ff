//! An axum server whose `/hold` route is guarded by caracal's `BulkheadLayer` (name
//! `shared-budget`, limit 2, scope from the `tenant` header), as a service on a fleet would be:
//! configured by `CARACAL_REDIS_URL` / `CARACAL_NAMESPACE`, the coordinator installed at
//! start-up. It prints `listening port=<port>`.
//!
//! `GET /hold` waits until `POST /release?n=<count>` lets that many held requests finish. A
//! rejection is `503` with caracal's error code as the body.

use std::sync::Arc;

use axum::Router;
use axum::error_handling::HandleErrorLayer;
use axum::extract::{RawQuery, Request};
use axum::http::StatusCode;
use axum::routing::{get, post};
use caracal::tower::BulkheadLayer;
use tokio::sync::Semaphore;
use tower::{BoxError, ServiceBuilder};

/// What a rejected request answers: 503 and the error's code for caracal's own rejections.
async fn rejected(error: BoxError) -> (StatusCode, String) {
    match error.downcast_ref::<caracal::Error>() {
        Some(error) => (StatusCode::SERVICE_UNAVAILABLE, error.code().to_owned()),
        None => (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    caracal::install(caracal::Coordinator::from_env().await?)?;
    let gate = Arc::new(Semaphore::new(0));
    let held = Arc::clone(&gate);
    let guarded = ServiceBuilder::new()
        .layer(HandleErrorLayer::new(rejected))
        .layer(
            BulkheadLayer::new("shared-budget")
                .limit(2)
                .scope(|req: &Request| {
                    req.headers()
                        .get("tenant")
                        .and_then(|tenant| tenant.to_str().ok())
                        .unwrap_or("global")
                        .to_owned()
                }),
        );
    let app = Router::new()
        .route(
            "/hold",
            get(move || async move {
                held.acquire().await.map(|permit| permit.forget()).ok();
                "done"
            })
            .route_layer(guarded),
        )
        .route(
            "/release",
            post(move |RawQuery(query): RawQuery| async move {
                let n = query
                    .as_deref()
                    .and_then(|query| query.strip_prefix("n="))
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(1);
                gate.add_permits(n);
                "released"
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    println!("listening port={}", listener.local_addr()?.port());
    axum::serve(listener, app).await?;
    Ok(())
}
