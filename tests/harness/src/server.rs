//! A throwaway `redis-server` on its own loopback port and temp dir.
//!
//! Ports are taken from below the kernel's ephemeral range (and so are their cluster-bus ports,
//! `port + 10000`), so no outgoing client connection and no `bind(0)` can ever grab a port a
//! stopped server keeps reserved for its restart. Within one process the ports handed out are
//! tracked, so parallel tests never get the same one; a clash with another process is caught
//! when the server fails to bind, and the start is retried on a fresh port.
//!
//! Every wait here is bounded and panics with the server's log tail when it runs out.

use std::collections::BTreeSet;
use std::collections::hash_map::RandomState;
use std::fs::{self, File};
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a server gets to answer after being spawned.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How many fresh ports `start` tries before giving up.
const START_ATTEMPTS: usize = 5;
/// How long `restart` keeps retrying when its reserved port is briefly busy.
const RESTART_BIND_TIMEOUT: Duration = Duration::from_secs(3);
/// Offset of the cluster bus port, fixed by Redis.
const BUS_OFFSET: u16 = 10_000;
/// The lowest port handed out.
const PORT_FLOOR: u16 = 10_001;

/// The server program the suites run: `$CARACAL_TEST_SERVER` when set (a path to another
/// server speaking the protocol, such as `valkey-server`, which `scripts/test` runs the
/// suites against as well), else `redis-server`. Its sentinels are the same program started
/// with `--sentinel`.
pub fn server_program() -> String {
    std::env::var("CARACAL_TEST_SERVER")
        .ok()
        .filter(|program| !program.is_empty())
        .unwrap_or_else(|| "redis-server".to_owned())
}

/// Panics with a clear message unless the [server program](server_program) and `redis-cli`
/// can be run.
///
/// Checked once per process; every constructor in this crate calls it.
pub fn ensure_redis_installed() {
    static CHECKED: OnceLock<Result<(), String>> = OnceLock::new();
    let result = CHECKED.get_or_init(|| {
        for tool in [server_program().as_str(), "redis-cli"] {
            match Command::new(tool)
                .arg("--version")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
            {
                Ok(status) if status.success() => {}
                Ok(status) => return Err(format!("`{tool} --version` exited with {status}")),
                Err(e) => {
                    return Err(format!(
                        "{tool} not on PATH; scripts/test installs it ({e})"
                    ));
                }
            }
        }
        Ok(())
    });
    if let Err(message) = result {
        panic!("{message}");
    }
}

/// A `redis-server` child process owned by a test.
///
/// Dropping it kills the process and removes its directory (kept, with its log, when the
/// thread is panicking so the failure can be investigated).
#[derive(Debug)]
pub struct RedisServer {
    reservation: PortReservation,
    dir: PathBuf,
    extra_args: Vec<String>,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a standalone server with no persistence and waits until it answers.
    pub fn start() -> Self {
        Self::start_with_args::<&str>(&[])
    }

    /// Starts a server with `args` appended to the standard ones (for example
    /// `["--cluster-enabled", "yes"]`). When the arguments enable cluster mode, the cluster bus
    /// port (`port + 10000`) is reserved as well.
    pub fn start_with_args<S: AsRef<str>>(args: &[S]) -> Self {
        ensure_redis_installed();
        let extra_args: Vec<String> = args.iter().map(|a| a.as_ref().to_owned()).collect();
        let needs_bus = extra_args
            .windows(2)
            .any(|w| w[0] == "--cluster-enabled" && w[1].eq_ignore_ascii_case("yes"));
        let mut clashes = Vec::new();
        for _ in 0..START_ATTEMPTS {
            let mut server = Self {
                reservation: PortReservation::take(needs_bus),
                dir: unique_temp_dir("redis"),
                extra_args: extra_args.clone(),
                child: None,
            };
            match server.spawn_and_wait() {
                Ok(()) => return server,
                // Another process took the port between our check and the server's bind:
                // `server` drops here (dir removed, port released) and a fresh port is tried.
                Err(StartFailure::PortInUse(message)) => clashes.push(message),
                Err(StartFailure::Other(message)) => {
                    panic!("redis-server did not start: {message}")
                }
            }
        }
        panic!(
            "redis-server did not start: its port was taken {START_ATTEMPTS} times in a row:\n{}",
            clashes.join("\n---\n")
        );
    }

