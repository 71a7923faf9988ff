//! `#[retry_budget]`: its settings, and the deposit and gate it wraps around the `#[retry]`
//! inside it.

use caracal_spec::retry_budget as spec;
use proc_macro2::{Span, TokenStream};
use quote::quote;

use crate::args::Args;
use crate::durations::{self, duration};
use crate::identity::Identity;
use crate::layer::{Frame, Kind, Layer, Place, Written, pinned};
use crate::values::{Value, boolean, integer};

/// The attribute.
pub(crate) const KIND: Kind = Kind {
    name: spec::KIND.name,
    parse,
};

fn parse(written: Written, function: &str) -> syn::Result<Box<dyn Layer>> {
    let mut args = Args::parse(&spec::KIND, written.anchor, written.args)?;
    let identity = Identity::parse(&mut args, function);
    let percent = args.setting(&spec::PERCENT, integer);
    let min_per_second = args.setting(&spec::MIN_PER_SECOND, integer);
    let window = args
        .setting(&spec::WINDOW, duration)
        .unwrap_or(spec::WINDOW.default.duration());
    let shadow = args
        .setting(&spec::SHADOW, boolean)
        .unwrap_or(spec::SHADOW.default.flag());
    let span = written.span;
    args.finish(|| {
        Some(Box::new(Budget {
            identity,
            percent: percent.unwrap_or(Value::Literal(spec::PERCENT.default.integer())),
            min_per_second: min_per_second
                .unwrap_or(Value::Literal(spec::MIN_PER_SECOND.default.integer())),
            window,
            shadow,
            span,
        }) as Box<dyn Layer>)
    })
}

struct Budget {
    identity: Identity,
    percent: Value<u32>,
    min_per_second: Value<u32>,
    window: std::time::Duration,
    shadow: bool,
    span: Span,
}

impl Layer for Budget {
    fn identity(&self) -> Option<&Identity> {
        Some(&self.identity)
    }

    fn site(&self, _: &Frame<'_>) -> (TokenStream, TokenStream) {
        let identity = self.identity.fields();
        let percent = self.percent.tokens();
        let min_per_second = self.min_per_second.tokens();
        let window = durations::tokens(self.window);
        let shadow = self.shadow;
        (
            quote!(::caracal::__private::RetryBudgetSite),
            quote!(::caracal::__private::RetryBudgetSite::new(
                ::caracal::__private::RetryBudgetConfig {
                    #identity
                    percent: #percent,
                    min_per_second: #min_per_second,
                    window: #window,
                    shadow: #shadow,
                }
            )),
        )
    }

    fn wrap(&self, place: &Place, _: &Frame<'_>, inner: TokenStream) -> TokenStream {
        let Place {
            site, scope, ctx, ..
        } = place;
        let inner = pinned(inner);
        quote!(::caracal::__private::retry_budget(&#site, #ctx, #scope, #inner))
    }

    fn gates_retries(&self) -> Option<(&'static str, Span)> {
        Some((KIND.name, self.span))
    }
}
