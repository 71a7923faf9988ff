//! Strict decoding of script replies: anything but the promised shape is a coordinator failure,
//! never a panic and never a guess.

use redis::Value;

use crate::error::Error;
use crate::error::FailureKind;

/// A reply that does not have the shape `script` promises.
pub(crate) fn malformed(script: &str, detail: impl std::fmt::Display) -> Error {
    Error::unavailable(
        FailureKind::MalformedReply,
        format!("{script} replied {detail}"),
    )
}

/// Decodes an array of exactly `N` integers.
pub(crate) fn integers<const N: usize>(script: &str, value: Value) -> Result<[i64; N], Error> {
    let run = integer_run(script, value, N, || N.to_string())?;
    Ok(std::array::from_fn(|index| run[index]))
}

/// Decodes a flat array of `count` groups of `N` integers (one group per request of a batch).
pub(crate) fn integer_groups<const N: usize>(
    script: &str,
    value: Value,
    count: usize,
) -> Result<Vec<[i64; N]>, Error> {
    let run = integer_run(script, value, N * count, || format!("{N} × {count}"))?;
    Ok(run
        .chunks_exact(N)
        .map(|group| std::array::from_fn(|index| group[index]))
        .collect())
}

/// Decodes an array of exactly `len` integers; `expected` says what `len` is made of.
pub(crate) fn integer_run(
    script: &str,
    value: Value,
    len: usize,
    expected: impl FnOnce() -> String,
) -> Result<Vec<i64>, Error> {
    let Value::Array(items) = value else {
        return Err(malformed(
            script,
            format_args!("{} instead of an array", kind(&value)),
        ));
    };
    if items.len() != len {
        return Err(malformed(
            script,
            format_args!("{} items instead of {}", items.len(), expected()),
        ));
    }
    items
        .into_iter()
        .map(|item| match item {
            Value::Int(n) => Ok(n),
            other => Err(malformed(
                script,
                format_args!("{} where an integer belongs", kind(&other)),
            )),
        })
        .collect()
}

/// Decodes an array of strings.
pub(crate) fn strings(script: &str, value: Value) -> Result<Vec<String>, Error> {
    let Value::Array(items) = value else {
        return Err(malformed(
            script,
            format_args!("{} instead of an array", kind(&value)),
        ));
    };
    items
        .into_iter()
        .map(|item| match item {
            Value::BulkString(bytes) => String::from_utf8(bytes)
                .map_err(|_| malformed(script, "a string that is not UTF-8")),
            Value::SimpleString(text) => Ok(text),
            other => Err(malformed(
                script,
                format_args!("{} where a string belongs", kind(&other)),
            )),
        })
        .collect()
}

/// Decodes an integer reply that must lie in `range`.
pub(crate) fn integer_in(
    script: &str,
    value: Value,
    range: std::ops::RangeInclusive<i64>,
) -> Result<i64, Error> {
    match value {
        Value::Int(n) if range.contains(&n) => Ok(n),
        Value::Int(n) => Err(malformed(script, format_args!("{n}, outside {range:?}"))),
        other => Err(malformed(
            script,
            format_args!("{} instead of an integer", kind(&other)),
        )),
    }
}

/// Decodes a 0/1 flag.
pub(crate) fn flag(script: &str, n: i64) -> Result<bool, Error> {
    match n {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(malformed(script, format_args!("{n} where 0 or 1 belongs"))),
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Nil => "nil",
        Value::Int(_) => "an integer",
        Value::BulkString(_) => "a bulk string",
        Value::Array(_) => "an array",
        Value::SimpleString(_) => "a simple string",
        Value::Okay => "OK",
        Value::Map(_) => "a map",
        Value::Attribute { .. } => "an attribute",
        Value::Set(_) => "a set",
        Value::Double(_) => "a double",
        Value::Boolean(_) => "a boolean",
        Value::VerbatimString { .. } => "a verbatim string",
        Value::BigNumber(_) => "a big number",
        Value::Push { .. } => "a push",
        Value::ServerError(_) => "a server error",
        _ => "an unknown value",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_the_promised_shape() {
        let value = Value::Array(vec![Value::Int(1), Value::Int(3)]);
        assert_eq!(integers::<2>("s", value).ok(), Some([1, 3]));
    }

    #[test]
    fn refuses_every_other_shape() {
        let cases = [
            Value::Nil,
            Value::Int(1),
            Value::Array(vec![Value::Int(1)]),
            Value::Array(vec![Value::Int(1), Value::Int(2), Value::Int(3)]),
            Value::Array(vec![Value::Int(1), Value::BulkString(b"2".to_vec())]),
            Value::Array(vec![Value::Nil, Value::Int(2)]),
            Value::SimpleString("OK".into()),
        ];
        for value in cases {
            let err = integers::<2>("s", value).expect_err("malformed");
            assert_eq!(err.failure_kind(), Some(FailureKind::MalformedReply));
        }
        assert!(flag("s", 2).is_err());
        assert!(integer_in("s", Value::Int(2), 0..=1).is_err());
    }
}