    /// The TCP port the server listens on (kept across `stop`/`restart`).
    pub fn port(&self) -> u16 {
        self.reservation.port
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port())
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, self.port()))
    }

    /// The server's working directory (its log, and `nodes.conf` in cluster mode).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The path of the server's log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("redis.log")
    }

    /// The last `lines` lines of the server's log and stderr.
    pub fn log_tail(&self, lines: usize) -> String {
        let mut out = String::new();
        for name in ["redis.log", "stderr.log"] {
            let text = fs::read_to_string(self.dir.join(name)).unwrap_or_default();
            let all: Vec<&str> = text.lines().collect();
            let tail = &all[all.len().saturating_sub(lines)..];
            if !tail.is_empty() {
                out.push_str(&format!("--- {name} (last {} lines) ---\n", tail.len()));
                for line in tail {
                    out.push_str(line);
                    out.push('\n');
                }
            }
        }
        if out.is_empty() {
            out.push_str("(log empty)\n");
        }
        out
    }

    /// The OS process id of the running server, `None` while stopped.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the server process is alive (a paused one counts as alive).
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// A `redis::Client` for this server.
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url())
            .unwrap_or_else(|e| panic!("invalid url {}: {e}", self.url()))
    }

    /// A fresh synchronous connection (5 s connect timeout), for assertions.
    ///
    /// # Panics
    /// When the server cannot be reached.
    pub fn connection(&self) -> redis::Connection {
        let conn = self
            .client()
            .get_connection_with_timeout(Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("cannot connect to redis-server at {}: {e}", self.url()));
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("set read timeout");
        conn.set_write_timeout(Some(Duration::from_secs(10)))
            .expect("set write timeout");
        conn
    }

    /// Kills the server with SIGKILL (a crash: clients see their connections drop) and waits
    /// for it to exit. The port stays reserved for [`restart`](Self::restart). Idempotent.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Kill fails only if the process already exited; `wait` reaps it either way.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Same as [`stop`](Self::stop): `Child::kill` is SIGKILL, so the server dies without any
    /// chance to clean up.
    pub fn sigkill(&mut self) {
        self.stop();
    }

    /// Freezes the process with SIGSTOP: connections stay open, nothing is answered.
    pub fn pause(&mut self) {
        self.signal("STOP");
    }

    /// Resumes a process frozen with [`pause`](Self::pause) (SIGCONT).
    pub fn resume(&mut self) {
        self.signal("CONT");
    }

    /// Stops the server if it runs, then starts it again on the same port with empty data and
    /// waits until it answers. The directory is kept, so a cluster node comes back with its
    /// `nodes.conf` (its identity and slots) but no keys.
    ///
    /// # Panics
    /// When the server does not come back within the bounded wait.
    pub fn restart(&mut self) {
        self.stop();
        let deadline = Instant::now() + RESTART_BIND_TIMEOUT;
        loop {
            let message = match self.spawn_and_wait() {
                Ok(()) => return,
                Err(StartFailure::PortInUse(_)) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
                Err(StartFailure::PortInUse(message) | StartFailure::Other(message)) => message,
            };
            panic!(
                "redis-server did not restart on port {}: {message}",
                self.port()
            );
        }
    }

    fn signal(&mut self, signal: &str) {
        let pid = self.pid().unwrap_or_else(|| {
            panic!(
                "cannot send SIG{signal}: redis-server {} is stopped",
                self.port()
            )
        });
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .unwrap_or_else(|e| panic!("cannot run `kill -{signal} {pid}`: {e}"));
        assert!(
            status.success(),
            "`kill -{signal} {pid}` exited with {status}"
        );
    }

    /// Spawns the process and waits until it answers; on failure the child is reaped and the
    /// error carries the log tail.
    fn spawn_and_wait(&mut self) -> Result<(), StartFailure> {
        let port = self.port().to_string();
        let dir = self.dir.to_string_lossy().into_owned();
        let log = self.log_path().to_string_lossy().into_owned();
        let stdout = File::create(self.dir.join("stdout.log"))
            .map_err(|e| StartFailure::Other(format!("cannot create stdout.log in {dir}: {e}")))?;
        let stderr = File::create(self.dir.join("stderr.log"))
            .map_err(|e| StartFailure::Other(format!("cannot create stderr.log in {dir}: {e}")))?;
        let mut command = Command::new(server_program());
        command
            .args(["--port", &port, "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--dir", &dir, "--logfile", &log, "--daemonize", "no"])
            .args(["--enable-debug-command", "local"])
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr);
        let child = command
            .spawn()
            .map_err(|e| StartFailure::Other(format!("cannot spawn redis-server: {e}")))?;
        let pid = child.id();
        self.child = Some(child);

        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                let tail = self.log_tail(20);
                let message =
                    format!("redis-server on port {port} exited during startup ({status})\n{tail}");
                return Err(if tail.contains("Address already in use") {
                    StartFailure::PortInUse(message)
                } else {
                    StartFailure::Other(message)
                });
            }
            // Check the answer comes from *our* process, not another one on this port.
            if let Ok(info) =
                raw_command(self.addr(), &["INFO", "server"], Duration::from_millis(500))
                && info.contains(&format!("process_id:{pid}\r"))
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.stop();
                return Err(StartFailure::Other(format!(
                    "redis-server on port {port} did not answer within {READY_TIMEOUT:?}\n{}",
                    self.log_tail(20)
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Why one start attempt failed.
#[derive(Debug)]
enum StartFailure {
    /// The port was taken by someone else: worth retrying.
    PortInUse(String),
    /// Anything else: retrying would fail the same way.
    Other(String),
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!(
                "redis-server {} files kept for inspection in {}",
                self.port(),
                self.dir.display()
            );
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// Sends one command over a fresh TCP connection and returns the reply as text (error
/// replies become `Err`). Only simple, integer and bulk replies are understood, which is all
/// the harness needs before a server is known to be up.
pub fn raw_command(addr: SocketAddr, args: &[&str], timeout: Duration) -> io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let mut request = format!("*{}\r\n", args.len());
    for arg in args {
        request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    stream.write_all(request.as_bytes())?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed",
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
        let Some(line_end) = buf.windows(2).position(|w| w == b"\r\n") else {
            continue;
        };
        let header = String::from_utf8_lossy(&buf[1..line_end]).into_owned();
        match buf[0] {
            b'+' | b':' => return Ok(header),
            b'-' => return Err(io::Error::other(header)),
            b'$' => {
                let len: usize = header
                    .parse()
                    .map_err(|_| io::Error::other(format!("bad bulk length {header}")))?;
                let body_start = line_end + 2;
                if buf.len() >= body_start + len {
                    return Ok(
                        String::from_utf8_lossy(&buf[body_start..body_start + len]).into_owned()
                    );
                }
            }
            other => {
                return Err(io::Error::other(format!(
                    "unexpected reply type {:?}",
                    other as char
                )));
            }
        }
    }
}

/// Creates a fresh, uniquely named directory under the system temp dir.
pub fn unique_temp_dir(prefix: &str) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    loop {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "caracal-{prefix}-{}-{n}-{:x}",
            std::process::id(),
            random_u64() & 0xffff_ffff
        ));
        match fs::create_dir(&path) {
            Ok(()) => return path,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => panic!("cannot create temp dir {}: {e}", path.display()),
        }
    }
}

