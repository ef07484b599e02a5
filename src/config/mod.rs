//! Configuration: the YAML file (docs/configuration.md), environment expansion, validation.
//!
//! Loading is three steps, in the spirit of River's split between file and
//! internal configuration: [`env::expand`] on the raw text, serde into the file
//! schema ([`file`]), then [`validate`] into the [`Config`] the rest of sluice
//! uses. Every error names `path:line:column` where a position exists. This
//! module knows nothing of Redis or Pingora.

mod checker;
pub mod consumers;
pub mod defaults;
pub mod diff;
pub mod duration;
pub mod env;
pub mod file;
pub mod forward;
pub mod jwks;
mod jwt;
pub mod position;
pub mod problem;
mod resolve;
pub mod rls;
pub mod template;
pub mod tls;
mod validate;

pub use crate::target::EscapedSlashes;
pub use resolve::resolve_server;
pub use sluice_limiter::calendar;
pub use sluice_limiter::settings::{
    Algorithm, Backend, LimiterConfig, OnError, RedisConfig, RedisTlsConfig, SentinelConfig,
};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use ipnet::IpNet;

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
    pub tls: Vec<tls::TlsListenerConfig>,
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
    pub rls: Option<rls::RlsConfig>,
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

/// What the key part `user` means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdentityConfig {
    /// No identity configured: `user` is always missing.
    None,
    /// A header (lower-case name) set by a trusted auth layer in front of sluice.
    Header(String),
    /// A verified bearer token's claim.
    Jwt(JwtConfig),
    /// An API key whose hash a consumers store knows: the consumer's id.
    ApiKey(consumers::ApiKeyConfig),
    /// The connection's verified client certificate (`server.tls[].client_auth`).
    ClientCert {
        /// What of the certificate becomes the user.
        from: file::CertField,
        /// Answer 401 without a verified certificate.
        required: bool,
    },
    /// An auth service asked about each request (`identity.auth_request`).
    AuthRequest(AuthRequestConfig),
    /// Several methods, tried in order (at most one of each kind): the
    /// first whose credential a request carries decides.
    Several(Vec<IdentityConfig>),
}

impl IdentityConfig {
    /// The methods in the order they are tried (none for `None`).
    pub fn methods(&self) -> &[IdentityConfig] {
        match self {
            IdentityConfig::None => &[],
            IdentityConfig::Several(methods) => methods,
            one => std::slice::from_ref(one),
        }
    }

    /// The `jwt` method, if one is configured.
    pub fn jwt(&self) -> Option<&JwtConfig> {
        self.methods().iter().find_map(|m| match m {
            IdentityConfig::Jwt(jwt) => Some(jwt),
            _ => None,
        })
    }

    /// The `api_key` method, if one is configured.
    pub fn api_key(&self) -> Option<&consumers::ApiKeyConfig> {
        self.methods().iter().find_map(|m| match m {
            IdentityConfig::ApiKey(keys) => Some(keys),
            _ => None,
        })
    }

    /// The `api_key` method, to fill in its consumers file.
    fn api_key_mut(&mut self) -> Option<&mut consumers::ApiKeyConfig> {
        match self {
            IdentityConfig::ApiKey(keys) => Some(keys),
            IdentityConfig::Several(methods) => methods.iter_mut().find_map(|m| m.api_key_mut()),
            _ => None,
        }
    }
}

/// `identity.auth_request`: an auth service that says who a request is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthRequestConfig {
    /// Where it is asked (http or https).
    pub url: String,
    /// How long an answer may take; past it, the request is not known.
    pub timeout: Duration,
    /// The request headers sent along (lower-case names): the credential.
    pub headers: Vec<String>,
    /// The service's answer header naming the user.
    pub user_header: String,
    /// The service's answer header naming the plan, if any.
    pub plan_header: Option<String>,
    /// How long a 2xx answer is reused for the same credential (zero: never).
    pub cache_ttl: Duration,
    /// Answer 401 without a credential, 503 when the service fails.
    pub required: bool,
}

/// `identity.jwt`: how bearer tokens are verified.
#[derive(Clone, PartialEq, Eq)]
pub struct JwtConfig {
    /// Lower-case header carrying `Bearer <token>`.
    pub header: String,
    /// Accepted signature algorithms (one key family).
    pub algorithms: Vec<jsonwebtoken::Algorithm>,
    /// The verification key: the HMAC secret, or a PEM public key.
    pub key: JwtKey,
    /// The claim whose value becomes the key part `user`.
    pub claim: String,
    /// When set, a token's `iss` must equal it.
    pub issuer: Option<String>,
    /// When not empty, a token's `aud` (a string or an array) must contain
    /// one of them.
    pub audiences: Vec<String>,
    /// Answer 401 when the token is missing or invalid.
    pub required: bool,
    /// Clock skew tolerated on `exp` and `nbf`.
    pub leeway: Duration,
}

