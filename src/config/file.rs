//! The YAML schema exactly as written by operators (docs/configuration.md).
//!
//! Every struct denies unknown keys, so a typo is an error rather than a silently
//! disabled limit. Values are kept close to their written form (durations as
//! strings, names unchecked); `validate` turns them into the internal `Config`.
//! A key planned but not implemented yet is accepted here as a raw value, so
//! that validation can say "not supported yet" instead of "unknown".
//!
//! Its fields are the YAML keys themselves, each documented where operators
//! read it (docs/configuration.md) and validated in `validate`: they carry
//! no doc comments of their own.
#![allow(missing_docs)]

use super::{Backend, EscapedSlashes, HeaderStyle, OnError, OnMissing, UpstreamProtocol};
use serde::Deserialize;
use serde_yaml::Value;
use std::collections::BTreeMap;

/// The whole file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
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
pub struct TracingFile {
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
pub struct ServerFile {
    pub listen: Option<Vec<String>>,
    pub admin: Option<String>,
    pub threads: Option<usize>,
    pub work_stealing: Option<bool>,
    pub grace_period: Option<String>,
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
pub struct RlsFile {
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
pub enum RlsHeadersFile {
    None,
    Draft,
}

/// One entry of `server.tls`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsListenerFile {
    pub listen: String,
    pub certs: Vec<TlsCertFile>,
    /// Client certificates asked for on this listener.
    pub client_auth: Option<ClientAuthFile>,
}

/// `server.tls[].client_auth`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientAuthFile {
    /// The PEM file of the CA certificates a client certificate must chain to.
    pub ca: String,
    /// `required` (the default) or `optional`.
    pub mode: Option<ClientAuthMode>,
}

/// Whether a TLS listener refuses clients without a valid certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientAuthMode {
    /// No certificate, or one that fails verification: the handshake fails.
    Required,
    /// Either is served as a client without a certificate.
    Optional,
}

/// One entry of `server.tls[].certs`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsCertFile {
    pub cert: String,
    pub key: String,
}

/// `server.access_log`.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AccessLogFile {
    Stderr,
    Off,
}

/// `client_ip:`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientIpFile {
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
    pub ipv6_prefix: Option<u8>,
}

/// `identity:`: one method, or a list of one-method maps tried in order.
#[derive(Debug)]
pub enum IdentityMethods {
    /// `identity: {jwt: …}` (or `header`, `api_key`).
    One(Box<IdentityFile>),
    /// `identity: [{jwt: …}, {api_key: …}]`.
    Several(Vec<IdentityFile>),
}

impl<'de> Deserialize<'de> for IdentityMethods {
    /// A map is one method, a sequence a list of them; each is read as an
    /// [`IdentityFile`], so its errors (an unknown key) keep their words and
    /// positions.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
        struct Methods;
        impl<'de> serde::de::Visitor<'de> for Methods {
            type Value = IdentityMethods;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(
                    "an identity method (header, jwt, api_key or client_cert), or a list of them",
                )
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Self::Value, A::Error> {
                IdentityFile::deserialize(MapAccessDeserializer::new(map))
                    .map(|one| IdentityMethods::One(Box::new(one)))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                seq: A,
            ) -> Result<Self::Value, A::Error> {
                Vec::<IdentityFile>::deserialize(SeqAccessDeserializer::new(seq))
                    .map(IdentityMethods::Several)
            }
        }
        d.deserialize_any(Methods)
    }
}

/// One identity method (one of `jwt`, `header` or `api_key`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdentityFile {
    pub jwt: Option<JwtFile>,
    pub header: Option<String>,
    pub api_key: Option<ApiKeyFile>,
    pub client_cert: Option<ClientCertIdentityFile>,
    pub auth_request: Option<AuthRequestFile>,
}

/// `identity.auth_request:`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthRequestFile {
    pub url: Option<String>,
    pub timeout: Option<String>,
    /// The request headers sent along (the credential).
    #[serde(default)]
    pub headers: Vec<String>,
    pub user_header: Option<String>,
    pub plan_header: Option<String>,
    pub cache_ttl: Option<String>,
    #[serde(default)]
    pub required: bool,
}

/// `identity.client_cert:`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientCertIdentityFile {
    /// What of the certificate becomes the user (default `fingerprint`).
    pub from: Option<CertField>,
    #[serde(default)]
    pub required: bool,
}

/// What of a verified client certificate becomes the user.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CertField {
    /// The first URI subject alternative name.
    SanUri,
    /// The first DNS subject alternative name.
    SanDns,
    /// The subject's common name.
    SubjectCn,
    /// The SHA-256 of the certificate, hex.
    Fingerprint,
}

