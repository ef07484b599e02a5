//! The file schema of `upstreams:`: servers, TLS, balancing, health checks.
//!
//! Its fields are the YAML keys themselves, documented where operators read
//! them (docs/configuration.md).
#![allow(missing_docs)]

use crate::config::file::route::KeyPartFile;
use crate::config::UpstreamProtocol;
use serde::Deserialize;

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
