//! Coordination identities and the Redis keys derived from them.
//!
//! An identity is (namespace, policy kind, name, operation, scope). Every part is validated where
//! it is built — the namespace in the coordinator builder, name and operation by the macro at
//! compile time, the scope by [`Scope::new`] once per call — so a backend never sees an invalid
//! one and a validation error can never be mistaken for a coordinator failure.
//!
//! The key layout is `caracal:v1:{<sha256 hex of the JSON array [namespace, "<kind>:<name>",
//! operation, scope]>}:<suffix>`, byte-compatible with @gkoos/caracal so Rust and TypeScript
//! replicas can share one budget. The `{…}` hash tag keeps every key of one identity in one
//! cluster slot.

use std::borrow::Cow;
use std::fmt::{self, Write as _};

use sha2::{Digest, Sha256};

use crate::error::Error;
use crate::labels::{At, Call};

/// The longest identity part, in UTF-8 bytes.
pub(crate) const MAX_PART_BYTES: usize = 1024;

/// Checks one identity part: non-blank and at most [`MAX_PART_BYTES`].
pub(crate) fn check_part(value: &str) -> Result<(), &'static str> {
    if value.trim().is_empty() {
        Err("must not be blank")
    } else if value.len() > MAX_PART_BYTES {
        Err("must be at most 1024 bytes")
    } else {
        Ok(())
    }
}

/// `value` as a `&'static str`: each distinct value is kept once for the life of the process.
/// Names and operations of identities built at run time (tower layers, the budgets hedges
/// adopt) live as long as those of attributes, and there are as few of them.
pub(crate) fn intern(value: &str) -> &'static str {
    static INTERNED: std::sync::Mutex<std::collections::BTreeSet<&'static str>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let mut interned = crate::sync::lock(&INTERNED);
    if let Some(existing) = interned.get(value) {
        return existing;
    }
    let leaked: &'static str = Box::leak(value.to_owned().into_boxed_str());
    interned.insert(leaked);
    leaked
}

/// The scope of a call without `scope = …`, which the expansion borrows rather than writes.
pub static DEFAULT_SCOPE: Result<Scope, Error> = Ok(Scope::GLOBAL);

/// A validated scope: the per-call part of an identity.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Scope(Cow<'static, str>);

impl Scope {
    /// The scope used when none is given.
    pub const GLOBAL: Scope = Scope(Cow::Borrowed("global"));

    /// Whether this is [`Scope::GLOBAL`]: by address first, for the one every call without
    /// `scope = …` borrows ([`DEFAULT_SCOPE`]), so that the check on each of its calls is one
    /// comparison.
    #[inline]
    pub(crate) fn is_global(&self) -> bool {
        matches!(&DEFAULT_SCOPE, Ok(default) if std::ptr::eq(self, default))
            || *self == Scope::GLOBAL
    }

    /// A scope the macro already validated at compile time.
    pub(crate) const fn from_static(value: &'static str) -> Self {
        Scope(Cow::Borrowed(value))
    }

    /// Validates a scope value.
    pub(crate) fn new(value: impl Into<Cow<'static, str>>) -> Result<Self, Error> {
        let value = value.into();
        check_part(&value).map_err(|reason| Error::InvalidScope { reason })?;
        Ok(Scope(value))
    }

    /// The scope as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

pub use caracal_spec::PolicyKind;

/// The kind named `text`, or the configuration error that names the kinds there are.
pub(crate) fn policy_kind(text: &str) -> Result<PolicyKind, Error> {
    text.parse().map_err(|_: caracal_spec::UnknownKind| {
        let kinds: Vec<String> = PolicyKind::ALL
            .iter()
            .map(|kind| format!("`{kind}`"))
            .collect();
        let (last, others) = kinds
            .split_last()
            .unwrap_or_else(|| unreachable!("three kinds"));
        Error::config(format!(
            "unknown policy kind `{text}`: expected {} or {last}",
            others.join(", ")
        ))
    })
}

/// One coordination identity of a distributed policy, as the runtime carries it: what it is
/// (kind, name, operation, scope) and where its state lives (the key base), derived once per
/// call from the coordinator's namespace. Every backend command and every event of a
/// distributed policy starts from one of these.
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    pub(crate) kind: PolicyKind,
    /// Static for an attribute's call site; owned for one built at run time (a tower layer,
    /// the admin API).
    pub(crate) name: Cow<'static, str>,
    pub(crate) operation: Cow<'static, str>,
    pub(crate) scope: Scope,
    pub(crate) key: KeyBase,
}