/// Key material for JWT verification. Never printed.
#[derive(Clone, PartialEq, Eq)]
pub enum JwtKey {
    /// HMAC secret bytes (HS256/384/512).
    Secret(Vec<u8>),
    /// RSA public key, PEM (RS*, PS*).
    RsaPem(Vec<u8>),
    /// EC public key, PEM (ES256/384).
    EcPem(Vec<u8>),
    /// Ed25519 public key, PEM (EdDSA).
    EdPem(Vec<u8>),
    /// An identity provider's keys, by `kid`, from a JWKS document.
    Jwks(JwksSource),
}

/// Where `identity.jwt`'s JWKS keys come from, and how often they are
/// refreshed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JwksSource {
    /// The provider's JWKS URL (https, or http to a loopback address).
    pub url: Option<String>,
    /// A JWKS document read when the config loaded (`jwks_file`).
    pub file: Option<Vec<u8>>,
    /// How often the URL is fetched.
    pub refresh: Duration,
    /// The least time between fetches for an unknown `kid`.
    pub min_refresh: Duration,
}

impl fmt::Debug for JwtConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JwtConfig")
            .field("header", &self.header)
            .field("algorithms", &self.algorithms)
            .field("claim", &self.claim)
            .field("issuer", &self.issuer)
            .field("audiences", &self.audiences)
            .field("required", &self.required)
            .field("leeway", &self.leeway)
            .finish_non_exhaustive()
    }
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

/// Which request paths a route matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathMatch {
    /// Any path.
    Any,
    /// Exactly this path.
    Exact(String),
    /// Paths starting with this prefix.
    Prefix(String),
    /// Paths of this template's shape (`/users/{id}/orders`).
    Template(template::PathTemplate),
}

/// What a matched route does with an admitted request.
#[derive(Debug, Clone, PartialEq)]
pub enum RouteAction {
    /// Proxy to `upstreams[index]`.
    Upstream(usize),
    /// Answer directly.
    Respond {
        /// Status code.
        status: u16,
        /// Body (sent as text/plain).
        body: String,
    },
}

/// One route.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteConfig {
    /// Unique `[a-z0-9_-]+` name.
    pub name: String,
    /// Path condition.
    pub path: PathMatch,
    /// Upper-case methods; empty means any.
    pub methods: Vec<String>,
    /// Lower-case host without port; `None` means any.
    pub host: Option<String>,
    /// Proxy or respond.
    pub action: RouteAction,
    /// Limits applied, all of which must admit.
    pub limits: Vec<LimitConfig>,
    /// `exempt:`: requests none of this route's limits count.
    pub exempt: ExemptConfig,
    /// The request body cap (the route's, else the server's); 0: none.
    pub max_body_bytes: u64,
    /// What changes on the way upstream and back.
    pub forward: forward::ForwardConfig,
}

/// Which requests a limit does not count (`exempt:` at the top level, on a
/// route or on a limit). Any one match exempts; an empty one exempts nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExemptConfig {
    /// Client IPs (as `client_ip` resolves them) in these networks.
    pub cidrs: Vec<IpNet>,
    /// Request headers (lower-case name) with one of these values, believed
    /// only from trusted proxies (a client could send any header).
    pub headers: Vec<(String, Vec<String>)>,
    /// Verified JWT claims with one of these values (for an array claim:
    /// any of its elements).
    pub claims: Vec<(String, Vec<String>)>,
}

impl ExemptConfig {
    /// Whether it exempts nothing.
    pub fn is_empty(&self) -> bool {
        self.cidrs.is_empty() && self.headers.is_empty() && self.claims.is_empty()
    }

    /// The exemption in one phrase: "10.0.0.0/8, header x-internal, claim
    /// role", or "nothing".
    pub fn describe(&self) -> String {
        let mut parts: Vec<String> = self.cidrs.iter().map(ToString::to_string).collect();
        parts.extend(
            self.headers
                .iter()
                .map(|(name, _)| format!("header {name}")),
        );
        parts.extend(self.claims.iter().map(|(name, _)| format!("claim {name}")));
        if parts.is_empty() {
            return "nothing".into();
        }
        parts.join(", ")
    }
}

