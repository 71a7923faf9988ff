//! The script registry: every `lua/*.lua` embedded at compile time, its SHA-1 computed once.
//! A script may be sent after a prelude (a file of what several scripts share, written once):
//! Redis runs one text, so the prelude's locals are the script's.

use std::sync::LazyLock;

/// One Lua script: its text and the SHA-1 `EVALSHA` addresses it by.
#[derive(Debug)]
pub(crate) struct Script {
    /// Its file's name, without `.lua`: what errors about its replies name.
    pub(crate) name: &'static str,
    /// What is sent: its prelude (if any), then its file.
    pub(crate) body: &'static str,
    /// The SHA-1 of `body`.
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

/// The text of `lua/<file>.lua`.
macro_rules! lua {
    ($file:literal) => {
        include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/", $file, ".lua"))
    };
}

/// `NAME => "file"` embeds `lua/file.lua` as the script `NAME`; `NAME => "file" after
/// "prelude"` sends `lua/prelude.lua` in front of it.
macro_rules! scripts {
    ($($static:ident => $file:literal $(after $prelude:literal)?),* $(,)?) => {
        $(
            #[doc = concat!("`lua/", $file, ".lua`", $(" after `lua/", $prelude, ".lua`",)?)]
            pub(crate) static $static: LazyLock<Script> = LazyLock::new(|| {
                Script::new($file, concat!($(lua!($prelude),)? lua!($file)))
            });
        )*

        /// Every script, for preloading and tests.
        #[cfg(test)]
        pub(crate) fn all() -> Vec<&'static Script> {
            vec![$(&*$static),*]
        }

        /// Each script's name and its own file, without its prelude: its contract opens it.
        #[cfg(test)]
        fn contracts() -> Vec<(&'static str, &'static str)> {
            vec![$(($file, lua!($file))),*]
        }
    };
}

scripts! {
    ACL_CHECK => "acl_check",
    BULKHEAD_LEASE => "bulkhead_lease",
    BREAKER_ADMIT => "breaker_admit" after "breaker_prelude",
    BREAKER_OBSERVE => "breaker_observe" after "breaker_prelude",
    BREAKER_SETTLE => "breaker_settle" after "breaker_prelude",
    BREAKER_FORCE => "breaker_force" after "breaker_prelude",
    RATE_LIMIT => "rate_limit",
    REGISTRY_REPORT => "registry_report",
    REGISTRY_READ => "registry_read",
    OVERRIDES_WRITE => "overrides_write",
    OVERRIDES_READ => "overrides_read",
    IDENTITY_READ => "identity_read",
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_script_opens_with_its_header() {
        for (name, file) in super::contracts() {
            let header: Vec<_> = file.lines().take_while(|l| l.starts_with("--")).collect();
            let header = header.join("\n");
            for field in ["KEYS", "ARGV", "Reply", "TTL", "Cost"] {
                assert!(header.contains(field), "{name} header lacks {field}");
            }
        }
        for script in super::all() {
            assert_eq!(script.sha.len(), 40);
        }
    }

    #[test]
    fn a_script_is_sent_after_its_prelude() {
        let prelude = lua!("breaker_prelude");
        for script in [
            &super::BREAKER_ADMIT,
            &super::BREAKER_OBSERVE,
            &super::BREAKER_SETTLE,
            &super::BREAKER_FORCE,
        ] {
            let file = script
                .body
                .strip_prefix(prelude)
                .expect("the prelude first");
            assert!(file.starts_with(&format!("-- {}:", script.name)));
        }
    }
}
