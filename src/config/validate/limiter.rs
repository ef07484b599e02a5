//! `limiter:` and `response:`.

use super::super::checker::Checker;
use super::super::file::{LimiterFile, ResponseFile};
use super::super::problem::{KeyPath, ProblemKind};
use super::super::{
    Backend, LimiterConfig, RedisConfig, RedisTlsConfig, ResponseConfig, SentinelConfig,
};

pub(super) fn limiter(c: &mut Checker, f: &LimiterFile) -> LimiterConfig {
    let d = LimiterConfig::default();
    let backend = f.backend.unwrap_or(d.backend);
    let redis = redis(c, f, backend);
    let at = |key: &str| KeyPath::root("limiter").key("local").key(key);
    let local_share = match &f.local.share {
        None => d.local_share,
        Some(value) => parse_share(value).unwrap_or_else(|| {
            c.problem(&at("share"), ProblemKind::BadShare);
            d.local_share
        }),
    };
    let local_max_keys = f.local.max_keys.unwrap_or(d.local_max_keys);
    if local_max_keys == 0 {
        let kind = ProblemKind::AtLeast {
            key: "max_keys",
            min: "1",
        };
        c.problem(&at("max_keys"), kind);
    }
    let max_waiting = f.max_waiting.unwrap_or(d.max_waiting);
    if max_waiting == 0 {
        let kind = ProblemKind::AtLeast {
            key: "max_waiting",
            min: "1",
        };
        c.problem(&KeyPath::root("limiter").key("max_waiting"), kind);
    }
    LimiterConfig {
        backend,
        max_waiting,
        redis,
        on_error: f.on_error.unwrap_or(d.on_error),
        deny_cache: f.deny_cache.unwrap_or(d.deny_cache),
        local_max_keys,
        local_share,
    }
}

fn redis(c: &mut Checker, f: &LimiterFile, backend: Backend) -> RedisConfig {
    let d = RedisConfig::default();
    let r = &f.redis;
    let at = |key: &str| KeyPath::root("limiter").key("redis").key(key);
    let url = r.url.clone().unwrap_or(d.url);
    if backend == Backend::Redis {
        if url.is_empty() {
            // `${SLUICE_REDIS_URL}` unset: an error to run, a warning to check.
            c.secret_unset(&at("url"), ProblemKind::RedisUrlEmpty);
        } else if let Err(kind) = redis_url_check(&url) {
            c.problem(&at("url"), kind);
        }
    }
    for (i, node) in r.cluster.iter().enumerate() {
        if let Err(kind) = redis_url_check(node) {
            c.problem(&at("cluster").index(i), kind);
        }
    }
    let tls = tls(c, f, &url);
    let sentinel = sentinel(c, f);
    let timeout = c.duration(&at("timeout"), r.timeout.as_deref(), d.timeout);
    if timeout.is_zero() {
        c.problem(&at("timeout"), ProblemKind::Zero("timeout".into()));
    }
    let connect_timeout = c.duration(
        &at("connect_timeout"),
        r.connect_timeout.as_deref(),
        d.connect_timeout,
    );
    if connect_timeout.is_zero() {
        let kind = ProblemKind::Zero("connect_timeout".into());
        c.problem(&at("connect_timeout"), kind);
    }
    let key_prefix = r.key_prefix.clone().unwrap_or(d.key_prefix);
    if key_prefix.contains(['{', '}']) || key_prefix.len() > 64 {
        c.problem(&at("key_prefix"), ProblemKind::BadKeyPrefix);
    }
    RedisConfig {
        url,
        cluster: r.cluster.clone(),
        timeout,
        connect_timeout,
        key_prefix,
        tls,
        sentinel,
    }
}

