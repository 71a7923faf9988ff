//! A TCP proxy on 127.0.0.1 that can cut, blackhole or slow the traffic to an upstream.
//!
//! It runs on plain std threads (one acceptor, two per connection), so it works the same
//! whatever tokio runtime, if any, the test uses. Modes switch at any time from any thread:
//!
//! * [`restore`](FaultProxy::restore) — pass-through (the default);
//! * [`cut`](FaultProxy::cut) — every open connection is shut down in both directions at
//!   once, and new ones are accepted and closed immediately (clients see EOF on first use);
//! * [`blackhole`](FaultProxy::blackhole) — connections stay open but nothing is forwarded
//!   either way; new connections are accepted but not connected upstream. Data read meanwhile
//!   is held, not dropped, so on `restore` surviving connections resume intact, like a
//!   partition that heals before TCP gives up;
//! * [`delay`](FaultProxy::delay) — each chunk is forwarded `d` after it was read, in each
//!   direction (so a request/response round trip grows by about `2 × d`).
//!
//! Dropping the proxy closes every connection and joins every thread it started.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long the proxy waits for the upstream to accept a connection.
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// What the proxy currently does with traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyMode {
    /// Forward everything unchanged.
    PassThrough,
    /// Close every connection and refuse new ones.
    Cut,
    /// Keep connections open, forward nothing.
    Blackhole,
    /// Forward each chunk this long after it was read.
    Delay(Duration),
}

/// A fault-injecting TCP proxy in front of one upstream address.
#[derive(Debug)]
pub struct FaultProxy {
    shared: Arc<Shared>,
    addr: SocketAddr,
    acceptor: Option<JoinHandle<()>>,
}

#[derive(Debug)]
struct Shared {
    upstream: SocketAddr,
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Debug)]
struct State {
    mode: ProxyMode,
    stopping: bool,
    next_id: u64,
    /// Live connections: the client socket and, once connected, the upstream one.
    conns: HashMap<u64, (TcpStream, Option<TcpStream>)>,
    /// Connection threads not yet joined.
    threads: Vec<JoinHandle<()>>,
}

