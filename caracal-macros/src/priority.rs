//! What `#[bulkhead]` and `#[rate_limit]` take about priorities: `thresholds(normal = …,
//! sheddable = …)`, the shares of the limit below `Critical`, fixed in the site's `static`; and
//! `priority = expr`, the call's class, evaluated once per call.

use caracal_spec::{Key, THRESHOLDS_NORMAL, THRESHOLDS_ORDERED, THRESHOLDS_SHEDDABLE, Type};
use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::Expr;
use syn::spanned::Spanned;

use crate::args::Args;
use crate::layer::Place;
use crate::values::literal_number;

/// How `thresholds` is written, for messages.
const EXAMPLE: &str = "thresholds(normal = 0.8, sheddable = 0.5)";

/// Thousandths in a whole limit, as `caracal::Thresholds` keeps shares.
const WHOLE: f64 = 1000.0;

/// The shares of the limit `Normal` and `Sheddable` calls may use, in thousandths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Thresholds {
    normal: u16,
    sheddable: u16,
}

impl Thresholds {
    /// Every class up to the whole limit: no `thresholds`.
    const NONE: Thresholds = Thresholds {
        normal: WHOLE as u16,
        sheddable: WHOLE as u16,
    };

    /// Reads `thresholds(…)`: each member a class below `Critical`, once, a share literal in
    /// the spec's bounds; `sheddable` at most `normal`. Absent, every class has the whole limit.
    pub(crate) fn parse(args: &mut Args) -> Self {
        let group = THRESHOLDS_NORMAL.argument();
        let Some(members) = args.members(group, EXAMPLE) else {
            return Thresholds::NONE;
        };
        let mut thresholds = Thresholds::NONE;
        let mut given: Vec<&str> = Vec::new();
        let mut written = [None, None];
        for (name, value) in members {
            let class = name.to_string();
            let found = [&THRESHOLDS_NORMAL, &THRESHOLDS_SHEDDABLE]
                .into_iter()
                .enumerate()
                .find(|(_, key)| key.group().is_some_and(|(_, member)| member == class));
            let Some((at, key)) = found else {
                let why = if class == "critical" {
                    "`critical` calls always have the whole limit: it is not a threshold; \
                     `thresholds` takes `normal` and `sheddable`"
                        .to_owned()
                } else {
                    format!(
                        "unknown class `{class}` in `thresholds`: it takes `normal` and \
                         `sheddable`, like `{EXAMPLE}`"
                    )
                };
                args.error(syn::Error::new_spanned(name, why));
                continue;
            };
            if given.contains(&key.name) {
                args.error(syn::Error::new_spanned(
                    name,
                    format!("`{class}` is given twice in `thresholds`"),
                ));
                continue;
            }
            given.push(key.name);
            match share(key, &value) {
                Ok(share) => {
                    written[at] = Some((share, value));
                    let thousandths = thousandths(share);
                    match at {
                        0 => thresholds.normal = thousandths,
                        _ => thresholds.sheddable = thousandths,
                    }
                }
                Err(error) => args.error(error),
            }
        }
        // Only both written can be out of order: a `sheddable` left out (the whole limit) is
        // `normal`'s.
        if let [Some((normal, _)), Some((sheddable, value))] = &written
            && thresholds.sheddable > thresholds.normal
        {
            args.error(syn::Error::new_spanned(
                value,
                THRESHOLDS_ORDERED.message(sheddable, normal).to_string(),
            ));
        }
        thresholds
    }

