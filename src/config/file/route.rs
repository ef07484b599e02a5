//! The file schema of `routes:`: matching, forwarding rules, CORS, fixed
//! replies, and each limit with its key parts, algorithm, plans and
//! overrides.
//!
//! Its fields are the YAML keys themselves, documented where operators read
//! them (docs/configuration.md).
#![allow(missing_docs)]

use super::usage::{CostFromFile, ReserveFile};
use super::ExemptFile;
use crate::config::OnMissing;
use serde::Deserialize;
use serde_yaml::Value;
use std::collections::BTreeMap;

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
    /// The rate-limit headers of this route (overrides `response.headers`).
    pub rate_headers: Option<crate::config::HeaderStyle>,
    /// The shape of sluice's error bodies on this route.
    pub errors: Option<crate::config::ErrorStyle>,
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
    /// Units taken before the request is proxied, settled by `cost_from`.
    pub reserve: Option<ReserveFile>,
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