/// `identity.api_key:`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyFile {
    pub header: Option<String>,
    pub query: Option<String>,
    pub store: Option<String>,
    pub file: Option<String>,
    pub cache_ttl: Option<String>,
    #[serde(default)]
    pub required: bool,
    pub failures: Option<FailuresFile>,
}

/// `identity.api_key.failures:`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailuresFile {
    pub limit: Option<u64>,
    pub window: Option<String>,
}

/// The consumers file of `identity.api_key.file`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumersFile {
    #[serde(default)]
    pub consumers: Vec<ConsumerFile>,
}

/// One consumer of the consumers file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumerFile {
    pub id: String,
    pub plan: Option<String>,
    #[serde(default)]
    pub keys: Vec<String>,
}

/// `identity.jwt:`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JwtFile {
    pub header: Option<String>,
    pub algorithms: Option<Vec<String>>,
    pub secret_env: Option<String>,
    pub public_key_file: Option<String>,
    /// The provider's JWKS URL.
    pub jwks_url: Option<String>,
    /// A JWKS document on disk.
    pub jwks_file: Option<String>,
    pub jwks_refresh: Option<String>,
    pub jwks_min_refresh: Option<String>,
    pub claim: Option<String>,
    /// The `iss` a token must carry.
    pub issuer: Option<String>,
    /// A token's `aud` must contain one of these.
    pub audiences: Option<Vec<String>>,
    #[serde(default)]
    pub required: bool,
    pub leeway: Option<String>,
}

/// `limiter:`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimiterFile {
    pub backend: Option<Backend>,
    #[serde(default)]
    pub redis: RedisFile,
    pub on_error: Option<OnError>,
    pub deny_cache: Option<bool>,
    /// The most requests delayed (`on_limit: delay`) at once, per instance.
    pub max_waiting: Option<usize>,
    #[serde(default)]
    pub local: LocalFile,
}

/// `limiter.redis:`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisFile {
    pub url: Option<String>,
    /// Redis Cluster seed nodes; non-empty selects cluster mode.
    #[serde(default)]
    pub cluster: Vec<String>,
    pub timeout: Option<String>,
    pub connect_timeout: Option<String>,
    pub key_prefix: Option<String>,
    pub tls: Option<RedisTlsFile>,
    pub sentinel: Option<SentinelFile>,
}

/// `limiter.redis.sentinel:`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SentinelFile {
    /// The name the sentinels monitor the primary under.
    pub master: String,
    /// `host:port` of each sentinel.
    pub nodes: Vec<String>,
    /// The sentinels' own password (`requirepass` of the sentinels).
    pub password: Option<String>,
    /// Whether the sentinels are reached over TLS.
    pub tls: Option<bool>,
}

/// `limiter.redis.tls:`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisTlsFile {
    /// PEM certificates of the CAs to trust instead of the system's.
    pub ca_file: Option<String>,
    /// PEM client certificate (with `key_file`) for servers that ask.
    pub cert_file: Option<String>,
    pub key_file: Option<String>,
}

/// `limiter.local:`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalFile {
    pub max_keys: Option<usize>,
    /// A fraction: `1/3` or `0.33`.
    pub share: Option<Value>,
}

/// `response:`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResponseFile {
    pub status: Option<u16>,
    pub headers: Option<HeaderStyle>,
}

/// One entry of `upstreams:`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamFile {
    pub servers: Vec<UpstreamServerFile>,
    pub balance: Option<BalanceFile>,
    /// consistent_hash: the key parts that choose a server.
    pub hash_key: Option<Vec<KeyPartFile>>,
    /// Passive health: failures that take a server out.
    pub max_fails: Option<u32>,
    /// Passive health: the window of `max_fails`, and how long a server stays out.
    pub fail_timeout: Option<String>,
    /// How often names in `servers` are resolved again.
    pub dns_refresh: Option<String>,
    pub health_check: Option<HealthCheckFile>,
    pub connect_timeout: Option<String>,
    pub read_timeout: Option<String>,
    pub tls: Option<UpstreamTlsFile>,
    pub protocol: Option<UpstreamProtocol>,
}

/// One entry of `upstreams.*.servers`: `"host:port"` or
/// `{addr: "host:port", weight: N}`.
#[derive(Debug, Clone)]
pub struct UpstreamServerFile {
    pub addr: String,
    pub weight: Option<u64>,
}

