//! A TCP proxy on 127.0.0.1 that can cut, blackhole, slow or hold the traffic to a Redis
//! upstream, and counts the requests and replies that cross it.
//!
//! It runs on plain std threads (one acceptor; per connection a reader and a writer in each
//! direction), so it works the same whatever tokio runtime, if any, the test uses. Modes
//! switch at any time from any thread:
//!
//! * [`restore`](FaultProxy::restore) — pass-through (the default);
//! * [`cut`](FaultProxy::cut) — every open connection is shut down in both directions at
//!   once, and new ones are accepted and closed immediately (clients see EOF on first use);
//! * [`blackhole`](FaultProxy::blackhole) — connections stay open but nothing is forwarded
//!   either way; new connections are accepted but not connected upstream. Data read meanwhile
//!   is held, not dropped, so on `restore` surviving connections resume intact, like a
//!   partition that heals before TCP gives up;
//! * [`delay`](FaultProxy::delay) — each frame is forwarded `d` after it was read, in each
//!   direction (so a request/response round trip grows by at least `2 × d`);
//! * [`hold_replies`](FaultProxy::hold_replies) — requests reach the server at once, but every
//!   frame the server sends back waits until the test lets it through with
//!   [`release_replies`](FaultProxy::release_replies), in the order the proxy received them.
//!   [`awaited_replies`](FaultProxy::awaited_replies) builds on it to count the round trips a
//!   call waits for, without measuring time.
//!
//! The proxy splits both directions into RESP frames: a request is one command from a client
//! (an array, or an inline command), a reply is one frame from the server (pub/sub messages
//! included). A stream that is not valid RESP is forwarded as it comes, uncounted and never
//! held by `hold_replies`.
//!
//! Dropping the proxy closes every connection and joins every thread it started.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::Poll;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long the proxy waits for the upstream to accept a connection.
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How often [`FaultProxy::awaited_replies`] and [`FaultProxy::wait_idle`] look at the counters.
const POLL: Duration = Duration::from_millis(1);
/// How long [`FaultProxy::wait_idle`] wants to see no traffic.
pub const QUIET: Duration = Duration::from_millis(100);

/// What the proxy currently does with traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyMode {
    /// Forward everything unchanged.
    PassThrough,
    /// Close every connection and refuse new ones.
    Cut,
    /// Keep connections open, forward nothing.
    Blackhole,
    /// Forward each frame this long after it was read.
    Delay(Duration),
    /// Forward requests; hold replies until released.
    HoldReplies,
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
    conns: HashMap<u64, Conn>,
    /// Connection threads not yet joined.
    threads: Vec<JoinHandle<()>>,
    /// Requests read from clients since the start.
    requests: u64,
    /// Frames read from the upstream since the start; also the number the next one gets.
    replies: u64,
    /// While holding replies, those numbered below this may be forwarded.
    released_through: u64,
    /// While recording: per read from a client, the names of the commands it completed.
    reads: Option<Vec<Vec<String>>>,
}

/// One proxied connection.
#[derive(Debug)]
struct Conn {
    client: TcpStream,
    /// Set once connected upstream.
    upstream: Option<TcpStream>,
    to_upstream: VecDeque<Piece>,
    to_client: VecDeque<Piece>,
    /// Requests and (non-push) replies of this connection, to tell what is unanswered.
    requests: u64,
    replies: u64,
    /// Subscribed to pub/sub: the server sends messages nobody asked for.
    subscribed: bool,
}

impl Conn {
    fn queue(&mut self, direction: Direction) -> &mut VecDeque<Piece> {
        match direction {
            Direction::ToUpstream => &mut self.to_upstream,
            Direction::ToClient => &mut self.to_client,
        }
    }

