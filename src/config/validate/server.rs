//! `server:`, `client_ip:` and `identity:`.

use super::super::checker::Checker;
use super::super::file::{
    AccessLogFile, AuthRequestFile, CertField, ClientAuthMode, ClientIpFile, IdentityFile,
    IdentityMethods, ServerFile,
};
use super::super::problem::{KeyPath, ProblemKind};
use super::super::tls::{ClientAuth, TlsListenerConfig};
use super::super::{
    AuthRequestConfig, ClientIpConfig, FrontDoorConfig, IdentityConfig, IpNet, ServerConfig,
};
use super::listeners::{check_listen_addr, load_certs};
use http::HeaderName;
use std::time::Duration;

/// The longest `server.shutdown_delay`: beyond it a stop is not a stop.
const MAX_SHUTDOWN_DELAY: Duration = Duration::from_secs(600);

/// `server.request_id_header`: a header name, not one whose meaning the
/// exchange depends on.
fn request_id_header(c: &mut Checker, s: &ServerFile, default: &HeaderName) -> HeaderName {
    let Some(name) = &s.request_id_header else {
        return default.clone();
    };
    let at = KeyPath::root("server").key("request_id_header");
    match HeaderName::from_bytes(name.as_bytes()) {
        Ok(header) if super::forward::reserved(&header).is_none() => header,
        Ok(header) => {
            let why = super::forward::reserved(&header).unwrap_or_default();
            c.problem(
                &at,
                ProblemKind::ReservedHeader {
                    name: name.clone(),
                    why,
                },
            );
            default.clone()
        }
        Err(_) => {
            c.problem(&at, ProblemKind::BadHeaderName(name.clone()));
            default.clone()
        }
    }
}

pub(super) fn server(c: &mut Checker, s: &ServerFile) -> ServerConfig {
    let d = ServerConfig::default();
    let at = |key: &str| KeyPath::root("server").key(key);
    let listen = plain_listeners(c, s, d.listen);
    let admin = s.admin.clone().unwrap_or(d.admin);
    check_listen_addr(c, &at("admin"), &admin);
    if listen.contains(&admin) {
        c.problem(&at("admin"), ProblemKind::AdminIsListener(admin.clone()));
    }
    let admin_token = admin_token(c, s);
    let threads = s.threads.unwrap_or(d.threads);
    check_between(c, &at("threads"), threads, (1, 1024));
    let grace_period = c.duration(
        &at("grace_period"),
        s.grace_period.as_deref(),
        d.grace_period,
    );
    let shutdown_delay = c.duration(
        &at("shutdown_delay"),
        s.shutdown_delay.as_deref(),
        d.shutdown_delay,
    );
    if shutdown_delay > MAX_SHUTDOWN_DELAY {
        let kind = ProblemKind::AtMost {
            key: "shutdown_delay",
            max: "10m",
        };
        c.problem(&at("shutdown_delay"), kind);
    }
    let pid_file = path_setting(c, &at("pid_file"), &s.pid_file, d.pid_file);
    let upgrade_sock = path_setting(c, &at("upgrade_sock"), &s.upgrade_sock, d.upgrade_sock);
    if pid_file == upgrade_sock {
        c.problem(&at("upgrade_sock"), ProblemKind::SameFile);
    }
    let server_header = s.server_header.clone().filter(|value| {
        let valid = !value.is_empty()
            && value.len() <= 256
            && value.bytes().all(|b| (0x20..0x7f).contains(&b));
        if !valid {
            c.problem(&at("server_header"), ProblemKind::BadServerHeader);
        }
        valid
    });
    let tls = tls_listeners(c, s, &listen, &admin);
    let request_id_header = request_id_header(c, s, &d.request_id_header);
    let mut taken: Vec<&str> = listen.iter().map(String::as_str).collect();
    taken.push(&admin);
    taken.extend(tls.iter().map(|l| l.listen.as_str()));
    let rls = s.rls.as_ref().map(|r| super::rls::rls(c, r, &taken));
    ServerConfig {
        rls,
        tls,
        request_id_header,
        max_body_bytes: s.max_body_bytes.unwrap_or(d.max_body_bytes),
        watch_config: s.watch_config.unwrap_or(d.watch_config),
        h2c: s.h2c.unwrap_or(d.h2c),
        listen,
        admin,
        server_header,
        admin_token,
        threads,
        work_stealing: s.work_stealing.unwrap_or(d.work_stealing),
        grace_period,
        shutdown_delay,
        pid_file,
        upgrade_sock,
        access_log: !matches!(s.access_log, Some(AccessLogFile::Off)),
        front_door: front_door(c, s),
    }
}

