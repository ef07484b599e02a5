//! The file schema of `limiter:`: the backend, Redis (Sentinel, TLS), the
//! in-process limiter.
//!
//! Its fields are the YAML keys themselves, documented where operators read
//! them (docs/configuration.md).
#![allow(missing_docs)]

use crate::config::{Backend, OnError};
use serde::Deserialize;
use serde_yaml::Value;

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
