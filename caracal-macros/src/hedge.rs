//! `#[hedge]`: its settings, and the attempts it runs the layers inside it as.

use std::time::Duration;

use caracal_spec::hedge as spec;
use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::{Expr, ExprPath};

use crate::args::{self, Args, Convert};
use crate::durations::{self, duration};
use crate::identity::Identity;
use crate::layer::{Frame, Kind, Layer, Place, Written};
use crate::values::{self, Value, integer};

/// The attribute.
pub(crate) const KIND: Kind = Kind {
    name: spec::KIND.name,
    parse,
};

fn parse(written: Written, function: &str) -> syn::Result<Box<dyn Layer>> {
    let mut args = Args::parse(&spec::KIND, written.anchor, written.args)?;
    let identity = Identity::parse(&mut args, function);
    let delay = args.required(&spec::DELAY, delay);
    let max_extra = args
        .setting(&spec::MAX_EXTRA, integer)
        .unwrap_or(Value::Literal(spec::MAX_EXTRA.default.integer()));
    let floor = args.setting(&spec::MIN_DELAY, duration);
    let ceiling = args.setting(&spec::MAX_DELAY, duration);
    let budget = args.get(spec::BUDGET.name, values::part);
    if args.all_valid() {
        check_bounds(&mut args, delay.as_ref(), floor, ceiling);
    }
    let span = written.span;
    let function = function.to_owned();
    args.finish(|| {
        let delay = match delay? {
            Given::Fixed(delay) => Delay::Fixed(delay),
            Given::Percentile(per_mille) => Delay::Percentile {
                per_mille,
                floor: floor.unwrap_or(spec::MIN_DELAY.default.duration()),
                ceiling: ceiling.unwrap_or(spec::MAX_DELAY.default.duration()),
            },
        };
        Some(Box::new(Hedge {
            identity,
            function,
            delay,
            max_extra,
            budget,
            span,
        }) as Box<dyn Layer>)
    })
}

/// `delay` as written: a duration, or a fleet percentile.
enum Given {
    Fixed(Duration),
    /// In thousandths: `p95` is 950.
    Percentile(u16),
}

/// Reads `delay`: a duration string, or `p50`…`p99`.
fn delay(key: &'static caracal_spec::Key) -> impl Convert<Given> {
    let fixed = duration(key);
    move |name, value: &Expr| {
        let Expr::Path(ExprPath { path, .. }) = value else {
            return fixed(name, value).map(Given::Fixed);
        };
        let usage = format!(
            "a duration string with a unit (`\"50ms\"`) or a percentile of the fleet's \
             latency, `p{}` to `p{}`",
            spec::MIN_PERCENTILE,
            spec::MAX_PERCENTILE
        );
        let percentile = path
            .get_ident()
            .and_then(|ident| ident.to_string().strip_prefix('p')?.parse::<u16>().ok())
            .filter(|n| (spec::MIN_PERCENTILE..=spec::MAX_PERCENTILE).contains(n));
        match percentile {
            Some(percentile) => Ok(Given::Percentile(percentile * 10)),
            None => Err(args::wrong_type(name, usage, value)),
        }
    }
}

/// `min_delay` and `max_delay` bound a percentile, in order; a fixed delay has no use for them.
fn check_bounds(
    args: &mut Args,
    delay: Option<&Given>,
    floor: Option<Duration>,
    ceiling: Option<Duration>,
) {
    if let Some(Given::Fixed(_)) = delay {
        for key in [&spec::MIN_DELAY, &spec::MAX_DELAY] {
            args.conflict(
                key.name,
                format!(
                    "`{}` bounds a percentile `delay` (`delay = p95`); a fixed delay is used as \
                     written",
                    key.name
                ),
            );
        }
        return;
    }
    let floor = floor.unwrap_or(spec::MIN_DELAY.default.duration());
    let ceiling = ceiling.unwrap_or(spec::MAX_DELAY.default.duration());
    if floor > ceiling {
        let relation = &spec::DELAYS_ORDERED;
        let key = if args.has(relation.key.name) {
            relation.key.name
        } else {
            relation.limit.name
        };
        args.conflict(
            key,
            relation.message(caracal_spec::Human(floor), caracal_spec::Human(ceiling)),
        );
    }
}

enum Delay {
    Fixed(Duration),
    Percentile {
        per_mille: u16,
        floor: Duration,
        ceiling: Duration,
    },
}

struct Hedge {
    identity: Identity,
    function: String,
    delay: Delay,
    max_extra: Value<u32>,
    budget: Option<Value<String>>,
    /// The attribute's name: where the body is run again from.
    span: Span,
}

impl Layer for Hedge {
    fn identity(&self) -> Option<&Identity> {
        Some(&self.identity)
    }

    fn site(&self, _: &Frame<'_>) -> (TokenStream, TokenStream) {
        let identity = self.identity.of_call(&self.function);
        let delay = match &self.delay {
            Delay::Fixed(delay) => {
                let delay = durations::tokens(*delay);
                quote!(::caracal::__private::Delay::Fixed(#delay))
            }
            Delay::Percentile {
                per_mille,
                floor,
                ceiling,
            } => {
                let floor = durations::tokens(*floor);
                let ceiling = durations::tokens(*ceiling);
                quote!(::caracal::__private::Delay::Percentile {
                    per_mille: #per_mille,
                    floor: #floor,
                    ceiling: #ceiling,
                })
            }
        };
        let max_extra = self.max_extra.tokens();
        let budget = match &self.budget {
            Some(budget) => {
                let budget = budget.tokens();
                quote!(::core::option::Option::Some(#budget))
            }
            None => quote!(::core::option::Option::None),
        };
        let local = self.identity.local;
        (
            quote!(::caracal::__private::HedgeSite),
            quote!(::caracal::__private::HedgeSite::new(
                ::caracal::__private::HedgeConfig {
                    identity: #identity,
                    delay: #delay,
                    max_extra: #max_extra,
                    budget: #budget,
                    local: #local,
                }
            )),
        )
    }

    fn wrap(&self, place: &Place, _: &Frame<'_>, inner: TokenStream) -> TokenStream {
        let Place {
            site, scope, ctx, ..
        } = place;
        // A closure making each attempt's future; the `async` block holds what the layers
        // inside pin, so every attempt owns its own.
        quote!(::caracal::__private::hedge(&#site, #ctx, #scope, || async { #inner.await }))
    }

    fn retry_span(&self) -> Option<Span> {
        Some(self.span)
    }
}
