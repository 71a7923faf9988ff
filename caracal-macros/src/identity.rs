//! The arguments shared by the coordinated policies (those whose spec takes
//! [`caracal_spec::IDENTITY`]): `name`, `operation`, `scope` and `local`.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, Lit};

use crate::args::Args;
use crate::names::hygienic;
use crate::values::{self, Value};

/// Who shares a budget or a breaker with whom.
pub(crate) struct Identity {
    name: Value<String>,
    operation: Value<String>,
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
    /// The identity of a function none of whose attributes say otherwise: `name` is the
    /// function's, `operation` the name, the scope global.
    pub(crate) fn of_function(function: &str) -> Self {
        Self::with(function, None, None)
    }

    /// `name` and `operation` as given, each defaulting as [`of_function`](Self::of_function)
    /// says.
    fn with(function: &str, name: Option<Value<String>>, operation: Option<Value<String>>) -> Self {
        let name = name.unwrap_or_else(|| Value::Literal(function.to_owned()));
        let operation = operation.unwrap_or_else(|| name.clone());
        Identity {
            name,
            operation,
            scope: Scope::Global,
            local: false,
        }
    }

    /// Reads the shared arguments; `function` is the default `name`.
    pub(crate) fn parse(args: &mut Args, function: &str) -> Self {
        let name = args.get("name", values::part);
        let operation = args.get("operation", values::part);
        let scope = args
            .get("scope", |key, value| match value {
                Expr::Lit(ExprLit {
                    lit: Lit::Str(literal),
                    ..
                }) => values::literal_part(key, literal).map(Scope::Static),
                _ => Ok(Scope::Dynamic(value.clone())),
            })
            .unwrap_or(Scope::Global);
        let local = args.flag("local");
        Identity {
            scope,
            local,
            ..Self::with(function, name, operation)
        }
    }

    /// The `FunctionIdentity` of `function` under this identity: what `#[retry]`,
    /// `#[timeout]` and `#[fallback]` report in their events.
    pub(crate) fn of_call(&self, function: &str) -> TokenStream {
        let name = self.name.tokens();
        let operation = self.operation.tokens();
        quote!(::caracal::__private::FunctionIdentity {
            function: #function,
            name: #name,
            operation: #operation,
        })
    }

    /// The `name`, `operation` and `local` fields of the policy's config struct.
    pub(crate) fn fields(&self) -> TokenStream {
        let name = self.name.tokens();
        let operation = self.operation.tokens();
        let local = self.local;
        quote!(name: #name, operation: #operation, local: #local,)
    }

    /// A reference to the scope, evaluated once per call: a `static` when it is a constant, so a
    /// call writes and drops nothing for it.
    pub(crate) fn scope(&self) -> TokenStream {
        match &self.scope {
            Scope::Global => quote!(&::caracal::__private::GLOBAL_SCOPE),
            Scope::Static(scope) => {
                let name = hygienic("__CARACAL_SCOPE");
                quote!({
                    static #name: ::caracal::__private::CallScope =
                        ::caracal::__private::static_scope(#scope);
                    &#name
                })
            }
            // Spanned on the expression, so "doesn't implement `Display`" points at it.
            Scope::Dynamic(expr) => {
                quote_spanned!(expr.span()=> &::caracal::__private::scope(&(#expr)))
            }
        }
    }
}
