//! `#[hedge]`: another attempt beside a slow one.

#[cfg_attr(
    not(test),
    expect(dead_code, reason = "`#[hedge]`, from the hedge branch, reads it")
)]
pub(crate) mod latency;
