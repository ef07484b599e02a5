//! The YAML schema exactly as written by operators (docs/configuration.md).
//!
//! Every struct denies unknown keys, so a typo is an error rather than a silently
//! disabled limit. Values are kept close to their written form (durations as
//! strings, names unchecked); `validate` turns them into the internal `Config`.
//!
//! Its fields are the YAML keys themselves, each documented where operators
//! read it (docs/configuration.md) and validated in `validate`: they carry
//! no doc comments of their own.
#![allow(missing_docs)]

mod identity;
mod limiter;
mod route;
mod upstream;
mod usage;

use super::{EscapedSlashes, HeaderStyle};
pub use identity::{
    ApiKeyFile, AuthRequestFile, CertField, ClientCertIdentityFile, ConsumerFile, ConsumersFile,
    FailuresFile, IdentityFile, IdentityMethods, JwtFile,
};
pub use limiter::{LimiterFile, LocalFile, RedisFile, RedisTlsFile, SentinelFile};
pub use route::{
    AlgorithmFile, CorsFile, CountWhenFile, HeaderEditsFile, KeyPartFile, LimitFile, LimitFromFile,
    MatchFile, OnLimitFile, OverrideFile, PeriodFile, RespondFile, RetriesFile, RewriteFile,
    RouteFile, RouteTimeoutsFile,
};
use serde::Deserialize;
use std::collections::BTreeMap;
pub use upstream::{
    BalanceFile, HealthCheckFile, UpstreamFile, UpstreamServerFile, UpstreamTlsFile,
};
pub use usage::{CostFromFile, PointersFile, ReserveFile, ReserveReadFile};

/// The whole file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileConfig {
    #[serde(default)]
    pub server: ServerFile,
    #[serde(default)]
    pub client_ip: ClientIpFile,
    #[serde(default)]
    pub identity: Option<IdentityMethods>,
    #[serde(default)]
    pub limiter: LimiterFile,
    #[serde(default)]
    pub response: ResponseFile,
    #[serde(default)]
    pub upstreams: BTreeMap<String, UpstreamFile>,
    #[serde(default)]
    pub routes: Vec<RouteFile>,
    pub exempt: Option<ExemptFile>,
    pub tracing: Option<TracingFile>,
}

/// `tracing:`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TracingFile {
    pub otlp_endpoint: Option<String>,
    pub sample_ratio: Option<f64>,
    pub service_name: Option<String>,
    pub always_sample_denied: Option<bool>,
}

/// `exempt:` (top level, a route's, a limit's).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExemptFile {
    #[serde(default)]
    pub cidrs: Vec<String>,
    #[serde(default)]
    pub headers: BTreeMap<String, Vec<String>>,
    #[serde(default)]
    pub claims: BTreeMap<String, Vec<String>>,
}

/// `server:`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ServerFile {
    pub listen: Option<Vec<String>>,
    pub admin: Option<String>,
    pub threads: Option<usize>,
    pub work_stealing: Option<bool>,
    pub grace_period: Option<String>,
    pub shutdown_delay: Option<String>,
    pub pid_file: Option<String>,
    pub upgrade_sock: Option<String>,
    pub access_log: Option<AccessLogFile>,
    pub escaped_slashes: Option<EscapedSlashes>,
    pub client_header_timeout: Option<String>,
    pub keepalive_timeout: Option<String>,
    pub client_body_timeout: Option<String>,
    pub send_timeout: Option<String>,
    pub max_header_bytes: Option<usize>,
    pub max_uri_bytes: Option<usize>,
    pub max_connections: Option<usize>,
    pub admin_token_env: Option<String>,
    /// The `Server` header of sluice's own responses; absent: none.
    pub server_header: Option<String>,
    /// TLS listeners.
    pub tls: Option<Vec<TlsListenerFile>>,
    /// HTTP/2 with prior knowledge (h2c) on the plain listeners.
    pub h2c: Option<bool>,
    /// The request body cap; 0: none.
    pub max_body_bytes: Option<u64>,
    /// Reload when the file changes.
    pub watch_config: Option<bool>,
    /// The header carrying the request ID.
    pub request_id_header: Option<String>,
    /// The gRPC rate-limit service for Envoy.
    pub rls: Option<RlsFile>,
}

/// `server.rls`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RlsFile {
    pub listen: String,
    pub config: String,
    pub algorithm: Option<AlgorithmFile>,
    pub response_headers: Option<RlsHeadersFile>,
    /// TLS on the listener, as in `server.tls`; absent: h2c.
    pub certs: Option<Vec<TlsCertFile>>,
}

/// `server.rls.response_headers`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RlsHeadersFile {
    None,
    Draft,
}

/// One entry of `server.tls`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TlsListenerFile {
    pub listen: String,
    pub certs: Vec<TlsCertFile>,
    /// Client certificates asked for on this listener.
    pub client_auth: Option<ClientAuthFile>,
}

/// `server.tls[].client_auth`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ClientAuthFile {
    /// The PEM file of the CA certificates a client certificate must chain to.
    pub ca: String,
    /// `required` (the default) or `optional`.
    pub mode: Option<ClientAuthMode>,
}

/// Whether a TLS listener refuses clients without a valid certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ClientAuthMode {
    /// No certificate, or one that fails verification: the handshake fails.
    Required,
    /// Either is served as a client without a certificate.
    Optional,
}

/// One entry of `server.tls[].certs`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TlsCertFile {
    pub cert: String,
    pub key: String,
}

/// `server.access_log`.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum AccessLogFile {
    Stderr,
    Off,
}

/// `client_ip:`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ClientIpFile {
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
    pub ipv6_prefix: Option<u8>,
}

/// `response:`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ResponseFile {
    pub status: Option<u16>,
    pub headers: Option<HeaderStyle>,
}
