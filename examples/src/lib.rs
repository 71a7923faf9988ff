//! Runnable examples live beside this crate as `[[example]]` targets.