/// `server.listen`: each address checked; none at all is an error unless
/// the process serves TLS or the rate-limit service instead.
fn plain_listeners(c: &mut Checker, s: &ServerFile, default: Vec<String>) -> Vec<String> {
    let at = KeyPath::root("server").key("listen");
    let listen = s.listen.clone().unwrap_or(default);
    let other_listeners = s.rls.is_some() || s.tls.as_ref().is_some_and(|t| !t.is_empty());
    if listen.is_empty() && !other_listeners {
        let (key, item) = ("listen", "address");
        c.problem(&at, ProblemKind::NeedsOne { key, item });
    }
    for (i, addr) in listen.iter().enumerate() {
        check_listen_addr(c, &at.index(i), addr);
    }
    listen
}

/// `server.admin_token_env`: the token from the environment; a variable
/// that is unset or empty is an error (an admin API meant to be guarded is
/// never served open).
fn admin_token(c: &mut Checker, s: &ServerFile) -> Option<String> {
    let var = s.admin_token_env.as_ref()?;
    let token = c.env(var).filter(|t| !t.is_empty());
    if token.is_none() {
        let at = KeyPath::root("server").key("admin_token_env");
        c.secret_unset(&at, ProblemKind::AdminTokenUnset(var.clone()));
    }
    token
}

/// `server.tls`: each listener's address, and its certificates read and
/// checked now (a missing file, an unreadable key, a key that is not its
/// certificate's are errors at the entry's line).
fn tls_listeners(
    c: &mut Checker,
    s: &ServerFile,
    listen: &[String],
    admin: &str,
) -> Vec<TlsListenerConfig> {
    let mut listeners = Vec::new();
    for (i, l) in s.tls.iter().flatten().enumerate() {
        let at = KeyPath::root("server").key("tls").index(i);
        check_listen_addr(c, &at.key("listen"), &l.listen);
        let taken = listen.contains(&l.listen)
            || l.listen == admin
            || listeners
                .iter()
                .any(|o: &TlsListenerConfig| o.listen == l.listen);
        if taken {
            c.problem(
                &at.key("listen"),
                ProblemKind::ListenTwice(l.listen.clone()),
            );
        }
        if l.certs.is_empty() {
            let item = "certificate ({cert: PATH, key: PATH})";
            c.problem(
                &at.key("certs"),
                ProblemKind::NeedsOne { key: "certs", item },
            );
        }
        let certs = load_certs(c, &at.key("certs"), &l.certs);
        let client_auth = l.client_auth.as_ref().and_then(|auth| {
            let required = auth.mode != Some(ClientAuthMode::Optional);
            ClientAuth::load(&auth.ca, required)
                .map_err(|why| {
                    c.problem(
                        &at.key("client_auth").key("ca"),
                        ProblemKind::BadCertificate(why),
                    );
                })
                .ok()
        });
        listeners.push(TlsListenerConfig {
            listen: l.listen.clone(),
            certs,
            client_auth,
        });
    }
    listeners
}

fn front_door(c: &mut Checker, s: &ServerFile) -> FrontDoorConfig {
    let d = FrontDoorConfig::default();
    let at = |key: &str| KeyPath::root("server").key(key);
    let mut timeout = |name: &str, text: &Option<String>, default: Duration| {
        let value = c.duration(&at(name), text.as_deref(), default);
        if value.is_zero() {
            c.problem(&at(name), ProblemKind::Zero(name.to_string()));
        }
        value
    };
    let client_header_timeout = timeout(
        "client_header_timeout",
        &s.client_header_timeout,
        d.client_header_timeout,
    );
    let keepalive_timeout = timeout(
        "keepalive_timeout",
        &s.keepalive_timeout,
        d.keepalive_timeout,
    );
    let client_body_timeout = timeout(
        "client_body_timeout",
        &s.client_body_timeout,
        d.client_body_timeout,
    );
    let send_timeout = timeout("send_timeout", &s.send_timeout, d.send_timeout);
    let mut bounded = |name: &str, value: Option<usize>, default: usize, range: (u64, u64)| {
        let value = value.unwrap_or(default);
        check_between(c, &at(name), value, range);
        value
    };
    let max_header_bytes = bounded(
        "max_header_bytes",
        s.max_header_bytes,
        d.max_header_bytes,
        (1024, 1 << 20),
    );
    let max_uri_bytes = bounded(
        "max_uri_bytes",
        s.max_uri_bytes,
        d.max_uri_bytes,
        (64, 1 << 20),
    );
    let max_connections = bounded(
        "max_connections",
        s.max_connections,
        d.max_connections,
        (1, 1_000_000),
    );
    if max_uri_bytes > max_header_bytes {
        c.problem(&at("max_uri_bytes"), ProblemKind::UriOverHead);
    }
    FrontDoorConfig {
        escaped_slashes: s.escaped_slashes.unwrap_or(d.escaped_slashes),
        client_header_timeout,
        keepalive_timeout,
        client_body_timeout,
        send_timeout,
        max_header_bytes,
        max_uri_bytes,
        max_connections,
    }
}