/// One part of a limit's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPart {
    /// The client IP (IPv6 by prefix).
    Ip,
    /// The identity (see [`IdentityConfig`]).
    User,
    /// The request method.
    Method,
    /// The request path, without query.
    Path,
    /// A request header, by lower-case name.
    Header(String),
    /// A query parameter, by name (percent-decoded before comparing).
    Query(String),
    /// A cookie, by name.
    Cookie(String),
    /// A parameter of the route's path template.
    Param(String),
    /// The SHA-256 (hex) of the verified client certificate.
    ClientCert,
    /// The verified client certificate's subject (RFC 4514 text).
    ClientSubject,
    /// The verified client certificate's first URI SAN, else its first
    /// DNS SAN.
    ClientSan,
}

impl KeyPart {
    /// The part as `describe` and the usage API name it: `ip`, `user`,
    /// `header.NAME`, `query.NAME`, `cookie.NAME`, `param.NAME`.
    pub fn label(&self) -> String {
        match self {
            KeyPart::Ip => "ip".into(),
            KeyPart::User => "user".into(),
            KeyPart::Method => "method".into(),
            KeyPart::Path => "path".into(),
            KeyPart::Header(name) => format!("header.{name}"),
            KeyPart::Query(name) => format!("query.{name}"),
            KeyPart::Cookie(name) => format!("cookie.{name}"),
            KeyPart::Param(name) => format!("param.{name}"),
            KeyPart::ClientCert => "client_cert".into(),
            KeyPart::ClientSubject => "client_subject".into(),
            KeyPart::ClientSan => "client_san".into(),
        }
    }
}

/// Formats a duration the way the file writes it (`250ms`, `10s`, `1m`, `1h`).
pub fn format_duration(d: Duration) -> String {
    let us = d.as_micros();
    for (unit, size) in [
        ("d", 86_400_000_000u128),
        ("h", 3_600_000_000),
        ("m", 60_000_000),
        ("s", 1_000_000),
        ("ms", 1_000),
    ] {
        if us >= size && us.is_multiple_of(size) {
            return format!("{}{unit}", us / size);
        }
    }
    format!("{us}us")
}

/// What to do when a key part is absent from a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnMissing {
    /// Use the client IP in its place.
    Ip,
    /// Do not apply this limit to the request.
    Skip,
}

/// One limit of a route.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitConfig {
    /// Unique-within-route `[a-z0-9_-]+` name.
    pub name: String,
    /// Key parts (non-empty).
    pub key: Vec<KeyPart>,
    /// Units admitted per window (≥ 1).
    pub limit: u64,
    /// Window length (≥ 1 ms).
    pub window: Duration,
    /// Algorithm.
    pub algorithm: Algorithm,
    /// Absent key part policy.
    pub on_missing: OnMissing,
    /// Units one request consumes (1..=limit).
    pub cost: u64,
    /// Count and report, never deny.
    pub shadow: bool,
    /// Name of the counter shared with other routes' limits (`share:`); the
    /// key then names the share instead of the route and limit.
    pub share: Option<String>,
    /// `exempt:`: requests this limit does not count.
    pub exempt: ExemptConfig,
    /// Where a request's plan comes from (`limit_from`), if plans are used.
    pub limit_from: Option<PlanSource>,
    /// Plan name → its limit (`plans`); a missing or unknown plan gets `limit`.
    pub plans: Vec<(String, u64)>,
    /// Limits for specific key values (`overrides`), first match wins; they
    /// take precedence over plans.
    pub overrides: Vec<Override>,
    /// The penalty box (`block_for`): a key this limit denies stays denied
    /// this long. Zero: none.
    pub block_for: Duration,
    /// Count only responses with one of these statuses (`count_when`).
    pub count_when: Option<Vec<StatusMatch>>,
    /// Count the response header's number instead of `cost` (`cost_from`,
    /// lower-case name).
    pub cost_from: Option<String>,
    /// The civil periods of a calendar quota (`calendar`, `timezone`); set
    /// exactly when the algorithm is [`Algorithm::Calendar`].
    pub calendar: Option<calendar::Calendar>,
    /// `on_limit: delay`: the longest a request over the limit waits for
    /// its turn instead of being denied. Zero: `on_limit: reject`.
    pub max_delay: Duration,
    /// `on_limit: delay`: the most requests of one key waiting at once on
    /// this instance (≥ 1).
    pub max_waiting: usize,
}

