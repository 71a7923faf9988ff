//! One expansion: gathers every caracal attribute on the function, checks the signature, and
//! builds the single pipeline they form.

use proc_macro2::{Delimiter, Group, Ident, Span, TokenStream, TokenTree};
use quote::{ToTokens, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{AttrStyle, Attribute, ItemFn, Meta, ReturnType, Type, parse_quote};

use crate::errors::Errors;
use crate::layer::{self, Kind, Layer, Written};

/// Expands the caracal attribute `kind`, written on `item` with arguments `args`.
pub(crate) fn attribute(kind: Kind, args: TokenStream, item: TokenStream) -> TokenStream {
    if is_stacked_marker(&args) {
        return item;
    }
    let mut function: ItemFn = match syn::parse2(item.clone()) {
        Ok(function) => function,
        Err(error) => {
            let error = syn::Error::new(
                error.span(),
                format!("`#[{}]` goes on an `async fn` with a body", kind.name()),
            )
            .into_compile_error();
            return quote!(#error #item);
        }
    };
    match expand(kind, args, &mut function) {
        Ok(expanded) => expanded,
        // The function stays, unguarded and without its caracal attributes, so the only
        // errors are ours and not a cascade from its callers.
        Err(error) => {
            let error = error.into_compile_error();
            quote!(#error #function)
        }
    }
}

fn expand(kind: Kind, args: TokenStream, function: &mut ItemFn) -> syn::Result<TokenStream> {
    let mut errors = Errors::default();
    let mut written = vec![Written {
        kind,
        anchor: TokenStream::new(),
        span: Span::call_site(),
        args,
    }];
    // Every other caracal attribute expands here too, so they form one pipeline. Each leaves a
    // marker in its place that expands to nothing, only so that its import counts as used.
    for attr in &mut function.attrs {
        let Some(kind) = ours(attr) else {
            continue;
        };
        match args_of(attr, kind) {
            Ok(args) => written.push(Written {
                kind,
                anchor: attr.to_token_stream(),
                span: attr
                    .path()
                    .segments
                    .last()
                    .map_or_else(|| attr.span(), |segment| segment.ident.span()),
                args,
            }),
            Err(error) => errors.push(error),
        }
        let path = attr.path();
        let marker = Ident::new(STACKED_MARKER, Span::call_site());
        *attr = parse_quote!(#[#path(@#marker)]);
    }

    if let Err(error) = check_signature(kind, function) {
        errors.push(error);
    }
    let name = function.sig.ident.unraw().to_string();
    let mut layers = Vec::with_capacity(written.len());
    for written in written {
        match Layer::parse(written, &name) {
            Ok(layer) => layers.push(layer),
            Err(error) => errors.push(error),
        }
    }
    errors.into_result()?;

    // Admission (bulkhead, rate limit) guards each attempt, wherever it is written; the rest
    // nest as written, outermost first.
    let (per_attempt, outer): (Vec<Layer>, Vec<Layer>) =
        layers.into_iter().partition(Layer::per_attempt);
    let layers: Vec<Layer> = outer.into_iter().chain(per_attempt).collect();
    Ok(assemble(function, &layers))
}

/// What marks a caracal attribute already expanded by the one above it: `@stacked`, which no
/// argument list starts with.
const STACKED_MARKER: &str = "stacked";

fn is_stacked_marker(args: &TokenStream) -> bool {
    let mut tokens = args.clone().into_iter();
    matches!(
        (tokens.next(), tokens.next(), tokens.next()),
        (Some(TokenTree::Punct(at)), Some(TokenTree::Ident(marker)), None)
            if at.as_char() == '@' && marker == STACKED_MARKER
    )
}

/// The caracal attribute `attr` is, if any.
fn ours(attr: &Attribute) -> Option<Kind> {
    match attr.style {
        AttrStyle::Outer => Kind::of(attr.path()),
        AttrStyle::Inner(_) => None,
    }
}

/// The arguments of a stacked attribute: `#[retry]` or `#[retry(…)]`.
fn args_of(attr: &Attribute, kind: Kind) -> syn::Result<TokenStream> {
    match &attr.meta {
        Meta::Path(_) => Ok(TokenStream::new()),
        Meta::List(list) => Ok(list.tokens.clone()),
        Meta::NameValue(meta) => Err(syn::Error::new_spanned(
            meta,
            format!("write `#[{0}(…)]`, not `#[{0} = …]`", kind.name()),
        )),
    }
}

fn check_signature(kind: Kind, function: &ItemFn) -> syn::Result<()> {
    let name = kind.name();
    let sig = &function.sig;
    let mut errors = Errors::default();
    if sig.asyncness.is_none() {
        errors.push(syn::Error::new_spanned(
            sig.fn_token,
            format!("`#[{name}]` goes on an `async fn`; add `async`"),
        ));
    }
    let needs_result = format!(
        "`#[{name}]` needs a function returning `Result<T, E>` where `E: From<caracal::Error>`: \
         rejections are returned as `Err(E::from(error))`"
    );
    match &sig.output {
        ReturnType::Type(_, ty) if returns_result(ty) => {}
        ReturnType::Type(_, ty) => errors.push(syn::Error::new_spanned(ty, needs_result)),
        ReturnType::Default => errors.push(syn::Error::new_spanned(sig, needs_result)),
    }
    errors.into_result()
}

/// Whether `ty` is a path ending in `Result` (`Result<T, E>`, `io::Result<T>`, …): an alias
/// under another name cannot be recognised from its tokens.
fn returns_result(ty: &Type) -> bool {
    match ty {
        Type::Path(path) => path
            .path
            .segments
            .last()
            .is_some_and(|segment| segment.ident == "Result"),
        Type::Paren(paren) => returns_result(&paren.elem),
        Type::Group(group) => returns_result(&group.elem),
        _ => false,
    }
}

/// The function with its body run through `layers`, outermost first.
fn assemble(function: &ItemFn, layers: &[Layer]) -> TokenStream {
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = function;
    let (inner_attrs, outer_attrs): (Vec<&Attribute>, Vec<&Attribute>) = attrs
        .iter()
        .partition(|attr| matches!(attr.style, AttrStyle::Inner(_)));
    let ReturnType::Type(_, output) = &sig.output else {
        unreachable!("check_signature requires a `Result` return type");
    };
    let stmts = &block.stmts;
    let fake_return = layer::hygienic("__caracal_fake_return");
    // tracing-attributes' trick: an unreachable `return` of the function's type tells the
    // compiler the block's type, so `?` and `return` in the body type-check as in the function.
    let body = quote! {
        #[allow(
            unreachable_code,
            clippy::diverging_sub_expression,
            clippy::empty_loop,
            clippy::let_unit_value,
            clippy::needless_return
        )]
        if false {
            let #fake_return: #output = loop {};
            return #fake_return;
        }
        #(#stmts)*
    };
    // A body moving a value out cannot run once per attempt; rustc reports the move "in
    // previous iteration of loop" on the body's block, which this points at the innermost
    // `#[retry]`. Only the block's delimiters get that span: the code inside stays the macro's.
    let attempt_span = layers
        .iter()
        .rev()
        .find_map(Layer::retry_span)
        .unwrap_or_else(Span::call_site);
    let mut body = Group::new(Delimiter::Brace, body);
    body.set_span(attempt_span);
    let mut pipeline = quote_spanned!(attempt_span=> async #body);
    for (index, layer) in layers.iter().enumerate().rev() {
        pipeline = layer.wrap(index, output, pipeline);
    }
    let sites = layers
        .iter()
        .enumerate()
        .map(|(index, layer)| layer.site(index));
    // Scopes are evaluated once, before any layer runs, so every retry reuses them.
    let scopes = layers.iter().enumerate().filter_map(|(index, layer)| {
        let scope = layer.identity()?.scope();
        let name = layer::scope_name(index);
        Some(quote!(let #name = #scope;))
    });
    let ctx = layer::ctx_name();
    let result = layer::hygienic("__caracal_result");
    quote! {
        #(#outer_attrs)*
        #vis #sig {
            #(#inner_attrs)*
            #(#sites)*
            let #ctx = ::caracal::__private::CallCtx::new();
            #(#scopes)*
            // Bound, so the pipeline's temporaries (which borrow the locals above) are dropped
            // before those locals, in every edition.
            let #result = #pipeline.await;
            #result
        }
    }
}
