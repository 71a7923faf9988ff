//! The wire's floor for the bench: one `EVALSHA` of the lease script on a blocking socket.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};

use super::raw_args;

/// The wire's floor on this machine: the raw baseline's `EVALSHA`, its RESP written by hand
/// once (only the token's last digits change per call) on a blocking socket, its reply read
/// whole. What no client on this machine can beat.
pub(crate) struct SocketFloor {
    stream: BufReader<TcpStream>,
    command: Vec<u8>,
    /// Where the token's 12 changing hex digits are in `command`.
    counter_at: usize,
    line: Vec<u8>,
}

impl SocketFloor {
    /// A plain TCP connection to the server at `url`; `None` for any other kind (TLS, a
    /// socket file) or a server that wants a password: those figures then read `null`.
    pub(crate) fn connect(url: &str, sha: &str, key: &str) -> Option<Self> {
        let info = redis::Client::open(url).ok()?.get_connection_info().clone();
        let redis::ConnectionAddr::Tcp(host, port) = info.addr().clone() else {
            return None;
        };
        if info.redis_settings().password().is_some() {
            return None;
        }
        let stream = TcpStream::connect((host.as_str(), port)).ok()?;
        stream.set_nodelay(true).ok()?;
        let token = format!("{:08x}-0000-4000-8000-{:012x}", std::process::id(), 0);
        let mut args = vec!["EVALSHA".to_owned()];
        args.extend(raw_args(sha, key, &token));
        let mut command = format!("*{}\r\n", args.len()).into_bytes();
        for arg in &args {
            command.extend(format!("${}\r\n{arg}\r\n", arg.len()).bytes());
        }
        // The token's last 12 digits, wherever it sits among the arguments (its share follows).
        let counter_at = command
            .windows(token.len())
            .position(|window| window == token.as_bytes())?
            + token.len()
            - 12;
        Some(SocketFloor {
            stream: BufReader::new(stream),
            command,
            counter_at,
            line: Vec::new(),
        })
    }

    /// One round trip, with a fresh token.
    pub(crate) fn call(&mut self) {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let digits = format!("{n:012x}");
        self.command[self.counter_at..self.counter_at + 12].copy_from_slice(digits.as_bytes());
        self.stream
            .get_mut()
            .write_all(&self.command)
            .expect("socket floor: write");
        self.skip_reply();
    }

    /// Reads one RESP2 reply whole; an error reply ends the bench.
    fn skip_reply(&mut self) {
        self.line.clear();
        self.stream
            .read_until(b'\n', &mut self.line)
            .expect("socket floor: read");
        let count = || -> i64 {
            std::str::from_utf8(&self.line[1..self.line.len() - 2])
                .ok()
                .and_then(|n| n.parse().ok())
                .expect("socket floor: a length")
        };
        match self.line.first() {
            Some(b'*') => {
                for _ in 0..count().max(0) {
                    self.skip_reply();
                }
            }
            Some(b'$') => {
                let mut bulk = vec![0; usize::try_from(count() + 2).unwrap_or(0)];
                self.stream
                    .read_exact(&mut bulk)
                    .expect("socket floor: read");
            }
            Some(b':' | b'+') => {}
            _ => panic!(
                "socket floor: {}",
                String::from_utf8_lossy(&self.line).trim_end()
            ),
        }
    }
}
