//! `#[circuit_breaker]`: its settings, and the breaker it wraps around the layers inside it.

use std::time::Duration;

use caracal_spec::breaker as spec;
use proc_macro2::TokenStream;
use quote::{ToTokens, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Expr, Path};

use crate::args::{self, Args};
use crate::durations::{self, duration};
use crate::identity::Identity;
use crate::layer::{Frame, Kind, Layer, Place, Written, pinned, typed_fn};
use crate::values::{self, Value, boolean, integer, number};

/// The attribute.
pub(crate) const KIND: Kind = Kind {
    name: spec::KIND.name,
    parse,
};

fn parse(written: Written, function: &str) -> syn::Result<Box<dyn Layer>> {
    let args = Args::parse(&spec::KIND, written.anchor, written.args)?;
    Ok(Box::new(Breaker::parse(args, function)?))
}

struct Breaker {
    identity: Identity,
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
    shadow: bool,
    classify: Option<Path>,
    /// The compile-time check that `minimum_throughput` fits in `window_size`, when one of
    /// them is a constant.
    window_fits: Option<TokenStream>,
}

impl Breaker {
    fn parse(mut args: Args, function: &str) -> syn::Result<Self> {
        let identity = Identity::parse(&mut args, function);
        let minimum_throughput = args
            .setting(&spec::MINIMUM_THROUGHPUT, integer)
            .unwrap_or(Value::Literal(spec::MINIMUM_THROUGHPUT.default.integer()));
        let failure_threshold = args
            .setting(&spec::FAILURE_THRESHOLD, threshold)
            .unwrap_or(Value::Literal(spec::FAILURE_THRESHOLD.default.float()));
        let window_size = args
            .setting(&spec::WINDOW_SIZE, integer)
            .unwrap_or(Value::Literal(spec::WINDOW_SIZE.default.integer()));
        let window = args.setting(&spec::WINDOW, duration);
        let open = args
            .setting(&spec::OPEN, duration)
            .unwrap_or(spec::OPEN.default.duration());
        let half_open_probes = args
            .setting(&spec::HALF_OPEN_PROBES, integer)
            .unwrap_or(Value::Literal(spec::HALF_OPEN_PROBES.default.integer()));
        let half_open_successes = args
            .setting(&spec::HALF_OPEN_SUCCESSES, integer)
            .unwrap_or(Value::Literal(spec::HALF_OPEN_SUCCESSES.default.integer()));
        let probe_lease = args.setting(&spec::PROBE_LEASE, duration);
        let slow_call = args.setting(&spec::SLOW_CALL, duration);
        let slow_call_threshold = args.setting(&spec::SLOW_CALL_THRESHOLD, threshold);
        if slow_call.is_none() && args.has("slow_call_threshold") {
            args.conflict(
                "slow_call_threshold",
                "`slow_call_threshold` needs `slow_call`: say how long a call must take to count as slow, e.g. `slow_call = \"2s\"`",
            );
        }
        let fail_closed = args
            .setting(&spec::ON_COORDINATOR_ERROR, choice)
            .unwrap_or(spec::ON_COORDINATOR_ERROR.default.choice())
            == "fail_closed";
        let shadow = args
            .setting(&spec::SHADOW, boolean)
            .unwrap_or(spec::SHADOW.default.flag());
        let classify = args.function(&spec::CLASSIFY);
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
                window: window.unwrap_or_else(|| spec::WINDOW.default.derived().apply(open)),
                open,
                half_open_probes,
                half_open_successes,
                probe_lease: probe_lease
                    .unwrap_or_else(|| spec::PROBE_LEASE.default.derived().apply(open)),
                slow_call: slow_call.map(|slow_call| {
                    let threshold = slow_call_threshold
                        .unwrap_or(Value::Literal(spec::SLOW_CALL_THRESHOLD.default.float()));
                    (slow_call, threshold)
                }),
                fail_closed,
                shadow,
                classify,
                window_fits,
            })
        })
    }
}

impl Layer for Breaker {
    fn reads_ctx_alone(&self) -> bool {
        false
    }

    fn identity(&self) -> Option<&Identity> {
        Some(&self.identity)
    }

    fn site(&self, _: &Frame<'_>) -> (TokenStream, TokenStream) {
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
        let shadow = self.shadow;
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
                shadow: #shadow,
            }) }),
        )
    }

    fn wrap(&self, place: &Place, frame: &Frame<'_>, inner: TokenStream) -> TokenStream {
        let Place {
            site, scope, ctx, ..
        } = place;
        let classify = match &self.classify {
            Some(path) => typed_fn(
                path,
                frame.output,
                quote!(::core::result::Result<T, E>),
                quote!(::caracal::Outcome),
            ),
            None => quote!(::caracal::__private::ClassifyByResult),
        };
        let inner = pinned(inner);
        quote!(::caracal::__private::circuit_breaker(&#site, #ctx, #scope, #classify, #inner))
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
    let relation = &spec::THROUGHPUT_FITS;
    let message = relation
        .message(
            describe(relation.key.name, minimum),
            describe(relation.limit.name, size),
        )
        .to_string();
    let constant = match (minimum, size) {
        (Value::Literal(minimum), Value::Literal(size)) => {
            if minimum > size {
                // One of the two was given: the defaults are consistent.
                let key = if args.has(relation.key.name) {
                    relation.key.name
                } else {
                    relation.limit.name
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

/// `failure_threshold` and `slow_call_threshold`: a fraction. A literal that reads as a
/// percentage gets the fraction it probably means.
fn threshold(spec: &'static caracal_spec::Key) -> impl args::Convert<Value<f64>> {
    let caracal_spec::Type::Float { min, max, hint } = spec.ty else {
        panic!("`{}` is not a number key", spec.name)
    };
    move |key: &str, value: &Expr| {
        number(spec, hint)(key, value).map_err(|error| match values::literal_number(value) {
            Some(percent) if (2.0..100.0).contains(&percent) => syn::Error::new_spanned(
                value,
                format!(
                    "`{key}` is a fraction from {min} to {max}, not a percentage: did you mean `{}`?",
                    percent / 100.0
                ),
            ),
            _ => error,
        })
    }
}

/// One of the choices of `spec`, a choice key: `"fail_open"` or `"fail_closed"`.
fn choice(spec: &'static caracal_spec::Key) -> impl args::Convert<&'static str> {
    let caracal_spec::Type::Choice(choices) = spec.ty else {
        panic!("`{}` is not a choice key", spec.name)
    };
    move |key: &str, value: &Expr| {
        let quoted: Vec<_> = choices
            .iter()
            .map(|choice| format!("\"{choice}\""))
            .collect();
        let expected = quoted.join(" or ");
        let literal =
            args::string(key, value).map_err(|_| args::wrong_type(key, &expected, value))?;
        choices
            .iter()
            .copied()
            .find(|choice| literal.value() == *choice)
            .ok_or_else(|| syn::Error::new_spanned(literal, format!("`{key}` must be {expected}")))
    }
}
