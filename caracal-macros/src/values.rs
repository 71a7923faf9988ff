//! Numeric, name and operation arguments: a literal, checked here with an error spanned on it,
//! or a constant expression (`limit = MAX_CALLS`, `rate = 10 * 60`, `name = PARTNER`), which
//! only the compiler can evaluate. The expansion carries the same check for those as an
//! assertion evaluated at compile time, so an out-of-range constant is a compile error too,
//! whose message names the argument and the range.

use std::fmt::Display;
use std::ops::RangeInclusive;

use caracal_spec::{Key, MAX_PART_BYTES, Type};
use proc_macro2::{Span, TokenStream, TokenTree};
use quote::{ToTokens, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, ExprUnary, Lit, LitFloat, LitStr, UnOp};

use crate::args::{Convert, wrong_type};
use crate::names::hygienic;

/// A setting given as a literal, or as a constant expression checked when it is compiled.
#[derive(Clone)]
pub(crate) enum Value<T> {
    Literal(T),
    // Boxed: a literal is the common case, and small.
    Const(Box<Const>),
}

/// A constant expression, with what the compiler must check about it.
#[derive(Clone)]
pub(crate) struct Const {
    expr: Expr,
    check: Check,
    /// What the assertion says when the check fails.
    message: String,
}

#[derive(Clone)]
enum Check {
    Count(RangeInclusive<u32>),
    Number(f64, f64),
    Part,
}

impl Const {
    /// `expr` as it is used; `written` as the user wrote it, for the message.
    fn new(
        key: &str,
        expr: &Expr,
        written: &Expr,
        check: Check,
        what: impl Display,
    ) -> syn::Result<Self> {
        refuse_self(key, expr)?;
        let problem = match check {
            Check::Count(_) | Check::Number(..) => "is out of range",
            Check::Part => "is not a valid identity part",
        };
        let text = written.to_token_stream().to_string();
        // Parentheses around the whole value would draw `unused_parens` where it is used.
        let mut expr = expr;
        while let Expr::Paren(paren) = expr {
            expr = &paren.expr;
        }
        Ok(Const {
            expr: expr.clone(),
            check,
            message: format!("`{key} = {text}` {problem}: `{key}` must be {what}"),
        })
    }

