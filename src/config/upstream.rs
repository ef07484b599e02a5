//! `upstreams:` as validated: each pool's servers (as written and as
//! resolved), balancing, protocol and TLS to its servers.

use crate::config::route::KeyPart;
use std::net::SocketAddr;
use std::time::Duration;

/// One upstream pool.
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamConfig {
    /// Its name in the file.
    pub name: String,
    /// Its servers as written (`host:port`), with their weights.
    pub addresses: Vec<ServerSpec>,
    /// The addresses they resolved to when the file was loaded (sorted by
    /// entry and address; non-empty unless `dns_refresh` lets a name that
    /// does not resolve yet wait for its next refresh).
    pub servers: Vec<ResolvedServer>,
    /// How often names in `addresses` are resolved again (`None`: only when
    /// the file is loaded).
    pub dns_refresh: Option<Duration>,
    /// TCP health-check interval; `None` disables health checks.
    pub health_check: Option<Duration>,
    /// Connect timeout to a server.
    pub connect_timeout: Duration,
    /// Read timeout on a server's response.
    pub read_timeout: Duration,
    /// HTTPS to the servers (`tls:`); `None`: plain HTTP.
    pub tls: Option<UpstreamTls>,
    /// The HTTP version spoken to the servers.
    pub protocol: UpstreamProtocol,
    /// How a server is chosen.
    pub balance: Balance,
    /// Passive health: failures within `fail_timeout` that take a server
    /// out (0: never).
    pub max_fails: u32,
    /// Passive health: the failures' window, and how long a server is out.
    pub fail_timeout: Duration,
}

/// `upstreams.*.balance`: how each request's server is chosen (every way
/// weighs servers by `weight` and skips those the health check took out).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Balance {
    /// Weighted round robin.
    #[default]
    RoundRobin,
    /// Weighted random.
    Random,
    /// Ketama consistent hashing on these key parts: one key keeps its
    /// server while the set is unchanged.
    ConsistentHash(Vec<KeyPart>),
}

/// One entry of `upstreams.*.servers`, as written.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServerSpec {
    /// `host:port`, a name or an IP address.
    pub addr: String,
    /// Its share of the requests relative to the others (≥ 1).
    pub weight: usize,
}

/// One address a server resolved to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ResolvedServer {
    /// The address.
    pub addr: SocketAddr,
    /// Which entry of `addresses` it is for.
    pub spec: usize,
}

/// `upstreams.*.protocol`: how sluice speaks to an upstream's servers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UpstreamProtocol {
    /// HTTP/1.1 (the default).
    #[default]
    Http1,
    /// HTTP/2 over TLS (needs `tls`): gRPC servers behind TLS.
    H2,
    /// HTTP/2 with prior knowledge over plain TCP: gRPC servers without TLS.
    H2c,
}

/// `upstreams.*.tls`: how sluice speaks TLS to an upstream.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UpstreamTls {
    /// The server name sent (SNI) and verified.
    pub sni: String,
    /// Verify the certificate chain and that it is for `sni`.
    pub verify: bool,
    /// DER certificates of the CAs to trust instead of the system's roots
    /// (read from `ca_file` when the config loads).
    pub ca_der: Option<Vec<Vec<u8>>>,
}
