//! `#[circuit_breaker]` settings.

use std::time::Duration;

use proc_macro2::TokenStream;
use quote::{ToTokens, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Expr, Path};

use crate::args::{self, Args, path};
use crate::durations::{self, DAY, MILLISECOND, duration};
use crate::identity::{self, Identity};
use crate::values::{self, Value, integer, number};

pub(crate) const ARGS: &[&[&str]] = &[
    &[
        "minimum_throughput",
        "failure_threshold",
        "window_size",
        "window",
        "open",
        "half_open_probes",
        "half_open_successes",
        "probe_lease",
        "slow_call",
        "slow_call_threshold",
        "on_coordinator_error",
        "classify",
    ],
    identity::ARGS,
];

const DEFAULT_MINIMUM_THROUGHPUT: u32 = 20;
const DEFAULT_WINDOW_SIZE: u32 = 100;
const DEFAULT_OPEN: Duration = Duration::from_secs(30);
/// The shortest default window, so a short `open` still leaves room for enough observations.
const MIN_DEFAULT_WINDOW: Duration = Duration::from_secs(60);

pub(crate) struct Breaker {
    pub(crate) identity: Identity,
    minimum_throughput: Value<u32>,
    failure_threshold: Value<f64>,
    window_size: Value<u32>,
    window: Duration,
    open: Duration,
    half_open_probes: Value<u32>,
    half_open_successes: Value<u32>,
    probe_lease: Duration,
    /// A call slower than this counts as slow, and the slow-call threshold.
    slow_call: Option<(Duration, Value<f64>)>,
    fail_closed: bool,
    classify: Option<Path>,
    /// The compile-time check that `minimum_throughput` fits in `window_size`, when one of
    /// them is a constant.
    window_fits: Option<TokenStream>,
}

impl Breaker {
    pub(crate) fn parse(mut args: Args, function: &str) -> syn::Result<Self> {
        let identity = Identity::parse(&mut args, function);
        let minimum_throughput = args
            .get("minimum_throughput", integer(1..=u32::MAX))
            .unwrap_or(Value::Literal(DEFAULT_MINIMUM_THROUGHPUT));
        let failure_threshold = args
            .get("failure_threshold", threshold)
            .unwrap_or(Value::Literal(0.5));
        let window_size = args
            .get("window_size", integer(1..=1_000_000))
            .unwrap_or(Value::Literal(DEFAULT_WINDOW_SIZE));
        let window = args.get("window", duration(MILLISECOND, DAY));
        let open = args
            .get("open", duration(MILLISECOND, DAY))
            .unwrap_or(DEFAULT_OPEN);
        let half_open_probes = args
            .get("half_open_probes", integer(1..=10_000))
            .unwrap_or(Value::Literal(3));
        let half_open_successes = args
            .get("half_open_successes", integer(1..=10_000))
            .unwrap_or(Value::Literal(2));
        let probe_lease = args.get("probe_lease", duration(MILLISECOND, DAY));
        let slow_call = args.get("slow_call", duration(MILLISECOND, DAY));
        let slow_call_threshold = args.get("slow_call_threshold", threshold);
        if slow_call.is_none() && args.has("slow_call_threshold") {
            args.conflict(
                "slow_call_threshold",
                "`slow_call_threshold` needs `slow_call`: say how long a call must take to count as slow, e.g. `slow_call = \"2s\"`",
            );
        }
        let fail_closed = args
            .get("on_coordinator_error", on_coordinator_error)
            .unwrap_or(false);
        let classify = args.get("classify", path("fn(&Result<T, E>) -> caracal::Outcome"));
        if identity.local && args.has("on_coordinator_error") {
            args.conflict(
                "on_coordinator_error",
                "`on_coordinator_error` has no effect on a `local` circuit breaker: it never asks the coordinator",
            );
        }
        let window_fits = args
            .all_valid()
            .then(|| window_fits(&mut args, &minimum_throughput, &window_size))
            .flatten();
        args.finish(|| {
            Some(Breaker {
                identity,
                minimum_throughput,
                failure_threshold,
                window_size,
                window: window.unwrap_or_else(|| (open * 3).max(MIN_DEFAULT_WINDOW)),
                open,
                half_open_probes,
                half_open_successes,
                probe_lease: probe_lease.unwrap_or(open * 2),
                slow_call: slow_call.map(|slow_call| {
                    let threshold = slow_call_threshold.unwrap_or(Value::Literal(0.5));
                    (slow_call, threshold)
                }),
                fail_closed,
                classify,
                window_fits,
            })
        })
    }

