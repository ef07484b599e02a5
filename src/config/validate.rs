//! File schema → [`Config`], with every semantic check the reference (docs/configuration.md) implies.

use super::checker::{leaf, Checker, NOT_YET};
use super::file::*;
use super::position::PositionIndex;
use super::*;
use std::collections::HashSet;
use std::net::ToSocketAddrs;

/// Validates `file`; on success also returns the warnings.
pub(super) fn validate(
    file: FileConfig,
    index: &PositionIndex,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(Config, Vec<Problem>), Vec<Problem>> {
    let mut c = Checker::new(index, env);

    let server = server(&mut c, &file.server);
    let client_ip = client_ip(&mut c, &file.client_ip);
    let identity = identity(&mut c, file.identity.as_ref());
    let limiter = limiter(&mut c, &file.limiter);
    let response = response(&mut c, &file.response);
    let upstreams: Vec<UpstreamConfig> = file
        .upstreams
        .iter()
        .map(|(name, u)| upstream(&mut c, name, u))
        .collect();
    let mut routes = Vec::with_capacity(file.routes.len());
    let mut route_names = HashSet::new();
    for (i, r) in file.routes.iter().enumerate() {
        let path = format!("routes[{i}]");
        if !route_names.insert(r.name.as_str()) {
            c.problem(
                &format!("{path}.name"),
                format!("duplicate route name `{}`", r.name),
            );
        }
        routes.push(route(&mut c, &path, r, &upstreams));
    }
    check_shares(&mut c, &routes);
    if identity == IdentityConfig::None {
        for (r, route) in routes.iter().enumerate() {
            for (l, limit) in route.limits.iter().enumerate() {
                if limit.key.contains(&KeyPart::User) {
                    c.warning(
                        &format!("routes[{r}].limits[{l}].key"),
                        format!(
                            "limit `{}` keys by `user` but no `identity` is configured: every request takes `on_missing`",
                            limit.name
                        ),
                    );
                }
            }
        }
    }

    if c.problems.is_empty() {
        Ok((
            Config {
                server,
                client_ip,
                identity,
                limiter,
                response,
                upstreams,
                routes,
                warnings: Vec::new(),
            },
            c.warnings,
        ))
    } else {
        Err(c.problems)
    }
}

fn server(c: &mut Checker, s: &ServerFile) -> ServerConfig {
    c.not_supported("server.tls", &s.tls, "TLS listeners (`server.tls`)");
    let listen = s
        .listen
        .clone()
        .unwrap_or_else(|| vec!["0.0.0.0:8080".into()]);
    if listen.is_empty() {
        c.problem("server.listen", "`listen` needs at least one address");
    }
    for (i, addr) in listen.iter().enumerate() {
        check_listen_addr(c, &format!("server.listen[{i}]"), addr);
    }
    let admin = s.admin.clone().unwrap_or_else(|| "127.0.0.1:9091".into());
    check_listen_addr(c, "server.admin", &admin);
    if listen.contains(&admin) {
        c.problem(
            "server.admin",
            format!("admin address `{admin}` is also a proxy listener"),
        );
    }
    let threads = s.threads.unwrap_or(2);
    if threads == 0 || threads > 1024 {
        c.problem("server.threads", "`threads` must be between 1 and 1024");
    }
    let grace_period = c.duration(
        "server.grace_period",
        s.grace_period.as_deref(),
        Duration::from_secs(5),
    );
    let pid_file = path_setting(c, "server.pid_file", &s.pid_file, "/tmp/sluice.pid");
    let upgrade_sock = path_setting(
        c,
        "server.upgrade_sock",
        &s.upgrade_sock,
        "/tmp/sluice_upgrade.sock",
    );
    if pid_file == upgrade_sock {
        c.problem(
            "server.upgrade_sock",
            "`upgrade_sock` and `pid_file` must be different files",
        );
    }
    ServerConfig {
        listen,
        admin,
        threads,
        grace_period,
        pid_file,
        upgrade_sock,
        access_log: !matches!(s.access_log, Some(AccessLogFile::Off)),
        front_door: front_door(c, s),
    }
}

fn front_door(c: &mut Checker, s: &ServerFile) -> FrontDoorConfig {
    let d = FrontDoorConfig::default();
    let timeout = |c: &mut Checker, name: &str, text: &Option<String>, default: Duration| {
        let path = format!("server.{name}");
        let value = c.duration(&path, text.as_deref(), default);
        if value.is_zero() {
            c.problem(&path, format!("`{name}` must be longer than 0"));
        }
        value
    };
    let client_header_timeout = timeout(
        c,
        "client_header_timeout",
        &s.client_header_timeout,
        d.client_header_timeout,
    );
    let keepalive_timeout = timeout(
        c,
        "keepalive_timeout",
        &s.keepalive_timeout,
        d.keepalive_timeout,
    );
    let client_body_timeout = timeout(
        c,
        "client_body_timeout",
        &s.client_body_timeout,
        d.client_body_timeout,
    );
    let send_timeout = timeout(c, "send_timeout", &s.send_timeout, d.send_timeout);
    let bounded = |c: &mut Checker,
                   name: &str,
                   value: Option<usize>,
                   default: usize,
                   range: (usize, usize)| {
        let value = value.unwrap_or(default);
        if value < range.0 || value > range.1 {
            c.problem(
                &format!("server.{name}"),
                format!("`{name}` must be between {} and {}", range.0, range.1),
            );
        }
        value
    };
    let max_header_bytes = bounded(
        c,
        "max_header_bytes",
        s.max_header_bytes,
        d.max_header_bytes,
        (1024, 1 << 20),
    );
    let max_uri_bytes = bounded(
        c,
        "max_uri_bytes",
        s.max_uri_bytes,
        d.max_uri_bytes,
        (64, 1 << 20),
    );
    let max_connections = bounded(
        c,
        "max_connections",
        s.max_connections,
        d.max_connections,
        (1, 1_000_000),
    );
    if max_uri_bytes > max_header_bytes {
        c.problem(
            "server.max_uri_bytes",
            "`max_uri_bytes` cannot exceed `max_header_bytes` (the target is part of the head)",
        );
    }
    FrontDoorConfig {
        escaped_slashes: match s.escaped_slashes {
            Some(EscapedSlashesFile::Keep) => EscapedSlashes::Keep,
            Some(EscapedSlashesFile::Reject) | None => EscapedSlashes::Reject,
        },
        client_header_timeout,
        keepalive_timeout,
        client_body_timeout,
        send_timeout,
        max_header_bytes,
        max_uri_bytes,
        max_connections,
    }
}

/// A file path setting: non-empty, defaulting to `default`.
fn path_setting(c: &mut Checker, path: &str, value: &Option<String>, default: &str) -> String {
    match value.as_deref() {
        None => default.to_string(),
        Some("") => {
            c.problem(path, format!("`{}` must not be empty", leaf(path)));
            default.to_string()
        }
        Some(text) => text.to_string(),
    }
}

fn check_listen_addr(c: &mut Checker, path: &str, addr: &str) {
    if addr.parse::<SocketAddr>().is_err() {
        c.problem(
            path,
            format!(
                "`{addr}` is not an IP:port listen address (for example 0.0.0.0:8080 or [::]:8080)"
            ),
        );
    }
}

fn client_ip(c: &mut Checker, f: &ClientIpFile) -> ClientIpConfig {
    let mut trusted_proxies = Vec::new();
    for (i, text) in f.trusted_proxies.iter().enumerate() {
        let parsed = text
            .parse::<IpNet>()
            .or_else(|_| text.parse::<std::net::IpAddr>().map(IpNet::from));
        match parsed {
            Ok(net) => trusted_proxies.push(net.trunc()),
            Err(_) => c.problem(
                &format!("client_ip.trusted_proxies[{i}]"),
                format!("`{text}` is not a CIDR (such as 10.0.0.0/8) or an IP address"),
            ),
        }
    }
    let ipv6_prefix = f.ipv6_prefix.unwrap_or(64);
    if ipv6_prefix == 0 || ipv6_prefix > 128 {
        c.problem(
            "client_ip.ipv6_prefix",
            "`ipv6_prefix` must be between 1 and 128",
        );
    }
    ClientIpConfig {
        trusted_proxies,
        ipv6_prefix,
    }
}

fn identity(c: &mut Checker, f: Option<&IdentityFile>) -> IdentityConfig {
    let Some(f) = f else {
        return IdentityConfig::None;
    };
    match (&f.header, &f.jwt) {
        (Some(_), Some(_)) => {
            c.problem(
                "identity",
                "`identity` has either `header` or `jwt`, not both",
            );
            IdentityConfig::None
        }
        (Some(name), None) => {
            if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                c.problem(
                    "identity.header",
                    format!("`{name}` is not a valid header name"),
                );
            }
            IdentityConfig::Header(name.to_ascii_lowercase())
        }
        (None, Some(jwt)) => super::jwt::validate(c, jwt),
        (None, None) => {
            c.problem("identity", "`identity` needs `header` or `jwt`");
            IdentityConfig::None
        }
    }
}

