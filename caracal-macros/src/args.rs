//! The `key = value, flag, …` argument list shared by every attribute but `#[timeout]`: parsing,
//! unknown and duplicate keys, and conversion of each value with an error spanned on it.

use std::fmt::Display;

use caracal_spec::{Default, Function, Key};
use proc_macro2::TokenStream;
use quote::{ToTokens, quote};
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream, Parser};
use syn::punctuated::Punctuated;
use syn::{Expr, ExprAssign, ExprLit, Ident, Lit, LitStr, Path, Token, parenthesized, token};

use crate::errors::Errors;

/// One `key = value`, bare `key`, or `key(member = value, …)`.
struct Arg {
    key: Ident,
    value: Option<(Token![=], Expr)>,
    /// The members of a group of keys: `thresholds(normal = 0.8)`.
    members: Option<Members>,
}

/// What is inside `key(…)`.
struct Members {
    paren: token::Paren,
    list: Punctuated<Expr, Token![,]>,
}

impl Parse for Arg {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        // Keywords too, so `type = …` is reported as an unknown argument, not a syntax error.
        let key = input.call(Ident::parse_any)?;
        let (value, members) = if input.peek(Token![=]) {
            (Some((input.parse()?, input.parse()?)), None)
        } else if input.peek(token::Paren) {
            let content;
            let paren = parenthesized!(content in input);
            let list = Punctuated::parse_terminated(&content)?;
            (None, Some(Members { paren, list }))
        } else if input.is_empty() || input.peek(Token![,]) {
            (None, None)
        } else {
            return Err(input.error(format!("expected `=` or `,` after `{key}`")));
        };
        Ok(Arg {
            key,
            value,
            members,
        })
    }
}

