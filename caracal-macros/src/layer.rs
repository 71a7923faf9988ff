//! What every attribute is to the pipeline: a [`Kind`] recognised on the function, whose
//! parsed settings are a [`Layer`] wrapping the layers inside it. Each attribute's file
//! defines its `KIND` and implements `Layer`; `lib.rs` registers it.

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::{Path, Type};

use crate::identity::Identity;
use crate::names::{ctx_name, hygienic, priority_name, scope_name, site_name};

/// One attribute: how it is named and how its arguments become a layer.
pub(crate) struct Kind {
    /// The attribute's name, as the user writes it.
    pub(crate) name: &'static str,
    /// Parses one attribute's settings; the `&str` is the annotated function's name.
    pub(crate) parse: fn(Written, &str) -> syn::Result<Box<dyn Layer>>,
}

impl Kind {
    /// The attribute among `kinds` that `path` names, if it is one of ours: `retry`,
    /// `caracal::retry` or `::caracal::retry`.
    pub(crate) fn of(kinds: &[&'static Kind], path: &Path) -> Option<&'static Kind> {
        let segments: Vec<_> = path.segments.iter().collect();
        let last = match segments.as_slice() {
            [last] if path.leading_colon.is_none() => last,
            [krate, last] if krate.ident == "caracal" && krate.arguments.is_none() => last,
            _ => return None,
        };
        if !last.arguments.is_none() {
            return None;
        }
        kinds.iter().copied().find(|kind| last.ident == kind.name)
    }
}

/// One caracal attribute as written on the function.
pub(crate) struct Written {
    pub(crate) kind: &'static Kind,
    /// The whole attribute, for errors about something missing from it. Empty for the
    /// attribute being expanded, whose own tokens a macro does not see: such an error then
    /// lands on the macro's call site, which is that attribute.
    pub(crate) anchor: TokenStream,
    /// Where diagnostics about the attribute's run-time shape point: its name.
    pub(crate) span: Span,
    /// What is inside its parentheses.
    pub(crate) args: TokenStream,
}

/// What every layer's code may refer to besides its own settings.
pub(crate) struct Frame<'a> {
    /// The function's return type.
    pub(crate) output: &'a Type,
    /// The function's arguments as a fallback handler receives them, if there is a fallback.
    pub(crate) arguments: &'a [TokenStream],
    /// The function's identity as the layers that guard the whole call report it (a
    /// `FunctionIdentity` expression).
    pub(crate) identity: TokenStream,
    /// The variable holding the scope of that identity, evaluated once per call.
    pub(crate) scope: syn::Ident,
}

/// Where one layer's code finds what the pipeline set up for it, by its position.
pub(crate) struct Place {
    /// The `static` holding its settings.
    pub(crate) site: syn::Ident,
    /// The variable holding its own scope (for a layer with an [`identity`](Layer::identity)).
    pub(crate) scope: syn::Ident,
    /// The variable holding a reference to the call's `CallCtx`.
    pub(crate) ctx: syn::Ident,
    /// The variable holding the priority it gives the call (for a layer that takes
    /// `priority = …`), set by its [`per_call`](Layer::per_call) statements.
    pub(crate) priority: syn::Ident,
}

impl Place {
    /// The place of the layer at `index` in the pipeline.
    fn at(index: usize) -> Self {
        Place {
            site: site_name(index),
            scope: scope_name(index),
            ctx: ctx_name(),
            priority: priority_name(index),
        }
    }
}

/// One attribute's validated settings, as a layer of the pipeline.
pub(crate) trait Layer {
    /// Whether the layer guards each attempt (innermost, wherever it is written) rather than
    /// the part of the pipeline its position gives it.
    fn per_attempt(&self) -> bool {
        false
    }

    /// The identity of a coordinated policy.
    fn identity(&self) -> Option<&Identity> {
        None
    }