/// One entry of `count_when.status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusMatch {
    /// Exactly this status.
    Exact(u16),
    /// A class: `4` for `4xx`.
    Class(u16),
}

impl StatusMatch {
    /// Whether `status` matches.
    pub fn matches(self, status: u16) -> bool {
        match self {
            StatusMatch::Exact(s) => s == status,
            StatusMatch::Class(c) => status / 100 == c,
        }
    }
}

impl LimitConfig {
    /// Whether the response decides what this limit counts: the request is
    /// checked before it is proxied and counted when its response head is
    /// known (`count_when`, `cost_from`).
    pub fn deferred(&self) -> bool {
        self.count_when.is_some() || self.cost_from.is_some()
    }
}

/// Where a request's plan name comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanSource {
    /// A verified JWT claim.
    Claim(String),
    /// A request header (lower-case name), believed from trusted proxies only.
    Header(String),
    /// The plan of the consumer whose API key the request carries.
    ConsumerPlan,
}

/// One `overrides` entry: requests whose key parts have these raw values get
/// this limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Override {
    /// Key parts of the limit, each with the value a request must carry.
    pub parts: Vec<(KeyPart, String)>,
    /// The limit (a plan's number when written as `plan:`).
    pub limit: u64,
}

impl LimitConfig {
    /// A limit in one phrase: "10 per 1m (sliding_log, key ip)".
    pub fn describe(&self) -> String {
        let rate = match self.algorithm {
            Algorithm::Concurrency { lease } => {
                format!(
                    "{} in flight (lease {})",
                    self.limit,
                    format_duration(lease)
                )
            }
            Algorithm::TokenBucket { burst } => format!(
                "{} per {}, burst {burst}",
                self.limit,
                format_duration(self.window)
            ),
            Algorithm::SlidingWindow { buckets } => format!(
                "{} per {}, {buckets} buckets",
                self.limit,
                format_duration(self.window)
            ),
            Algorithm::Calendar { period, .. } => {
                let zone = self
                    .calendar
                    .as_ref()
                    .map_or("UTC", |c| c.zone_name.as_str());
                format!("{} per {} ({zone})", self.limit, period.name())
            }
            _ => format!("{} per {}", self.limit, format_duration(self.window)),
        };
        let key: Vec<String> = self.key.iter().map(KeyPart::label).collect();
        let mut notes = vec![
            self.algorithm.name().to_string(),
            format!("key {}", key.join("+")),
        ];
        if self.on_missing == OnMissing::Skip {
            notes.push("on_missing skip".into());
        }
        if self.cost != 1 {
            notes.push(format!("cost {}", self.cost));
        }
        if let Some(share) = &self.share {
            notes.push(format!("shared as {share}"));
        }
        if self.shadow {
            notes.push("shadow".into());
        }
        if let Some(when) = &self.count_when {
            let statuses: Vec<String> = when
                .iter()
                .map(|m| match m {
                    StatusMatch::Exact(s) => s.to_string(),
                    StatusMatch::Class(c) => format!("{c}xx"),
                })
                .collect();
            notes.push(format!("counts {}", statuses.join(" ")));
        }
        if let Some(header) = &self.cost_from {
            notes.push(format!("cost from {header}"));
        }
        if !self.block_for.is_zero() {
            notes.push(format!("block_for {}", format_duration(self.block_for)));
        }
        if !self.exempt.is_empty() {
            notes.push(format!("exempt {}", self.exempt.describe()));
        }
        if let Some(source) = &self.limit_from {
            let plans: Vec<String> = self.plans.iter().map(|(n, l)| format!("{n}={l}")).collect();
            let from = match source {
                PlanSource::Claim(c) => format!("claim {c}"),
                PlanSource::Header(h) => format!("header {h}"),
                PlanSource::ConsumerPlan => "consumer plan".to_string(),
            };
            notes.push(format!("plans {} by {from}", plans.join(" ")));
        }
        if !self.overrides.is_empty() {
            // Counts and numbers only: matched values may be API keys.
            let limits: Vec<String> = self.overrides.iter().map(|o| o.limit.to_string()).collect();
            notes.push(format!("overrides {}", limits.join(" ")));
        }
        format!("{rate} ({})", notes.join(", "))
    }
}

/// One problem found in a configuration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// 1-based (line, column), when the problem has a place in the file.
    pub position: Option<(usize, usize)>,
    /// What is wrong, for a person.
    pub message: String,
}