impl Identity {
    /// The identity of `kind`'s (name, operation, scope) in `namespace`; every part is
    /// already validated.
    pub(crate) fn new(
        namespace: &str,
        kind: PolicyKind,
        name: impl Into<Cow<'static, str>>,
        operation: impl Into<Cow<'static, str>>,
        scope: &Scope,
    ) -> Self {
        let (name, operation) = (name.into(), operation.into());
        Identity {
            kind,
            key: KeyBase::derive(namespace, kind, &name, &operation, scope),
            name,
            operation,
            scope: scope.clone(),
        }
    }

    /// What this identity's events carry.
    pub(crate) fn at(&self) -> At<'_> {
        At {
            policy: self.kind.as_str(),
            name: &self.name,
            operation: &self.operation,
            scope: self.scope.as_str(),
            coordination: "distributed",
            shadow: false,
        }
    }
}

/// The identity the attributes that guard the whole call (`#[retry]`, `#[timeout]`,
/// `#[fallback]`) report in their events: the function's, as its coordinated attributes share
/// it. The macro fills it in; its scope is evaluated per call.
#[doc(hidden)]
#[derive(Debug)]
pub struct FunctionIdentity {
    /// The annotated function's name.
    pub function: &'static str,
    /// The `name` of the function's first coordinated attribute, else the function's name.
    pub name: &'static str,
    /// That attribute's `operation`, else `name`.
    pub operation: &'static str,
}

impl FunctionIdentity {
    /// What `policy`'s events carry for a call whose scope evaluated to `scope`.
    pub(crate) fn call<'a>(
        &self,
        policy: &'static str,
        scope: &'a Result<Scope, Error>,
    ) -> Call<'a> {
        Call {
            policy,
            function: self.function,
            name: self.name,
            operation: self.operation,
            scope: scope.as_ref().ok().map(Scope::as_str),
        }
    }
}

/// The hash tag of one identity: `caracal:v1:{<hex>}:`, to which a suffix is appended.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct KeyBase(String);

impl KeyBase {
    /// Derives the key base of an identity. The parts must already be validated.
    pub(crate) fn derive(
        namespace: &str,
        kind: PolicyKind,
        name: &str,
        operation: &str,
        scope: &Scope,
    ) -> Self {
        let mut json = String::with_capacity(
            namespace.len() + name.len() + operation.len() + scope.as_str().len() + 32,
        );
        json.push('[');
        push_js_string(&mut json, &[namespace]);
        json.push(',');
        push_js_string(&mut json, &[kind.key_name(), ":", name]);
        json.push(',');
        push_js_string(&mut json, &[operation]);
        json.push(',');
        push_js_string(&mut json, &[scope.as_str()]);
        json.push(']');
        Self::hashed(&json)
    }

    /// The key base tagged with the SHA-256 of `json`.
    fn hashed(json: &str) -> Self {
        let digest = Sha256::digest(json.as_bytes());
        let mut base = String::with_capacity(11 + 64 + 3);
        base.push_str("caracal:v1:{");
        // Derived on every distributed call: two table lookups a byte, not a `write!`.
        const HEX: &[u8; 16] = b"0123456789abcdef";
        for byte in digest {
            base.push(char::from(HEX[usize::from(byte >> 4)]));
            base.push(char::from(HEX[usize::from(byte & 0x0f)]));
        }
        base.push_str("}:");
        KeyBase(base)
    }

    /// The 64 hex digits inside the hash tag: what names the identity in pub/sub messages.
    pub(crate) fn tag(&self) -> &str {
        &self.0[12..76]
    }

    /// The key base of a namespace's own keys (its registry, its fleet overrides): the same
    /// layout, tagged with the hash of `["namespace", <namespace>]`, so no identity's can match.
    pub(crate) fn namespace(namespace: &str) -> Self {
        let mut json = String::from("[\"namespace\",");
        push_js_string(&mut json, &[namespace]);
        json.push(']');
        Self::hashed(&json)
    }

