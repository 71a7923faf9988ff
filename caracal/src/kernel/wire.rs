//! What a kernel's command and reply look like on the way to and from its script: the clock a
//! step reads, where its arguments are written and how a reply's integers are checked.

use std::fmt;

/// One reading of the clock a step decides at, in the units kernels use: Redis `TIME` inside a
/// script, tokio's clock in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Now {
    /// Milliseconds.
    pub(crate) ms: u64,
    /// Nanoseconds.
    pub(crate) ns: u64,
    /// The step's place in the order of every step of its backend, strictly increasing: what a
    /// reply is stamped with (a script stamps it with its server time in microseconds).
    pub(crate) order: u64,
}

/// Where a script publishes what it decides (the breaker's transitions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Publish {
    /// It publishes nothing.
    Nothing,
    /// It publishes, as decided by a call.
    Calls,
    /// It publishes, as decided by an operator.
    Operator,
}

/// What the backend knows that a script call carries besides its commands.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Wire<'a> {
    /// The channel a publishing script publishes on (`""`: nowhere).
    pub(crate) channel: &'a str,
    /// What its messages start with (who decided, and about which identity).
    pub(crate) prefix: &'a str,
    /// The highest fencing token the caller knows to be live in the identity (0: none).
    pub(crate) known: u64,
}

/// Where a command's script arguments are written, in `ARGV` order.
pub(crate) trait Sink {
    /// An integer argument.
    fn int(&mut self, n: u64);
    /// A text argument.
    fn text(&mut self, text: &str);
}

/// A reply without the shape its script promises: what was wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Malformed(pub(crate) String);

impl Malformed {
    /// `detail` about a reply, e.g. `"phase 9"`.
    pub(crate) fn new(detail: impl fmt::Display) -> Self {
        Malformed(detail.to_string())
    }

    /// A flag: 0 or 1.
    pub(crate) fn flag(n: i64) -> Result<bool, Malformed> {
        match n {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(Malformed::new(format_args!("{other} where 0 or 1 belongs"))),
        }
    }

    /// A count that fits a `u32`.
    pub(crate) fn count(n: i64) -> Result<u32, Malformed> {
        u32::try_from(n).map_err(|_| Malformed::new(format_args!("{n} where a count belongs")))
    }

    /// A non-negative integer, `what` naming it for the error.
    pub(crate) fn natural(what: &str, n: i64) -> Result<u64, Malformed> {
        u64::try_from(n).map_err(|_| Malformed::new(format_args!("{what} {n}")))
    }
}

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A reply with its place in the order of its identity's decisions: a script stamps it with its
/// server time (microseconds), the in-memory backend with [`Now::order`]. Replies can reach a
/// process in another order than they were decided in (a batch is sent from a background task,
/// replies are handled by different tasks); the stamp puts them back in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamped<T> {
    pub(crate) reply: T,
    pub(crate) stamp: u64,
}
