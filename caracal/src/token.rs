//! Random values that name what caracal writes: lease and probe tokens, and the generation of
//! an epoch started after its state was lost. At the bottom: the coordinator, its backends and
//! the policies all draw them.

/// A fresh lease or probe token: a version-4 UUID, as the TypeScript library's tokens are,
/// drawn from the thread's generator (seeded from the OS once) rather than from a system call
/// per token, which `Uuid::new_v4` makes.
pub(crate) fn fresh() -> uuid::Uuid {
    uuid::Builder::from_random_bytes(rand::random()).into_uuid()
}

/// A generation for an epoch started after its state was lost: random, non-zero, and below
/// 2^44 so it survives Lua's double-precision numbers exactly.
pub(crate) fn generation() -> u64 {
    (rand::random::<u64>() & ((1 << 44) - 1)).max(1)
}

#[cfg(test)]
mod tests {
    /// Tokens are what the TypeScript library writes (version-4 UUIDs), and never repeat.
    #[test]
    fn fresh_tokens_are_distinct_version_4_uuids() {
        let tokens: std::collections::HashSet<uuid::Uuid> =
            (0..10_000).map(|_| super::fresh()).collect();
        assert_eq!(tokens.len(), 10_000);
        for token in tokens {
            assert_eq!(token.get_version(), Some(uuid::Version::Random));
            assert_eq!(token.get_variant(), uuid::Variant::RFC4122);
        }
    }
}
