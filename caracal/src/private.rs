//! What the attribute macros expand to. Not a public API: names here change without notice.

use std::fmt::Display;
use std::future::Future;
use std::marker::PhantomData;

use futures_util::FutureExt;

pub use crate::ctx::{CallCtx, Rejection};
pub use crate::identity::{FunctionIdentity, Scope};
pub use crate::policy::expansion::*;
pub use core::ops::ControlFlow;
pub use core::time::Duration;

use crate::error::Error;
use crate::identity::MAX_PART_BYTES;

/// Evaluates a `scope = <expr>` value once per call.
pub fn scope<S: Display + ?Sized>(value: &S) -> Result<Scope, Error> {
    Scope::new(value.to_string())
}

/// A call's scope, or why its `scope = <expr>` is not one.
pub type CallScope = Result<Scope, Error>;

/// The default scope, `"global"`: a `static`, which a call borrows rather than writes.
pub use crate::identity::DEFAULT_SCOPE as GLOBAL_SCOPE;

/// A `scope = "literal"`, validated by the macro at compile time, for a `static`.
pub const fn static_scope(value: &'static str) -> CallScope {
    Ok(Scope::from_static(value))
}

/// Whether a constant count is within `min..=max` (checked at compile time).
pub const fn count_within(value: u32, min: u32, max: u32) -> bool {
    min <= value && value <= max
}

/// Whether a constant number is within `min..=max` (checked at compile time; NaN never is).
pub const fn number_within(value: f64, min: f64, max: f64) -> bool {
    min <= value && value <= max
}

/// Whether a constant `name` or `operation` is a valid identity part (checked at compile
/// time): the rule `Scope::new` applies at run time, non-blank and at most 1024 bytes.
pub const fn valid_part(value: &str) -> bool {
    value.len() <= MAX_PART_BYTES && !blank(value)
}

/// `value.trim().is_empty()`, which is not a `const fn`: every character is whitespace.
const fn blank(value: &str) -> bool {
    let bytes = value.as_bytes();
    let mut at = 0;
    while at < bytes.len() {
        // UTF-8: the lead byte gives the length; each continuation byte carries 6 bits.
        let lead = bytes[at];
        let (len, mut code) = match lead {
            0x00..0x80 => (1, lead as u32),
            0xC0..0xE0 => (2, (lead & 0x1F) as u32),
            0xE0..0xF0 => (3, (lead & 0x0F) as u32),
            _ => (4, (lead & 0x07) as u32),
        };
        let mut next = 1;
        while next < len {
            code = (code << 6) | (bytes[at + next] & 0x3F) as u32;
            next += 1;
        }
        match char::from_u32(code) {
            Some(c) if c.is_whitespace() => at += len,
            _ => return false,
        }
    }
    true
}

// The error type check. A guarded function's `E` must implement `From<caracal::Error>`; every
// layer requires it, so a type without it would be reported once per layer, each time listing
// every `From` impl the type does have and naming a function of this module. Instead the
// expansion picks a witness by autoref specialisation: `(&Probe::<R>(PhantomData)).witness()` is
// `Checked<R>` when `R` is a `Result` whose `E` implements `From<caracal::Error>`, and
// `NoFromCaracalError<R>` otherwise. Only a `Checked` passes `require` (one error, saying what to
// write), and with the other the pipeline runs on a stand-in error type that does implement
// `From`, so no layer adds an error of its own.

/// Asks whether `R`'s error type implements `From<caracal::Error>`.
pub struct Probe<R>(pub PhantomData<R>);

/// `R` is a `Result` whose error type implements `From<caracal::Error>`.
pub struct Checked<R>(PhantomData<R>);

/// `R` is not a `Result` whose error type implements `From<caracal::Error>`.
pub struct NoFromCaracalError<R>(PhantomData<R>);

/// The witness when the error type implements `From<caracal::Error>` (found first: it takes
/// the probe by reference).
pub trait ProbeChecked<R> {
    /// See the module's note on the error type check.
    fn witness(&self) -> Checked<R>;
}

impl<T, E: From<Error>> ProbeChecked<Result<T, E>> for Probe<Result<T, E>> {
    fn witness(&self) -> Checked<Result<T, E>> {
        Checked(PhantomData)
    }
}

