//! A `redis-server` that also speaks TLS, with a certificate authority of its own made for the
//! test by the `openssl` command: the server's certificate names `127.0.0.1`, and only a client
//! that trusts this CA can verify it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::server::{PortReservation, RedisServer, unique_temp_dir};

/// A server with a plain port (for the harness's own checks) and a TLS port.
#[derive(Debug)]
pub struct TlsRedisServer {
    server: RedisServer,
    tls_port: PortReservation,
    dir: PathBuf,
}

impl TlsRedisServer {
    /// Makes a CA and a server certificate signed by it, and starts the server.
    ///
    /// # Panics
    /// When `openssl` fails or the server does not start.
    pub fn start() -> Self {
        let dir = unique_temp_dir("tls");
        make_certificates(&dir);
        let tls_port = PortReservation::take(false);
        let file = |name: &str| dir.join(name).to_string_lossy().into_owned();
        let server = RedisServer::start_with_args(&[
            "--tls-port".to_owned(),
            tls_port.port.to_string(),
            "--tls-cert-file".to_owned(),
            file("server.crt"),
            "--tls-key-file".to_owned(),
            file("server.key"),
            "--tls-ca-cert-file".to_owned(),
            file("ca.crt"),
            "--tls-auth-clients".to_owned(),
            "no".to_owned(),
        ]);
        TlsRedisServer {
            server,
            tls_port,
            dir,
        }
    }

    /// `rediss://127.0.0.1:TLS_PORT`.
    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.tls_port.port)
    }

    /// The CA certificate (PEM) that signed the server's.
    ///
    /// # Panics
    /// When the file cannot be read.
    pub fn ca_pem(&self) -> Vec<u8> {
        std::fs::read(self.dir.join("ca.crt")).expect("read ca.crt")
    }

    /// The server, for plain-port access.
    pub fn server(&self) -> &RedisServer {
        &self.server
    }
}

impl Drop for TlsRedisServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let status = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("cannot run openssl (scripts/test installs it): {e}"));
    assert!(status.success(), "openssl {args:?} exited with {status}");
}

fn make_certificates(dir: &Path) {
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .expect("write server.ext");
    let key = ["-newkey", "rsa:2048", "-nodes"];
    openssl(
        dir,
        &[
            &["req", "-x509"][..],
            &key,
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-days",
                "2",
                "-subj",
                "/CN=caracal test CA",
            ],
        ]
        .concat(),
    );
    openssl(
        dir,
        &[
            &["req"][..],
            &key,
            &[
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=127.0.0.1",
            ],
        ]
        .concat(),
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "server.ext",
        ],
    );
}
