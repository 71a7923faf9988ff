//! `#[fallback(handler)]`: a rejection by the layers inside it is answered by the handler.
//!
//! The macro calls the handler itself (it alone can name the function's arguments); this
//! decides whether it is called, and with which error.

use std::ops::ControlFlow;

use crate::ctx::CallCtx;
use crate::error::Error;
use crate::error::Refusal;
use crate::events;
use crate::identity::{FunctionIdentity, Scope};

/// The settings of one `#[fallback]` call site.
#[doc(hidden)]
#[derive(Debug)]
pub struct FallbackConfig {
    /// Who the events are about.
    pub identity: FunctionIdentity,
}

/// Whether a rejection is one a fallback answers: caracal protecting the downstream or itself
/// (full, open, limited, late, lost, or the coordinator out of reach). A scope that is not
/// valid or a coordinator that was never installed is a mistake in the program, which a
/// fallback would hide on every call; those reach the caller.
fn answers(error: &Error) -> bool {
    error.refusal() != Refusal::Mistake
}

/// Takes the result of the layers inside a `#[fallback]`: `Continue` with the rejection to
/// hand to the handler, or `Break` with the result to return as it is (a success, the body's
/// own error, or a rejection a fallback does not answer).
///
/// Once handed over, the rejection is forgotten: what the handler returns is the call's
/// outcome, which the layers outside it (a breaker, a retry) judge like the body's. `scope` is
/// the function's, for events.
#[doc(hidden)]
pub fn fallback<T, E>(
    config: &'static FallbackConfig,
    ctx: &CallCtx,
    scope: &Result<Scope, Error>,
    result: Result<T, E>,
) -> ControlFlow<Result<T, E>, Error> {
    if result.is_ok() {
        return ControlFlow::Break(result);
    }
    match ctx.take_if(answers) {
        Some(error) => {
            events::fallback_invoked(&config.identity.call("fallback", scope), error.code());
            ControlFlow::Continue(error)
        }
        None => ControlFlow::Break(result),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    static CONFIG: FallbackConfig = FallbackConfig {
        identity: FunctionIdentity {
            function: "f",
            name: "f",
            operation: "f",
        },
    };
    static SCOPE: Result<Scope, Error> = Ok(Scope::GLOBAL);

    /// The code of the error the handler would get for a call rejected with `error`.
    fn handed_over(error: Error) -> Option<&'static str> {
        let ctx = CallCtx::new();
        let rejected: Result<(), Error> = Err(ctx.reject(error));
        match fallback(&CONFIG, &ctx, &SCOPE, rejected) {
            ControlFlow::Continue(error) => Some(error.code()),
            ControlFlow::Break(_) => None,
        }
    }

    #[test]
    fn every_protective_rejection_reaches_the_handler() {
        let errors = crate::error::tests::one_of_each();
        let protective: Vec<_> = errors
            .iter()
            .filter(|error| error.refusal() != Refusal::Mistake)
            .map(Error::code)
            .collect();
        assert_eq!(protective.len(), 6, "{protective:?}");
        let codes: Vec<_> = errors.into_iter().filter_map(handed_over).collect();
        assert_eq!(codes, protective);
    }

    #[test]
    fn mistakes_in_the_program_reach_the_caller() {
        assert_eq!(handed_over(Error::NotInstalled), None);
        assert_eq!(
            handed_over(Error::InvalidScope {
                reason: "must not be blank"
            }),
            None
        );
    }

    #[test]
    fn the_body_s_own_error_and_success_pass_through() {
        let ctx = CallCtx::new();
        assert!(matches!(
            fallback(&CONFIG, &ctx, &SCOPE, Err::<(), _>("body")),
            ControlFlow::Break(Err("body"))
        ));
        assert!(matches!(
            fallback(&CONFIG, &ctx, &SCOPE, Ok::<_, ()>(1)),
            ControlFlow::Break(Ok(1))
        ));
    }

    #[test]
    fn a_handed_over_rejection_is_forgotten_and_one_passed_on_is_kept() {
        let ctx = CallCtx::new();
        let rejected: Result<(), Error> = Err(ctx.reject(Error::Timeout {
            after: Duration::from_secs(1),
        }));
        assert!(fallback(&CONFIG, &ctx, &SCOPE, rejected).is_continue());
        assert_eq!(
            ctx.rejection(),
            None,
            "the handler's result is not a rejection"
        );

        let refused: Result<(), Error> = Err(ctx.reject(Error::NotInstalled));
        assert!(fallback(&CONFIG, &ctx, &SCOPE, refused).is_break());
        assert!(ctx.rejection().is_some(), "outer layers still see it");
    }
}