/// The witness otherwise (found second: it takes the probe by a reference to a reference).
pub trait ProbeUnchecked<R> {
    /// See the module's note on the error type check.
    fn witness(&self) -> NoFromCaracalError<R>;
}

impl<R> ProbeUnchecked<R> for &Probe<R> {
    fn witness(&self) -> NoFromCaracalError<R> {
        NoFromCaracalError(PhantomData)
    }
}

/// Fails to compile, with a message saying what to write, unless the function's error type
/// implements `From<caracal::Error>`.
#[diagnostic::on_unimplemented(
    message = "a function with caracal attributes needs an error type `E` with `From<caracal::Error>`",
    label = "this `Result`'s error type does not implement `From<caracal::Error>`",
    note = "rejections are returned as `Err(E::from(caracal::Error))`: give `E` a variant holding a `caracal::Error` and `impl From<caracal::Error> for E` (with thiserror: `#[error(transparent)] Resilience(#[from] caracal::Error)`)"
)]
pub trait Accepted {}

#[diagnostic::do_not_recommend]
impl<R> Accepted for Checked<R> {}

/// The witness, once [`Accepted`].
pub const fn require<W: Accepted>(witness: W) -> W {
    witness
}

/// The result type the pipeline runs on: the function's own once checked, a stand-in otherwise.
pub trait Witness<R> {
    /// The pipeline's result type.
    type Pipeline;
    /// The body's future as the pipeline runs it: the body itself once checked, so it costs
    /// no future around it.
    type Body<F: Future<Output = R>>: Future<Output = Self::Pipeline>;
    /// The body into the pipeline.
    fn body<F: Future<Output = R>>(body: F) -> Self::Body<F>;
    /// A result into the pipeline.
    fn enter(result: R) -> Self::Pipeline;
    /// Out of the pipeline.
    fn leave(result: Self::Pipeline) -> R;
}

impl<R> Witness<R> for Checked<R> {
    type Pipeline = R;
    type Body<F: Future<Output = R>> = F;
    fn body<F: Future<Output = R>>(body: F) -> F {
        body
    }
    fn enter(result: R) -> R {
        result
    }
    fn leave(result: R) -> R {
        result
    }
}

/// The stand-in error type of a function whose own cannot carry rejections. Such a function
/// does not compile, so no value of it ever exists.
#[derive(Debug)]
pub enum Unconvertible {}

impl From<Error> for Unconvertible {
    fn from(_: Error) -> Self {
        unreachable!("a function whose error type lacks From<caracal::Error> does not compile")
    }
}

impl<R, O> Witness<O> for NoFromCaracalError<R> {
    type Pipeline = Result<(), Unconvertible>;
    type Body<F: Future<Output = O>> = std::future::Ready<Self::Pipeline>;
    fn body<F: Future<Output = O>>(_: F) -> Self::Body<F> {
        unreachable!("a function whose error type lacks From<caracal::Error> does not compile")
    }
    fn enter(_: O) -> Self::Pipeline {
        unreachable!("a function whose error type lacks From<caracal::Error> does not compile")
    }
    fn leave(_: Self::Pipeline) -> O {
        unreachable!("a function whose error type lacks From<caracal::Error> does not compile")
    }
}

/// The function's body as the pipeline runs it.
pub fn body<R, W: Witness<R>, F: Future<Output = R>>(_: &W, body: F) -> W::Body<F> {
    W::body(body)
}

/// `future` (a fallback handler's), with its result taken into the pipeline: a handler of the
/// wrong type is one error, at this bound.
pub fn enter<R, W: Witness<R>>(
    _: &W,
    future: impl Future<Output = R>,
) -> impl Future<Output = W::Pipeline> {
    future.map(W::enter)
}

/// The pipeline's result, as the function's.
pub fn leave<R, W: Witness<R>>(_: &W, result: W::Pipeline) -> R {
    W::leave(result)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::check_part;

    #[test]
    fn the_compile_time_part_check_is_the_run_time_one() {
        let long = "x".repeat(MAX_PART_BYTES + 1);
        for part in [
            "",
            " ",
            "\t\n",
            "\u{3000}\u{a0}",
            "\u{85}",
            "api",
            " api ",
            "é",
            "\u{3000}x",
            "🦀",
            &long,
            &long[1..],
        ] {
            assert_eq!(valid_part(part), check_part(part).is_ok(), "{part:?}");
        }
    }
}