    /// The `caracal::Thresholds` in the site's config.
    pub(crate) fn tokens(self) -> TokenStream {
        if self == Thresholds::NONE {
            return quote!(::caracal::Thresholds::NONE);
        }
        let Thresholds { normal, sheddable } = self;
        quote!(::caracal::Thresholds::from_thousandths(#normal, #sheddable))
    }
}

/// A share literal within `key`'s bounds.
fn share(key: &'static Key, value: &Expr) -> syn::Result<f64> {
    let Type::Float { min, max, .. } = key.ty else {
        panic!("`{}` is not a number key", key.name)
    };
    let (_, class) = key.group().expect("a key of the group");
    let within = literal_number(value).filter(|share| (min..=max).contains(share));
    within.ok_or_else(|| {
        syn::Error::new_spanned(
            value,
            format!(
                "`{class}` must be a share of the limit written as a number from {min} to {max} \
                 (0.8 is four fifths of it)"
            ),
        )
    })
}

/// A share as thousandths, rounded as `caracal::Thresholds::new` rounds it.
fn thousandths(share: f64) -> u16 {
    (share * WHOLE).round().clamp(1.0, WHOLE) as u16
}

/// `priority = expr`: the class of each call through the layer.
pub(crate) struct Priority(Option<Expr>);

impl Priority {
    /// Reads `priority`, any expression (checked to be a `caracal::Priority` where it is
    /// evaluated).
    pub(crate) fn parse(args: &mut Args) -> Self {
        Priority(args.get(caracal_spec::PRIORITY, |_, value| Ok(value.clone())))
    }

    /// Evaluates the expression once per call, into the layer's [`Place::priority`].
    pub(crate) fn per_call(&self, place: &Place) -> TokenStream {
        let Some(expr) = &self.0 else {
            return TokenStream::new();
        };
        let name = &place.priority;
        // Spanned on the expression, so a type mismatch points at it.
        quote_spanned!(expr.span()=> let #name: ::caracal::Priority = #expr;)
    }

    /// Whether the attribute gives the call a priority.
    pub(crate) fn is_given(&self) -> bool {
        self.0.is_some()
    }

    /// `admission` (the layer's future) run with the call's priority, when one is given: its
    /// decision and the body inside it see it, as they would inside `caracal::with_priority`.
    pub(crate) fn wrap(&self, place: &Place, admission: TokenStream) -> TokenStream {
        match &self.0 {
            Some(_) => {
                let name = &place.priority;
                quote!(::caracal::with_priority(#name, #admission))
            }
            None => admission,
        }
    }
}

#[cfg(test)]
mod tests {
    use proc_macro2::TokenStream;
    use quote::quote;

    use super::*;

    fn parsed(tokens: TokenStream) -> syn::Result<Thresholds> {
        let mut args = Args::parse(&caracal_spec::bulkhead::KIND, TokenStream::new(), tokens)?;
        let thresholds = Thresholds::parse(&mut args);
        // Read as the attribute does, for what `limit(…)` is told.
        args.get("limit", |_, _| Ok(()));
        args.finish(|| Some(thresholds))
    }

    fn error(tokens: TokenStream) -> String {
        match parsed(tokens) {
            Err(error) => error
                .into_iter()
                .map(|error| error.to_string())
                .collect::<Vec<_>>()
                .join("\n"),
            Ok(thresholds) => panic!("accepted as {thresholds:?}"),
        }
    }

    #[test]
    fn shares_become_thousandths_and_an_omitted_class_keeps_the_whole_limit() {
        let cases = [
            (quote!(), (1000, 1000)),
            (
                quote!(thresholds(normal = 0.8, sheddable = 0.5)),
                (800, 500),
            ),
            (quote!(thresholds(sheddable = 0.25)), (1000, 250)),
            (quote!(thresholds(normal = 1)), (1000, 1000)),
            (
                quote!(thresholds(normal = 0.0014, sheddable = 0.001)),
                (1, 1),
            ),
            (
                quote!(thresholds(sheddable = 0.5, normal = 0.5,)),
                (500, 500),
            ),
        ];
        for (tokens, (normal, sheddable)) in cases {
            let text = tokens.to_string();
            assert_eq!(
                parsed(tokens).expect(&text),
                Thresholds { normal, sheddable },
                "{text}"
            );
        }
        assert_eq!(
            Thresholds::NONE.tokens().to_string(),
            quote!(::caracal::Thresholds::NONE).to_string()
        );
    }

    #[test]
    fn each_mistake_is_named() {
        let cases = [
            (
                quote!(thresholds(normal = 0)),
                "`normal` must be a share of the limit written as a number from 0.001 to 1",
            ),
            (
                quote!(thresholds(sheddable = 1.5)),
                "`sheddable` must be a share",
            ),
            (
                quote!(thresholds(normal = "0.8")),
                "`normal` must be a share",
            ),
            (
                quote!(thresholds(normal = LIMIT)),
                "`normal` must be a share",
            ),
            (
                quote!(thresholds(normal = 0.5, sheddable = 0.8)),
                "`thresholds.sheddable` (0.8) is larger than `thresholds.normal` (0.5)",
            ),
            (
                quote!(thresholds(critical = 0.9)),
                "`critical` calls always have the whole limit",
            ),
            (quote!(thresholds(bulk = 0.9)), "unknown class `bulk`"),
            (
                quote!(thresholds(normal = 0.8, normal = 0.7)),
                "`normal` is given twice in `thresholds`",
            ),
            (
                quote!(thresholds(normal = 0.8), thresholds(sheddable = 0.5)),
                "duplicate argument `thresholds`",
            ),
            (quote!(thresholds = 0.8), "write `thresholds(normal = 0.8"),
            (quote!(thresholds), "write `thresholds(normal = 0.8"),
            (quote!(thresholds()), "`thresholds()` sets nothing"),
            (quote!(thresholds(0.8)), "expected `name = value`"),
            (
                quote!(limit(20)),
                "`limit` takes one value: write `limit = …`",
            ),
        ];
        for (tokens, expected) in cases {
            let text = tokens.to_string();
            let error = error(tokens);
            assert!(error.contains(expected), "{text}: {error}");
        }
    }
}
