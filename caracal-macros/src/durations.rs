//! Duration arguments: string literals with a unit, parsed at compile time and emitted as a
//! `const`-evaluable nanosecond count.

use std::time::Duration;

use caracal_spec::{Human, Key, Type};
use proc_macro2::TokenStream;
use quote::quote;
use syn::{Expr, LitStr};

use crate::args::{self, Convert};

/// A duration argument within the bounds of `spec`, a duration key.
pub(crate) fn duration(spec: &'static Key) -> impl Convert<Duration> {
    let (min, max) = bounds(spec);
    move |key, value: &Expr| {
        let literal = args::string(key, value).map_err(|_| {
            args::wrong_type(
                key,
                r#"a duration string with a unit, like "250ms" or "2s""#,
                value,
            )
        })?;
        parse(&literal, &format!("`{key}`"), min, max)
    }
}

/// The bounds of `spec`, a duration key.
pub(crate) fn bounds(spec: &Key) -> (Duration, Duration) {
    match spec.ty {
        Type::Duration { min, max } => (min, max),
        _ => panic!("`{}` is not a duration key", spec.name),
    }
}

/// Parses `literal` as a duration within `min..=max`; `what` names it in messages.
pub(crate) fn parse(
    literal: &LitStr,
    what: &str,
    min: Duration,
    max: Duration,
) -> syn::Result<Duration> {
    let text = literal.value();
    let parsed = humantime::parse_duration(text.trim()).map_err(|error| {
        syn::Error::new_spanned(
            literal,
            format!(r#"malformed duration for {what}: {error}; write a number and a unit, like "250ms", "2s", "1m" or "1h""#),
        )
    })?;
    if (min..=max).contains(&parsed) {
        return Ok(parsed);
    }
    let range = if min.is_zero() {
        format!("at most {}", Human(max))
    } else if min == Duration::from_nanos(1) {
        format!("greater than 0 and at most {}", Human(max))
    } else {
        format!("from {} to {}", Human(min), Human(max))
    };
    Err(syn::Error::new_spanned(
        literal,
        format!("{what} must be {range}"),
    ))
}

/// The expression for `duration` in the expansion.
pub(crate) fn tokens(duration: Duration) -> TokenStream {
    // Every parsed duration is at most a day, and the defaults derived from them a few days.
    let nanos =
        u64::try_from(duration.as_nanos()).expect("durations are bounded well below u64::MAX ns");
    quote!(::caracal::__private::Duration::from_nanos(#nanos))
}

/// The expression for an optional duration.
pub(crate) fn optional_tokens(duration: Option<Duration>) -> TokenStream {
    match duration {
        Some(duration) => {
            let duration = tokens(duration);
            quote!(::core::option::Option::Some(#duration))
        }
        None => quote!(::core::option::Option::None),
    }
}
