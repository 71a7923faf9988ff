//! One node's client: the TLS trust a `rediss://` connection asks for, the socket settings and
//! protocol every node (standalone server, master, sentinel) is spoken to with, and the error a
//! URL the client refuses becomes. Below both the connector and the sentinel resolver.

use redis::{IntoConnectionInfo, RedisError};

use crate::error::Error;

/// The certificates (PEM) a `rediss://` connection trusts instead of the system's; `None`: the
/// system's. Only with the `tls` feature; without it, a `rediss://` URL is refused.
#[derive(Debug, Clone, Default)]
pub(crate) struct Trust {
    /// The certificates to trust, as PEM; `None`: the system's.
    #[cfg(feature = "tls")]
    pub(crate) roots: Option<Vec<u8>>,
}

impl Trust {
    /// A client for `info` that trusts these certificates.
    pub(super) fn client(&self, info: redis::ConnectionInfo) -> redis::RedisResult<redis::Client> {
        #[cfg(feature = "tls")]
        if let Some(roots) = &self.roots {
            return redis::Client::build_with_tls(info, self.certificates(roots));
        }
        redis::Client::open(info)
    }

    #[cfg(feature = "tls")]
    pub(super) fn certificates(&self, roots: &[u8]) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(roots.to_vec()),
        }
    }
}

/// No Nagle delay: commands are small, and each waits for its answer.
pub(super) fn tcp_settings() -> redis::io::tcp::TcpSettings {
    redis::io::tcp::TcpSettings::default().set_nodelay(true)
}

/// A client for one node (a standalone server, a master, a sentinel) at `url`: RESP3, so a
/// connection reports its own end, and so a password reaches a server without one as the
/// `default` user's (which any password opens), not as a legacy `AUTH` it would refuse.
pub(super) fn node_client(url: &str, trust: &Trust) -> redis::RedisResult<redis::Client> {
    let info = url.into_connection_info()?;
    let redis = info
        .redis_settings()
        .clone()
        .set_protocol(redis::ProtocolVersion::RESP3);
    trust.client(
        info.set_tcp_settings(tcp_settings())
            .set_redis_settings(redis),
    )
}

/// A URL the client would not take, as a configuration error.
pub(super) fn invalid_url(error: RedisError) -> Error {
    Error::config(format!("invalid Redis URL: {error}"))
}
