//! Redis URLs as the coordinator keeps them: whatever prints one (`Debug`, `Display`, an
//! error, an event) shows it with its password hidden, so a `?builder` log field, a `dbg!`
//! or an application's configuration deriving `Debug` never carries a credential.

use std::fmt;

/// A Redis URL that prints redacted; [`Url::expose`] hands the real one to the client only.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Url(String);

impl Url {
    pub(crate) fn new(url: impl Into<String>) -> Self {
        Url(url.into())
    }

    /// The URL with its credentials, for the Redis client and nothing else.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Url {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&redacted(&self.0), f)
    }
}

impl fmt::Display for Url {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redacted(&self.0))
    }
}

/// `url` with its password replaced by `***`: `redis://user:***@host:6379/0`,
/// `redis://***@host` (a lone user-info part is a password to Redis URLs), and the `pass=` or
/// `password=` query parameter of a `redis+unix://` URL. Errs towards hiding too much: the
/// user-info part runs to the last `@`, wherever it is, since a password may hold a `/`.
///
/// ```
/// assert_eq!(
///     caracal::admin::redacted_url("redis://app:s3cret@redis.internal:6379/0"),
///     "redis://app:***@redis.internal:6379/0"
/// );
/// assert_eq!(caracal::admin::redacted_url("redis://h:6379"), "redis://h:6379");
/// ```
pub fn redacted(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    };
    let rest = match rest.rfind('@') {
        Some(at) => {
            let hidden = match rest[..at].split_once(':') {
                Some((user, _)) => format!("{user}:***"),
                None => "***".to_owned(),
            };
            format!("{hidden}{}", &rest[at..])
        }
        None => rest.to_owned(),
    };
    let rest = match rest.split_once('?') {
        Some((path, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((key, _)) if matches!(key, "pass" | "password") => format!("{key}=***"),
                    _ => pair.to_owned(),
                })
                .collect();
            format!("{path}?{}", query.join("&"))
        }
        None => rest,
    };
    match scheme {
        Some(scheme) => format!("{scheme}://{rest}"),
        None => rest,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_of_a_password_is_hidden() {
        for (url, shown) in [
            ("redis://user:pw@h:6379/0", "redis://user:***@h:6379/0"),
            ("rediss://:pw@h", "rediss://:***@h"),
            ("redis://pw@h", "redis://***@h"),
            ("redis://u:p/w@h:1", "redis://u:***@h:1"),
            ("redis://u:p@w@h", "redis://u:***@h"),
            (
                "redis+unix:///tmp/r.sock?db=1&pass=pw",
                "redis+unix:///tmp/r.sock?db=1&pass=***",
            ),
            (
                "redis-sentinel://u:pw@a:26379,b:26379/0#main",
                "redis-sentinel://u:***@a:26379,b:26379/0#main",
            ),
            ("redis://h:6379", "redis://h:6379"),
            ("u:pw@h", "u:***@h"),
        ] {
            assert_eq!(redacted(url), shown, "{url}");
            assert!(!format!("{:?}{}", Url::new(url), Url::new(url)).contains("pw"));
        }
    }
}
