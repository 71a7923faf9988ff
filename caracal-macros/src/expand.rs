//! One expansion: gathers every caracal attribute on the function, checks the signature, and
//! builds the single pipeline they form.

use proc_macro2::{Delimiter, Group, Ident, Span, TokenStream, TokenTree};
use quote::{ToTokens, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{
    AttrStyle, Attribute, Block, Expr, FnArg, GenericArgument, Item, ItemFn, Local, Meta, Pat,
    PatIdent, PathArguments, ReturnType, Signature, Stmt, TraitItemFn, Type, TypeParamBound,
    parse_quote,
};

use crate::errors::Errors;
use crate::identity::Identity;
use crate::layer::{self, Frame, Kind, Layer, Written};
use crate::names;

/// Expands the caracal attribute `kind`, written on `item` with arguments `args`; `kinds` are
/// every attribute, which it gathers from the function too.
pub(crate) fn attribute(
    kind: &'static Kind,
    kinds: &[&'static Kind],
    args: TokenStream,
    item: TokenStream,
) -> TokenStream {
    if is_stacked_marker(&args) {
        return item;
    }
    let mut function: ItemFn = match syn::parse2(item.clone()) {
        Ok(function) => function,
        Err(error) => {
            let error = misplaced(kind, &item, error).into_compile_error();
            return quote!(#error #item);
        }
    };
    match expand(kind, kinds, args, &mut function) {
        Ok(expanded) => expanded,
        // The function stays, unguarded and without its caracal attributes, so the only
        // errors are ours and not a cascade from its callers.
        Err(error) => {
            let error = error.into_compile_error();
            quote!(#error #function)
        }
    }
}

/// The error for an attribute on something that is not a function with a body.
fn misplaced(kind: &Kind, item: &TokenStream, error: syn::Error) -> syn::Error {
    let name = kind.name;
    match syn::parse2::<Item>(item.clone()) {
        // Also what `#[retry] #[async_trait] impl …` comes to: the attribute cannot reach the
        // methods through the impl, while one on a method runs after `#[async_trait]`.
        Ok(Item::Impl(_) | Item::Trait(_)) => syn::Error::new(
            Span::call_site(),
            format!(
                "`#[{name}]` goes on each `async fn` inside the block, not on the `impl` or \
                 `trait` itself (with `#[async_trait]`, keep that on the `impl` and this on the \
                 method)"
            ),
        ),
        _ => match syn::parse2::<TraitItemFn>(item.clone()) {
            Ok(TraitItemFn { default: None, .. }) => syn::Error::new(
                error.span(),
                format!(
                    "`#[{name}]` goes on an `async fn` with a body: put it on the method in each \
                     `impl`, not on the trait's declaration"
                ),
            ),
            _ => syn::Error::new(
                error.span(),
                format!("`#[{name}]` goes on an `async fn` with a body"),
            ),
        },
    }
}

fn expand(
    kind: &'static Kind,
    kinds: &[&'static Kind],
    args: TokenStream,
    function: &mut ItemFn,
) -> syn::Result<TokenStream> {
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
        let Some(kind) = ours(kinds, attr) else {
            continue;
        };
        match args_of(attr, kind) {
            Ok(args) => {
                if written.iter().any(|earlier| earlier.kind.name == kind.name) {
                    errors.push(twice(kind, attr));
                }
                written.push(Written {
                    kind,
                    anchor: attr.to_token_stream(),
                    span: attr
                        .path()
                        .segments
                        .last()
                        .map_or_else(|| attr.span(), |segment| segment.ident.span()),
                    args,
                });
            }
            Err(error) => errors.push(error),
        }
        let path = attr.path();
        let marker = Ident::new(STACKED_MARKER, Span::call_site());
        *attr = parse_quote!(#[#path(@#marker)]);
    }

    let shape = Shape::of(kind, function)
        .map_err(|error| errors.push(error))
        .ok();
    let name = function.sig.ident.unraw().to_string();
    let mut layers = Vec::with_capacity(written.len());
    for written in written {
        match (written.kind.parse)(written, &name) {
            Ok(layer) => layers.push(layer),
            Err(error) => errors.push(error),
        }
    }
    let arguments = match (
        &shape,
        layers.iter().find_map(|layer| layer.fallback_span()),
    ) {
        (Some(shape), Some(span)) => arguments(&function.sig, shape, span)
            .map_err(|error| errors.push(error))
            .unwrap_or_default(),
        _ => Vec::new(),
    };
    errors.into_result()?;
    let shape = shape.expect("a function without a shape has recorded an error");

    // The function's identity, as the layers that guard the whole call report it: the first
    // coordinated attribute written on it says who the function is.
    let first_coordinated = layers.iter().position(|layer| layer.identity().is_some());
    // Admission guards each attempt, wherever it is written; the rest nest as written,
    // outermost first.
    let (per_attempt, outer): (Vec<_>, Vec<_>) = layers
        .into_iter()
        .enumerate()
        .partition(|(_, layer)| layer.per_attempt());
    let (written_at, layers): (Vec<usize>, Vec<Box<dyn Layer>>) =
        outer.into_iter().chain(per_attempt).unzip();
    let identity =
        first_coordinated.and_then(|first| written_at.iter().position(|&at| at == first));
    ungated_retries(&layers)?;
    assemble(function, shape, &layers, identity, &arguments);
    Ok(function.to_token_stream())
}

/// A layer gating the retries inside it needs a `#[retry]` inside it (below it, as written).
fn ungated_retries(layers: &[Box<dyn Layer>]) -> syn::Result<()> {
    for (index, layer) in layers.iter().enumerate() {
        let Some((name, span)) = layer.gates_retries() else {
            continue;
        };
        if !layers[index + 1..]
            .iter()
            .any(|inner| inner.retry_span().is_some())
        {
            return Err(syn::Error::new(
                span,
                format!(
                    "`#[{name}]` decides on the retries of a `#[retry]` inside it: write one \
                     below it"
                ),
            ));
        }
    }
    Ok(())
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

/// The caracal attribute among `kinds` that `attr` is, if any.
fn ours(kinds: &[&'static Kind], attr: &Attribute) -> Option<&'static Kind> {
    match attr.style {
        AttrStyle::Outer => Kind::of(kinds, attr.path()),
        AttrStyle::Inner(_) => None,
    }
}

/// The arguments of a stacked attribute: `#[retry]` or `#[retry(…)]`.
fn args_of(attr: &Attribute, kind: &Kind) -> syn::Result<TokenStream> {
    match &attr.meta {
        Meta::Path(_) => Ok(TokenStream::new()),
        Meta::List(list) => Ok(list.tokens.clone()),
        Meta::NameValue(meta) => Err(syn::Error::new_spanned(
            meta,
            format!("write `#[{0}(…)]`, not `#[{0} = …]`", kind.name),
        )),
    }
}

/// The error for a second attribute of one kind: the two would nest, each running all of the
/// other (two `#[retry(max_attempts = 3)]` run the body up to 9 times).
fn twice(kind: &Kind, attr: &Attribute) -> syn::Error {
    let name = kind.name;
    syn::Error::new_spanned(
        attr,
        format!(
            "`#[{name}]` is already on this function: each caracal attribute goes on a function \
             once (two would nest, the outer one running all of the inner one each time)"
        ),
    )
}

/// Where the body the pipeline wraps is, and its result type.
struct Shape {
    /// The function's result type, `Result<T, E>`.
    output: Type,
    /// `Some` for a method rewritten by `#[async_trait]`.
    async_trait: Option<AsyncTrait>,
}

/// A method of an `#[async_trait]` impl, as that attribute (on the impl, so it expands first)
/// leaves it: `fn m(…) -> Pin<Box<dyn Future<Output = R> + Send + '_>>` whose block is
/// `Box::pin(async move { …; let __ret: R = { body }; __ret })`, the arguments moved into the
/// `async move` and rebound there, `self` as `__self`.
struct AsyncTrait {
    /// The name `self` is rebound to inside the `async move`.
    receiver: Option<Ident>,
}

impl Shape {
    /// The shape of `function`, or why it cannot take caracal attributes.
    fn of(kind: &Kind, function: &mut ItemFn) -> syn::Result<Self> {
        let name = kind.name;
        let mut errors = Errors::default();
        let (output, async_trait) = if function.sig.asyncness.is_some() {
            let output = match &function.sig.output {
                ReturnType::Type(_, ty) => Some((**ty).clone()),
                ReturnType::Default => None,
            };
            (output, None)
        } else if let Some((output, async_trait)) = rewritten_by_async_trait(function) {
            (Some(output), Some(async_trait))
        } else {
            errors.push(syn::Error::new_spanned(
                function.sig.fn_token,
                format!("`#[{name}]` goes on an `async fn`; add `async`"),
            ));
            (None, None)
        };
        let sig = &function.sig;
        let needs_result = format!(
            "`#[{name}]` needs a function returning `Result<T, E>` where `E: From<caracal::Error>`: \
             rejections are returned as `Err(E::from(error))`"
        );
        match &output {
            Some(ty) if returns_result(ty) => {}
            Some(ty) => errors.push(syn::Error::new_spanned(ty, needs_result)),
            None if sig.asyncness.is_some() => {
                errors.push(syn::Error::new_spanned(sig, needs_result))
            }
            None => {}
        }
        errors.into_result()?;
        Ok(Shape {
            output: output.expect("checked above"),
            async_trait,
        })
    }
}

/// The result type and rebound receiver of a method `#[async_trait]` rewrote, if `function`
/// is one.
fn rewritten_by_async_trait(function: &mut ItemFn) -> Option<(Type, AsyncTrait)> {
    let ReturnType::Type(_, boxed) = &function.sig.output else {
        return None;
    };
    let output = boxed_future_output(boxed)?;
    let stmts = async_trait_stmts(&mut function.block)?;
    async_trait_body(stmts)?;
    let receiver = stmts.iter().find_map(|stmt| match stmt {
        Stmt::Local(Local { pat, .. }) => match pat {
            Pat::Ident(PatIdent { ident, .. }) if ident == "__self" => Some(ident.clone()),
            _ => None,
        },
        _ => None,
    });
    Some((output, AsyncTrait { receiver }))
}

/// `R` of `Pin<Box<dyn Future<Output = R> + …>>`.
fn boxed_future_output(ty: &Type) -> Option<Type> {
    /// The one type argument of a path type ending in `name`.
    fn argument<'a>(ty: &'a Type, name: &str) -> Option<&'a Type> {
        let Type::Path(path) = ty else { return None };
        let last = path.path.segments.last()?;
        let PathArguments::AngleBracketed(args) = &last.arguments else {
            return None;
        };
        match args.args.first()? {
            GenericArgument::Type(ty) if last.ident == name => Some(ty),
            _ => None,
        }
    }
    let Type::TraitObject(object) = argument(argument(ty, "Pin")?, "Box")? else {
        return None;
    };
    object.bounds.iter().find_map(|bound| {
        let TypeParamBound::Trait(bound) = bound else {
            return None;
        };
        let future = bound.path.segments.last()?;
        let PathArguments::AngleBracketed(args) = &future.arguments else {
            return None;
        };
        args.args.iter().find_map(|arg| match arg {
            GenericArgument::AssocType(assoc)
                if future.ident == "Future" && assoc.ident == "Output" =>
            {
                Some(assoc.ty.clone())
            }
            _ => None,
        })
    })
}

/// The statements of the `async move` block in `Box::pin(async move { … })`, the whole of
/// `block`.
fn async_trait_stmts(block: &mut Block) -> Option<&mut Vec<Stmt>> {
    let [Stmt::Expr(Expr::Call(call), None)] = block.stmts.as_mut_slice() else {
        return None;
    };
    let Expr::Path(func) = &*call.func else {
        return None;
    };
    let segments: Vec<String> = func
        .path
        .segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect();
    if !segments.ends_with(&["Box".to_owned(), "pin".to_owned()]) || call.args.len() != 1 {
        return None;
    }
    match call.args.first_mut()? {
        Expr::Async(block) if block.capture.is_some() => Some(&mut block.block.stmts),
        _ => None,
    }
}

/// The user's body among `stmts`: the block in `let __ret: R = { body };`.
fn async_trait_body(stmts: &mut [Stmt]) -> Option<&mut Block> {
    stmts.iter_mut().find_map(|stmt| {
        let Stmt::Local(Local {
            pat: Pat::Type(typed),
            init: Some(init),
            ..
        }) = stmt
        else {
            return None;
        };
        match (&*typed.pat, &mut *init.expr) {
            (Pat::Ident(PatIdent { ident, .. }), Expr::Block(block)) if ident == "__ret" => {
                Some(&mut block.block)
            }
            _ => None,
        }
    })
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

/// The function's arguments as the fallback handler at `at` receives them, in order.
fn arguments(sig: &Signature, shape: &Shape, at: Span) -> syn::Result<Vec<TokenStream>> {
    let mut errors = Errors::default();
    let mut arguments = Vec::with_capacity(sig.inputs.len());
    // Each name keeps its own resolution (it is the argument's binding) but is reported at the
    // handler's path, where a mismatch with the handler's parameters is the user's to fix.
    let located = |mut ident: Ident| {
        ident.set_span(at.resolved_at(ident.span()));
        ident.into_token_stream()
    };
    for input in &sig.inputs {
        match input {
            FnArg::Receiver(receiver) => match shape.async_trait.as_ref() {
                Some(AsyncTrait {
                    receiver: Some(rebound),
                }) => arguments.push(located(rebound.clone())),
                _ => arguments.push(located(Ident::from(receiver.self_token))),
            },
            FnArg::Typed(typed) => match &*typed.pat {
                // `#[async_trait]` renames a pattern argument `__argN` and destructures it,
                // so the value by that name is gone; the span is still the pattern's.
                Pat::Ident(PatIdent {
                    by_ref: None,
                    subpat: None,
                    ident,
                    ..
                }) if !(shape.async_trait.is_some() && ident.to_string().starts_with("__arg")) => {
                    arguments.push(located(ident.clone()));
                }
                pat => errors.push(syn::Error::new_spanned(
                    pat,
                    "`#[fallback]` hands every argument to its handler, so each needs a name: \
                     write `name: Type` here, not a pattern",
                )),
            },
        }
    }
    errors.into_result().map(|()| arguments)
}

/// Replaces the function's body with the body run through `layers`, outermost first;
/// `identity` is the index of the layer whose identity is the function's, if any has one.
fn assemble(
    function: &mut ItemFn,
    shape: Shape,
    layers: &[Box<dyn Layer>],
    identity: Option<usize>,
    arguments: &[TokenStream],
) {
    let name = function.sig.ident.unraw().to_string();
    // Without a coordinated layer, the function has the identity every attribute would give
    // it by default, whose scope is evaluated like theirs.
    let default = Identity::of_function(&name);
    let (identity, scope, default_scope) = match identity {
        Some(index) => (
            layers[index].identity().expect("the layer has an identity"),
            names::scope_name(index),
            TokenStream::new(),
        ),
        None => {
            let variable = names::function_scope_name();
            let scope = default.scope();
            (&default, variable.clone(), quote!(let #variable = #scope;))
        }
    };
    let frame = Frame {
        output: &shape.output,
        arguments,
        identity: identity.of_call(&name),
        scope,
    };
    // Scopes (and priorities) are evaluated once, before any layer runs, so every retry reuses
    // them.
    let scopes: TokenStream = layers
        .iter()
        .enumerate()
        .filter_map(|(index, layer)| {
            let scope = layer.identity()?.scope();
            let name = names::scope_name(index);
            Some(quote!(let #name = #scope;))
        })
        .chain(std::iter::once(default_scope))
        .chain(
            layers
                .iter()
                .enumerate()
                .map(|(index, layer)| layer::per_call(&**layer, index)),
        )
        .collect();
    let verbatim = |tokens| Stmt::Expr(Expr::Verbatim(tokens), None);
    match shape.async_trait {
        None => {
            let body = pipeline(&function.block.stmts, &frame, layers);
            function.block.stmts = vec![verbatim(quote!(#scopes #body))];
            // The macro's braces, as the function's own would make lints judge the rewritten
            // function as if the user had written it.
            function.block.brace_token = syn::token::Brace::default();
        }
        Some(_) => {
            let stmts = async_trait_stmts(&mut function.block)
                .expect("the shape was recognised as #[async_trait]'s");
            let block = async_trait_body(stmts).expect("the shape was recognised");
            let body = pipeline(&block.stmts, &frame, layers);
            block.stmts = vec![verbatim(body)];
            // First in the `async move`, before the arguments are rebound there (`self` as
            // `__self`), so that a scope over `self` or an argument means what it says.
            stmts.insert(0, verbatim(scopes));
        }
    }
}

/// The statements that run `stmts` (the function's body) through `layers`, given the scopes
/// are evaluated before them.
fn pipeline(stmts: &[Stmt], frame: &Frame<'_>, layers: &[Box<dyn Layer>]) -> TokenStream {
    let output = frame.output;
    let fake_return = names::hygienic("__caracal_fake_return");
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
        .find_map(|layer| layer.retry_span())
        .unwrap_or_else(Span::call_site);
    let mut body = Group::new(Delimiter::Brace, body);
    body.set_span(attempt_span);
    let witness = names::witness_name();
    let mut pipeline = quote_spanned! {attempt_span=>
        ::caracal::__private::body(&#witness, async #body)
    };
    let inner = names::hygienic("__caracal_inner");
    let inline = layers
        .first()
        .and_then(|outermost| layer::inline(&**outermost, &inner));
    let wrapped = if inline.is_some() { 1 } else { 0 };
    for (index, layer) in layers.iter().enumerate().skip(wrapped).rev() {
        pipeline = layer::wrap(&**layer, index, frame, pipeline);
    }
    let sites = layers
        .iter()
        .enumerate()
        .map(|(index, layer)| layer::site(&**layer, index, frame));
    let ctx = names::ctx_name();
    let ctx_init = match layers {
        [only] if !only.reads_ctx_alone() => quote!(::caracal::__private::CallCtx::unread()),
        _ => quote!(&::caracal::__private::CallCtx::new()),
    };
    let result = names::hygienic("__caracal_result");
    let run = match inline {
        Some(inline) => quote! {
            let #inner = ::core::pin::pin!(#pipeline);
            let #result = #inline;
        },
        None => quote!(let #result = #pipeline.await;),
    };
    // Whether the error type takes rejections is checked once, here, with a message saying
    // what to write, spanned on the return type (see `caracal::__private::Probe`).
    let check = quote_spanned! {output.span()=>
        ::caracal::__private::require({
            // One of the two is used, depending on the error type.
            #[allow(unused_imports)]
            use ::caracal::__private::{ProbeChecked as _, ProbeUnchecked as _};
            (&::caracal::__private::Probe::<#output>(::core::marker::PhantomData)).witness()
        })
    };
    quote! {
        #(#sites)*
        let #ctx = #ctx_init;
        let #witness = #check;
        // Bound, so the pipeline's temporaries (which borrow the locals above) are dropped
        // before those locals, in every edition.
        #run
        ::caracal::__private::leave(&#witness, #result)
    }
}
