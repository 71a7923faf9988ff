//! The script registry: every `lua/*.lua` embedded at compile time, its SHA-1 computed once.

use std::sync::LazyLock;

/// One Lua script: its text and the SHA-1 `EVALSHA` addresses it by.
#[derive(Debug)]
pub(crate) struct Script {
    pub(crate) name: &'static str,
    pub(crate) body: &'static str,
    pub(crate) sha: String,
}

impl Script {
    fn new(name: &'static str, body: &'static str) -> Self {
        Script {
            name,
            body,
            sha: redis::Script::new(body).get_hash().to_owned(),
        }
    }
}

macro_rules! scripts {
    ($($static:ident => $file:literal),* $(,)?) => {
        $(
            pub(crate) static $static: LazyLock<Script> = LazyLock::new(|| {
                Script::new($file, include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/", $file, ".lua")))
            });
        )*

        /// The script called `name`: what a kind's status read names.
        pub(crate) fn named(name: &str) -> Option<&'static Script> {
            match name {
                $($file => Some(&*$static),)*
                _ => None,
            }
        }

        /// Every script, for preloading and tests.
        #[cfg(test)]
        pub(crate) fn all() -> Vec<&'static Script> {
            vec![$(&*$static),*]
        }
    };
}

scripts! {
    ACL_CHECK => "acl_check",
    BULKHEAD_LEASE => "bulkhead_lease",
    BREAKER_ADMIT => "breaker_admit",
    BREAKER_OBSERVE => "breaker_observe",
    BREAKER_SETTLE => "breaker_settle",
    BREAKER_FORCE => "breaker_force",
    RATE_LIMIT => "rate_limit",
    REGISTRY_REPORT => "registry_report",
    REGISTRY_READ => "registry_read",
    OVERRIDES_WRITE => "overrides_write",
    OVERRIDES_READ => "overrides_read",
    BULKHEAD_STATUS => "bulkhead_status",
    BREAKER_STATUS => "breaker_status",
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_script_opens_with_its_header() {
        for script in super::all() {
            let header: Vec<_> = script
                .body
                .lines()
                .take_while(|l| l.starts_with("--"))
                .collect();
            let header = header.join("\n");
            for field in ["KEYS", "ARGV", "Reply", "TTL", "Cost"] {
                assert!(
                    header.contains(field),
                    "{} header lacks {field}",
                    script.name
                );
            }
            assert_eq!(script.sha.len(), 40);
        }
    }
}