impl<'de> Deserialize<'de> for UpstreamServerFile {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Weighted {
            addr: String,
            weight: Option<u64>,
        }
        struct ServerVisitor;
        impl<'de> serde::de::Visitor<'de> for ServerVisitor {
            type Value = UpstreamServerFile;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("\"host:port\" or {addr: \"host:port\", weight: N}")
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<UpstreamServerFile, E> {
                Ok(UpstreamServerFile {
                    addr: v.to_string(),
                    weight: None,
                })
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<UpstreamServerFile, A::Error> {
                let w = Weighted::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(UpstreamServerFile {
                    addr: w.addr,
                    weight: w.weight,
                })
            }
        }
        deserializer.deserialize_any(ServerVisitor)
    }
}

/// `upstreams.*.tls`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamTlsFile {
    /// The name to ask for and verify (default: the first server's host).
    pub sni: Option<String>,
    /// Verify the certificate and its name (default true).
    pub verify: Option<bool>,
    /// PEM CAs to trust instead of the system's.
    pub ca_file: Option<String>,
}

/// `upstreams.*.balance`.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BalanceFile {
    RoundRobin,
    Random,
    ConsistentHash,
    /// `consistent_hash` on `[ip]`.
    HashIp,
}

/// `upstreams.*.health_check`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthCheckFile {
    pub interval: Option<String>,
}

/// One entry of `routes:`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteFile {
    pub name: String,
    #[serde(rename = "match", default)]
    pub matcher: MatchFile,
    pub upstream: Option<String>,
    pub respond: Option<RespondFile>,
    #[serde(default)]
    pub limits: Vec<LimitFile>,
    pub exempt: Option<ExemptFile>,
    /// The request body cap of this route (overrides the server's).
    pub max_body_bytes: Option<u64>,
    pub rewrite: Option<RewriteFile>,
    /// `preserve`, `upstream`, or a literal name.
    pub upstream_host: Option<String>,
    pub request_headers: Option<HeaderEditsFile>,
    pub response_headers: Option<HeaderEditsFile>,
    pub timeouts: Option<RouteTimeoutsFile>,
    pub retries: Option<RetriesFile>,
    pub cors: Option<CorsFile>,
}

/// `routes[].rewrite`: exactly one of its keys.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewriteFile {
    pub strip_prefix: Option<bool>,
    pub prefix: Option<String>,
    pub path: Option<String>,
}

/// `routes[].request_headers` and `routes[].response_headers`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderEditsFile {
    #[serde(default)]
    pub set: BTreeMap<String, String>,
    #[serde(default)]
    pub add: BTreeMap<String, String>,
    #[serde(default)]
    pub remove: Vec<String>,
}

/// `routes[].timeouts`: the upstream's timeouts, for this route.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteTimeoutsFile {
    pub connect: Option<String>,
    pub read: Option<String>,
}

/// `routes[].retries`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetriesFile {
    pub attempts: Option<u32>,
    pub on: Option<Vec<Value>>,
}

/// `routes[].cors`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CorsFile {
    #[serde(default)]
    pub origins: Vec<String>,
    pub methods: Option<Vec<String>>,
    pub headers: Option<Vec<String>>,
    pub expose: Option<Vec<String>>,
    pub max_age: Option<String>,
    pub credentials: Option<bool>,
}

/// `routes[].match`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatchFile {
    pub path_prefix: Option<String>,
    pub path: Option<String>,
    pub methods: Option<Vec<String>>,
    pub host: Option<String>,
}

/// `routes[].respond`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RespondFile {
    pub status: Option<u16>,
    #[serde(default)]
    pub body: String,
}

/// One entry of `routes[].limits`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitFile {
    pub name: String,
    pub key: Vec<KeyPartFile>,
    /// Absent only beside `plans`: then the smallest plan's number.
    pub limit: Option<u64>,
    pub window: Option<String>,
    pub algorithm: Option<AlgorithmFile>,
    pub on_missing: Option<OnMissing>,
    #[serde(default)]
    pub shadow: bool,
    pub cost: Option<u64>,
    /// sliding_window only.
    pub buckets: Option<u32>,
    /// token_bucket only.
    pub burst: Option<u64>,
    /// concurrency only.
    pub lease: Option<String>,
    /// Name of a counter shared between routes.
    pub share: Option<String>,
    pub exempt: Option<ExemptFile>,
    /// Where a request's plan comes from: `{claim: NAME}` or `{header: NAME}`.
    pub limit_from: Option<LimitFromFile>,
    /// Plan name → its limit.
    pub plans: Option<BTreeMap<String, u64>>,
    /// Limits for specific key values.
    pub overrides: Option<Vec<OverrideFile>>,
    /// The penalty box after a denial.
    pub block_for: Option<String>,
    pub count_when: Option<CountWhenFile>,
    pub cost_from: Option<CostFromFile>,
    /// A calendar quota's period: day, week or month.
    pub calendar: Option<PeriodFile>,
    /// The IANA time zone of the calendar's periods (UTC if absent).
    pub timezone: Option<String>,
    /// What a request over the limit gets: reject (429) or delay.
    pub on_limit: Option<OnLimitFile>,
    /// `on_limit: delay`: the longest wait.
    pub max_delay: Option<String>,
    /// `on_limit: delay`: the most requests of one key waiting at once.
    pub max_waiting: Option<usize>,
}