/// Why a configuration could not be loaded. Its `Display` is one line per
/// problem, `PATH:LINE:COLUMN: message` (or `PATH: message`).
#[derive(Debug, thiserror::Error)]
pub struct ConfigError {
    /// The file.
    pub path: PathBuf,
    /// Every problem found (at least one).
    pub problems: Vec<Problem>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.problems.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            match problem.position {
                Some((line, column)) => write!(
                    f,
                    "{}:{line}:{column}: {}",
                    self.path.display(),
                    problem.message
                )?,
                None => write!(f, "{}: {}", self.path.display(), problem.message)?,
            }
        }
        Ok(())
    }
}

impl Config {
    /// Reads, expands, parses and validates the file at `path`, using the
    /// process environment for `${VAR}`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            path: path.to_path_buf(),
            problems: vec![Problem {
                position: None,
                message: format!("cannot read: {e}"),
            }],
        })?;
        Self::from_text(path, &text, |name| std::env::var(name).ok())
    }

    /// Like [`Config::load`] on `text` already read from `path`, with `lookup`
    /// for environment variables.
    pub fn from_text(
        path: &Path,
        text: &str,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let fail = |problems: Vec<Problem>| ConfigError {
            path: path.to_path_buf(),
            problems,
        };
        let expanded = env::expand(text, &lookup).map_err(|e| {
            fail(vec![match e {
                env::ExpandError::Unset(v) => Problem {
                    position: Some((v.line, v.column)),
                    message: format!(
                        "environment variable `{}` is not set (write ${{{}:-default}} to give a default)",
                        v.name, v.name
                    ),
                },
                env::ExpandError::Unterminated(line, column) => Problem {
                    position: Some((line, column)),
                    message: "`${` without a closing `}`".into(),
                },
            }])
        })?;
        let parsed: file::FileConfig = if expanded.trim().is_empty() {
            file::FileConfig::default()
        } else {
            serde_yaml::from_str(&expanded).map_err(|e| fail(vec![serde_problem(&e)]))?
        };
        let index = position::PositionIndex::build(&expanded);
        let (mut config, warnings) = validate::validate(parsed, &index, &lookup).map_err(fail)?;
        resolve::resolve(&mut config, &index, &lookup).map_err(fail)?;
        let mut consumer_warnings = config.read_consumers()?;
        consumer_warnings.extend(config.read_rls_rules()?);
        config.warnings = fail(warnings)
            .to_string()
            .lines()
            .filter(|line| !line.is_empty())
            .map(str::to_string)
            .chain(consumer_warnings)
            .collect();
        Ok(config)
    }

    /// Reads the rules of `server.rls` into it; their warnings. Their
    /// problems are reported against their own files.
    fn read_rls_rules(&mut self) -> Result<Vec<String>, ConfigError> {
        let Some(rls) = &mut self.server.rls else {
            return Ok(Vec::new());
        };
        let (rules, warnings) = rls::read_rules(&rls.config_path, rls.algorithm)?;
        rls.rules = std::sync::Arc::new(rules);
        Ok(warnings)
    }

    /// Reads the consumers file of `identity.api_key` into it; its
    /// warnings. Its problems are reported against that file.
    fn read_consumers(&mut self) -> Result<Vec<String>, ConfigError> {
        let plans: std::collections::BTreeSet<String> = self
            .routes
            .iter()
            .flat_map(|r| &r.limits)
            .flat_map(|l| l.plans.iter().map(|(name, _)| name.clone()))
            .collect();
        let Some(api_key) = self.identity.api_key_mut() else {
            return Ok(Vec::new());
        };
        let consumers::KeyStore::File { path, consumers } = &mut api_key.store else {
            return Ok(Vec::new());
        };
        let (read, warnings) = consumers::load(path, &plans)?;
        *consumers = std::sync::Arc::new(read);
        Ok(warnings)
    }
}

pub(crate) fn serde_problem(error: &serde_yaml::Error) -> Problem {
    let text = error.to_string();
    // serde_yaml appends " at line L column C" to its message; we print the
    // position in front instead.
    let message = match text.find(" at line ") {
        Some(cut) => text[..cut].to_string(),
        None => text,
    };
    let message = message.trim_start_matches(": ").to_string();
    Problem {
        position: error.location().map(|l| (l.line(), l.column())),
        message,
    }
}

#[cfg(test)]
mod tests;