impl FaultProxy {
    /// Starts a pass-through proxy on a free loopback port in front of `upstream`.
    pub fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap_or_else(|e| panic!("fault proxy cannot bind a loopback port: {e}"));
        let addr = listener.local_addr().expect("proxy local addr");
        let shared = Arc::new(Shared {
            upstream,
            state: Mutex::new(State {
                mode: ProxyMode::PassThrough,
                stopping: false,
                next_id: 0,
                conns: HashMap::new(),
                threads: Vec::new(),
            }),
            changed: Condvar::new(),
        });
        let acceptor = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name(format!("fault-proxy-{}", addr.port()))
                .spawn(move || accept_loop(&listener, &shared))
                .expect("spawn proxy acceptor")
        };
        Self {
            shared,
            addr,
            acceptor: Some(acceptor),
        }
    }

    /// The proxy's own address (`127.0.0.1:PORT`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `redis://127.0.0.1:PORT`, the proxy's address as a Redis URL.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// The address traffic is forwarded to.
    pub fn upstream(&self) -> SocketAddr {
        self.shared.upstream
    }

    /// The current mode.
    pub fn mode(&self) -> ProxyMode {
        self.shared.lock().mode
    }

    /// Number of live client connections (including held ones in blackhole mode).
    pub fn connections(&self) -> usize {
        self.shared.lock().conns.len()
    }

    /// Back to pass-through; held data on surviving connections is forwarded.
    pub fn restore(&self) {
        self.set_mode(ProxyMode::PassThrough);
    }

    /// Shuts every open connection down in both directions and refuses new ones until the
    /// mode changes.
    pub fn cut(&self) {
        let mut state = self.shared.lock();
        state.mode = ProxyMode::Cut;
        close_all(&mut state);
        self.shared.changed.notify_all();
    }

    /// Forwards nothing in either direction while keeping connections open.
    pub fn blackhole(&self) {
        self.set_mode(ProxyMode::Blackhole);
    }

    /// Forwards each chunk `delay` after it was read, in each direction.
    pub fn delay(&self, delay: Duration) {
        self.set_mode(ProxyMode::Delay(delay));
    }

    fn set_mode(&self, mode: ProxyMode) {
        self.shared.lock().mode = mode;
        self.shared.changed.notify_all();
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        {
            let mut state = self.shared.lock();
            state.stopping = true;
            close_all(&mut state);
            self.shared.changed.notify_all();
        }
        // Wake the blocking accept; the acceptor sees `stopping` and exits.
        let woke = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1)).is_ok();
        if let Some(acceptor) = self.acceptor.take()
            && woke
        {
            let _ = acceptor.join();
        }
        let threads = std::mem::take(&mut self.shared.lock().threads);
        for thread in threads {
            let _ = thread.join();
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until a chunk read at `read_at` on connection `id` may be forwarded: `false`
    /// when the connection was cut or the proxy is stopping.
    fn gate(&self, id: u64, read_at: Instant) -> bool {
        let mut state = self.lock();
        loop {
            if state.stopping || !state.conns.contains_key(&id) {
                return false;
            }
            match state.mode {
                ProxyMode::Cut => return false,
                ProxyMode::PassThrough => return true,
                ProxyMode::Blackhole => {
                    state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
                }
                ProxyMode::Delay(delay) => {
                    let now = Instant::now();
                    let due = read_at + delay;
                    if now >= due {
                        return true;
                    }
                    state = self
                        .changed
                        .wait_timeout(state, due - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
        }
    }

    /// Removes connection `id` and shuts its sockets down (waking its other pump).
    fn close(&self, id: u64) {
        if let Some((client, upstream)) = self.lock().conns.remove(&id) {
            shutdown(&client, upstream.as_ref());
        }
    }
}

fn close_all(state: &mut State) {
    for (_, (client, upstream)) in state.conns.drain() {
        shutdown(&client, upstream.as_ref());
    }
}

fn shutdown(client: &TcpStream, upstream: Option<&TcpStream>) {
    let _ = client.shutdown(Shutdown::Both);
    if let Some(upstream) = upstream {
        let _ = upstream.shutdown(Shutdown::Both);
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    for stream in listener.incoming() {
        let mut state = shared.lock();
        if state.stopping {
            return;
        }
        let Ok(client) = stream else {
            // Transient (e.g. out of descriptors): back off instead of spinning.
            drop(state);
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        if state.mode == ProxyMode::Cut {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        }
        let Ok(registered) = client.try_clone() else {
            continue;
        };
        let id = state.next_id;
        state.next_id += 1;
        state.conns.insert(id, (registered, None));
        state.threads.retain(|t| !t.is_finished());
        let worker = {
            let shared = Arc::clone(shared);
            std::thread::Builder::new()
                .name(format!("fault-proxy-conn-{id}"))
                .spawn(move || serve(&shared, id, client))
        };
        match worker {
            Ok(handle) => state.threads.push(handle),
            Err(_) => {
                drop(state);
                shared.close(id);
            }
        }
    }
}

/// Runs one proxied connection to completion.
fn serve(shared: &Arc<Shared>, id: u64, client: TcpStream) {
    // Connect upstream only once forwarding is allowed (not while blackholed).
    if !shared.gate(id, Instant::now()) {
        shared.close(id);
        return;
    }
    let upstream = match TcpStream::connect_timeout(&shared.upstream, UPSTREAM_CONNECT_TIMEOUT) {
        Ok(upstream) => upstream,
        Err(_) => {
            shared.close(id);
            return;
        }
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (Ok(client_reader), Ok(upstream_reader), Ok(upstream_registered)) = (
        client.try_clone(),
        upstream.try_clone(),
        upstream.try_clone(),
    ) else {
        shared.close(id);
        return;
    };
    {
        let mut state = shared.lock();
        match state.conns.get_mut(&id) {
            Some(entry) => entry.1 = Some(upstream_registered),
            None => {
                // Cut while we were connecting.
                drop(state);
                shutdown(&client, Some(&upstream));
                return;
            }
        }
    }
    let backward = {
        let shared = Arc::clone(shared);
        std::thread::Builder::new()
            .name(format!("fault-proxy-conn-{id}-back"))
            .spawn(move || pump(&shared, id, upstream_reader, client))
    };
    pump(shared, id, client_reader, upstream);
    match backward {
        Ok(handle) => {
            let _ = handle.join();
        }
        Err(_) => shared.close(id),
    }
}

/// Copies `from` to `to` chunk by chunk through the gate; closes the connection when done.
fn pump(shared: &Shared, id: u64, mut from: TcpStream, mut to: TcpStream) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if !shared.gate(id, Instant::now()) || to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    shared.close(id);
}
