//! Per-call state shared by the layers of one guarded call.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use crate::error::Error;
use crate::error::Refusal;
use crate::identity::Scope;
use crate::sync::lock;

/// Which caracal rejection, if any, produced the current attempt's `Err`.
///
/// A guarded function's error type is the user's `E`, so once a rejection is converted with
/// `E::from` an outer layer can no longer tell it apart from the body's own errors. The layer
/// that rejects records it here; the retry layer clears it before each attempt, so an outer
/// layer reading it after the call sees the rejection that ended the last attempt, if any.
///
/// The rejecting [`Error`] itself is kept too, for a `#[fallback]` handler: by the time the
/// fallback layer sees the `Err`, it is the user's `E`, from which the original cannot be had
/// back. The kind stays in an atomic of its own, so the layers that only ask which kind it was
/// (the breaker on every call, the retry on every failure) never take the lock.
#[derive(Debug)]
pub struct CallCtx {
    /// Whether a layer may read what the others record: not in [`CallCtx::unread`].
    recorded: bool,
    rejection: AtomicU8,
    error: Mutex<Option<Error>>,
    /// What an outer layer says of each further attempt (see [`Gate`]).
    // A lock rather than a `OnceLock`: setting a `OnceLock` cost a guarded call more than the
    // rest of its retry budget's first attempt.
    gate: Mutex<Option<Gated>>,
    /// Whether the call's first attempt was settled with its gate (deposited, or found refused).
    deposited: AtomicBool,
}

impl Default for CallCtx {
    fn default() -> Self {
        Self::new()
    }
}

/// A call's gate: one its layer keeps for the program's life (shared by every call, so a call
/// costs no allocation for it), or one made for the call.
#[derive(Debug)]
pub(crate) enum Gated {
    Kept(&'static dyn Gate),
    Made(Box<dyn Gate>),
}

impl Gated {
    /// Counts the call's first attempt.
    pub(crate) fn deposit(&self) {
        self.gate().deposit();
    }

    /// Whether another attempt may run.
    pub(crate) fn another(&self) -> bool {
        self.gate().another()
    }

    fn gate(&self) -> &dyn Gate {
        match self {
            Gated::Kept(gate) => *gate,
            Gated::Made(gate) => &**gate,
        }
    }
}

/// Whether another attempt of a call may run: installed in the call's context by a layer
/// outside the retry loop, and asked by that loop before each attempt after the first. A gate
/// saying no ends the call with the last attempt's result; saying so (an event) is the gate's.
pub(crate) trait Gate: Send + Sync + std::fmt::Debug {
    /// Told once, when the call's first attempt reached the downstream.
    fn deposit(&self);

    /// Asked once per further attempt, which runs only if this says yes.
    fn another(&self) -> bool;

    /// The name of the budget it draws from, which a `#[hedge]` naming it shares.
    fn budget(&self) -> &str;
}

/// The rejection that ended an attempt, taken out of the context by a layer that runs
/// attempts side by side (a hedge), and put back if that attempt's result becomes the call's.
#[derive(Debug)]
pub(crate) struct Taken {
    rejection: Rejection,
    error: Error,
}

impl Taken {
    /// Whether the attempt reached the downstream (a budget counts it as a first attempt):
    /// see [`CallCtx::deposit_first`].
    pub(crate) fn reached(taken: Option<&Taken>) -> bool {
        taken.is_none_or(|taken| taken.rejection == Rejection::Cut)
    }
}

/// The rejections an outer layer distinguishes (part of the macro contract, not a public API).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[doc(hidden)]
pub enum Rejection {
    /// Not admitted by a bulkhead or rate limit: the call never started.
    Admission,
    /// Admitted, then cut short by caracal (lease lost, timeout).
    Cut,
    /// The coordinator failed (the admission or the call's fate is unknown).
    Coordinator,
    /// Refused before anything was attempted (open circuit, usage errors).
    Refused,
}

impl Rejection {
    fn of(error: &Error) -> Self {
        match error.refusal() {
            Refusal::Admission => Rejection::Admission,
            Refusal::Cut => Rejection::Cut,
            Refusal::Coordinator => Rejection::Coordinator,
            Refusal::Protection | Refusal::Mistake => Rejection::Refused,
        }
    }

    fn code(self) -> u8 {
        match self {
            Rejection::Admission => 1,
            Rejection::Cut => 2,
            Rejection::Coordinator => 3,
            Rejection::Refused => 4,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(Rejection::Admission),
            2 => Some(Rejection::Cut),
            3 => Some(Rejection::Coordinator),
            4 => Some(Rejection::Refused),
            _ => None,
        }
    }
}

impl CallCtx {
    /// A fresh context for one call.
    pub const fn new() -> Self {
        Self::recording(true)
    }

    const fn recording(recorded: bool) -> Self {
        CallCtx {
            recorded,
            rejection: AtomicU8::new(0),
            error: Mutex::new(None),
            gate: Mutex::new(None),
            deposited: AtomicBool::new(false),
        }
    }

    /// The context of a call guarded by one layer that needs none of its own (a bulkhead, a
    /// rate limit, a breaker or a timeout alone on a function, or as a tower layer): each writes
    /// there only its own rejection, for layers outside it, of which there are none, and reads
    /// only what layers inside it record, of which there are none either. Shared by every such
    /// call, it records nothing, so the call makes and drops none (a tenth of a local
    /// bulkhead's instructions, callgrind, `bench local`). Gates and deposits are a retry
    /// budget's, which never runs on it.
    pub fn unread() -> &'static CallCtx {
        static UNREAD: CallCtx = CallCtx::recording(false);
        &UNREAD
    }

