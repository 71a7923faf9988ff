//! A ledger of guarded bodies on a Redis server's clock: every body enters with an id and
//! leaves with it, and whenever more than `limit` are open at once the ledger records who was
//! in. Unlike [`Witness`](crate::Witness)'s counter, it knows *which* bodies overlapped, so a
//! soak can tell an overlap the library must prevent from one a lease cannot (a body whose
//! process was frozen past its lease), and bodies of a killed process can be closed by id.
//!
//! It can also log the bodies that *completed* after running longer than a threshold: only such
//! a body can have been frozen past its lease, and one that completed after such a freeze took
//! a step it must not have.
//!
//! Ids are `"<pid>-<rest>"`, so the bodies of one process can be found again. Point the
//! ledger at a server of its own, never at the one under test.

use std::time::Duration;

/// Records `ARGV[1]` entering at server time: returns the number of open bodies, and logs a
/// violation (time and every open body with its entry time) when they are more than `ARGV[2]`.
const ENTER: &str = r"
local clock = redis.call('TIME')
local now = string.format('%d', tonumber(clock[1]) * 1000000 + tonumber(clock[2]))
redis.call('HSET', KEYS[1], ARGV[1], now)
local open = redis.call('HLEN', KEYS[1])
local max = tonumber(redis.call('GET', KEYS[2]) or '0')
if open > max then redis.call('SET', KEYS[2], open) end
if open > tonumber(ARGV[2]) then
  local entries = redis.call('HGETALL', KEYS[1])
  local parts = {}
  for i = 1, #entries, 2 do parts[#parts + 1] = entries[i] .. '@' .. entries[i + 1] end
  redis.call('RPUSH', KEYS[3], now .. ' ' .. table.concat(parts, ','))
end
return open
";

/// Records `ARGV[1]` completing its body (leaving, not dropped): when it took longer than
/// `ARGV[2]` µs, logs it with its entry and exit times (only a body that long can have been
/// frozen past its lease).
const COMPLETE: &str = r"
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local entered = tonumber(redis.call('HGET', KEYS[1], ARGV[1]))
redis.call('HDEL', KEYS[1], ARGV[1])
if entered and now - entered > tonumber(ARGV[2]) then
  redis.call('RPUSH', KEYS[2], ARGV[1] .. ' ' .. string.format('%d %d', entered, now))
end
";

/// The key names of one ledger.
#[derive(Debug, Clone)]
struct Keys {
    open: String,
    max: String,
    violations: String,
    long: String,
}

impl Keys {
    fn new(name: &str) -> Self {
        Keys {
            open: format!("{name}:open"),
            max: format!("{name}:max"),
            violations: format!("{name}:violations"),
            long: format!("{name}:long"),
        }
    }

    fn enter(&self, id: &str, limit: u64) -> redis::ScriptInvocation<'static> {
        let mut invocation = enter_script().prepare_invoke();
        invocation
            .key(&self.open)
            .key(&self.max)
            .key(&self.violations)
            .arg(id)
            .arg(limit);
        invocation
    }

    fn exit(&self, id: &str) -> redis::Cmd {
        let mut cmd = redis::cmd("HDEL");
        cmd.arg(&self.open).arg(id);
        cmd
    }
}

fn enter_script() -> &'static redis::Script {
    static SCRIPT: std::sync::OnceLock<redis::Script> = std::sync::OnceLock::new();
    SCRIPT.get_or_init(|| redis::Script::new(ENTER))
}

/// A body that completed (left the ledger rather than being dropped) after running longer than
/// the ledger's threshold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LongBody {
    /// The body's id.
    pub id: String,
    /// When it entered (server µs).
    pub entered_us: u64,
    /// When it completed (server µs).
    pub completed_us: u64,
}

/// More than `limit` bodies open at once, as the ledger saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// When the body that made them too many entered (server µs).
    pub at_us: u64,
    /// Every open body then: its id and when it entered (server µs).
    pub open: Vec<(String, u64)>,
}

impl Violation {
    /// The process ids among the open bodies.
    pub fn pids(&self) -> impl Iterator<Item = u32> + '_ {
        self.open.iter().filter_map(|(id, _)| pid_of(id))
    }
}

/// The process id in a body id `"<pid>-…"`.
pub fn pid_of(id: &str) -> Option<u32> {
    id.split('-').next()?.parse().ok()
}

