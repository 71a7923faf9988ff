//! The quickstart (`examples/quickstart.rs`) is a target of this package, which exists so that
//! `cargo run --example quickstart` builds caracal and tokio only.
