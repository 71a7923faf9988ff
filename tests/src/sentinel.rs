//! A Sentinel-managed deployment on loopback: a master, its replicas (each a [`RedisServer`])
//! and three `redis-sentinel` processes watching them under the name [`MASTER_NAME`], with a
//! short `down-after-milliseconds` so a failover takes seconds.
//!
//! Every wait is bounded and panics with the sentinels' log tails when it runs out.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::server::{
    PortReservation, RedisServer, ensure_redis_installed, server_program, unique_temp_dir,
};

/// The name the sentinels know the master by.
pub const MASTER_NAME: &str = "mymaster";
/// How many sentinels watch the master; a majority of them authorises a failover.
const SENTINELS: usize = 3;
/// How long a deployment gets to form (replicas in sync, sentinels aware of each other) or to
/// agree on a failover.
const AGREE_TIMEOUT: Duration = Duration::from_secs(30);

/// A sentinel started on the configuration `path`: `redis-sentinel <path>` (Debian's package
/// of that name; `scripts/test` installs it), or, under `$CARACAL_TEST_SERVER`, that server
/// program with `--sentinel`.
fn sentinel_command(path: Option<&Path>) -> Command {
    let program = server_program();
    if program == "redis-server" {
        let mut command = Command::new("redis-sentinel");
        command.args(path);
        command
    } else {
        let mut command = Command::new(program);
        if let Some(path) = path {
            command.arg(path).arg("--sentinel");
        }
        command
    }
}

/// Panics with a clear message unless sentinels can be run.
fn ensure_sentinel_installed() {
    static CHECKED: OnceLock<Result<(), String>> = OnceLock::new();
    let result = CHECKED.get_or_init(|| {
        match sentinel_command(None)
            .arg("--version")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
        {
            Ok(status) if status.success() => Ok(()),
            Ok(status) => Err(format!("the sentinel's `--version` exited with {status}")),
            Err(e) => Err(format!(
                "no sentinel program ({e}): scripts/test installs redis-sentinel"
            )),
        }
    });
    if let Err(message) = result {
        panic!("{message}");
    }
}

/// One `redis-sentinel` child process.
#[derive(Debug)]
struct Sentinel {
    reservation: PortReservation,
    dir: PathBuf,
    child: Child,
}

impl Sentinel {
    fn start(master_port: u16) -> Self {
        let reservation = PortReservation::take(false);
        let dir = unique_temp_dir("sentinel");
        let port = reservation.port;
        let config = format!(
            "port {port}\nbind 127.0.0.1\ndaemonize no\ndir {dir}\nlogfile {dir}/sentinel.log\n\
             sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n\
             sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
             sentinel failover-timeout {MASTER_NAME} 5000\n\
             sentinel parallel-syncs {MASTER_NAME} 1\n",
            dir = dir.display()
        );
        let path = dir.join("sentinel.conf");
        fs::write(&path, config).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        let stderr = File::create(dir.join("stderr.log")).expect("sentinel stderr.log");
        let child = sentinel_command(Some(&path))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn a sentinel: {e}"));
        Sentinel {
            reservation,
            dir,
            child,
        }
    }

    fn port(&self) -> u16 {
        self.reservation.port
    }

    fn connection(&self) -> redis::RedisResult<redis::Connection> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}", self.port()))?;
        let conn = client.get_connection_with_timeout(Duration::from_secs(2))?;
        conn.set_read_timeout(Some(Duration::from_secs(5)))?;
        Ok(conn)
    }

    /// The master's port, as this sentinel names it now.
    fn master_port(&self) -> Option<u16> {
        let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(MASTER_NAME)
            .query(&mut self.connection().ok()?)
            .ok()?;
        addr.map(|(_, port)| port)
    }

    /// How many replicas and other sentinels of the master this sentinel knows.
    fn known(&self) -> Option<(usize, usize)> {
        let mut conn = self.connection().ok()?;
        let count = |conn: &mut redis::Connection, what: &str| {
            redis::cmd("SENTINEL")
                .arg(what)
                .arg(MASTER_NAME)
                .query::<Vec<redis::Value>>(conn)
                .map(|entries| entries.len())
                .ok()
        };
        Some((
            count(&mut conn, "replicas")?,
            count(&mut conn, "sentinels")?,
        ))
    }

    fn log_tail(&self, lines: usize) -> String {
        let text = fs::read_to_string(self.dir.join("sentinel.log")).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "redis-sentinel {} files kept in {}",
                self.port(),
                self.dir.display()
            );
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// A master, its replicas and three sentinels, all on loopback.
///
/// Dropping it kills every process (sentinels first, so none reacts to the others' end).
#[derive(Debug)]
pub struct RedisSentinel {
    sentinels: Vec<Sentinel>,
    /// The master it started with, then its replicas.
    servers: Vec<RedisServer>,
}