    /// Whether, as the function's only layer, it needs a context of the call's own. A layer
    /// that writes there only its own rejection (for layers outside it), and reads there only
    /// what layers inside it record (alone, nothing: the body cannot reach the context), runs
    /// on a shared context that records nothing, which the call neither makes nor drops.
    fn reads_ctx_alone(&self) -> bool {
        true
    }

    /// Statements evaluated once per call before any layer runs, as the scopes are: what its
    /// [`wrap`](Self::wrap) reads from its [`Place`].
    fn per_call(&self, _: &Place) -> TokenStream {
        TokenStream::new()
    }

    /// The type and initializer of the call site's `static` holding the settings.
    fn site(&self, frame: &Frame<'_>) -> (TokenStream, TokenStream);

    /// The future that runs `inner` (a future) under this layer.
    fn wrap(&self, place: &Place, frame: &Frame<'_>, inner: TokenStream) -> TokenStream;

    /// As the outermost layer, an expression that runs `inner` (a variable holding the pinned
    /// future of the layers inside it) under this layer in the function's own future, where
    /// the layer can: its admission then costs the call no future of its own.
    fn inline(&self, _: &Place, _: &syn::Ident) -> Option<TokenStream> {
        None
    }

    /// Where errors about a fallback handler's shape point, if this is a fallback.
    fn fallback_span(&self) -> Option<Span> {
        None
    }

    /// Where a retry re-runs the body from, if this is a retry: its attribute.
    fn retry_span(&self) -> Option<Span> {
        None
    }

    /// Whether the layer decides on the further attempts of a retry inside it (a budget), and
    /// then its attribute's name and where it is written: it means nothing without one.
    fn gates_retries(&self) -> Option<(&'static str, Span)> {
        None
    }
}

/// The call site's `static` for the layer at `index`.
pub(crate) fn site(layer: &dyn Layer, index: usize, frame: &Frame<'_>) -> TokenStream {
    let (ty, init) = layer.site(frame);
    let name = site_name(index);
    quote!(static #name: #ty = #init;)
}

/// The per-call statements of the layer at `index`.
pub(crate) fn per_call(layer: &dyn Layer, index: usize) -> TokenStream {
    layer.per_call(&Place::at(index))
}

/// The outermost layer run inline around the pinned future in `inner`, if it can be.
pub(crate) fn inline(layer: &dyn Layer, inner: &syn::Ident) -> Option<TokenStream> {
    layer.inline(&Place::at(0), inner)
}

/// The layer at `index` wrapped around `inner`.
pub(crate) fn wrap(
    layer: &dyn Layer,
    index: usize,
    frame: &Frame<'_>,
    inner: TokenStream,
) -> TokenStream {
    layer.wrap(&Place::at(index), frame, inner)
}

/// `inner` (a future) as the runtime takes it: pinned where it is created, as a temporary of
/// the statement that awaits the pipeline. Passed by value, each layer's future would hold it
/// twice (its argument, and the future it awaits): the size doubles per layer.
pub(crate) fn pinned(inner: TokenStream) -> TokenStream {
    quote!(::core::pin::pin!(#inner))
}

/// The user's function `path` as a `fn(&param) -> ret` pointer, where `param` may name the
/// `T` and `E` of the function's return type `output`.
///
/// Fixing `T` and `E` from the return type before `path` is used means a function of the wrong
/// type is one "expected fn pointer" error on the path, instead of a cascade of inference
/// errors from the runtime call that first meets it.
pub(crate) fn typed_fn(
    path: &Path,
    output: &Type,
    param: TokenStream,
    ret: TokenStream,
) -> TokenStream {
    let check = hygienic("__caracal_typed");
    quote!({
        fn #check<T, E>(
            _: ::core::marker::PhantomData<::core::result::Result<T, E>>,
            function: fn(&#param) -> #ret,
        ) -> fn(&#param) -> #ret {
            function
        }
        #check(::core::marker::PhantomData::<#output>, #path)
    })
}
