//! Duration arguments: string literals with a unit, parsed at compile time and emitted as a
//! `const`-evaluable nanosecond count.

use std::time::Duration;

use proc_macro2::TokenStream;
use quote::quote;
use syn::{Expr, LitStr};

use crate::args::{self, Convert};

pub(crate) const MILLISECOND: Duration = Duration::from_millis(1);
/// The longest duration any argument accepts: past it a value is a typo, not a setting.
pub(crate) const DAY: Duration = Duration::from_secs(24 * 60 * 60);

/// A duration argument within `min..=max`.
pub(crate) fn duration(min: Duration, max: Duration) -> impl Convert<Duration> {
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
        format!("at most {}", human(max))
    } else if min == Duration::from_nanos(1) {
        format!("greater than 0 and at most {}", human(max))
    } else {
        format!("from {} to {}", human(min), human(max))
    };
    Err(syn::Error::new_spanned(
        literal,
        format!("{what} must be {range}"),
    ))
}

/// The duration in the largest unit that keeps it whole, as a user would write it.
fn human(duration: Duration) -> String {
    let nanos = duration.as_nanos();
    [
        (3_600_000_000_000, "h"),
        (60_000_000_000, "m"),
        (1_000_000_000, "s"),
        (1_000_000, "ms"),
        (1_000, "us"),
    ]
    .into_iter()
    .find(|(unit, _)| nanos.is_multiple_of(*unit))
    .map_or_else(
        || format!("{nanos}ns"),
        |(unit, suffix)| format!("{}{suffix}", nanos / unit),
    )
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