/// A random number from std's per-instance random hash keys.
fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.finish()
}

/// Ports handed out by this process and not yet released.
static RESERVED_PORTS: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// A port (and, for cluster nodes, its bus port) reserved for one server's lifetime.
#[derive(Debug)]
pub struct PortReservation {
    /// The port reserved.
    pub port: u16,
    bus: bool,
}

impl PortReservation {
    /// Reserves a free port, and its cluster bus port with `bus`.
    pub fn take(bus: bool) -> Self {
        let (low, high) = candidate_range();
        let mut reserved = RESERVED_PORTS.lock().unwrap_or_else(|e| e.into_inner());
        for _ in 0..10_000 {
            let port = low + (random_u64() % u64::from(high - low)) as u16;
            let ports = [port, port + BUS_OFFSET];
            let ports = if bus { &ports[..] } else { &ports[..1] };
            if ports
                .iter()
                .any(|p| reserved.contains(p) || *p == 6379 || !bindable(*p))
            {
                continue;
            }
            reserved.extend(ports.iter().copied());
            return Self { port, bus };
        }
        panic!("no free loopback port found in {low}..{high} after 10000 tries");
    }
}

impl Drop for PortReservation {
    fn drop(&mut self) {
        let mut reserved = RESERVED_PORTS.lock().unwrap_or_else(|e| e.into_inner());
        reserved.remove(&self.port);
        if self.bus {
            reserved.remove(&(self.port + BUS_OFFSET));
        }
    }
}

/// Ports below the ephemeral range whose bus port is below it too; falls back to a wide range
/// if the ephemeral range starts unusually low.
fn candidate_range() -> (u16, u16) {
    let ephemeral_low = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    let high = ephemeral_low.saturating_sub(BUS_OFFSET);
    if high > PORT_FLOOR + 1_000 {
        (PORT_FLOOR, high)
    } else {
        (PORT_FLOOR, u16::MAX - BUS_OFFSET)
    }
}

fn bindable(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}
