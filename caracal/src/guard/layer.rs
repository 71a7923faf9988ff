//! What every layer has in common: its identity (name, operation, the request's scope), and the
//! checks its setters apply to values as the attribute checks them.

use std::fmt::{self, Display};
use std::sync::Arc;
use std::time::Duration;

use crate::config::Setting;
use crate::config::keys::{self, Read as _};
use crate::error::Error;
use crate::identity::{PolicyKind, Scope, check_part, intern};

/// The scope of a request: a function of it, or the default.
type ScopeOf<Req> = Option<Arc<dyn Fn(&Req) -> Result<Scope, Error> + Send + Sync>>;

/// Checks `setting` as the attribute checks `key` of `kind`; panics otherwise (see the
/// module's docs).
pub(crate) fn checked(kind: PolicyKind, key: &str, setting: Setting) -> Setting {
    let checked = keys::find(kind, key).and_then(|spec| spec.check(setting));
    checked.unwrap_or_else(|why| panic!("caracal::tower: `{key}` of `{kind}`: {why}"))
}

/// A count setter's value, checked.
pub(crate) fn count(kind: PolicyKind, key: &str, n: u32) -> u32 {
    match checked(kind, key, Setting::Count(n)) {
        Setting::Count(n) => n,
        _ => unreachable!("a count stays a count"),
    }
}

/// A number setter's value, checked.
pub(crate) fn number(kind: PolicyKind, key: &str, x: f64) -> f64 {
    match checked(kind, key, Setting::Number(x)) {
        Setting::Number(x) => x,
        _ => unreachable!("a number stays a number"),
    }
}

/// A duration setter's value, checked.
pub(crate) fn duration(kind: PolicyKind, key: &str, d: Duration) -> Duration {
    match checked(kind, key, Setting::Duration(d)) {
        Setting::Duration(d) => d,
        _ => unreachable!("a duration stays a duration"),
    }
}

/// A name or operation, checked and made `'static` (each distinct one is kept once for the
/// life of the process, as attribute names are).
pub(crate) fn part(what: &str, value: &str) -> &'static str {
    check_part(value).unwrap_or_else(|why| panic!("caracal::tower: the {what} {why}"));
    intern(value)
}

/// What every layer has: its identity's name and operation, and the request's scope.
pub(crate) struct Identity<Req> {
    pub(crate) name: &'static str,
    pub(crate) operation: Option<&'static str>,
    pub(crate) scope: ScopeOf<Req>,
}

impl<Req> Clone for Identity<Req> {
    fn clone(&self) -> Self {
        Identity {
            name: self.name,
            operation: self.operation,
            scope: self.scope.clone(),
        }
    }
}

impl<Req> Identity<Req> {
    /// The identity `name`, with the attribute's defaults.
    pub(crate) fn new(name: &str) -> Self {
        Identity {
            name: part("name", name),
            operation: None,
            scope: None,
        }
    }

    /// The operation: the one set, or the name.
    pub(crate) fn operation(&self) -> &'static str {
        self.operation.unwrap_or(self.name)
    }

    /// Scopes requests by `f`'s value.
    pub(crate) fn scope_by<D: Display>(&mut self, f: impl Fn(&Req) -> D + Send + Sync + 'static) {
        self.scope = Some(Arc::new(move |req: &Req| Scope::new(f(req).to_string())));
    }

    /// The scope of `req`.
    pub(crate) fn scope(&self, req: &Req) -> Result<Scope, Error> {
        match &self.scope {
            Some(scope) => scope(req),
            None => Ok(Scope::GLOBAL),
        }
    }
}

impl<Req> fmt::Debug for Identity<Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity")
            .field("name", &self.name)
            .field("operation", &self.operation())
            .field("scoped", &self.scope.is_some())
            .finish()
    }
}

/// The setters every layer has (`operation`, `scope`, `local`), on a builder with the fields
/// `identity: Identity<Req>` and `local: bool`.
macro_rules! identity_setters {
    () => {
        /// The operation (by default, the name).
        pub fn operation(mut self, operation: &str) -> Self {
            self.identity.operation = Some($crate::guard::layer::part("operation", operation));
            self
        }

        /// The scope of a request (by default, `global`): every distinct value has its own
        /// state. A value that is blank or longer than 1024 bytes fails the call with
        /// [`Error::InvalidScope`](crate::Error::InvalidScope).
        pub fn scope<D: ::std::fmt::Display>(
            mut self,
            scope: impl Fn(&Req) -> D + Send + Sync + 'static,
        ) -> Self {
            self.identity.scope_by(scope);
            self
        }

        /// Per-process only: the state is this process's, the coordinator is never asked.
        pub fn local(mut self) -> Self {
            self.local = true;
            self
        }
    };
}

pub(crate) use identity_setters;
