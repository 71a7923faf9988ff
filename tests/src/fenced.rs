//! A downstream that honours fencing tokens: a write is accepted only with a token above every
//! token it accepted before, so a holder whose lease was lost (and another holder's since) is
//! refused even when its write arrives late. It keeps the tokens it accepted and refused, in
//! order, on a Redis server of its own.

/// Accepts `ARGV[1]` if it is above the highest accepted so far.
const WRITE: &str = r"
local token = tonumber(ARGV[1])
local highest = tonumber(redis.call('GET', KEYS[1]) or '0')
if token > highest then
  redis.call('SET', KEYS[1], ARGV[1])
  redis.call('RPUSH', KEYS[2], ARGV[1])
  return 1
end
redis.call('RPUSH', KEYS[3], ARGV[1])
return 0
";

/// The keys of one fenced store named `name`.
fn keys(name: &str) -> [String; 3] {
    [
        format!("{name}:highest"),
        format!("{name}:accepted"),
        format!("{name}:refused"),
    ]
}

/// Writes with `token` to the store `name` on `conn`: whether it was accepted.
///
/// # Panics
/// When Redis fails.
pub async fn write(conn: &mut redis::aio::MultiplexedConnection, name: &str, token: u64) -> bool {
    // A plain EVAL: one request, whatever the server has cached (a write may be the first
    // thing a slow link carries).
    let accepted: i64 = redis::cmd("EVAL")
        .arg(WRITE)
        .arg(3)
        .arg(&keys(name))
        .arg(token)
        .query_async(conn)
        .await
        .unwrap_or_else(|e| panic!("fenced write to {name}: {e}"));
    accepted == 1
}

/// The tokens the store `name` accepted and refused, each in order.
///
/// # Panics
/// When Redis fails.
pub fn history(conn: &mut redis::Connection, name: &str) -> (Vec<u64>, Vec<u64>) {
    let [_, accepted, refused] = keys(name);
    let list = |conn: &mut redis::Connection, key: &str| -> Vec<u64> {
        redis::cmd("LRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .query(conn)
            .unwrap_or_else(|e| panic!("fenced store {name}: {e}"))
    };
    (list(conn, &accepted), list(conn, &refused))
}