    /// The expression, typed and checked: a block evaluated where the site's `static` is
    /// initialised, at compile time, so a failed check is a compile error spanned on it.
    fn tokens(&self) -> TokenStream {
        let Const {
            expr,
            check,
            message,
        } = self;
        let value = hygienic("__caracal_value");
        let (ty, holds) = match check {
            Check::Count(range) => {
                let (min, max) = (range.start(), range.end());
                (
                    quote!(::core::primitive::u32),
                    quote!(::caracal::__private::count_within(#value, #min, #max)),
                )
            }
            Check::Number(min, max) => (
                quote!(::core::primitive::f64),
                quote!(::caracal::__private::number_within(#value, #min, #max)),
            ),
            Check::Part => (
                quote!(&'static ::core::primitive::str),
                quote!(::caracal::__private::valid_part(#value)),
            ),
        };
        quote_spanned! {expr.span()=> {
            let #value: #ty = #expr;
            ::core::assert!(#holds, #message);
            #value
        }}
    }

    /// The expression alone, for a check that relates it to another argument.
    pub(crate) fn expr(&self) -> &Expr {
        &self.expr
    }
}

impl<T: ToTokens> Value<T> {
    /// The setting in the expansion.
    pub(crate) fn tokens(&self) -> TokenStream {
        match self {
            Value::Literal(literal) => literal.to_token_stream(),
            Value::Const(constant) => constant.tokens(),
        }
    }
}

/// A site's settings live in a `static` inside the function, which cannot name `Self` (nor
/// the function's generic parameters): say so, instead of rustc's "can't use `Self` from outer
/// item".
fn refuse_self(key: &str, expr: &Expr) -> syn::Result<()> {
    fn find(tokens: TokenStream) -> Option<Span> {
        tokens.into_iter().find_map(|token| match token {
            TokenTree::Ident(ident) if ident == "Self" => Some(ident.span()),
            TokenTree::Group(group) => find(group.stream()),
            _ => None,
        })
    }
    match find(expr.to_token_stream()) {
        Some(span) => Err(syn::Error::new(
            span,
            format!(
                "`{key}` cannot name `Self`: the value is fixed once for the call site, outside \
                 the impl; name the type instead (`Client::LIMIT`) or use a free `const`"
            ),
        )),
        None => Ok(()),
    }
}

/// A numeric literal's sign and digits, or `None` for anything else.
fn numeric(value: &Expr) -> Option<(bool, &Lit)> {
    match value {
        Expr::Lit(ExprLit {
            lit: lit @ (Lit::Int(_) | Lit::Float(_)),
            ..
        }) => Some((false, lit)),
        Expr::Unary(ExprUnary {
            op: UnOp::Neg(_),
            expr,
            ..
        }) => numeric(expr)
            .filter(|(negative, _)| !negative)
            .map(|(_, lit)| (true, lit)),
        _ => None,
    }
}

/// The value of a numeric literal (an integer or a float, maybe negated).
pub(crate) fn literal_number(value: &Expr) -> Option<f64> {
    let (negative, lit) = numeric(value)?;
    let parsed = match lit {
        Lit::Int(int) => int.base10_parse::<f64>(),
        Lit::Float(float) => float.base10_parse::<f64>(),
        _ => return None,
    };
    parsed.ok().map(|n| if negative { -n } else { n })
}

/// A literal that is neither a number nor a negated one: a string, a boolean, a character.
fn other_literal(value: &Expr) -> bool {
    matches!(value, Expr::Lit(_)) && numeric(value).is_none()
}

/// A count (`u32`) within the bounds of `spec`, an integer key: an integer literal, or a
/// constant expression.
pub(crate) fn integer(spec: &'static Key) -> impl Convert<Value<u32>> {
    let Type::Integer { min, max } = spec.ty else {
        panic!("`{}` is not an integer key", spec.name)
    };
    let range = min..=max;
    move |key, value| {
        let what = format!("an integer from {} to {}", range.start(), range.end());
        let out_of_range = || syn::Error::new_spanned(value, format!("`{key}` must be {what}"));
        match numeric(value) {
            Some((false, Lit::Int(int))) => int
                .base10_parse::<u32>()
                .ok()
                .filter(|n| range.contains(n))
                .map(Value::Literal)
                .ok_or_else(out_of_range),
            Some((true, Lit::Int(_))) => Err(out_of_range()),
            Some(_) => Err(wrong_type(key, what, value)),
            None if other_literal(value) => Err(wrong_type(key, what, value)),
            None => Const::new(key, value, value, Check::Count(range.clone()), what)
                .map(|constant| Value::Const(Box::new(constant))),
        }
    }
}

/// A flag's value (`shadow = true`): a boolean literal. A constant is refused: whether a
/// policy enforces is read where it is written, and changed at run time by configuration.
pub(crate) fn boolean(_: &'static Key) -> impl Convert<bool> {
    |key, value| match value {
        Expr::Lit(ExprLit {
            lit: Lit::Bool(flag),
            ..
        }) => Ok(flag.value),
        _ => Err(wrong_type(key, "`true` or `false`", value)),
    }
}

/// A number (`f64`) within the bounds of `spec`, a number key: an integer or float literal,
/// or a constant expression in which integer literals count as floats (`rate = 10 * 60` is
/// `600.0`). `hint` adds to the message of a constant out of range.
pub(crate) fn number(spec: &'static Key, hint: &'static str) -> impl Convert<Value<f64>> {
    let Type::Float { min, max, .. } = spec.ty else {
        panic!("`{}` is not a number key", spec.name)
    };
    move |key, value| {
        let what = format!("a number between {min} and {max}");
        if let Some(n) = literal_number(value) {
            return if (min..=max).contains(&n) {
                Ok(Value::Literal(n))
            } else {
                Err(syn::Error::new_spanned(
                    value,
                    format!("`{key}` must be {what}"),
                ))
            };
        }
        if other_literal(value) {
            return Err(wrong_type(key, what, value));
        }
        let mut typed = value.clone();
        integers_as_floats(&mut typed);
        let what = format!("{what}{hint}");
        Const::new(key, &typed, value, Check::Number(min, max), what)
            .map(|constant| Value::Const(Box::new(constant)))
    }
}

/// Rewrites the unsuffixed integer literals of an arithmetic expression as floats, so that
/// `10 * 60` type-checks as an `f64`. Only through arithmetic: an index or a call argument
/// inside keeps its integers.
fn integers_as_floats(expr: &mut Expr) {
    match expr {
        Expr::Lit(ExprLit {
            lit: lit @ Lit::Int(_),
            ..
        }) => {
            if let Lit::Int(int) = lit
                && int.suffix().is_empty()
            {
                *lit = Lit::Float(LitFloat::new(
                    &format!("{}.0", int.base10_digits()),
                    int.span(),
                ));
            }
        }
        Expr::Binary(binary) => {
            integers_as_floats(&mut binary.left);
            integers_as_floats(&mut binary.right);
        }
        Expr::Unary(unary) => integers_as_floats(&mut unary.expr),
        Expr::Paren(paren) => integers_as_floats(&mut paren.expr),
        Expr::Group(group) => integers_as_floats(&mut group.expr),
        _ => {}
    }
}

/// A `name` or `operation`: a non-blank string literal of at most [`MAX_PART_BYTES`], or a
/// path to a `const &str`.
pub(crate) fn part(key: &str, value: &Expr) -> syn::Result<Value<String>> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Str(literal),
            ..
        }) => literal_part(key, literal).map(Value::Literal),
        Expr::Path(path) if path.qself.is_none() => Const::new(
            key,
            value,
            value,
            Check::Part,
            format_args!("non-blank and at most {MAX_PART_BYTES} bytes"),
        )
        .map(|constant| Value::Const(Box::new(constant))),
        _ => Err(wrong_type(
            key,
            "a string literal or a path to a `const &str`",
            value,
        )),
    }
}

/// A non-blank string literal of at most [`MAX_PART_BYTES`].
pub(crate) fn literal_part(key: &str, literal: &LitStr) -> syn::Result<String> {
    let text = literal.value();
    if text.trim().is_empty() {
        Err(syn::Error::new_spanned(
            literal,
            format!("`{key}` must not be blank"),
        ))
    } else if text.len() > MAX_PART_BYTES {
        Err(syn::Error::new_spanned(
            literal,
            format!(
                "`{key}` must be at most {MAX_PART_BYTES} bytes; this one has {}",
                text.len()
            ),
        ))
    } else {
        Ok(text)
    }
}