/// A number that must lie in `range` (inclusive).
pub(super) fn check_between(
    c: &mut Checker,
    path: &KeyPath,
    value: impl TryInto<u64>,
    range: (u64, u64),
) {
    let value = value.try_into().unwrap_or(u64::MAX);
    if value < range.0 || value > range.1 {
        let (min, max) = range;
        let key = path.leaf().to_string();
        c.problem(path, ProblemKind::Between { key, min, max });
    }
}

/// A file path setting: non-empty, defaulting to `default`.
fn path_setting(
    c: &mut Checker,
    path: &KeyPath,
    value: &Option<String>,
    default: String,
) -> String {
    match value.as_deref() {
        None => default,
        Some("") => {
            c.problem(path, ProblemKind::Empty(path.leaf().to_string()));
            default
        }
        Some(text) => text.to_string(),
    }
}

/// A network (`10.0.0.0/8`) or one address, truncated to its network.
pub(super) fn cidr(c: &mut Checker, path: &KeyPath, text: &str) -> Option<IpNet> {
    let parsed = text
        .parse::<IpNet>()
        .or_else(|_| text.parse::<std::net::IpAddr>().map(IpNet::from));
    match parsed {
        Ok(net) => Some(net.trunc()),
        Err(_) => {
            c.problem(path, ProblemKind::BadCidr(text.to_string()));
            None
        }
    }
}

pub(super) fn client_ip(c: &mut Checker, f: &ClientIpFile) -> ClientIpConfig {
    let d = ClientIpConfig::default();
    let at = |key: &str| KeyPath::root("client_ip").key(key);
    let mut trusted_proxies = Vec::new();
    for (i, text) in f.trusted_proxies.iter().enumerate() {
        if let Some(net) = cidr(c, &at("trusted_proxies").index(i), text) {
            trusted_proxies.push(net);
        }
    }
    let ipv6_prefix = f.ipv6_prefix.unwrap_or(d.ipv6_prefix);
    check_between(c, &at("ipv6_prefix"), ipv6_prefix, (1, 128));
    ClientIpConfig {
        trusted_proxies,
        ipv6_prefix,
    }
}

pub(super) fn identity(c: &mut Checker, f: Option<&IdentityMethods>) -> IdentityConfig {
    let root = KeyPath::root("identity");
    match f {
        None => IdentityConfig::None,
        Some(IdentityMethods::One(method)) => identity_method(c, &root, method),
        Some(IdentityMethods::Several(methods)) => {
            if methods.is_empty() {
                let (key, item) = ("identity", "method");
                c.problem(&root, ProblemKind::NeedsOne { key, item });
            }
            let mut seen: Vec<&'static str> = Vec::new();
            let mut configs = Vec::new();
            for (i, method) in methods.iter().enumerate() {
                let path = root.index(i);
                let config = identity_method(c, &path, method);
                let kind = match &config {
                    IdentityConfig::Header(_) => "header",
                    IdentityConfig::Jwt(_) => "jwt",
                    IdentityConfig::ApiKey(_) => "api_key",
                    IdentityConfig::ClientCert { .. } => "client_cert",
                    IdentityConfig::AuthRequest(_) => "auth_request",
                    _ => continue,
                };
                if seen.contains(&kind) {
                    c.problem(&path, ProblemKind::IdentityListedTwice(kind));
                }
                seen.push(kind);
                configs.push(config);
            }
            warn_optional_beside_required(c, &root, &configs);
            IdentityConfig::Several(configs)
        }
    }
}

/// A list that mixes required and optional methods: once one is required,
/// the optional ones' `required: false` changes nothing (an invalid
/// credential of any method is refused), which is worth saying.
fn warn_optional_beside_required(c: &mut Checker, root: &KeyPath, methods: &[IdentityConfig]) {
    if !methods.iter().any(IdentityConfig::required) {
        return;
    }
    for (i, method) in methods.iter().enumerate() {
        let kind = match method {
            IdentityConfig::Jwt(_) => "jwt",
            IdentityConfig::ApiKey(_) => "api_key",
            IdentityConfig::ClientCert { .. } => "client_cert",
            IdentityConfig::AuthRequest(_) => "auth_request",
            _ => continue,
        };
        if !method.required() {
            c.warning(
                &root.index(i).key(kind),
                ProblemKind::OptionalBesideRequired(kind),
            );
        }
    }
}

