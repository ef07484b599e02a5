//! `routes:` as validated: how a route matches, what it does, its
//! exemptions, and each limit with its key parts, algorithm, plans and
//! overrides.

use crate::config::duration::format_duration;
use crate::limiter::settings::Algorithm;
use ipnet::IpNet;
use std::time::Duration;

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
    Template(super::template::PathTemplate),
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
    pub forward: super::forward::ForwardConfig,
    /// The rate-limit headers its responses carry (`rate_headers`, else
    /// `response.headers`).
    pub rate_headers: super::HeaderStyle,
    /// The shape of its error bodies (`errors`).
    pub errors: super::ErrorStyle,
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
    /// The identity (see [`IdentityConfig`](crate::config::IdentityConfig)).
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
    /// For each of `key`'s parts, whether it reads a credential (see
    /// [`IdentityConfig::reads_credential`](crate::config::IdentityConfig::reads_credential)):
    /// such a value enters the counter key, and so Redis, the top keys and
    /// every admin answer, only as its hash. Filled in once the identity
    /// is known; a part beyond its end is not a credential.
    pub credential_parts: Vec<bool>,
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
    /// Count what the response says it cost instead of `cost`
    /// (`cost_from`).
    pub cost_from: Option<super::usage::CostFrom>,
    /// Units taken before the request is proxied, settled to what the
    /// response says it cost (`reserve`).
    pub reserve: Option<super::usage::Reserve>,
    /// The civil periods of a calendar quota (`calendar`, `timezone`); set
    /// exactly when the algorithm is [`Algorithm::Calendar`].
    pub calendar: Option<super::calendar::Calendar>,
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
    /// checked before it is proxied and counted when its response is known
    /// (`count_when`, or `cost_from` without `reserve`).
    pub fn deferred(&self) -> bool {
        self.count_when.is_some() || (self.cost_from.is_some() && self.reserve.is_none())
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
        let rate = self.describe_rate();
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
        if let Some(reserve) = &self.reserve {
            notes.push(reserve.describe());
        }
        if let Some(from) = &self.cost_from {
            notes.push(from.describe());
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

    /// The rate: "10 per 1m", "5 in flight (lease 30s)", …
    fn describe_rate(&self) -> String {
        match self.algorithm {
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
        }
    }
}