/// The orchestrator's side: reads the ledger and closes the bodies of killed processes.
pub struct Ledger {
    keys: Keys,
    conn: redis::Connection,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger")
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

impl Ledger {
    /// The ledger `name` on the server at `url`.
    ///
    /// # Panics
    /// When the server cannot be reached.
    pub fn new(url: &str, name: &str) -> Self {
        let conn = redis::Client::open(url)
            .and_then(|client| client.get_connection_with_timeout(Duration::from_secs(5)))
            .unwrap_or_else(|e| panic!("ledger {name} on {url}: {e}"));
        Ledger {
            keys: Keys::new(name),
            conn,
        }
    }

    /// The server's time in µs (to place outside events, such as a process being frozen, on
    /// the ledger's clock).
    pub fn now_us(&mut self) -> u64 {
        let (seconds, micros): (u64, u64) = redis::cmd("TIME")
            .query(&mut self.conn)
            .expect("ledger TIME");
        seconds * 1_000_000 + micros
    }

    /// Closes every open body of process `pid` (it was killed: its bodies ended with it).
    pub fn close_process(&mut self, pid: u32) {
        let open: Vec<String> = redis::cmd("HKEYS")
            .arg(&self.keys.open)
            .query(&mut self.conn)
            .expect("ledger HKEYS");
        for id in open.iter().filter(|id| pid_of(id) == Some(pid)) {
            self.keys
                .exit(id)
                .query::<()>(&mut self.conn)
                .expect("ledger HDEL");
        }
    }

    /// Bodies open now.
    pub fn open(&mut self) -> u64 {
        redis::cmd("HLEN")
            .arg(&self.keys.open)
            .query(&mut self.conn)
            .expect("ledger HLEN")
    }

    /// The processes with a body open now.
    pub fn open_pids(&mut self) -> std::collections::BTreeSet<u32> {
        let open: Vec<String> = redis::cmd("HKEYS")
            .arg(&self.keys.open)
            .query(&mut self.conn)
            .expect("ledger HKEYS");
        open.iter().filter_map(|id| pid_of(id)).collect()
    }

    /// The most bodies ever open at once.
    pub fn max_open(&mut self) -> u64 {
        redis::cmd("GET")
            .arg(&self.keys.max)
            .query::<Option<u64>>(&mut self.conn)
            .expect("ledger GET")
            .unwrap_or(0)
    }

    /// The bodies that completed after running longer than the threshold the workers were given.
    pub fn long_bodies(&mut self) -> Vec<LongBody> {
        let lines: Vec<String> = redis::cmd("LRANGE")
            .arg(&self.keys.long)
            .arg(0)
            .arg(-1)
            .query(&mut self.conn)
            .expect("ledger LRANGE");
        lines
            .iter()
            .map(|line| {
                let mut parts = line.split(' ');
                let body = (|| {
                    Some(LongBody {
                        id: parts.next()?.to_owned(),
                        entered_us: parts.next()?.parse().ok()?,
                        completed_us: parts.next()?.parse().ok()?,
                    })
                })();
                body.unwrap_or_else(|| panic!("ledger: unreadable long body {line:?}"))
            })
            .collect()
    }

