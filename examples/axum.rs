//! An axum service whose routes are guarded by caracal's tower layers: each route its own
//! bulkhead, one breaker and one rate limit per tenant — shared by every replica on the same
//! Redis.
//!
//! ```text
//! cargo run --example axum                                   # in memory
//! CARACAL_REDIS_URL=redis://127.0.0.1:6379 cargo run --example axum
//! curl -H 'tenant: acme' localhost:3000/orders/7
//! PORT=3001 CARACAL_REDIS_URL=redis://127.0.0.1:6379 cargo run --example axum   # a second replica
//! ```

use std::time::Duration;

use axum::Router;
use axum::error_handling::HandleErrorLayer;
use axum::extract::{Path, Request};
use axum::http::StatusCode;
use axum::routing::get;
use caracal::Outcome;
use caracal::tower::{BulkheadLayer, CircuitBreakerLayer, RateLimitLayer};
use tower::{BoxError, ServiceBuilder};

/// The tenant a request is for: its `tenant` header.
fn tenant(request: &Request) -> String {
    request
        .headers()
        .get("tenant")
        .and_then(|value| value.to_str().ok())
        .unwrap_or("anonymous")
        .to_owned()
}

/// caracal's rejections become 503 (429 for a rate limit), with a `Retry-After` when known.
async fn rejected(error: BoxError) -> (StatusCode, [(&'static str, String); 1], String) {
    let Some(error) = error.downcast_ref::<caracal::Error>() else {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            [("retry-after", String::new())],
            error.to_string(),
        );
    };
    let (status, retry_after) = match error {
        caracal::Error::RateLimited { retry_after, .. } => {
            (StatusCode::TOO_MANY_REQUESTS, Some(*retry_after))
        }
        caracal::Error::CircuitOpen { retry_after, .. } => {
            (StatusCode::SERVICE_UNAVAILABLE, *retry_after)
        }
        _ => (StatusCode::SERVICE_UNAVAILABLE, None),
    };
    let seconds = retry_after.map_or_else(String::new, |wait| wait.as_secs().max(1).to_string());
    (
        status,
        [("retry-after", seconds)],
        format!("{}\n", error.code()),
    )
}

async fn order(Path(id): Path<u64>) -> String {
    // Stands for a call to a partner that is sometimes slow.
    tokio::time::sleep(Duration::from_millis(20)).await;
    format!("order {id}\n")
}

async fn report() -> String {
    tokio::time::sleep(Duration::from_millis(200)).await;
    "report\n".to_owned()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    caracal::install(caracal::Coordinator::from_env().await?)?;

    let orders = ServiceBuilder::new()
        .layer(HandleErrorLayer::new(rejected))
        .layer(
            CircuitBreakerLayer::new("orders")
                .open(Duration::from_secs(10))
                .slow_call(Duration::from_secs(1))
                .classify(
                    |result: &Result<axum::response::Response, BoxError>| match result {
                        Ok(response) if response.status().is_server_error() => Outcome::Failure,
                        Ok(_) => Outcome::Success,
                        Err(_) => Outcome::Failure,
                    },
                ),
        )
        .layer(
            RateLimitLayer::new("orders")
                .rate(50.0)
                .burst(10)
                .scope(tenant),
        )
        .layer(
            BulkheadLayer::new("orders")
                .limit(20)
                .max_wait(Duration::from_millis(50)),
        );
    // Reports are expensive: at most two at once fleet-wide, none waiting.
    let reports = ServiceBuilder::new()
        .layer(HandleErrorLayer::new(rejected))
        .layer(BulkheadLayer::new("reports").limit(2));

    let app = Router::new()
        .route("/orders/{id}", get(order).route_layer(orders))
        .route("/report", get(report).route_layer(reports));
    let port = std::env::var("PORT").unwrap_or_else(|_| "3000".to_owned());
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}")).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
