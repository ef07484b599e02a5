//! A route's `cors:`: the origins, methods and headers a browser is told
//! it may use, made into the header values sluice answers with.

use super::super::checker::Checker;
use super::super::file::CorsFile;
use super::super::forward::{CorsOrigins, CorsPolicy};
use super::super::problem::{KeyPath, ProblemKind};
use http::{HeaderName, HeaderValue, Method};
use std::time::Duration;

/// What a page may read of a response besides the safelisted headers,
/// always: the answer to "when may I retry" and "how much is left".
const ALWAYS_EXPOSED: [&str; 6] = [
    "retry-after",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "ratelimit",
    "ratelimit-policy",
];

/// Methods allowed when `methods` is not given.
const DEFAULT_METHODS: &str = "GET, HEAD, POST, PUT, PATCH, DELETE";

pub(super) fn cors(
    c: &mut Checker,
    at: &KeyPath,
    f: &CorsFile,
    request_id: &HeaderName,
) -> CorsPolicy {
    let origins = origins(c, &at.key("origins"), &f.origins);
    let credentials = f.credentials.unwrap_or(false);
    if credentials && origins == CorsOrigins::Any {
        c.problem(
            &at.key("credentials"),
            ProblemKind::AnyOriginWithCredentials,
        );
    }
    let allow_methods = match &f.methods {
        None => HeaderValue::from_static(DEFAULT_METHODS),
        Some(methods) => list(&methods_written(c, &at.key("methods"), methods)),
    };
    let allow_headers = f
        .headers
        .as_ref()
        .map(|names| list(&header_names(c, &at.key("headers"), names)));
    let mut exposed = f
        .expose
        .as_ref()
        .map(|names| header_names(c, &at.key("expose"), names))
        .unwrap_or_default();
    for name in ALWAYS_EXPOSED.iter().copied().chain([request_id.as_str()]) {
        if !exposed.iter().any(|e| e == name) {
            exposed.push(name.to_string());
        }
    }
    let max_age = f.max_age.as_deref().map(|text| {
        let seconds = c.duration(&at.key("max_age"), Some(text), Duration::ZERO);
        HeaderValue::from(seconds.as_secs())
    });
    CorsPolicy {
        origins,
        allow_methods,
        allow_headers,
        expose: list(&exposed),
        max_age,
        credentials,
    }
}

/// `origins:`: `["*"]`, or origins as a browser sends them.
fn origins(c: &mut Checker, at: &KeyPath, written: &[String]) -> CorsOrigins {
    if written.is_empty() {
        let kind = ProblemKind::NeedsOne {
            key: "origins",
            item: "origin",
        };
        c.problem(at, kind);
    }
    if written.iter().any(|o| o == "*") {
        if written.len() > 1 {
            c.problem(at, ProblemKind::BadOrigin("*".to_string()));
        }
        return CorsOrigins::Any;
    }
    let mut listed = Vec::with_capacity(written.len());
    for (i, origin) in written.iter().enumerate() {
        if is_origin(origin) {
            listed.push(origin.to_ascii_lowercase());
        } else {
            c.problem(&at.index(i), ProblemKind::BadOrigin(origin.clone()));
        }
    }
    CorsOrigins::Listed(listed)
}

/// `scheme://host[:port]`: what a browser's `Origin` holds (never `null`,
/// which any sandboxed page sends, nor a path).
fn is_origin(text: &str) -> bool {
    let Some((scheme, authority)) = text.split_once("://") else {
        return false;
    };
    let scheme_ok = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
    let (host, port) = match authority.strip_prefix('[') {
        // An IPv6 literal: [addr] or [addr]:port.
        Some(bracketed) => match bracketed.split_once(']') {
            Some((addr, "")) => (addr, None),
            Some((addr, rest)) => match rest.strip_prefix(':') {
                Some(port) => (addr, Some(port)),
                None => return false,
            },
            None => return false,
        },
        None => match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        },
    };
    let host_ok = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-.:".contains(c))
        && (authority.starts_with('[') || !host.contains(':'));
    let port_ok = port.is_none_or(|p| p.parse::<u16>().is_ok());
    scheme_ok && host_ok && port_ok
}

/// `methods:` as written, each an HTTP method (upper case as sent).
fn methods_written(c: &mut Checker, at: &KeyPath, written: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(written.len());
    for (i, method) in written.iter().enumerate() {
        match Method::from_bytes(method.as_bytes()) {
            Ok(_) if !method.is_empty() => out.push(method.to_ascii_uppercase()),
            _ => c.problem(&at.index(i), ProblemKind::BadMethod(method.clone())),
        }
    }
    if written.is_empty() {
        c.problem(at, ProblemKind::NoMethods);
    }
    out
}

/// Header names as written (lower case); `*` passes as itself.
fn header_names(c: &mut Checker, at: &KeyPath, written: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(written.len());
    for (i, name) in written.iter().enumerate() {
        if name == "*" {
            out.push(name.clone());
            continue;
        }
        match HeaderName::from_bytes(name.as_bytes()) {
            Ok(header) => out.push(header.as_str().to_string()),
            Err(_) => c.problem(&at.index(i), ProblemKind::BadHeaderName(name.clone())),
        }
    }
    out
}

/// `a, b, c` as one header value (every part was checked to be a token).
fn list(parts: &[String]) -> HeaderValue {
    HeaderValue::from_str(&parts.join(", ")).unwrap_or_else(|_| HeaderValue::from_static(""))
}

#[cfg(test)]
mod tests {
    use super::is_origin;

    #[test]
    fn only_what_a_browser_sends_as_origin_is_an_origin() {
        for good in [
            "https://app.example.com",
            "http://localhost:8080",
            "http://127.0.0.1:3000",
            "http://[::1]:8080",
            "https://[2001:db8::1]",
            "chrome-extension://abcdef",
        ] {
            assert!(is_origin(good), "{good}");
        }
        for bad in [
            "app.example.com",
            "https://app.example.com/",
            "https://app.example.com/path",
            "https://",
            "https://a:b:c",
            "https://a:99999",
            "https://*.example.com",
            "null",
            "https://[::1",
            "https://[::1]x",
            "1http://a",
        ] {
            assert!(!is_origin(bad), "{bad}");
        }
    }
}