fn limiter(c: &mut Checker, f: &LimiterFile) -> LimiterConfig {
    let backend = match f.backend.unwrap_or(BackendFile::Redis) {
        BackendFile::Redis => Backend::Redis,
        BackendFile::Local => Backend::Local,
    };
    let url = f
        .redis
        .url
        .clone()
        .unwrap_or_else(|| "redis://127.0.0.1:6379/0".into());
    if backend == Backend::Redis {
        if let Err(e) = redis_url_check(&url) {
            c.problem("limiter.redis.url", e);
        }
    }
    for (i, node) in f.redis.cluster.iter().enumerate() {
        if let Err(e) = redis_url_check(node) {
            c.problem(&format!("limiter.redis.cluster[{i}]"), e);
        }
    }
    c.not_supported(
        "limiter.redis.tls",
        &f.redis.tls,
        "TLS to Redis (`limiter.redis.tls`; use a rediss:// URL)",
    );
    let timeout = c.duration(
        "limiter.redis.timeout",
        f.redis.timeout.as_deref(),
        Duration::from_millis(20),
    );
    if timeout.is_zero() {
        c.problem(
            "limiter.redis.timeout",
            "`timeout` must be greater than zero",
        );
    }
    let key_prefix = f
        .redis
        .key_prefix
        .clone()
        .unwrap_or_else(|| "sluice:".into());
    if key_prefix.contains(['{', '}']) || key_prefix.len() > 64 {
        c.problem(
            "limiter.redis.key_prefix",
            "`key_prefix` must be at most 64 bytes and contain no `{` or `}` (they would change Redis Cluster slots)",
        );
    }
    let local_share = match &f.local.share {
        None => 1.0,
        Some(value) => match parse_share(value) {
            Some(share) => share,
            None => {
                c.problem(
                    "limiter.local.share",
                    "`share` must be a fraction in (0, 1], written as 1/3 or 0.33",
                );
                1.0
            }
        },
    };
    let on_error = match f.on_error.unwrap_or(OnErrorFile::Local) {
        OnErrorFile::Allow => OnError::Allow,
        OnErrorFile::Deny => OnError::Deny,
        OnErrorFile::Local => OnError::Local,
    };
    let local_max_keys = f.local.max_keys.unwrap_or(1_000_000);
    if local_max_keys == 0 {
        c.problem("limiter.local.max_keys", "`max_keys` must be at least 1");
    }
    LimiterConfig {
        backend,
        redis: RedisConfig {
            url,
            cluster: f.redis.cluster.clone(),
            timeout,
            key_prefix,
        },
        on_error,
        deny_cache: f.deny_cache.unwrap_or(true),
        local_max_keys,
        local_share,
    }
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

fn redis_url_check(url: &str) -> Result<(), String> {
    let Some((scheme, _)) = url.split_once("://") else {
        return Err(format!("`{url}` is not a Redis URL (redis://host:port/db)"));
    };
    match scheme {
        "redis" | "redis+unix" | "unix" => Ok(()),
        "rediss" => Err(format!("TLS to Redis (`rediss://`) {NOT_YET}")),
        other => Err(format!("unknown Redis URL scheme `{other}` (use redis://)")),
    }
}

fn response(c: &mut Checker, f: &ResponseFile) -> ResponseConfig {
    let status = f.status.unwrap_or(429);
    if !(400..=499).contains(&status) {
        c.problem(
            "response.status",
            "`status` of a denied request must be a 4xx code",
        );
    }
    let headers = match f.headers.unwrap_or(HeaderStyleFile::Legacy) {
        HeaderStyleFile::Legacy => HeaderStyle::Legacy,
        HeaderStyleFile::None => HeaderStyle::None,
        HeaderStyleFile::Draft => HeaderStyle::Draft,
        HeaderStyleFile::Both => HeaderStyle::Both,
    };
    ResponseConfig { status, headers }
}

fn upstream(c: &mut Checker, name: &str, f: &UpstreamFile) -> UpstreamConfig {
    let path = format!("upstreams.{name}");
    c.name(&path, name, "upstream");
    c.not_supported(&format!("{path}.tls"), &f.tls, "TLS to upstreams (`tls`)");
    match f.balance.unwrap_or(BalanceFile::RoundRobin) {
        BalanceFile::RoundRobin => {}
        BalanceFile::Random | BalanceFile::HashIp => c.problem(
            &format!("{path}.balance"),
            format!("`balance` other than round_robin {NOT_YET}"),
        ),
    }
    if f.servers.is_empty() {
        c.problem(
            &format!("{path}.servers"),
            "`servers` needs at least one host:port",
        );
    }
    let mut servers = Vec::new();
    for (i, server) in f.servers.iter().enumerate() {
        let spath = format!("{path}.servers[{i}]");
        if server.contains("://") {
            c.problem(
                &spath,
                format!("`{server}`: write host:port without a scheme"),
            );
            continue;
        }
        match server.to_socket_addrs() {
            Ok(addrs) => {
                let before = servers.len();
                servers.extend(addrs);
                if servers.len() == before {
                    c.problem(&spath, format!("`{server}` resolves to no address"));
                }
            }
            Err(e) => c.problem(
                &spath,
                format!("cannot resolve `{server}` (host:port): {e}"),
            ),
        }
    }
    let health_check = f.health_check.as_ref().map(|h| {
        let interval = c.duration(
            &format!("{path}.health_check.interval"),
            h.interval.as_deref(),
            Duration::from_secs(5),
        );
        if interval < Duration::from_millis(100) {
            c.problem(
                &format!("{path}.health_check.interval"),
                "`interval` must be at least 100ms",
            );
        }
        interval
    });
    let connect_timeout = c.duration(
        &format!("{path}.connect_timeout"),
        f.connect_timeout.as_deref(),
        Duration::from_secs(1),
    );
    let read_timeout = c.duration(
        &format!("{path}.read_timeout"),
        f.read_timeout.as_deref(),
        Duration::from_secs(30),
    );
    for (field, d) in [
        ("connect_timeout", connect_timeout),
        ("read_timeout", read_timeout),
    ] {
        if d.is_zero() {
            c.problem(
                &format!("{path}.{field}"),
                format!("`{field}` must be greater than zero"),
            );
        }
    }
    UpstreamConfig {
        name: name.to_string(),
        servers,
        health_check,
        connect_timeout,
        read_timeout,
    }
}

fn route(c: &mut Checker, path: &str, f: &RouteFile, upstreams: &[UpstreamConfig]) -> RouteConfig {
    c.name(&format!("{path}.name"), &f.name, "route");
    let m = &f.matcher;
    let path_match = match (&m.path, &m.path_prefix) {
        (Some(_), Some(_)) => {
            c.problem(
                &format!("{path}.match"),
                "use either `path` or `path_prefix`, not both",
            );
            PathMatch::Any
        }
        (Some(p), None) => PathMatch::Exact(checked_path(c, &format!("{path}.match.path"), p)),
        (None, Some(p)) => {
            PathMatch::Prefix(checked_path(c, &format!("{path}.match.path_prefix"), p))
        }
        (None, None) => PathMatch::Any,
    };
    let mut methods = Vec::new();
    for (i, method) in m.methods.iter().flatten().enumerate() {
        if http::Method::from_bytes(method.as_bytes()).is_err() || method.is_empty() {
            c.problem(
                &format!("{path}.match.methods[{i}]"),
                format!("`{method}` is not an HTTP method"),
            );
        }
        methods.push(method.to_ascii_uppercase());
    }
    if m.methods.as_ref().is_some_and(|v| v.is_empty()) {
        c.problem(
            &format!("{path}.match.methods"),
            "`methods: []` matches nothing; omit it to match any method",
        );
    }
    let host = m
        .host
        .as_ref()
        .map(|h| match crate::target::canonical_host(h.as_bytes()) {
            Ok(Some(canonical)) => canonical.into_owned(),
            Ok(None) | Err(_) => {
                c.problem(
                    &format!("{path}.match.host"),
                    format!("`{h}` is not a host name or address"),
                );
                h.to_ascii_lowercase()
            }
        });
    let action = match (&f.upstream, &f.respond) {
        (Some(_), Some(_)) => {
            c.problem(path, "a route has either `upstream` or `respond`, not both");
            RouteAction::Respond {
                status: 200,
                body: String::new(),
            }
        }
        (None, None) => {
            c.problem(
                path,
                format!("route `{}` needs `upstream` or `respond`", f.name),
            );
            RouteAction::Respond {
                status: 200,
                body: String::new(),
            }
        }
        (Some(name), None) => match upstreams.iter().position(|u| &u.name == name) {
            Some(i) => RouteAction::Upstream(i),
            None => {
                let known: Vec<&str> = upstreams.iter().map(|u| u.name.as_str()).collect();
                c.problem(
                    &format!("{path}.upstream"),
                    format!(
                        "unknown upstream `{name}` (defined: {})",
                        if known.is_empty() {
                            "none".into()
                        } else {
                            known.join(", ")
                        }
                    ),
                );
                RouteAction::Respond {
                    status: 200,
                    body: String::new(),
                }
            }
        },
        (None, Some(r)) => {
            let status = r.status.unwrap_or(200);
            if !(200..=599).contains(&status) {
                c.problem(
                    &format!("{path}.respond.status"),
                    "`status` must be between 200 and 599",
                );
            }
            RouteAction::Respond {
                status,
                body: r.body.clone(),
            }
        }
    };
    let mut limits = Vec::with_capacity(f.limits.len());
    let mut names = HashSet::new();
    for (i, l) in f.limits.iter().enumerate() {
        let lpath = format!("{path}.limits[{i}]");
        if !names.insert(l.name.as_str()) {
            c.problem(
                &format!("{lpath}.name"),
                format!("duplicate limit name `{}` in route `{}`", l.name, f.name),
            );
        }
        limits.push(limit(c, &lpath, l));
    }
    RouteConfig {
        name: f.name.clone(),
        path: path_match,
        methods,
        host,
        action,
        limits,
    }
}

fn checked_path(c: &mut Checker, path: &str, value: &str) -> String {
    if !value.starts_with('/') {
        c.problem(path, format!("`{value}` must start with `/`"));
        return value.to_string();
    }
    // Requests are matched on their canonical path: a pattern in any other
    // spelling would never match (or match less than it says).
    match crate::target::canonical_path(value.as_bytes(), crate::target::EscapedSlashes::Keep) {
        Ok(canonical) if canonical == value => {}
        Ok(canonical) => c.problem(
            path,
            format!("`{value}` is not a canonical path (requests are matched as `{canonical}`): write `{canonical}`"),
        ),
        Err(e) => c.problem(path, format!("`{value}` is not a valid path: {e}")),
    }
    value.to_string()
}

fn limit(c: &mut Checker, path: &str, f: &LimitFile) -> LimitConfig {
    c.name(&format!("{path}.name"), &f.name, "limit");
    let kind = f.algorithm.unwrap_or(AlgorithmFile::SlidingLog);
    let only = |c: &mut Checker, field: &str, present: bool, owner: AlgorithmFile| {
        if present && !matches_kind(kind, owner) {
            c.problem(
                &format!("{path}.{field}"),
                format!("`{field}` applies to algorithm {} only", kind_name(owner)),
            );
        }
    };
    only(
        c,
        "buckets",
        f.buckets.is_some(),
        AlgorithmFile::SlidingWindow,
    );
    only(c, "burst", f.burst.is_some(), AlgorithmFile::TokenBucket);
    only(c, "lease", f.lease.is_some(), AlgorithmFile::Concurrency);

    if f.key.is_empty() {
        c.problem(
            &format!("{path}.key"),
            "`key` needs at least one part (ip, user, method, path or {header: NAME})",
        );
    }
    let mut key = Vec::with_capacity(f.key.len());
    for (i, part) in f.key.iter().enumerate() {
        key.push(match part {
            KeyPartFile::Ip => KeyPart::Ip,
            KeyPartFile::User => KeyPart::User,
            KeyPartFile::Method => KeyPart::Method,
            KeyPartFile::Path => KeyPart::Path,
            KeyPartFile::Header(name) => {
                if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                    c.problem(
                        &format!("{path}.key[{i}]"),
                        format!("`{name}` is not a valid header name"),
                    );
                }
                KeyPart::Header(name.to_ascii_lowercase())
            }
        });
    }
    if f.limit == 0 {
        c.problem(
            &format!("{path}.limit"),
            "`limit` must be at least 1 (to block a route, use `respond` with a 403)",
        );
    }
    let is_concurrency = matches!(kind, AlgorithmFile::Concurrency);
    const MAX_WINDOW: Duration = Duration::from_secs(366 * 86_400);
    let window = match (&f.window, is_concurrency) {
        (Some(_), true) => {
            c.problem(
                &format!("{path}.window"),
                "a concurrency limit has no `window` (it limits requests in flight; `lease` bounds how long one is held)",
            );
            Duration::ZERO
        }
        (None, true) => Duration::ZERO,
        (None, false) => {
            c.problem(
                path,
                format!("limit `{}` needs a `window` (such as 10s or 1m)", f.name),
            );
            Duration::from_secs(1)
        }
        (Some(text), false) => {
            let window = c.duration(
                &format!("{path}.window"),
                Some(text),
                Duration::from_secs(1),
            );
            if window < Duration::from_millis(1) {
                c.problem(&format!("{path}.window"), "`window` must be at least 1ms");
            }
            if window > MAX_WINDOW {
                c.problem(&format!("{path}.window"), "`window` must be at most 366d");
            }
            window
        }
    };
    let cost = f.cost.unwrap_or(1);
    let algorithm = match kind {
        AlgorithmFile::SlidingLog => {
            const MAX_LOG: u64 = 1_000_000;
            const LARGE_LOG: u64 = 10_000;
            if f.limit > MAX_LOG {
                c.problem(
                    &format!("{path}.limit"),
                    format!("a sliding_log limit keeps one entry per admitted unit; {} per window is too many (at most {MAX_LOG}); use algorithm: sliding_window", f.limit),
                );
            } else if f.limit > LARGE_LOG {
                c.warning(
                    &format!("{path}.limit"),
                    format!(
                        "a sliding_log limit of {} keeps up to {} entries (about {} KiB) per key in Redis; algorithm: sliding_window needs {} counters per key whatever the limit",
                        f.limit,
                        f.limit,
                        f.limit * 100 / 1024,
                        DEFAULT_BUCKETS + 1
                    ),
                );
            }
            Algorithm::SlidingLog
        }
        AlgorithmFile::SlidingWindow => {
            let buckets = f.buckets.unwrap_or(DEFAULT_BUCKETS);
            if !(1..=1000).contains(&buckets) {
                c.problem(
                    &format!("{path}.buckets"),
                    "`buckets` must be between 1 and 1000",
                );
            } else if !window.as_micros().is_multiple_of(u128::from(buckets)) {
                c.problem(
                    &format!("{path}.buckets"),
                    format!(
                        "`window` {} does not divide into {buckets} equal sub-windows (whole microseconds); pick a window or a bucket count that divides it",
                        format_duration(window)
                    ),
                );
            }
            Algorithm::SlidingWindow { buckets }
        }
        AlgorithmFile::FixedWindow => Algorithm::FixedWindow,
        AlgorithmFile::TokenBucket => {
            let burst = f.burst.unwrap_or(f.limit);
            if burst == 0 {
                c.problem(&format!("{path}.burst"), "`burst` must be at least 1");
            } else if cost > burst {
                c.problem(
                    &format!("{path}.cost"),
                    format!("`cost` {cost} exceeds `burst` {burst}: no request could ever pass"),
                );
            }
            Algorithm::TokenBucket { burst }
        }
        AlgorithmFile::Concurrency => {
            let lease = c.duration(
                &format!("{path}.lease"),
                f.lease.as_deref(),
                Duration::from_secs(30),
            );
            if lease < Duration::from_millis(1) {
                c.problem(&format!("{path}.lease"), "`lease` must be at least 1ms");
            }
            Algorithm::Concurrency { lease }
        }
    };
    if cost == 0 {
        c.problem(&format!("{path}.cost"), "`cost` must be at least 1");
    } else if cost > f.limit && f.limit > 0 && !matches!(kind, AlgorithmFile::TokenBucket) {
        c.problem(
            &format!("{path}.cost"),
            format!(
                "`cost` {cost} exceeds `limit` {}: no request could ever pass",
                f.limit
            ),
        );
    }
    if let Some(share) = &f.share {
        c.name(&format!("{path}.share"), share, "share");
    }
    let on_missing = match f.on_missing.unwrap_or(OnMissingFile::Ip) {
        OnMissingFile::Ip => OnMissing::Ip,
        OnMissingFile::Skip => OnMissing::Skip,
    };
    LimitConfig {
        name: f.name.clone(),
        key,
        limit: f.limit,
        window,
        algorithm,
        on_missing,
        cost,
        shadow: f.shadow,
        share: f.share.clone(),
    }
}