    /// The call site's `static`: its type and initializer.
    pub(crate) fn site(&self) -> (TokenStream, TokenStream) {
        let identity = self.identity.fields();
        let minimum_throughput = self.minimum_throughput.tokens();
        let failure_threshold = self.failure_threshold.tokens();
        let window_size = self.window_size.tokens();
        let half_open_probes = self.half_open_probes.tokens();
        let half_open_successes = self.half_open_successes.tokens();
        let window_fits = &self.window_fits;
        let window = durations::tokens(self.window);
        let open = durations::tokens(self.open);
        let probe_lease = durations::tokens(self.probe_lease);
        let slow_call = match &self.slow_call {
            Some((slow_call, threshold)) => {
                let slow_call = durations::tokens(*slow_call);
                let threshold = threshold.tokens();
                quote!(::core::option::Option::Some(::caracal::__private::SlowCall {
                    after: #slow_call,
                    threshold: #threshold,
                }))
            }
            None => quote!(::core::option::Option::None),
        };
        let on_coordinator_error = if self.fail_closed {
            quote!(::caracal::__private::OnCoordinatorError::FailClosed)
        } else {
            quote!(::caracal::__private::OnCoordinatorError::FailOpen)
        };
        (
            quote!(::caracal::__private::BreakerSite),
            quote!({ #window_fits ::caracal::__private::BreakerSite::new(::caracal::__private::BreakerConfig {
                #identity
                minimum_throughput: #minimum_throughput,
                failure_threshold: #failure_threshold,
                window_size: #window_size,
                window: #window,
                open: #open,
                half_open_probes: #half_open_probes,
                half_open_successes: #half_open_successes,
                probe_lease: #probe_lease,
                slow_call: #slow_call,
                on_coordinator_error: #on_coordinator_error,
            }) }),
        )
    }

    /// The `classify` function, if one was given.
    pub(crate) fn classify(&self) -> Option<&Path> {
        self.classify.as_ref()
    }
}

/// Checks that `minimum_throughput` is at most `window_size`, or the breaker could never open:
/// here for two literals, or as an assertion the expansion carries when one is a constant.
fn window_fits(args: &mut Args, minimum: &Value<u32>, size: &Value<u32>) -> Option<TokenStream> {
    let describe = |key, value: &Value<u32>| match value {
        Value::Literal(n) if args.has(key) => n.to_string(),
        Value::Literal(n) => format!("{n} by default"),
        Value::Const(constant) => format!("`{}`", constant.expr().to_token_stream()),
    };
    let message = format!(
        "`minimum_throughput` ({}) is larger than `window_size` ({}): the breaker could never open",
        describe("minimum_throughput", minimum),
        describe("window_size", size),
    );
    let constant = match (minimum, size) {
        (Value::Literal(minimum), Value::Literal(size)) => {
            if minimum > size {
                // One of the two was given: the defaults are consistent.
                let key = if args.has("minimum_throughput") {
                    "minimum_throughput"
                } else {
                    "window_size"
                };
                args.conflict(key, message);
            }
            return None;
        }
        (Value::Const(constant), _) | (_, Value::Const(constant)) => constant.expr(),
    };
    // Untyped, so a constant of the wrong type is reported once, where it is used.
    let operand = |value: &Value<u32>| match value {
        Value::Literal(n) => proc_macro2::Literal::u32_unsuffixed(*n).into_token_stream(),
        Value::Const(constant) => constant.expr().to_token_stream(),
    };
    let (minimum, size) = (operand(minimum), operand(size));
    Some(quote_spanned! {constant.span()=>
        ::core::assert!((#minimum) <= (#size), #message);
    })
}

/// `failure_threshold` and `slow_call_threshold`: a fraction. A literal that reads as a percentage gets the fraction it
/// probably means.
fn threshold(key: &str, value: &Expr) -> syn::Result<Value<f64>> {
    let (min, max) = (0.001, 0.999);
    number(min, max, " (a fraction: 0.5 is half the observations)")(key, value).map_err(|error| {
        match values::literal_number(value) {
            Some(percent) if (2.0..100.0).contains(&percent) => syn::Error::new_spanned(
                value,
                format!(
                    "`{key}` is a fraction from {min} to {max}, not a percentage: did you mean `{}`?",
                    percent / 100.0
                ),
            ),
            _ => error,
        }
    })
}

/// `"fail_open"` (false) or `"fail_closed"` (true).
fn on_coordinator_error(key: &str, value: &syn::Expr) -> syn::Result<bool> {
    let expected = r#""fail_open" or "fail_closed""#;
    let literal = args::string(key, value).map_err(|_| args::wrong_type(key, expected, value))?;
    match literal.value().as_str() {
        "fail_open" => Ok(false),
        "fail_closed" => Ok(true),
        _ => Err(syn::Error::new_spanned(
            literal,
            format!("`{key}` must be {expected}"),
        )),
    }
}