impl RedisSentinel {
    /// Starts a master with `replicas` replicas and three sentinels, and waits until the
    /// replicas are in sync and every sentinel knows every replica and the other sentinels (a
    /// failover needs them to).
    ///
    /// # Panics
    /// When that does not happen within the bounded waits.
    pub fn start(replicas: usize) -> Self {
        ensure_redis_installed();
        ensure_sentinel_installed();
        // Any of them may become the master: none delays the replicas' first sync.
        let quick = ["--repl-diskless-sync-delay", "0"];
        let master = RedisServer::start_with_args(&quick);
        let master_port = master.port().to_string();
        let mut servers = vec![master];
        for _ in 0..replicas {
            let replica = ["--replicaof", "127.0.0.1", &master_port];
            servers.push(RedisServer::start_with_args(
                &[&quick[..], &replica].concat(),
            ));
        }
        let sentinels = (0..SENTINELS)
            .map(|_| Sentinel::start(servers[0].port()))
            .collect();
        let deployment = RedisSentinel { sentinels, servers };
        for replica in &deployment.servers[1..] {
            deployment.wait("a replica in sync", || {
                info(replica, "replication").contains("master_link_status:up")
            });
        }
        deployment.wait("every sentinel to know the replicas and the others", || {
            deployment
                .sentinels
                .iter()
                .all(|s| s.known() == Some((replicas, SENTINELS - 1)))
        });
        deployment
    }

    /// The sentinels' URL in caracal's form:
    /// `redis-sentinel://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3#mymaster`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect();
        format!("redis-sentinel://{}#{MASTER_NAME}", hosts.join(","))
    }

    /// Every server: the master it started with first, then the replicas.
    pub fn servers(&self) -> &[RedisServer] {
        &self.servers
    }

    /// The server every sentinel names as the master now.
    ///
    /// # Panics
    /// When the sentinels do not agree within the bounded wait.
    pub fn master(&self) -> &RedisServer {
        let mut port = None;
        self.wait("the sentinels to agree on the master", || {
            port = self.agreed();
            port.is_some()
        });
        self.by_port(port.unwrap_or_default())
    }

    /// Makes the sentinels fail the master over to one of its replicas (`SENTINEL FAILOVER`,
    /// no agreement of the master needed), and waits until every sentinel names the new
    /// master and it answers as a master. Returns the new master. (The old one answers as a
    /// master for seconds more, until the sentinels convert it into a replica of the new.)
    ///
    /// # Panics
    /// When that does not happen within the bounded waits.
    pub fn failover(&self) -> &RedisServer {
        let old = self.master().port();
        self.wait("a sentinel to accept the failover", || {
            self.sentinels[0].connection().is_ok_and(|mut conn| {
                redis::cmd("SENTINEL")
                    .arg("FAILOVER")
                    .arg(MASTER_NAME)
                    .exec(&mut conn)
                    .is_ok()
            })
        });
        self.promoted(old)
    }

    /// Kills the master with SIGKILL through its handle (a crash: nobody asks for a failover;
    /// the sentinels find it down after `down-after-milliseconds`, 1 s here, and agree to
    /// fail it over), and waits until every sentinel names a new master and it answers as
    /// one. Returns the new master.
    ///
    /// # Panics
    /// When that does not happen within the bounded waits.
    pub fn kill_master(&mut self) -> &RedisServer {
        let old = self.master().port();
        if let Some(master) = self.servers.iter_mut().find(|s| s.port() == old) {
            master.sigkill();
        }
        self.promoted(old)
    }

    /// Waits until every sentinel names another master than the one on port `old`, and it
    /// answers as a master; returns it.
    fn promoted(&self, old: u16) -> &RedisServer {
        let mut new = None;
        self.wait("the sentinels to agree on a new master", || {
            new = self.agreed().filter(|&port| port != old);
            new.is_some()
        });
        let new = self.by_port(new.unwrap_or_default());
        self.wait("the new master to answer as a master", || {
            info(new, "replication").contains("role:master")
        });
        new
    }

    /// The master's port if every sentinel names the same.
    fn agreed(&self) -> Option<u16> {
        let ports: Vec<Option<u16>> = self.sentinels.iter().map(Sentinel::master_port).collect();
        let first = ports[0]?;
        ports.iter().all(|&p| p == Some(first)).then_some(first)
    }

    fn by_port(&self, port: u16) -> &RedisServer {
        self.servers
            .iter()
            .find(|server| server.port() == port)
            .unwrap_or_else(|| panic!("the sentinels name port {port}, which no server has"))
    }

    fn wait(&self, what: &str, mut condition: impl FnMut() -> bool) {
        let deadline = Instant::now() + AGREE_TIMEOUT;
        while !condition() {
            if Instant::now() >= deadline {
                let logs: Vec<String> = self
                    .sentinels
                    .iter()
                    .map(|s| format!("--- sentinel {} ---\n{}", s.port(), s.log_tail(20)))
                    .collect();
                panic!(
                    "timed out after {AGREE_TIMEOUT:?} waiting for {what}\n{}",
                    logs.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        self.sentinels.clear();
    }
}

/// `INFO section` of `server`, empty when it does not answer.
fn info(server: &RedisServer, section: &str) -> String {
    server
        .client()
        .get_connection_with_timeout(Duration::from_secs(2))
        .and_then(|mut conn| redis::cmd("INFO").arg(section).query(&mut conn))
        .unwrap_or_default()
}

/// `total_connections_received` from `INFO stats` of `server`: every connection it accepted
/// since it started (the read's own connection included).
///
/// # Panics
/// When the server does not answer or names no such field.
pub fn connections_received(server: &RedisServer) -> u64 {
    let text: String = redis::cmd("INFO")
        .arg("stats")
        .query(&mut server.connection())
        .unwrap_or_else(|e| panic!("INFO stats failed: {e}"));
    text.lines()
        .find_map(|line| line.trim().strip_prefix("total_connections_received:"))
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no total_connections_received in INFO stats:\n{text}"))
}
