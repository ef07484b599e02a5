//! Every default of the configuration, in one place. Validation starts from
//! these values and overrides what the file sets; the reference in
//! `docs/configuration.md` and the shipped `conf/sluice.yaml` are tested to
//! spell exactly these (`config/tests.rs`). The limiter's own defaults
//! (`limiter:`, `limiter.redis:`) are its settings' `Default`s, in the
//! limiter crate.

use super::{
    ClientIpConfig, EscapedSlashes, FrontDoorConfig, HeaderStyle, OnMissing, ResponseConfig,
    ServerConfig,
};
use std::time::Duration;

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: vec!["0.0.0.0:8080".into()],
            admin: "127.0.0.1:9091".into(),
            admin_token: None,
            threads: 2,
            // Measured with the benchmark's bare Pingora proxy and with sluice:
            // per-thread runtimes serve more per core (docs/benchmarks.md).
            work_stealing: false,
            grace_period: Duration::from_secs(5),
            shutdown_delay: Duration::ZERO,
            pid_file: "/tmp/sluice.pid".into(),
            upgrade_sock: "/tmp/sluice_upgrade.sock".into(),
            access_log: true,
            server_header: None,
            tls: Vec::new(),
            h2c: false,
            front_door: FrontDoorConfig::default(),
            // nginx's client_max_body_size.
            max_body_bytes: 1024 * 1024,
            watch_config: false,
            request_id_header: http::HeaderName::from_static("x-request-id"),
            rls: None,
        }
    }
}

impl Default for FrontDoorConfig {
    /// nginx's defaults where nginx has one.
    fn default() -> Self {
        Self {
            escaped_slashes: EscapedSlashes::Reject,
            client_header_timeout: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(60),
            client_body_timeout: Duration::from_secs(60),
            send_timeout: Duration::from_secs(60),
            max_header_bytes: 32 * 1024,
            max_uri_bytes: 8 * 1024,
            max_connections: 10_000,
        }
    }
}

impl Default for ClientIpConfig {
    fn default() -> Self {
        Self {
            trusted_proxies: Vec::new(),
            ipv6_prefix: 64,
        }
    }
}

impl Default for ResponseConfig {
    fn default() -> Self {
        Self {
            status: 429,
            headers: HeaderStyle::Legacy,
        }
    }
}

/// Defaults of an upstream pool.
pub mod upstream {
    use std::time::Duration;
    /// `health_check.interval`.
    pub const HEALTH_INTERVAL: Duration = Duration::from_secs(5);
    /// `connect_timeout`.
    pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
    /// `read_timeout`.
    pub const READ_TIMEOUT: Duration = Duration::from_secs(30);
    /// `max_fails` (nginx's).
    pub const MAX_FAILS: u32 = 1;
    /// `fail_timeout` (nginx's).
    pub const FAIL_TIMEOUT: Duration = Duration::from_secs(10);
}

/// Defaults of a limit.
pub mod limit {
    use super::OnMissing;
    use std::time::Duration;
    /// The most entries a `sliding_log` limit may keep per key (a bound,
    /// not a default: larger limits take `sliding_window`).
    pub const MAX_LOG: u64 = 1_000_000;
    /// `cost`.
    pub const COST: u64 = 1;
    /// `on_missing`.
    pub const ON_MISSING: OnMissing = OnMissing::Ip;
    /// `buckets` of `sliding_window`.
    pub const BUCKETS: u32 = 10;
    /// `lease` of `concurrency`.
    pub const LEASE: Duration = Duration::from_secs(30);
    /// `max_delay` of `on_limit: delay`.
    pub const MAX_DELAY: Duration = Duration::from_millis(500);
    /// `max_waiting` of `on_limit: delay`: requests of one key.
    pub const MAX_WAITING: usize = 100;
}

/// Defaults of `identity.jwt`.
pub mod jwt {
    use std::time::Duration;
    /// `header`.
    pub const HEADER: &str = "authorization";
    /// `algorithms`.
    pub const ALGORITHM: &str = "HS256";
    /// `algorithms` with `jwks_url` or `jwks_file`: what identity providers
    /// sign with unless told otherwise.
    pub const JWKS_ALGORITHM: &str = "RS256";
    /// `jwks_refresh`.
    pub const JWKS_REFRESH: Duration = Duration::from_secs(300);
    /// `jwks_min_refresh`.
    pub const JWKS_MIN_REFRESH: Duration = Duration::from_secs(10);
    /// `secret_env`.
    pub const SECRET_ENV: &str = "SLUICE_JWT_SECRET";
    /// `claim`.
    pub const CLAIM: &str = "sub";
    /// `leeway`.
    pub const LEEWAY: Duration = Duration::ZERO;
}

/// Defaults of `identity.auth_request`.
pub mod auth_request {
    use std::time::Duration;
    /// `timeout`.
    pub const TIMEOUT: Duration = Duration::from_millis(500);
    /// `headers`.
    pub const HEADERS: [&str; 2] = ["authorization", "cookie"];
    /// `user_header`.
    pub const USER_HEADER: &str = "x-auth-user";
    /// `cache_ttl` (off).
    pub const CACHE_TTL: Duration = Duration::ZERO;
}
