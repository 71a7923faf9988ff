//! A tower-wrapped HTTP client: hyper's client behind a circuit breaker that counts 5xx
//! responses as failures, a bulkhead and a rate limit — every replica shares them.
//!
//! ```text
//! cargo run --example http_client -- http://127.0.0.1:3000/orders/7
//! ```

use std::time::Duration;

use caracal::Outcome;
use caracal::tower::{BulkheadLayer, CircuitBreakerLayer, RateLimitLayer};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};

type Connector = hyper_util::client::legacy::connect::HttpConnector;
type Response = hyper::Response<hyper::body::Incoming>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    caracal::install(caracal::Coordinator::from_env().await?)?;
    let uri = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "http://127.0.0.1:3000/orders/7".to_owned());

    let hyper: Client<Connector, Empty<hyper::body::Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let mut client = ServiceBuilder::new()
        .layer(
            CircuitBreakerLayer::new("orders-api")
                .failure_threshold(0.5)
                .open(Duration::from_secs(5))
                .classify(|result: &Result<Response, BoxError>| match result {
                    Ok(response) if response.status().is_server_error() => Outcome::Failure,
                    Ok(_) => Outcome::Success,
                    Err(_) => Outcome::Failure,
                }),
        )
        .layer(BulkheadLayer::new("orders-api").limit(8))
        .layer(RateLimitLayer::new("orders-api").rate(20.0).burst(5))
        .service(hyper);

    for _ in 0..5 {
        let request = hyper::Request::get(&uri).body(Empty::new())?;
        match client.ready().await?.call(request).await {
            Ok(response) => {
                let status = response.status();
                let body = response.into_body().collect().await?.to_bytes();
                println!("{status} {}", String::from_utf8_lossy(&body).trim_end());
            }
            Err(error) => match error.downcast_ref::<caracal::Error>() {
                Some(rejection) => println!("refused by caracal: {rejection}"),
                None => println!("failed: {error}"),
            },
        }
    }
    Ok(())
}