    fn in_flight(&self) -> u64 {
        if self.subscribed {
            0
        } else {
            self.requests.saturating_sub(self.replies)
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    ToUpstream,
    ToClient,
}

/// Bytes read and waiting to be forwarded: a whole frame, or raw bytes of a stream that is
/// not RESP.
#[derive(Debug)]
struct Piece {
    bytes: Vec<u8>,
    read_at: Instant,
    /// A reply's number, for holding; `None` for requests and raw bytes.
    reply: Option<u64>,
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
                requests: 0,
                replies: 0,
                released_through: 0,
                reads: None,
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

    /// Requests (commands) read from clients since the proxy started, forwarded or not.
    pub fn requests(&self) -> u64 {
        self.shared.lock().requests
    }

    /// Frames read from the server since the proxy started, forwarded or not.
    pub fn replies(&self) -> u64 {
        self.shared.lock().replies
    }

    /// Requests the server has not answered yet, as far as the proxy has seen, over the live
    /// connections that are not subscribed to pub/sub (a subscriber gets messages it did not
    /// ask for, so its counts say nothing about what is outstanding).
    pub fn in_flight(&self) -> u64 {
        self.shared.lock().conns.values().map(Conn::in_flight).sum()
    }

    /// Replies read from the server and held, while in [`ProxyMode::HoldReplies`] (0 in
    /// every other mode).
    pub fn held_replies(&self) -> u64 {
        let state = self.shared.lock();
        if state.mode == ProxyMode::HoldReplies {
            state.replies.saturating_sub(state.released_through)
        } else {
            0
        }
    }

    /// Starts recording how clients' requests arrive: which commands each read from a client
    /// completes (what the client wrote at once, unless the proxy fell behind its writes).
    pub fn record_reads(&self) {
        self.shared.lock().reads = Some(Vec::new());
    }

    /// The reads recorded since [`record_reads`](Self::record_reads), in the order they were
    /// read (over all connections): for each, the names of the commands it completed,
    /// upper-cased, in order. Reads that completed no command are left out.
    pub fn recorded_reads(&self) -> Vec<Vec<String>> {
        self.shared.lock().reads.clone().unwrap_or_default()
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

    /// Forwards each frame `delay` after it was read, in each direction.
    pub fn delay(&self, delay: Duration) {
        self.set_mode(ProxyMode::Delay(delay));
    }

    /// Forwards requests as usual but holds every reply read from now on until
    /// [`release_replies`](Self::release_replies) or a mode change lets it through. Replies
    /// read before this call are not held.
    pub fn hold_replies(&self) {
        let mut state = self.shared.lock();
        state.mode = ProxyMode::HoldReplies;
        state.released_through = state.replies;
        self.shared.changed.notify_all();
    }

    /// Lets the next `n` replies through, in the order the proxy read them from the server
    /// (across connections): those held now first, then ones still to come.
    pub fn release_replies(&self, n: u64) {
        let mut state = self.shared.lock();
        state.released_through += n;
        self.shared.changed.notify_all();
    }

    /// Waits until the traffic has settled: no request [in flight](Self::in_flight) and none
    /// read for [`QUIET`]. A request a client queued just before (a release its connection's
    /// task has not written yet, a batch due in a few milliseconds) has gone through by then,
    /// unless the machine stalls for longer.
    ///
    /// # Panics
    /// When the traffic has not settled after `patience`.
    pub async fn wait_idle(&self, patience: Duration) {
        let deadline = Instant::now() + patience;
        let traffic = || (self.requests(), self.replies());
        let mut seen = traffic();
        let mut quiet_since = Instant::now();
        loop {
            let now = traffic();
            if now != seen || self.in_flight() > 0 {
                seen = now;
                quiet_since = Instant::now();
            } else if quiet_since.elapsed() >= QUIET {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "traffic still flowing after {patience:?}: {} requests unanswered",
                self.in_flight()
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Runs `call` with the replies held, and lets one reply through each time `call` is
    /// still pending while a reply is held, at most `budget` of them. Returns the call's
    /// output and the number of replies it was let through, or `None` (dropping the call) when
    /// it was still pending `patience` after the last reply it got (or its start). The proxy
    /// passes through again afterwards, either way.
    ///
    /// A call that completes after `n` releases waited for at most `n` round trips: a call
    /// that needs one more reply cannot complete, however slow or fast the machine is. The
    /// count can only be too high: a reply to work the call does not wait for (a release, a
    /// batch of outcomes sent in the background, or a request of another task) may be the one
    /// let through. Start once [idle](Self::wait_idle), and retry a count that came out too
    /// high: only a call that needs more replies comes out too high every time.
    pub async fn awaited_replies<F: Future>(
        &self,
        call: F,
        budget: u64,
        patience: Duration,
    ) -> Option<(F::Output, u64)> {
        self.hold_replies();
        let mut call = Box::pin(call);
        let mut released = 0;
        let outcome = 'outcome: loop {
            let deadline = Instant::now() + patience;
            loop {
                tokio::select! {
                    biased;
                    output = &mut call => break 'outcome Some((output, released)),
                    () = tokio::time::sleep(POLL) => {}
                }
                if released < budget && self.held_replies() > 0 {
                    // A reply that arrived during the sleep may have completed the call
                    // already: look once more before letting another one through.
                    let polled = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx)));
                    if let Poll::Ready(output) = polled.await {
                        break 'outcome Some((output, released));
                    }
                    break;
                }
                if Instant::now() >= deadline {
                    break 'outcome None;
                }
            }
            self.release_replies(1);
            released += 1;
        };
        // The call is dropped before the replies flow, so an abandoned call stays abandoned.
        drop(call);
        self.restore();
        outcome
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

    fn wait<'a>(&self, state: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.changed.wait(state).unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until connection `id` may be connected upstream (not while blackholed): `false`
    /// when it was cut or the proxy is stopping.
    fn may_connect(&self, id: u64) -> bool {
        let mut state = self.lock();
        loop {
            if state.stopping || !state.conns.contains_key(&id) {
                return false;
            }
            match state.mode {
                ProxyMode::Cut => return false,
                ProxyMode::Blackhole => state = self.wait(state),
                _ => return true,
            }
        }
    }

    /// Queues what was read on connection `id` for its writer: `false` when the connection is
    /// gone.
    fn enqueue(&self, id: u64, direction: Direction, frames: Vec<Frame>, read_at: Instant) -> bool {
        let mut guard = self.lock();
        let state = &mut *guard;
        let Some(conn) = state.conns.get_mut(&id) else {
            return false;
        };
        if direction == Direction::ToUpstream
            && let Some(reads) = &mut state.reads
        {
            let names: Vec<String> = frames
                .iter()
                .filter(|frame| frame.complete)
                .map(|frame| {
                    String::from_utf8_lossy(first_bulk(&frame.bytes).unwrap_or_default())
                        .to_ascii_uppercase()
                })
                .collect();
            if !names.is_empty() {
                reads.push(names);
            }
        }
        for frame in frames {
            let mut reply = None;
            if frame.complete {
                match direction {
                    Direction::ToUpstream => {
                        state.requests += 1;
                        conn.requests += 1;
                        conn.subscribed |= subscribes(&frame.bytes);
                    }
                    Direction::ToClient => {
                        reply = Some(state.replies);
                        state.replies += 1;
                        // A RESP3 push is sent without a request.
                        if frame.bytes.first() != Some(&b'>') {
                            conn.replies += 1;
                        }
                    }
                }
            }
            conn.queue(direction).push_back(Piece {
                bytes: frame.bytes,
                read_at,
                reply,
            });
        }
        self.changed.notify_all();
        true
    }

    /// Waits for the next piece connection `id` may forward in `direction`: `None` when the
    /// connection was cut or closed, or the proxy is stopping.
    fn next_piece(&self, id: u64, direction: Direction) -> Option<Piece> {
        let mut state = self.lock();
        loop {
            if state.stopping {
                return None;
            }
            let (mode, released_through) = (state.mode, state.released_through);
            let queue = state.conns.get_mut(&id)?.queue(direction);
            let due = match (mode, queue.front()) {
                (ProxyMode::Cut, _) => return None,
                (ProxyMode::Blackhole, _) | (_, None) => None,
                (ProxyMode::PassThrough, Some(_)) => Some(Instant::now()),
                (ProxyMode::Delay(delay), Some(piece)) => Some(piece.read_at + delay),
                (ProxyMode::HoldReplies, Some(piece)) => match piece.reply {
                    Some(number) if number >= released_through => None,
                    _ => Some(Instant::now()),
                },
            };
            match due {
                Some(due) if due <= Instant::now() => return queue.pop_front(),
                Some(due) => {
                    let wait = due.saturating_duration_since(Instant::now());
                    state = self
                        .changed
                        .wait_timeout(state, wait)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                None => state = self.wait(state),
            }
        }
    }

    /// Removes connection `id`, shuts its sockets down and wakes its threads.
    fn close(&self, id: u64) {
        if let Some(conn) = self.lock().conns.remove(&id) {
            shutdown(&conn);
        }
        self.changed.notify_all();
    }
}

fn close_all(state: &mut State) {
    for (_, conn) in state.conns.drain() {
        shutdown(&conn);
    }
}

fn shutdown(conn: &Conn) {
    let _ = conn.client.shutdown(Shutdown::Both);
    if let Some(upstream) = &conn.upstream {
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
        state.conns.insert(
            id,
            Conn {
                client: registered,
                upstream: None,
                to_upstream: VecDeque::new(),
                to_client: VecDeque::new(),
                requests: 0,
                replies: 0,
                subscribed: false,
            },
        );
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
    if !shared.may_connect(id) {
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
    let (Ok(client_reader), Ok(upstream_reader), Ok(upstream_writer), Ok(registered)) = (
        client.try_clone(),
        upstream.try_clone(),
        upstream.try_clone(),
        upstream.try_clone(),
    ) else {
        shared.close(id);
        return;
    };
    match shared.lock().conns.get_mut(&id) {
        Some(conn) => conn.upstream = Some(registered),
        None => {
            // Cut while we were connecting.
            let _ = client.shutdown(Shutdown::Both);
            let _ = upstream.shutdown(Shutdown::Both);
            return;
        }
    }
    let spawn = |name: &str, work: Box<dyn FnOnce() + Send>| {
        std::thread::Builder::new()
            .name(format!("fault-proxy-conn-{id}-{name}"))
            .spawn(work)
    };
    let helpers = [
        spawn("read-client", {
            let shared = Arc::clone(shared);
            Box::new(move || read_side(&shared, id, client_reader, Direction::ToUpstream))
        }),
        spawn("read-upstream", {
            let shared = Arc::clone(shared);
            Box::new(move || read_side(&shared, id, upstream_reader, Direction::ToClient))
        }),
        spawn("write-client", {
            let shared = Arc::clone(shared);
            Box::new(move || write_side(&shared, id, client, Direction::ToClient))
        }),
    ];
    write_side(shared, id, upstream_writer, Direction::ToUpstream);
    for helper in helpers {
        match helper {
            Ok(handle) => {
                let _ = handle.join();
            }
            Err(_) => shared.close(id),
        }
    }
}

/// Reads `from` and queues what it reads, frame by frame; closes the connection at EOF.
fn read_side(shared: &Shared, id: u64, mut from: TcpStream, direction: Direction) {
    let mut splitter = FrameSplitter::default();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let frames = splitter.push(&buf[..n]);
        if !shared.enqueue(id, direction, frames, Instant::now()) {
            break;
        }
    }
    shared.close(id);
}

/// Writes what `id`'s mode lets through to `to`; closes the connection when done.
fn write_side(shared: &Shared, id: u64, mut to: TcpStream, direction: Direction) {
    while let Some(piece) = shared.next_piece(id, direction) {
        if to.write_all(&piece.bytes).is_err() {
            break;
        }
    }
    shared.close(id);
}

/// One complete frame, or raw bytes, read from a connection.
#[derive(Debug)]
struct Frame {
    bytes: Vec<u8>,
    /// `false` for bytes of a stream that is not RESP.
    complete: bool,
}

/// Splits a byte stream into RESP frames, keeping an incomplete one until its end arrives.
#[derive(Debug, Default)]
struct FrameSplitter {
    pending: Vec<u8>,
    /// The stream stopped parsing as RESP: everything from there on is raw.
    raw: bool,
}

impl FrameSplitter {
    /// Adds `bytes` and returns the frames completed by them.
    fn push(&mut self, bytes: &[u8]) -> Vec<Frame> {
        if self.raw {
            return vec![Frame {
                bytes: bytes.to_vec(),
                complete: false,
            }];
        }
        self.pending.extend_from_slice(bytes);
        let mut frames = Vec::new();
        let mut start = 0;
        loop {
            let rest = &self.pending[start..];
            match frame_len(rest) {
                Ok(Some(len)) => {
                    let bytes = rest[..len].to_vec();
                    frames.push(Frame {
                        bytes,
                        complete: true,
                    });
                    start += len;
                }
                Ok(None) => break,
                Err(Malformed) => {
                    self.raw = true;
                    frames.push(Frame {
                        bytes: rest.to_vec(),
                        complete: false,
                    });
                    start = self.pending.len();
                    break;
                }
            }
        }
        self.pending.drain(..start);
        frames
    }
}

/// The bytes do not parse as RESP.
#[derive(Debug)]
struct Malformed;

/// The length of the RESP frame (or inline command) at the start of `buf`; `None` while it
/// is incomplete.
fn frame_len(buf: &[u8]) -> Result<Option<usize>, Malformed> {
    let Some(&marker) = buf.first() else {
        return Ok(None);
    };
    if !b"+-:_,#($!=*~>%|".contains(&marker) {
        // An inline command: one line.
        return Ok(buf.iter().position(|&b| b == b'\n').map(|at| at + 1));
    }
    let Some(line_end) = buf.windows(2).position(|w| w == b"\r\n") else {
        return Ok(None);
    };
    let after_header = line_end + 2;
    let count = || -> Result<i64, Malformed> {
        std::str::from_utf8(&buf[1..line_end])
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or(Malformed)
    };
    match marker {
        b'$' | b'!' | b'=' => {
            let Ok(len) = usize::try_from(count()?) else {
                return Ok(Some(after_header)); // a null bulk string
            };
            let end = after_header + len + 2;
            Ok((buf.len() >= end).then_some(end))
        }
        b'*' | b'~' | b'>' | b'%' | b'|' => {
            let Ok(elements) = usize::try_from(count()?) else {
                return Ok(Some(after_header)); // a null array
            };
            // Maps and attributes hold key-value pairs.
            let elements = if matches!(marker, b'%' | b'|') {
                elements * 2
            } else {
                elements
            };
            let mut end = after_header;
            for _ in 0..elements {
                match frame_len(&buf[end..])? {
                    Some(len) => end += len,
                    None => return Ok(None),
                }
            }
            if marker == b'|' {
                // An attribute comes before the frame it describes: they are one reply.
                return Ok(frame_len(&buf[end..])?.map(|len| end + len));
            }
            Ok(Some(end))
        }
        _ => Ok(Some(after_header)),
    }
}

/// Whether a request enters pub/sub mode (after it the server sends messages unasked).
fn subscribes(request: &[u8]) -> bool {
    let name = first_bulk(request).unwrap_or_default();
    [&b"SUBSCRIBE"[..], b"PSUBSCRIBE", b"SSUBSCRIBE"]
        .iter()
        .any(|command| name.eq_ignore_ascii_case(command))
}

/// The first element of an array frame, when it is a bulk string.
fn first_bulk(frame: &[u8]) -> Option<&[u8]> {
    let header_end = frame.windows(2).position(|w| w == b"\r\n")? + 2;
    let element = &frame[header_end..];
    let len_end = element.windows(2).position(|w| w == b"\r\n")?;
    if element.first() != Some(&b'$') {
        return None;
    }
    let len: usize = std::str::from_utf8(&element[1..len_end])
        .ok()?
        .parse()
        .ok()?;
    element.get(len_end + 2..len_end + 2 + len)
}
