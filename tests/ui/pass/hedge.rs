//! `#[hedge]` alone, with a percentile and bounds, on a method, over a bulkhead, under a
//! retry budget of the name it draws from.
use caracal::{bulkhead, hedge, retry, retry_budget};

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

const BUDGET: &str = "partner-api";

#[hedge(delay = "50ms")]
async fn fixed(id: u64) -> Result<u64, ApiError> {
    Ok(id)
}

#[retry_budget(name = "partner-api", percent = 10)]
#[hedge(delay = p95, max_extra = 2, min_delay = "5ms", max_delay = "500ms", budget = BUDGET,
        scope = format!("region:{region}"))]
#[retry(max_attempts = 2)]
#[bulkhead(name = "partner-api", limit = 20)]
async fn stacked(region: &str, id: u64) -> Result<u64, ApiError> {
    Ok(id + region.len() as u64)
}

struct Client {
    base: String,
}

impl Client {
    #[hedge(delay = "20ms", budget = "partner-api", local)]
    async fn get(&self, path: &str) -> Result<String, ApiError> {
        Ok(format!("{}{path}", self.base))
    }
}

fn main() {
    drop(fixed(1));
    drop(stacked("eu", 1));
    let client = Client { base: String::new() };
    drop(client.get("/"));
}