impl Arg {
    /// Everything written after the key: `= value` or `(…)`.
    fn after_key(&self) -> TokenStream {
        let value = self.value.as_ref().map(|(eq, value)| quote!(#eq #value));
        let members = self.members.as_ref().map(|members| {
            let mut tokens = TokenStream::new();
            members
                .paren
                .surround(&mut tokens, |tokens| members.list.to_tokens(tokens));
            tokens
        });
        quote!(#value #members)
    }
}

/// The arguments of one attribute, and the errors found so far in them.
///
/// Accessors return `None` for an argument that is absent *or* invalid; an invalid one has
/// recorded its error, and [`Args::finish`] reports every error at once.
pub(crate) struct Args {
    attribute: &'static str,
    /// What a missing argument is reported on: the attribute.
    anchor: TokenStream,
    given: Vec<Arg>,
    errors: Errors,
}

/// Turns an argument's value into a setting: gets the key (for messages) and the value.
pub(crate) trait Convert<T>: FnOnce(&str, &Expr) -> syn::Result<T> {}

impl<T, F: FnOnce(&str, &Expr) -> syn::Result<T>> Convert<T> for F {}

impl Args {
    /// Parses `tokens` as the arguments of the attribute `spec` describes.
    pub(crate) fn parse(
        spec: &'static caracal_spec::Kind,
        anchor: TokenStream,
        tokens: TokenStream,
    ) -> syn::Result<Self> {
        let list = Punctuated::<Arg, Token![,]>::parse_terminated.parse2(tokens)?;
        let attribute = spec.name;
        let mut args = Args {
            attribute,
            anchor,
            given: Vec::new(),
            errors: Errors::default(),
        };
        let valid: Vec<&str> = spec.arguments().collect();
        for arg in list {
            let key = arg.key.unraw().to_string();
            if !valid.contains(&key.as_str()) {
                let expected: Vec<String> = valid.iter().map(|key| format!("`{key}`")).collect();
                args.errors.push(syn::Error::new_spanned(
                    &arg.key,
                    format!(
                        "unknown argument `{key}` for `#[{attribute}]`; expected one of {}",
                        expected.join(", ")
                    ),
                ));
            } else if args.find(&key).is_some() {
                args.errors.push(syn::Error::new_spanned(
                    &arg.key,
                    format!("duplicate argument `{key}`"),
                ));
            } else {
                args.given.push(arg);
            }
        }
        Ok(args)
    }

    fn find(&self, key: &str) -> Option<&Arg> {
        self.given.iter().find(|arg| arg.key == key)
    }

    /// Whether `key` was written at all, valid or not.
    pub(crate) fn has(&self, key: &str) -> bool {
        self.find(key).is_some()
    }

    /// Whether the bare flag `key` is present.
    pub(crate) fn flag(&mut self, key: &str) -> bool {
        let Some(arg) = self.find(key) else {
            return false;
        };
        if arg.value.is_some() || arg.members.is_some() {
            let error = syn::Error::new_spanned(
                arg.after_key(),
                format!("`{key}` is a bare flag: write `{key}`, not `{key} = …`"),
            );
            self.errors.push(error);
        }
        true
    }

    /// The value of `key = value`, converted.
    pub(crate) fn get<T>(&mut self, key: &str, convert: impl Convert<T>) -> Option<T> {
        let arg = self.find(key)?;
        let result = match (&arg.value, &arg.members) {
            (Some((_, value)), _) => convert(key, value),
            (None, Some(_)) => Err(syn::Error::new_spanned(
                arg.after_key(),
                format!("`{key}` takes one value: write `{key} = …`, not `{key}(…)`"),
            )),
            (None, None) => Err(syn::Error::new_spanned(
                &arg.key,
                format!("`{key}` needs a value: `{key} = …`"),
            )),
        };
        result.map_err(|error| self.errors.push(error)).ok()
    }

    /// The members of the group `key` (`key(member = value, …)`), each as its name and
    /// value, in the order written; `example` shows the group written. Anything but
    /// `name = value` inside is an error spanned on it; an empty group is one too.
    pub(crate) fn members(&mut self, key: &str, example: &str) -> Option<Vec<(Ident, Expr)>> {
        let arg = self.find(key)?;
        let Some(members) = &arg.members else {
            let (name, after) = (&arg.key, arg.after_key());
            let error = syn::Error::new_spanned(quote!(#name #after), format!("write `{example}`"));
            self.errors.push(error);
            return None;
        };
        let mut named = Vec::with_capacity(members.list.len());
        let mut errors = Vec::new();
        for member in &members.list {
            match member {
                Expr::Assign(ExprAssign { left, right, .. }) => match &**left {
                    Expr::Path(path) if path.path.get_ident().is_some() => {
                        let name = path.path.get_ident().expect("checked").clone();
                        named.push((name, (**right).clone()));
                    }
                    _ => errors.push(syn::Error::new_spanned(
                        left,
                        format!("expected a name, like `{example}`"),
                    )),
                },
                _ => errors.push(syn::Error::new_spanned(
                    member,
                    format!("expected `name = value`, like `{example}`"),
                )),
            }
        }
        if members.list.is_empty() {
            errors.push(syn::Error::new(
                members.paren.span.join(),
                format!("`{key}()` sets nothing: write `{example}`"),
            ));
        }
        let valid = errors.is_empty();
        errors.into_iter().for_each(|error| self.errors.push(error));
        valid.then_some(named)
    }

    /// Records an error about an argument's value found by its reader.
    pub(crate) fn error(&mut self, error: syn::Error) {
        self.errors.push(error);
    }

    /// The value of the spec's `key`, converted by what `convert` makes for it.
    pub(crate) fn setting<T, C: Convert<T>>(
        &mut self,
        key: &'static Key,
        convert: impl FnOnce(&'static Key) -> C,
    ) -> Option<T> {
        self.get(key.name, convert(key))
    }

    /// Like [`setting`](Self::setting), for a key the spec says is required.
    pub(crate) fn required<T, C: Convert<T>>(
        &mut self,
        key: &'static Key,
        convert: impl FnOnce(&'static Key) -> C,
    ) -> Option<T> {
        let Default::Required { example } = key.default else {
            panic!("`{}` has a default", key.name)
        };
        self.require(key.name, example, convert(key))
    }

    /// The path the spec's function argument names, if given.
    pub(crate) fn function(&mut self, spec: &'static Function) -> Option<Path> {
        self.get(spec.name, path(spec))
    }

    /// Like [`get`](Self::get), for an argument without a default; `example` shows its use.
    fn require<T>(&mut self, key: &str, example: &str, convert: impl Convert<T>) -> Option<T> {
        if !self.has(key) {
            let attribute = self.attribute;
            let error = syn::Error::new_spanned(
                &self.anchor,
                format!("`#[{attribute}]` needs `{key}`, e.g. `#[{attribute}({example})]`"),
            );
            self.errors.push(error);
        }
        self.get(key, convert)
    }

    /// Reports a conflict between arguments on the whole `key = value` of `key`, which must
    /// have been given.
    pub(crate) fn conflict(&mut self, key: &str, message: impl Display) {
        if let Some(arg) = self.find(key) {
            let (key, value) = (&arg.key, arg.after_key());
            let error = syn::Error::new_spanned(quote!(#key #value), message);
            self.errors.push(error);
        }
    }

    /// Whether every argument so far was valid: relations between arguments are only checked
    /// then, so a value replaced by its default after an error cannot cause a second, bogus one.
    pub(crate) fn all_valid(&self) -> bool {
        self.errors.is_empty()
    }

    /// Every error found, or the settings `build` makes from the arguments. `build` only runs
    /// without errors, when every required argument is present.
    pub(crate) fn finish<T>(self, build: impl FnOnce() -> Option<T>) -> syn::Result<T> {
        self.errors.into_result()?;
        Ok(build().expect("a missing or invalid argument always records an error"))
    }
}

/// What a value is, for "must be …, not a string" messages.
fn describe(value: &Expr) -> &'static str {
    match value {
        Expr::Lit(ExprLit { lit, .. }) => match lit {
            Lit::Str(_) => "a string",
            Lit::Int(_) => "an integer",
            Lit::Float(_) => "a float",
            Lit::Bool(_) => "a boolean",
            _ => "that literal",
        },
        Expr::Path(_) => "a path",
        _ => "an expression",
    }
}

/// "`key` must be `what`, not `describe(value)`", on the value.
pub(crate) fn wrong_type(key: &str, what: impl Display, value: &Expr) -> syn::Error {
    syn::Error::new_spanned(
        value,
        format!("`{key}` must be {what}, not {}", describe(value)),
    )
}

/// A string literal.
pub(crate) fn string(key: &str, value: &Expr) -> syn::Result<LitStr> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Str(string),
            ..
        }) => Ok(string.clone()),
        _ => Err(wrong_type(key, "a string literal", value)),
    }
}

/// A path, naming a function of the shape `spec` gives.
fn path(spec: &'static Function) -> impl Convert<Path> {
    let shape = spec.shape;
    move |key, value| match value {
        Expr::Path(path) if path.qself.is_none() => Ok(path.path.clone()),
        _ => Err(wrong_type(
            key,
            format_args!("a path to a function `{shape}`"),
            value,
        )),
    }
}
