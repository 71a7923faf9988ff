//! Runnable examples live beside this crate as `[[example]]` targets. What more than one of
//! them needs lives here: the benchmarks' JSON lines and their reading of Redis' `INFO`.

/// The Redis the examples use: `CARACAL_REDIS_URL`, else `redis://127.0.0.1:6379`.
pub fn redis_url() -> String {
    std::env::var("CARACAL_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// Prints one JSON line: a figure name and its numeric fields. A whole number is written
/// without decimals, anything else with three; a value that is not finite (a ratio to a
/// baseline that could not be measured) is `null`.
pub fn emit(figure: &str, fields: &[(&str, f64)]) {
    let fields: Vec<String> = fields
        .iter()
        .map(|&(name, value)| {
            if !value.is_finite() {
                format!("\"{name}\":null")
            } else if value.fract() == 0.0 && value.abs() < 1e15 {
                format!("\"{name}\":{value:.0}")
            } else {
                format!("\"{name}\":{value:.3}")
            }
        })
        .collect();
    println!("{{\"figure\":\"{figure}\",{}}}", fields.join(","));
}

/// Prints one JSON line: a figure name and text fields (say, why a part was skipped).
pub fn emit_text(figure: &str, fields: &[(&str, &str)]) {
    let fields: Vec<String> = fields
        .iter()
        .map(|&(name, value)| format!("\"{name}\":{}", json_string(value)))
        .collect();
    println!("{{\"figure\":\"{figure}\",{}}}", fields.join(","));
}

fn json_string(text: &str) -> String {
    let mut quoted = String::with_capacity(text.len() + 2);
    quoted.push('"');
    for c in text.chars() {
        match c {
            '"' => quoted.push_str("\\\""),
            '\\' => quoted.push_str("\\\\"),
            '\n' => quoted.push_str("\\n"),
            c if u32::from(c) < 0x20 => quoted.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => quoted.push(c),
        }
    }
    quoted.push('"');
    quoted
}

/// `(command, calls, usec)` of every line of an `INFO commandstats` reply.
///
/// Redis counts a command a script runs on that command's own line as well as inside the
/// script's time: summing every line counts it twice.
pub fn commandstats(info: &str) -> impl Iterator<Item = (&str, f64, f64)> {
    info.lines().filter_map(|line| {
        let (command, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
        let field = |name: &str| {
            stats
                .split(',')
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        Some((command, field("calls"), field("usec")))
    })
}
