//! A Lua script as a `static`: its text, assembled from its parts (a shared prelude and the
//! body), and the SHA-1 `EVALSHA` addresses it by, both computed once on first use. A kernel
//! names its script; it lives outside `kernel/`, which hashes nothing with a Redis client.

use std::sync::OnceLock;

/// One Lua script, as a `static` its kernel names.
#[derive(Debug)]
pub(crate) struct Script {
    /// What errors and tests call it.
    pub(crate) name: &'static str,
    parts: &'static [&'static str],
    assembled: OnceLock<Assembled>,
}

#[derive(Debug)]
struct Assembled {
    body: String,
    sha: String,
}

impl Script {
    /// The script `name` whose text is `parts`, joined.
    pub(crate) const fn new(name: &'static str, parts: &'static [&'static str]) -> Self {
        Script {
            name,
            parts,
            assembled: OnceLock::new(),
        }
    }

    fn assembled(&self) -> &Assembled {
        self.assembled.get_or_init(|| {
            let body = self.parts.concat();
            let sha = redis::Script::new(&body).get_hash().to_owned();
            Assembled { body, sha }
        })
    }

    /// The whole text, as `EVAL` sends it.
    pub(crate) fn body(&self) -> &str {
        &self.assembled().body
    }

    /// The SHA-1 of [`body`](Self::body), as `EVALSHA` names it.
    pub(crate) fn sha(&self) -> &str {
        &self.assembled().sha
    }
}
