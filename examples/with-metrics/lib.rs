//! The `metrics` example (`examples/metrics.rs`) is a target of this package, which exists so
//! that only it is built with caracal's `metrics` feature.