const DEFAULT_BUCKETS: u32 = 10;

fn matches_kind(kind: AlgorithmFile, owner: AlgorithmFile) -> bool {
    std::mem::discriminant(&kind) == std::mem::discriminant(&owner)
}

fn kind_name(kind: AlgorithmFile) -> &'static str {
    match kind {
        AlgorithmFile::SlidingLog => "sliding_log",
        AlgorithmFile::SlidingWindow => "sliding_window",
        AlgorithmFile::FixedWindow => "fixed_window",
        AlgorithmFile::TokenBucket => "token_bucket",
        AlgorithmFile::Concurrency => "concurrency",
    }
}

/// Limits naming the same `share` use one counter, so they must count the
/// same way: same algorithm, limit, window and key parts (cost may differ).
fn check_shares(c: &mut Checker, routes: &[RouteConfig]) {
    let mut first: std::collections::HashMap<&str, (usize, usize)> = Default::default();
    for (r, route) in routes.iter().enumerate() {
        let mut in_route = HashSet::new();
        for (l, limit) in route.limits.iter().enumerate() {
            let Some(share) = limit.share.as_deref() else {
                continue;
            };
            let path = format!("routes[{r}].limits[{l}].share");
            if !in_route.insert(share) {
                c.problem(
                    &path,
                    format!("route `{}` uses share `{share}` twice", route.name),
                );
                continue;
            }
            match first.get(share) {
                None => {
                    first.insert(share, (r, l));
                }
                Some(&(fr, fl)) => {
                    let other = &routes[fr].limits[fl];
                    let same = other.algorithm == limit.algorithm
                        && other.limit == limit.limit
                        && other.window == limit.window
                        && other.key == limit.key;
                    if !same {
                        c.problem(
                            &path,
                            format!(
                                "share `{share}` is also used by route `{}` limit `{}` with a different algorithm, limit, window or key; limits sharing a counter must count alike (only `cost` may differ)",
                                routes[fr].name, other.name
                            ),
                        );
                    }
                }
            }
        }
    }
}