    /// Installs `gate` for the call's further attempts; a call takes one gate (the outermost
    /// layer's: it is installed first), so a later one is ignored.
    pub(crate) fn gate(&self, gate: Gated) {
        debug_assert!(
            self.recorded,
            "a gate installed in the shared, unread context"
        );
        lock(&self.gate).get_or_insert(gate);
    }

    /// Whether the call may make another attempt: yes, unless its gate says no. Asked after the
    /// first attempt, it first settles that attempt's deposit, so the decision counts it.
    pub(crate) fn another_attempt(&self) -> bool {
        self.deposit_first();
        lock(&self.gate).as_ref().is_none_or(Gated::another)
    }

    /// Tells the gate of the call's first attempt, once, if it reached the downstream: asked
    /// when the first retry is (the rejection recorded then is the first attempt's), or when the
    /// call ends (then it is the only attempt's). An attempt a policy below refused before it
    /// started (a full bulkhead, a rate limit, an open breaker, a failed coordinator) cost the
    /// downstream nothing, and a budget must not count it among the calls its retries are a
    /// share of.
    pub(crate) fn deposit_first(&self) {
        if self.deposited.swap(true, Ordering::Relaxed) {
            return;
        }
        if self.rejection().is_none_or(|r| r == Rejection::Cut)
            && let Some(gate) = lock(&self.gate).as_ref()
        {
            gate.deposit();
        }
    }

    /// Claims the call's one deposit for a layer that makes it itself (a `#[hedge]` no gate of
    /// its budget gates): `true` if no deposit was settled yet, which the caller then makes. A
    /// gate's [`deposit_first`](Self::deposit_first) after it, or the same hedge run again by a
    /// retry above, finds it settled: one deposit per call.
    pub(crate) fn claim_deposit(&self) -> bool {
        !self.deposited.swap(true, Ordering::Relaxed)
    }

    /// The call's scope, or its validation error as this attempt's rejection.
    pub(crate) fn scope<'a, E: From<Error>>(
        &self,
        scope: &'a Result<Scope, Error>,
    ) -> Result<&'a Scope, E> {
        scope.as_ref().map_err(|error| self.reject(error.clone()))
    }

    /// Records `error` as the rejection that ends this attempt and converts it for the caller.
    pub(crate) fn reject<E: From<Error>>(&self, error: Error) -> E {
        let rejection = Rejection::of(&error);
        self.reject_as(error, rejection)
    }

    /// Like [`reject`](Self::reject), for an error whose kind alone would misdescribe it.
    pub(crate) fn reject_as<E: From<Error>>(&self, error: Error, rejection: Rejection) -> E {
        if self.recorded {
            *lock(&self.error) = Some(error.clone());
            self.rejection.store(rejection.code(), Ordering::Relaxed);
        }
        E::from(error)
    }

    /// The rejection that ended the last attempt, if caracal produced its `Err`.
    pub(crate) fn rejection(&self) -> Option<Rejection> {
        Rejection::from_code(self.rejection.load(Ordering::Relaxed))
    }

    /// Whether the call's gate draws from the budget `name`.
    pub(crate) fn gated_by(&self, name: &str) -> bool {
        lock(&self.gate)
            .as_ref()
            .is_some_and(|gate| gate.gate().budget() == name)
    }

    /// The rejection that ended the attempt which just returned, if caracal's, taken out.
    pub(crate) fn take_rejection(&self) -> Option<Taken> {
        let rejection = self.rejection()?;
        let error = self.take_if(|_| true)?;
        Some(Taken { rejection, error })
    }

    /// Makes `taken` (or no rejection) the one that ended the last attempt.
    pub(crate) fn put_back(&self, taken: Option<Taken>) {
        match taken {
            Some(Taken { rejection, error }) => {
                self.reject_as::<Error>(error, rejection);
            }
            None => self.clear(),
        }
    }

    /// Forgets the previous attempt's rejection (a new attempt starts).
    pub(crate) fn clear(&self) {
        self.take_if(|_| true);
    }

    /// The error of the rejection that ended the last attempt if `wanted` accepts it, then
    /// forgotten: whoever takes it (a fallback) turns the call's result into one of its own,
    /// no longer caracal's rejection. One it does not want stays for the outer layers.
    pub(crate) fn take_if(&self, wanted: impl FnOnce(&Error) -> bool) -> Option<Error> {
        // Only a rejection stores an error, so a call without one never touches the lock.
        if self.rejection.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let mut error = lock(&self.error);
        if !error.as_ref().is_some_and(wanted) {
            return None;
        }
        self.rejection.store(0, Ordering::Relaxed);
        error.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shared context keeps nothing a call records: one call's rejection is never another's.
    #[test]
    fn the_unread_context_records_no_rejection() {
        let rejected: Error = CallCtx::unread().reject(Error::NotInstalled);
        assert!(matches!(rejected, Error::NotInstalled));
        assert_eq!(CallCtx::unread().rejection(), None);
        assert!(CallCtx::unread().take_if(|_| true).is_none());

        let own = CallCtx::new();
        let _: Error = own.reject(Error::NotInstalled);
        assert_eq!(own.rejection(), Some(Rejection::Refused));
    }
}
