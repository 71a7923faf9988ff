//! What a call's result means to the circuit breaker.

/// How the circuit breaker counts one call's result, as returned by a `classify` function.
///
/// ```
/// use caracal::Outcome;
///
/// // Count a 404 as a success: the partner answered, the resource just is not there.
/// fn classify(result: &Result<u16, std::io::Error>) -> Outcome {
///     match result {
///         Ok(_) => Outcome::Success,
///         Err(e) if e.kind() == std::io::ErrorKind::NotFound => Outcome::Success,
///         Err(_) => Outcome::Failure,
///     }
/// }
/// assert_eq!(classify(&Ok(200)), Outcome::Success);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// The downstream behaved: counts towards keeping (or getting) the breaker closed.
    Success,
    /// The downstream failed: counts towards opening the breaker.
    Failure,
    /// Not evidence either way: recorded nowhere; a probe slot it held is freed.
    Ignored,
}

impl Outcome {
    /// A stable snake_case name, used in events.
    ///
    /// ```
    /// assert_eq!(caracal::Outcome::Ignored.as_str(), "ignored");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Failure => "failure",
            Outcome::Ignored => "ignored",
        }
    }
}
