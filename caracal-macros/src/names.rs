//! The names the expansion gives its own items and variables: mixed-site hygiene, so the
//! user's code can neither see nor shadow them.

use proc_macro2::Span;
use quote::format_ident;

/// A name of the expansion's own, invisible to the user's code (mixed-site hygiene), so it can
/// neither shadow nor be shadowed by an argument or a local of the same name.
pub(crate) fn hygienic(name: &str) -> syn::Ident {
    syn::Ident::new(name, Span::mixed_site())
}

/// The call site's `static` holding the settings of the layer at `index`.
pub(crate) fn site_name(index: usize) -> syn::Ident {
    format_ident!("__CARACAL_{}", index, span = Span::mixed_site())
}

/// The variable holding the scope of the coordinated layer at `index`, evaluated up front.
pub(crate) fn scope_name(index: usize) -> syn::Ident {
    format_ident!("__caracal_scope_{}", index, span = Span::mixed_site())
}

/// The variable holding the scope of the function's identity when none of its layers has an
/// identity of its own (else that layer's [`scope_name`] holds it).
pub(crate) fn function_scope_name() -> syn::Ident {
    hygienic("__caracal_function_scope")
}

/// The variable holding the priority the layer at `index` gives the call, evaluated up front.
pub(crate) fn priority_name(index: usize) -> syn::Ident {
    format_ident!("__caracal_priority_{}", index, span = Span::mixed_site())
}

/// The variable holding a reference to the call's `CallCtx`.
pub(crate) fn ctx_name() -> syn::Ident {
    hygienic("__caracal_ctx")
}

/// The variable holding the witness that the function's error type takes rejections (see
/// `caracal::__private::Probe`).
pub(crate) fn witness_name() -> syn::Ident {
    hygienic("__caracal_witness")
}
