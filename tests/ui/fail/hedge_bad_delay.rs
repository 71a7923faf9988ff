//! A delay is a duration with a unit or a percentile from p50 to p99; it is required; its
//! bounds are a percentile's, in order.
use caracal::hedge;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

#[hedge(delay = "fast")]
async fn malformed() -> Result<(), ApiError> {
    Ok(())
}

#[hedge(delay = p100)]
async fn past_p99() -> Result<(), ApiError> {
    Ok(())
}

#[hedge(delay = 50)]
async fn no_unit() -> Result<(), ApiError> {
    Ok(())
}

#[hedge(max_extra = 2)]
async fn missing() -> Result<(), ApiError> {
    Ok(())
}

#[hedge(delay = "50ms", max_delay = "1s")]
async fn bounds_on_a_fixed_delay() -> Result<(), ApiError> {
    Ok(())
}

#[hedge(delay = p95, min_delay = "2s", max_delay = "1s")]
async fn bounds_out_of_order() -> Result<(), ApiError> {
    Ok(())
}

fn main() {
    drop(malformed());
    drop(past_p99());
    drop(no_unit());
    drop(missing());
    drop(bounds_on_a_fixed_delay());
    drop(bounds_out_of_order());
}
