//! The validated configuration as the gateway uses it: the whole [`Config`]
//! and its server-wide sections (listeners, front door, client IP,
//! response, tracing). Routes, upstreams and identity have their own files;
//! the limiter's settings are the limiter crate's.

use crate::config::identity::IdentityConfig;
use crate::config::route::ExemptConfig;
use crate::config::route::RouteConfig;
use crate::config::upstream::UpstreamConfig;
use crate::limiter::settings::LimiterConfig;
use crate::target::EscapedSlashes;
use ipnet::IpNet;
use std::time::Duration;

/// A validated configuration. Every value in it has been checked; building
/// the gateway from it cannot fail on account of the file.
#[derive(Debug, Clone)]
pub struct Config {
    /// `server:`.
    pub server: ServerConfig,
    /// `client_ip:`.
    pub client_ip: ClientIpConfig,
    /// `identity:`.
    pub identity: IdentityConfig,
    /// `limiter:`.
    pub limiter: LimiterConfig,
    /// `response:`.
    pub response: ResponseConfig,
    /// `upstreams:`, in name order; routes refer to them by index.
    pub upstreams: Vec<UpstreamConfig>,
    /// `routes:`, in file order (first match wins).
    pub routes: Vec<RouteConfig>,
    /// `exempt:`: requests no limit of any route counts.
    pub exempt: ExemptConfig,
    /// `tracing:`: traces over OTLP; `None` when no collector is named.
    pub tracing: Option<TracingConfig>,
    /// Things that work but deserve the operator's attention, `path:line:column`
    /// formatted like errors (printed by `--check` and logged at start).
    pub warnings: Vec<String>,
}

/// Listeners, threads and shutdown.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// Proxy listener addresses (`host:port`).
    pub listen: Vec<String>,
    /// Admin listener address (`/metrics`, `/healthz`, `/readyz`).
    pub admin: String,
    /// The bearer token the usage API (`/v1/usage`) requires, read from the
    /// environment variable `server.admin_token_env` when the config loads.
    /// Without one the usage API answers on a loopback admin listener only.
    pub admin_token: Option<String>,
    /// Proxy worker threads (≥ 1).
    pub threads: usize,
    /// Whether idle worker threads steal tasks from busy ones (one shared
    /// work-stealing runtime) instead of each running its own.
    pub work_stealing: bool,
    /// How long a graceful stop may drain.
    pub grace_period: Duration,
    /// How long, after `SIGTERM`, the listeners keep accepting and serving
    /// (with `/readyz` answering 503 and keep-alive connections closed
    /// after their response) before the graceful stop begins: the time a
    /// load balancer or Kubernetes takes to stop sending new connections.
    pub shutdown_delay: Duration,
    /// Where Pingora writes its pid when run as a daemon.
    pub pid_file: String,
    /// Unix socket over which an upgrading sluice (`--upgrade`) receives the
    /// listeners of the running one.
    pub upgrade_sock: String,
    /// Write one JSON line per request to stderr.
    pub access_log: bool,
    /// The `Server` header of the responses sluice writes itself (errors,
    /// denials, `respond:` routes); `None`: they carry none. Proxied
    /// responses keep the upstream's.
    pub server_header: Option<String>,
    /// Limits on what one client connection may hold (reloadable).
    pub front_door: FrontDoorConfig,
    /// TLS listeners (HTTP/1.1 and HTTP/2 by ALPN); their certificates are
    /// re-read on every reload, their addresses only on a restart.
    pub tls: Vec<super::tls::TlsListenerConfig>,
    /// HTTP/2 with prior knowledge (h2c) on the plain listeners too.
    pub h2c: bool,
    /// The largest request body a route takes unless it sets its own
    /// (`max_body_bytes`); 0: no cap.
    pub max_body_bytes: u64,
    /// Reload when the config file changes, as on SIGHUP.
    pub watch_config: bool,
    /// The header carrying a request's ID (lower case): believed from a
    /// trusted proxy, generated otherwise; sent upstream and returned.
    pub request_id_header: http::HeaderName,
    /// `server.rls`: the gRPC rate-limit service for Envoy; `None`: off.
    pub rls: Option<super::rls::RlsConfig>,
}

/// How much of the gateway one client connection may hold, and how the
/// request target is made canonical. Every value applies to connections
/// accepted after a reload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrontDoorConfig {
    /// `%2F` / `%5C` in paths: refused (400) or kept encoded.
    pub escaped_slashes: EscapedSlashes,
    /// The whole request head must arrive within this time of its first byte.
    pub client_header_timeout: Duration,
    /// An idle keep-alive connection is closed after this long.
    pub keepalive_timeout: Duration,
    /// The longest wait between two reads of a request body.
    pub client_body_timeout: Duration,
    /// The longest a write to a client that stopped reading may wait.
    pub send_timeout: Duration,
    /// The largest request head (request line and headers), in bytes: 431 beyond.
    pub max_header_bytes: usize,
    /// The longest request target, in bytes: 414 beyond.
    pub max_uri_bytes: usize,
    /// Client connections open at once, per instance; more are closed at once.
    pub max_connections: usize,
}

/// How the client address is found.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientIpConfig {
    /// Peers whose `X-Forwarded-For` is believed.
    pub trusted_proxies: Vec<IpNet>,
    /// IPv6 clients are keyed by this prefix length (1..=128).
    pub ipv6_prefix: u8,
}

/// Which rate-limit headers responses carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HeaderStyle {
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset`.
    Legacy,
    /// IETF `RateLimit-Policy` and `RateLimit`.
    Draft,
    /// Legacy and draft.
    Both,
    /// No rate-limit headers (Retry-After is still sent on denial).
    None,
    /// OpenAI's: `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`,
    /// and `retry-after-ms` on a denial.
    #[serde(rename = "openai")]
    Openai,
}

/// The shape of the JSON body of sluice's own answers on a route
/// (`errors`): sluice's `{"error": "too_many_requests", …}`, or the error
/// shape of the API the route fronts, so that its clients' SDKs read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorStyle {
    /// `{"error": "<code>", "route": …, "limit": …, …}`.
    #[default]
    Sluice,
    /// `{"error": {"message", "type", "param", "code"}}`.
    #[serde(rename = "openai")]
    Openai,
    /// `{"type": "error", "error": {"type", "message"}}`.
    Anthropic,
}

/// `response:`.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponseConfig {
    /// Status of a denied request (4xx).
    pub status: u16,
    /// Header style.
    pub headers: HeaderStyle,
}

/// `tracing:`: where and how often traces are exported.
#[derive(Debug, Clone, PartialEq)]
pub struct TracingConfig {
    /// The OTLP/HTTP endpoint spans are posted to: the URL as written, with
    /// `/v1/traces` appended when it has no path.
    pub otlp_endpoint: String,
    /// The share of requests without a sampled parent that are traced
    /// (0 to 1); a parent's sampled flag decides for the others.
    pub sample_ratio: f64,
    /// `service.name` of the spans' resource.
    pub service_name: String,
    /// Every denied request is traced, whatever the sampling said.
    pub always_sample_denied: bool,
}