/// Where the `kind` method of `identity` is written (`identity.jwt`, or
/// `identity[i].jwt` in a list), for problems found after validation.
pub(super) fn identity_path(f: Option<&IdentityMethods>, kind: &str) -> KeyPath {
    let root = KeyPath::root("identity");
    if let Some(IdentityMethods::Several(methods)) = f {
        let given = |m: &IdentityFile| match kind {
            "jwt" => m.jwt.is_some(),
            "api_key" => m.api_key.is_some(),
            "client_cert" => m.client_cert.is_some(),
            "auth_request" => m.auth_request.is_some(),
            _ => m.header.is_some(),
        };
        if let Some(i) = methods.iter().position(given) {
            return root.index(i).key(kind);
        }
    }
    root.key(kind)
}

/// One identity method at `path`: exactly one of `header`, `jwt`,
/// `api_key`, `client_cert`.
fn identity_method(c: &mut Checker, path: &KeyPath, f: &IdentityFile) -> IdentityConfig {
    let given = [
        f.header.is_some(),
        f.jwt.is_some(),
        f.api_key.is_some(),
        f.client_cert.is_some(),
        f.auth_request.is_some(),
    ];
    if given.iter().filter(|g| **g).count() != 1 {
        let kind = ProblemKind::OneOf {
            owner: "`identity`",
            keys: "header, jwt, api_key, client_cert or auth_request",
        };
        c.problem(path, kind);
        return IdentityConfig::None;
    }
    if let Some(auth) = &f.auth_request {
        return IdentityConfig::AuthRequest(auth_request(c, &path.key("auth_request"), auth));
    }
    if let Some(cert) = &f.client_cert {
        return IdentityConfig::ClientCert {
            from: cert.from.unwrap_or(CertField::Fingerprint),
            required: cert.required,
        };
    }
    if let Some(name) = &f.header {
        c.header_name(&path.key("header"), name);
        return IdentityConfig::Header(name.to_ascii_lowercase());
    }
    if let Some(jwt) = &f.jwt {
        return super::super::jwt::validate(c, &path.key("jwt"), jwt);
    }
    match &f.api_key {
        Some(api_key) => {
            IdentityConfig::ApiKey(super::api_key::api_key(c, &path.key("api_key"), api_key))
        }
        None => IdentityConfig::None,
    }
}

/// `identity.auth_request`: its URL (http or https), timeout, the headers it
/// is sent and the ones it answers with.
fn auth_request(c: &mut Checker, at: &KeyPath, f: &AuthRequestFile) -> AuthRequestConfig {
    use super::super::defaults::auth_request as d;
    let url = f.url.clone().unwrap_or_else(|| {
        c.problem(at, ProblemKind::Needs("auth_request", "url"));
        String::new()
    });
    let scheme = url.parse::<http::Uri>().ok().and_then(|u| {
        let scheme = u.scheme_str()?.to_string();
        u.host()?;
        Some(scheme)
    });
    if !url.is_empty() && !matches!(scheme.as_deref(), Some("http" | "https")) {
        c.problem(&at.key("url"), ProblemKind::BadUrl(url.clone()));
    }
    let timeout = c.duration(&at.key("timeout"), f.timeout.as_deref(), d::TIMEOUT);
    if timeout.is_zero() {
        c.problem(&at.key("timeout"), ProblemKind::Zero("timeout".into()));
    }
    let headers: Vec<String> = if f.headers.is_empty() {
        d::HEADERS.iter().map(|h| h.to_string()).collect()
    } else {
        f.headers.iter().map(|h| h.to_ascii_lowercase()).collect()
    };
    for (i, name) in headers.iter().enumerate() {
        c.header_name(&at.key("headers").index(i), name);
    }
    let user_header = f
        .user_header
        .as_deref()
        .unwrap_or(d::USER_HEADER)
        .to_ascii_lowercase();
    c.header_name(&at.key("user_header"), &user_header);
    let plan_header = f.plan_header.as_ref().map(|h| h.to_ascii_lowercase());
    if let Some(name) = &plan_header {
        c.header_name(&at.key("plan_header"), name);
    }
    let cache_ttl = c.duration(&at.key("cache_ttl"), f.cache_ttl.as_deref(), d::CACHE_TTL);
    AuthRequestConfig {
        url,
        timeout,
        headers,
        user_header,
        plan_header,
        cache_ttl,
        required: f.required,
    }
}