/// `limits[].on_limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnLimitFile {
    Reject,
    Delay,
}

/// `limits[].calendar`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PeriodFile {
    Day,
    Week,
    Month,
}

/// `limits[].count_when`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CountWhenFile {
    pub status: Vec<Value>,
}

/// `limits[].cost_from`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostFromFile {
    pub response_header: String,
}

/// `limits[].limit_from`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitFromFile {
    pub claim: Option<String>,
    pub header: Option<String>,
    pub consumer: Option<String>,
}

/// One entry of `limits[].overrides`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverrideFile {
    #[serde(rename = "match")]
    pub matcher: BTreeMap<String, String>,
    pub limit: Option<u64>,
    pub plan: Option<String>,
}

/// One key part: `ip`, `user`, `method`, `path`, `client_cert`,
/// `client_subject`, `client_san`, or a map of one entry: `{header: NAME}`,
/// `{query: NAME}`, `{cookie: NAME}`, `{param: NAME}`.
#[derive(Debug, Clone)]
pub enum KeyPartFile {
    Ip,
    User,
    Method,
    Path,
    ClientCert,
    ClientSubject,
    ClientSan,
    Header(String),
    Query(String),
    Cookie(String),
    Param(String),
}

const KEY_PART_EXPECTED: &str =
    "ip, user, method, path, client_cert, client_subject, client_san, {header: NAME}, {query: NAME}, {cookie: NAME} or {param: NAME}";

impl<'de> Deserialize<'de> for KeyPartFile {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct PartVisitor;
        impl<'de> serde::de::Visitor<'de> for PartVisitor {
            type Value = KeyPartFile;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(KEY_PART_EXPECTED)
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<KeyPartFile, E> {
                match v {
                    "ip" => Ok(KeyPartFile::Ip),
                    "user" => Ok(KeyPartFile::User),
                    "method" => Ok(KeyPartFile::Method),
                    "path" => Ok(KeyPartFile::Path),
                    "client_cert" => Ok(KeyPartFile::ClientCert),
                    "client_subject" => Ok(KeyPartFile::ClientSubject),
                    "client_san" => Ok(KeyPartFile::ClientSan),
                    "header" | "query" | "cookie" | "param" => {
                        Err(E::custom(format!("write a {v} key part as {{{v}: NAME}}")))
                    }
                    other => Err(E::custom(format!(
                        "unknown key part `{other}` (expected {KEY_PART_EXPECTED})"
                    ))),
                }
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<KeyPartFile, A::Error> {
                use serde::de::Error;
                let Some(kind) = map.next_key::<String>()? else {
                    return Err(A::Error::custom(format!(
                        "empty key part (expected {KEY_PART_EXPECTED})"
                    )));
                };
                let make = match kind.as_str() {
                    "header" => KeyPartFile::Header,
                    "query" => KeyPartFile::Query,
                    "cookie" => KeyPartFile::Cookie,
                    "param" => KeyPartFile::Param,
                    _ => {
                        return Err(A::Error::custom(format!(
                            "unknown key part `{kind}` (expected {KEY_PART_EXPECTED})"
                        )))
                    }
                };
                let name: String = map.next_value()?;
                if map.next_key::<String>()?.is_some() {
                    return Err(A::Error::custom(format!(
                        "a key part map has exactly one entry: {{{kind}: NAME}}"
                    )));
                }
                Ok(make(name))
            }
        }
        deserializer.deserialize_any(PartVisitor)
    }
}

/// `limits[].algorithm`: which algorithm, before its parameters are
/// checked (they live in other keys of the limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlgorithmFile {
    SlidingLog,
    SlidingWindow,
    FixedWindow,
    TokenBucket,
    Concurrency,
}

impl AlgorithmFile {
    /// Its name in the file.
    pub fn name(self) -> &'static str {
        match self {
            AlgorithmFile::SlidingLog => "sliding_log",
            AlgorithmFile::SlidingWindow => "sliding_window",
            AlgorithmFile::FixedWindow => "fixed_window",
            AlgorithmFile::TokenBucket => "token_bucket",
            AlgorithmFile::Concurrency => "concurrency",
        }
    }
}