    /// Every violation, in order.
    pub fn violations(&mut self) -> Vec<Violation> {
        let lines: Vec<String> = redis::cmd("LRANGE")
            .arg(&self.keys.violations)
            .arg(0)
            .arg(-1)
            .query(&mut self.conn)
            .expect("ledger LRANGE");
        lines
            .iter()
            .map(|line| {
                parse_violation(line)
                    .unwrap_or_else(|| panic!("ledger: unreadable violation {line:?}"))
            })
            .collect()
    }
}

fn parse_violation(line: &str) -> Option<Violation> {
    let (at, entries) = line.split_once(' ')?;
    let open = entries
        .split(',')
        .filter_map(|entry| {
            let (id, entered) = entry.rsplit_once('@')?;
            Some((id.to_owned(), entered.parse().ok()?))
        })
        .collect();
    Some(Violation {
        at_us: at.parse().ok()?,
        open,
    })
}

/// A worker's side, for guarded bodies in async code: they enter and leave.
///
/// Every record is written on a blocking connection, the calling thread waiting for its reply
/// (one round trip to the ledger's own server). A body's exit is recorded as its guard is
/// dropped, which cannot await: written there, it has landed before the drop returns, so
/// before the library's cancellation of the body is over, and the ledger judges the body by
/// when it stopped. An exit sent from a task of its own landed whenever that task ran: after
/// the next holder's entry, or never when the process ended first (a holder cancelled just
/// before its process exits), a false overlap either way. Entries and completions go the
/// same way, so no record is ever in flight behind a body cancelled while making it, and
/// every record of a process reaches the server in the order it was made.
#[derive(Clone)]
pub struct AsyncLedger {
    keys: Keys,
    conn: std::sync::Arc<std::sync::Mutex<redis::Connection>>,
    limit: u64,
    /// Bodies completing after running longer than this are logged (µs).
    long_us: u64,
}

impl std::fmt::Debug for AsyncLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncLedger")
            .field("keys", &self.keys)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl AsyncLedger {
    /// The ledger `name` at `url`, for bodies under a limit of `limit`.
    ///
    /// # Panics
    /// When the server cannot be reached within 5 s.
    pub fn connect(url: &str, name: &str, limit: u64) -> Self {
        Self::connect_logging_longer_than(url, name, limit, Duration::MAX)
    }

    /// Like [`connect`](Self::connect), and logs every body that completes after running
    /// longer than `long` (see [`Ledger::long_bodies`]).
    ///
    /// # Panics
    /// When the server cannot be reached within 5 s.
    pub fn connect_logging_longer_than(url: &str, name: &str, limit: u64, long: Duration) -> Self {
        let conn = redis::Client::open(url)
            .and_then(|client| client.get_connection_with_timeout(Duration::from_secs(5)))
            .unwrap_or_else(|e| panic!("ledger {name} on {url}: {e}"));
        // A record waits out a busy machine (a minute per reply), not a server that stopped
        // answering for good.
        let patience = Some(Duration::from_secs(60));
        conn.set_read_timeout(patience)
            .and_then(|()| conn.set_write_timeout(patience))
            .unwrap_or_else(|e| panic!("ledger {name} on {url}: {e}"));
        AsyncLedger {
            keys: Keys::new(name),
            conn: std::sync::Arc::new(std::sync::Mutex::new(conn)),
            limit,
            long_us: u64::try_from(long.as_micros()).unwrap_or(u64::MAX),
        }
    }

    /// Records body `id` entering. The body is in the ledger until [`Entered::leave`], or
    /// until the guard is dropped if it is cancelled first.
    pub fn enter(&self, id: &str) -> Entered {
        let _open: u64 = self
            .keys
            .enter(id, self.limit)
            .invoke(&mut *self.connection())
            .unwrap_or_else(|e| panic!("ledger enter: {e}"));
        Entered {
            ledger: self.clone(),
            id: Some(id.to_owned()),
        }
    }

    /// The connection; a panic while another body held it (its record failed) leaves it fit
    /// for the next record.
    fn connection(&self) -> std::sync::MutexGuard<'_, redis::Connection> {
        self.conn
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn exit(&self, id: &str) -> redis::RedisResult<()> {
        self.keys.exit(id).query(&mut *self.connection())
    }

    fn complete(&self, id: &str) {
        static SCRIPT: std::sync::OnceLock<redis::Script> = std::sync::OnceLock::new();
        SCRIPT
            .get_or_init(|| redis::Script::new(COMPLETE))
            .key(&self.keys.open)
            .key(&self.keys.long)
            .arg(id)
            .arg(self.long_us)
            .invoke::<()>(&mut *self.connection())
            .unwrap_or_else(|e| panic!("ledger complete: {e}"));
    }
}

/// A body in the ledger: it leaves when the body ends, however it ends.
#[derive(Debug)]
pub struct Entered {
    ledger: AsyncLedger,
    id: Option<String>,
}

impl Entered {
    /// Records the body completing (leaving, not dropped); the ledger has it on return.
    pub fn leave(mut self) {
        if let Some(id) = self.id.take() {
            self.ledger.complete(&id);
        }
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        if let Some(id) = self.id.take()
            && let Err(e) = self.ledger.exit(&id)
            // Unrecorded, the body stays open in the ledger: counted, never hidden. Said
            // unless a panic is under way already, which a second one would turn into an abort.
            && !std::thread::panicking()
        {
            panic!("ledger exit of {id}: {e}");
        }
    }
}
