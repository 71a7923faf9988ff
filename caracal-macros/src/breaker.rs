//! `#[circuit_breaker]` settings.

use std::time::Duration;

use proc_macro2::TokenStream;
use quote::quote;
use syn::Path;

use crate::args::{self, Args, integer, number, path};
use crate::durations::{self, DAY, MILLISECOND, duration};
use crate::identity::{self, Identity};

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
        "on_coordinator_error",
        "classify",
    ],
    identity::ARGS,
];

const DEFAULT_OPEN: Duration = Duration::from_secs(30);
/// The shortest default window, so a short `open` still leaves room for enough observations.
const MIN_DEFAULT_WINDOW: Duration = Duration::from_secs(60);

pub(crate) struct Breaker {
    pub(crate) identity: Identity,
    minimum_throughput: u32,
    failure_threshold: f64,
    window_size: u32,
    window: Duration,
    open: Duration,
    half_open_probes: u32,
    half_open_successes: u32,
    probe_lease: Duration,
    fail_closed: bool,
    classify: Option<Path>,
}

impl Breaker {
    pub(crate) fn parse(mut args: Args, function: &str) -> syn::Result<Self> {
        let identity = Identity::parse(&mut args, function);
        let minimum_throughput = args
            .get("minimum_throughput", integer(1..=u32::MAX))
            .unwrap_or(20);
        let failure_threshold = args
            .get("failure_threshold", number(0.001, 0.999))
            .unwrap_or(0.5);
        let window_size = args
            .get("window_size", integer(1..=1_000_000))
            .unwrap_or(100);
        let window = args.get("window", duration(MILLISECOND, DAY));
        let open = args
            .get("open", duration(MILLISECOND, DAY))
            .unwrap_or(DEFAULT_OPEN);
        let half_open_probes = args
            .get("half_open_probes", integer(1..=10_000))
            .unwrap_or(3);
        let half_open_successes = args
            .get("half_open_successes", integer(1..=10_000))
            .unwrap_or(2);
        let probe_lease = args.get("probe_lease", duration(MILLISECOND, DAY));
        let fail_closed = args
            .get("on_coordinator_error", on_coordinator_error)
            .unwrap_or(false);
        let classify = args.get("classify", path("fn(&Result<T, E>) -> caracal::Outcome"));
        if args.all_valid() && minimum_throughput > window_size {
            // One of the two was given: the defaults (20, 100) are consistent.
            let key = if args.has("minimum_throughput") {
                "minimum_throughput"
            } else {
                "window_size"
            };
            args.conflict(
                key,
                format!(
                    "`minimum_throughput` ({minimum_throughput}) is larger than `window_size` \
                     ({window_size}): the breaker could never open"
                ),
            );
        }
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
                fail_closed,
                classify,
            })
        })
    }

    /// The call site's `static`: its type and initializer.
    pub(crate) fn site(&self) -> (TokenStream, TokenStream) {
        let identity = self.identity.fields();
        let Breaker {
            minimum_throughput,
            failure_threshold,
            window_size,
            half_open_probes,
            half_open_successes,
            ..
        } = self;
        let window = durations::tokens(self.window);
        let open = durations::tokens(self.open);
        let probe_lease = durations::tokens(self.probe_lease);
        let on_coordinator_error = if self.fail_closed {
            quote!(::caracal::__private::OnCoordinatorError::FailClosed)
        } else {
            quote!(::caracal::__private::OnCoordinatorError::FailOpen)
        };
        (
            quote!(::caracal::__private::BreakerSite),
            quote!(::caracal::__private::BreakerSite::new(::caracal::__private::BreakerConfig {
                #identity
                minimum_throughput: #minimum_throughput,
                failure_threshold: #failure_threshold,
                window_size: #window_size,
                window: #window,
                open: #open,
                half_open_probes: #half_open_probes,
                half_open_successes: #half_open_successes,
                probe_lease: #probe_lease,
                on_coordinator_error: #on_coordinator_error,
            })),
        )
    }

    /// The `classify` function, if one was given.
    pub(crate) fn classify(&self) -> Option<&Path> {
        self.classify.as_ref()
    }
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
