//! The three state machines every policy decision comes down to, as pure functions of (stored
//! state, input, `now`): the circuit breaker ([`breaker`]), the bulkhead's lease set
//! ([`lease`]) and the rate limiter's GCRA cell ([`gcra`]).
//!
//! Nothing here reads a clock, does I/O or draws a random number: `now` and every value that
//! would be random (a token, a generation to mint) come in as plain integers. That is what lets
//! one piece of code serve three users — the local policies and the in-memory coordinator run
//! it on tokio's clock, and each Lua script in `lua/` implements the same steps on Redis time —
//! and lets a differential test replay generated sequences against a kernel and its script and
//! demand identical replies and identical stored state.
//!
//! This module sits below both the policies and the coordinator backends and imports neither.

pub(crate) mod breaker;
pub(crate) mod gcra;
pub(crate) mod lease;

/// Which branches of a kernel a run reached, one bit per branch: the coverage a differential
/// test asserts. Recording is a single OR; callers that do not measure coverage pass a
/// throwaway value.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Seen(u64);

impl Seen {
    /// Marks branch `index` (below 64) as reached.
    pub(crate) fn record(&mut self, index: usize) {
        self.0 |= 1 << index;
    }

    /// Adds what `other` reached.
    #[cfg(test)]
    pub(crate) fn merge(&mut self, other: Seen) {
        self.0 |= other.0;
    }

    /// The branches of `all` (indexed as recorded) never reached.
    #[cfg(test)]
    pub(crate) fn missing<'a, T>(&self, all: &'a [T]) -> Vec<&'a T> {
        all.iter()
            .enumerate()
            .filter(|&(index, _)| self.0 & (1 << index) == 0)
            .map(|(_, branch)| branch)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::Seen;

    #[test]
    fn seen_reports_what_was_not_reached() {
        let mut seen = Seen::default();
        seen.record(0);
        let mut other = Seen::default();
        other.record(2);
        seen.merge(other);
        assert_eq!(seen.missing(&["a", "b", "c", "d"]), [&"b", &"d"]);
    }
}
