//! The arguments shared by the coordinated policies (`#[bulkhead]`, `#[circuit_breaker]`,
//! `#[rate_limit]`): `name`, `operation`, `scope` and `local`.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, Lit};

use crate::args::{self, Args};

/// The keys parsed here.
pub(crate) const ARGS: &[&str] = &["name", "operation", "scope", "local"];

/// The longest identity part, in UTF-8 bytes (as the runtime checks for run-time scopes).
const MAX_PART_BYTES: usize = 1024;

/// Who shares a budget or a breaker with whom.
pub(crate) struct Identity {
    name: String,
    operation: String,
    scope: Scope,
    pub(crate) local: bool,
}

enum Scope {
    Global,
    /// A literal, validated here so it costs nothing per call.
    Static(String),
    /// Evaluated once per call.
    Dynamic(Expr),
}

impl Identity {
    /// Reads the shared arguments; `function` is the default `name`.
    pub(crate) fn parse(args: &mut Args, function: &str) -> Self {
        let name = args
            .get("name", part)
            .unwrap_or_else(|| function.to_owned());
        let operation = args.get("operation", part).unwrap_or_else(|| name.clone());
        let scope = args
            .get("scope", |key, value| match value {
                Expr::Lit(ExprLit {
                    lit: Lit::Str(_), ..
                }) => part(key, value).map(Scope::Static),
                _ => Ok(Scope::Dynamic(value.clone())),
            })
            .unwrap_or(Scope::Global);
        let local = args.flag("local");
        Identity {
            name,
            operation,
            scope,
            local,
        }
    }

    /// The `name`, `operation` and `local` fields of the policy's config struct.
    pub(crate) fn fields(&self) -> TokenStream {
        let Identity {
            name,
            operation,
            local,
            ..
        } = self;
        quote!(name: #name, operation: #operation, local: #local,)
    }

    /// The expression evaluating the scope, once per call.
    pub(crate) fn scope(&self) -> TokenStream {
        match &self.scope {
            Scope::Global => quote!(::caracal::__private::global_scope()),
            Scope::Static(scope) => quote!(::caracal::__private::static_scope(#scope)),
            // Spanned on the expression, so "doesn't implement `Display`" points at it.
            Scope::Dynamic(expr) => {
                quote_spanned!(expr.span()=> ::caracal::__private::scope(&(#expr)))
            }
        }
    }
}

/// A non-blank string literal of at most [`MAX_PART_BYTES`].
fn part(key: &str, value: &Expr) -> syn::Result<String> {
    let literal = args::string(key, value)?;
    let text = literal.value();
    if text.trim().is_empty() {
        Err(syn::Error::new_spanned(
            &literal,
            format!("`{key}` must not be blank"),
        ))
    } else if text.len() > MAX_PART_BYTES {
        Err(syn::Error::new_spanned(
            &literal,
            format!(
                "`{key}` must be at most {MAX_PART_BYTES} bytes; this one has {}",
                text.len()
            ),
        ))
    } else {
        Ok(text)
    }
}