    /// The key base of the identity whose tag is `tag` (as [`tag`](Self::tag) returns it).
    pub(crate) fn from_tag(tag: &str) -> Option<Self> {
        (tag.len() == 64 && tag.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| KeyBase(format!("caracal:v1:{{{tag}}}:")))
    }

    /// The full key for `suffix`.
    pub(crate) fn key(&self, suffix: &str) -> String {
        let mut key = String::with_capacity(self.0.len() + suffix.len());
        key.push_str(&self.0);
        key.push_str(suffix);
        key
    }
}

/// Appends the concatenation of `parts` as a JSON string exactly as JavaScript's
/// `JSON.stringify` writes it, so keys match the ones @gkoos/caracal derives. (Rust strings
/// cannot hold the lone surrogates that `JSON.stringify` would also escape.)
fn push_js_string(out: &mut String, parts: &[&str]) {
    out.push('"');
    for part in parts {
        // Derived on every distributed call: a part with nothing to escape (the usual one)
        // is copied whole.
        if part
            .bytes()
            .all(|byte| byte >= 0x20 && byte != b'"' && byte != b'\\')
        {
            out.push_str(part);
        } else {
            push_escaped(out, part);
        }
    }
    out.push('"');
}

/// `part`'s characters, escaped as `JSON.stringify` escapes them.
fn push_escaped(out: &mut String, part: &str) {
    for ch in part.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scope_validation() {
        assert!(Scope::new("tenant:1").is_ok());
        assert!(matches!(
            Scope::new("  \t"),
            Err(Error::InvalidScope { .. })
        ));
        assert!(Scope::new("x".repeat(1024)).is_ok());
        assert!(matches!(
            Scope::new("x".repeat(1025)),
            Err(Error::InvalidScope { .. })
        ));
    }

    #[test]
    fn json_escaping_matches_javascript() {
        let mut out = String::new();
        push_js_string(&mut out, &["a\"b\\c\u{1}\u{1f}", "\n\t\u{7f}é😀\u{2028}"]);
        assert_eq!(out, "\"a\\\"b\\\\c\\u0001\\u001f\\n\\t\u{7f}é😀\u{2028}\"");
    }

    #[test]
    fn every_suffix_shares_the_hash_tag() {
        let base = KeyBase::derive("ns", PolicyKind::CircuitBreaker, "p", "op", &Scope::GLOBAL);
        let a = base.key("breaker");
        let b = base.key("probes");
        assert_eq!(a[..a.len() - 7], b[..b.len() - 6]);
        assert!(a.starts_with("caracal:v1:{") && a.ends_with("}:breaker"));
        assert_eq!(KeyBase::from_tag(base.tag()), Some(base));
        assert_eq!(KeyBase::from_tag("not hex"), None);
    }

    /// Keys @gkoos/caracal derives, escaping edge cases included: a Rust replica must land on
    /// the very same keys to share a budget with TypeScript ones.
    #[test]
    fn keys_match_the_typescript_vectors() {
        let vectors = include_str!("../tests/data/key-vectors.jsonl");
        let mut checked = 0;
        for line in vectors.lines().filter(|l| !l.trim().is_empty()) {
            let v: serde_json::Value = serde_json::from_str(line).expect("vector is JSON");
            let text = |field: &str| v[field].as_str().expect("string field").to_owned();
            let policy = text("policy");
            let (kind, name) = policy.split_once(':').expect("kind:name");
            let kind = PolicyKind::ALL
                .into_iter()
                .find(|known| known.key_name() == kind)
                .unwrap_or_else(|| panic!("unknown policy kind {kind}"));
            let scope = Scope::new(text("scope")).expect("vector scope is valid");
            let base = KeyBase::derive(&text("namespace"), kind, name, &text("operation"), &scope);
            assert_eq!(base.key(&text("suffix")), text("key"), "vector {line}");
            checked += 1;
        }
        assert!(checked >= 10);
    }

    #[test]
    fn delimiters_cannot_collide() {
        let a = KeyBase::derive("a:b", PolicyKind::Bulkhead, "c", "d", &Scope::GLOBAL);
        let b = KeyBase::derive("a", PolicyKind::Bulkhead, "b:c", "d", &Scope::GLOBAL);
        assert_ne!(a, b);
    }
}