/// `limiter.redis.sentinel`: a master name and at least one `host:port`;
/// not with a Redis Cluster (a cluster fails over by itself).
fn sentinel(c: &mut Checker, f: &LimiterFile) -> Option<SentinelConfig> {
    let s = f.redis.sentinel.as_ref()?;
    let at = |key: &str| {
        KeyPath::root("limiter")
            .key("redis")
            .key("sentinel")
            .key(key)
    };
    if !f.redis.cluster.is_empty() {
        let (owner, a, b) = ("`limiter.redis` names", "sentinel", "cluster");
        c.problem(&at("nodes"), ProblemKind::NotBoth { owner, a, b });
    }
    if s.master.is_empty() {
        c.problem(&at("master"), ProblemKind::Empty("master".into()));
    }
    if s.nodes.is_empty() {
        let item = "sentinel (host:port)";
        c.problem(&at("nodes"), ProblemKind::NeedsOne { key: "nodes", item });
    }
    for (i, node) in s.nodes.iter().enumerate() {
        let valid = node.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0)
        });
        if !valid || node.contains("://") {
            c.problem(
                &at("nodes").index(i),
                ProblemKind::NotHostPort(node.clone()),
            );
        }
    }
    Some(SentinelConfig {
        master: s.master.clone(),
        nodes: s.nodes.clone(),
        password: s.password.clone(),
        tls: s.tls.unwrap_or(false),
    })
}

/// `limiter.redis.tls`: the files are read now, so a missing or unreadable
/// one is a config error and not a failure at the first decision.
fn tls(c: &mut Checker, f: &LimiterFile, url: &str) -> RedisTlsConfig {
    let at = |key: &str| KeyPath::root("limiter").key("redis").key("tls").key(key);
    let Some(t) = &f.redis.tls else {
        return RedisTlsConfig::default();
    };
    // An empty URL (its variable unset, in `--check`) may be either.
    let uses_tls = url.is_empty()
        || url.starts_with("rediss://")
        || f.redis.cluster.iter().any(|n| n.starts_with("rediss://"))
        || f.redis.sentinel.as_ref().and_then(|s| s.tls) == Some(true);
    if !uses_tls {
        let path = KeyPath::root("limiter").key("redis").key("tls");
        c.problem(&path, ProblemKind::RedisTlsWithoutRediss);
    }
    let mut read = |key: &str, file: &Option<String>| -> Option<Vec<u8>> {
        let file = file.as_ref()?;
        let pem = c.read_file(&at(key), file)?;
        if !pem.windows(11).any(|w| w == b"-----BEGIN ") {
            c.problem(&at(key), ProblemKind::NotPem(file.clone()));
            return None;
        }
        Some(pem)
    };
    let ca_pem = read("ca_file", &t.ca_file);
    let cert = read("cert_file", &t.cert_file);
    let key = read("key_file", &t.key_file);
    let client_pem = match (t.cert_file.is_some(), t.key_file.is_some()) {
        (true, false) => {
            c.problem(
                &at("cert_file"),
                ProblemKind::Needs("cert_file", "key_file"),
            );
            None
        }
        (false, true) => {
            c.problem(&at("key_file"), ProblemKind::Needs("key_file", "cert_file"));
            None
        }
        _ => cert.zip(key),
    };
    RedisTlsConfig { ca_pem, client_pem }
}

/// `1/3`, `0.33` or `1` → the fraction, if it is in (0, 1].
fn parse_share(value: &serde_yaml::Value) -> Option<f64> {
    let share = match value {
        serde_yaml::Value::Number(n) => n.as_f64()?,
        serde_yaml::Value::String(text) => match text.split_once('/') {
            Some((num, den)) => {
                let num: f64 = num.trim().parse().ok()?;
                let den: f64 = den.trim().parse().ok()?;
                num / den
            }
            None => text.trim().parse().ok()?,
        },
        _ => return None,
    };
    (share > 0.0 && share <= 1.0 && share.is_finite()).then_some(share)
}

fn redis_url_check(url: &str) -> Result<(), ProblemKind> {
    let Some((scheme, _)) = url.split_once("://") else {
        return Err(ProblemKind::NotRedisUrl(url.to_string()));
    };
    match scheme {
        "redis" | "redis+unix" | "unix" => Ok(()),
        "rediss" => Ok(()),
        other => Err(ProblemKind::UnknownRedisScheme(other.to_string())),
    }
}

pub(super) fn response(c: &mut Checker, f: &ResponseFile) -> ResponseConfig {
    let d = ResponseConfig::default();
    let status = f.status.unwrap_or(d.status);
    if !(400..=499).contains(&status) {
        c.problem(
            &KeyPath::root("response").key("status"),
            ProblemKind::DenyStatus,
        );
    }
    ResponseConfig {
        status,
        headers: f.headers.unwrap_or(d.headers),
    }
}
