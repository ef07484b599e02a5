//! The admin APIs' guard against other sites, checked before any token:
//!
//! - A call that changes state (any method but `GET` and `HEAD`) sent by a
//!   page of another origin is refused (`403 cross_site`): a browser names
//!   the page's origin in `Origin`, and its kind in `Sec-Fetch-Site`. Such
//!   calls are non-simple requests already (a `DELETE`, or a token in
//!   `Authorization`), which a browser preflights and the admin listener
//!   never allows; this is the second wall, should one fall.
//! - Without an admin token (the APIs then answer only on a loopback
//!   listener), the `Host` must be a loopback one too: a page whose name
//!   an attacker rebinds to 127.0.0.1 (DNS rebinding) is same-origin to
//!   the browser, but its requests still carry the attacker's name.
//! - On a loopback listener, the paths no token guards (`/metrics`,
//!   `/healthz`, `/readyz`, the console's files) answer only a loopback
//!   `Host` too, whether a token is set or not ([`host_check`]): a
//!   rebinding page cannot read route, limit and upstream names off
//!   `/metrics`. The APIs follow the rule above: a token guards them, and
//!   without one they answer only a loopback `Host`. A request without `Host` (HTTP/1.0, no
//!   browser sends one) and a Prometheus scraping `127.0.0.1:9091` pass;
//!   a listener on another address is reached by the names the operator
//!   gave it (`sluice:9091` in a compose file) and is not restricted.

use crate::admin::api::{error, Answer};
use crate::policy::state::GatewayState;
use http::{Method, StatusCode};
use pingora::http::RequestHeader;
use serde_json::json;
use std::net::IpAddr;

/// `Ok` when `head` may go on to the API's own checks; else the 403.
pub fn check(state: &GatewayState, head: &RequestHeader) -> Result<(), Answer> {
    let header = |name: &str| {
        head.headers
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    };
    let host = header("host").unwrap_or_default();
    let changes_state = head.method != Method::GET && head.method != Method::HEAD;
    if changes_state {
        let fetch_site = header("sec-fetch-site");
        let foreign_site = fetch_site.is_some_and(|s| s != "same-origin" && s != "none");
        let foreign_origin = header("origin").is_some_and(|origin| !origin_is_host(&origin, &host));
        if foreign_site || foreign_origin {
            let reason = "a call that changes state must come from the admin listener's own origin";
            return Err(error(
                StatusCode::FORBIDDEN,
                "cross_site",
                json!({ "reason": reason }),
            ));
        }
    }
    if state.config.server.admin_token.is_none() && !is_loopback_host(&host) {
        let reason = "without server.admin_token_env the admin APIs answer only to a loopback Host (localhost, 127.0.0.1, [::1])";
        return Err(error(
            StatusCode::FORBIDDEN,
            "forbidden",
            json!({ "reason": reason }),
        ));
    }
    Ok(())
}

/// `Ok` when `head` names the admin listener as a client may: on a
/// loopback listener, by a loopback `Host` (or none); else the reason.
pub fn host_check(state: &GatewayState, head: &RequestHeader) -> Result<(), &'static str> {
    let listener_is_loopback = state
        .config
        .server
        .admin
        .parse::<std::net::SocketAddr>()
        .map_or(true, |addr| addr.ip().is_loopback());
    let mut hosts = head.headers.get_all(http::header::HOST).iter();
    let allowed = match (hosts.next(), hosts.next()) {
        (None, _) => true,
        (Some(host), None) => std::str::from_utf8(host.as_bytes()).is_ok_and(is_loopback_host),
        (Some(_), Some(_)) => false,
    };
    if listener_is_loopback && !allowed {
        return Err("a loopback admin listener answers only to a loopback Host (localhost, 127.0.0.1, [::1])");
    }
    Ok(())
}

/// Whether `origin` (`scheme://host[:port]`) names `host` (`host[:port]`).
fn origin_is_host(origin: &str, host: &str) -> bool {
    let Some((scheme, rest)) = origin.split_once("://") else {
        return false; // "null", or nonsense: not this origin
    };
    let default_port = match scheme {
        "http" => ":80",
        "https" => ":443",
        _ => return false,
    };
    let with_port = |name: &str| {
        if has_port(name) {
            name.to_ascii_lowercase()
        } else {
            format!("{}{default_port}", name.to_ascii_lowercase())
        }
    };
    !host.is_empty() && with_port(rest) == with_port(host)
}

/// Whether `authority` ends in `:port` (an IPv6 literal's colons are inside
/// its brackets).
fn has_port(authority: &str) -> bool {
    match authority.rfind(':') {
        Some(colon) => !authority[colon..].contains(']'),
        None => false,
    }
}

/// Whether `host` (`name[:port]`) is `localhost` or a loopback address.
fn is_loopback_host(host: &str) -> bool {
    let name = if has_port(host) {
        host.rsplit_once(':').map_or(host, |(name, _)| name)
    } else {
        host
    };
    let name = name.trim_start_matches('[').trim_end_matches(']');
    name.eq_ignore_ascii_case("localhost")
        || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_origin_is_the_host_only_with_the_same_name_and_port() {
        assert!(origin_is_host("http://127.0.0.1:9090", "127.0.0.1:9090"));
        assert!(origin_is_host("http://LOCALHOST", "localhost:80"));
        assert!(origin_is_host("https://[::1]:8443", "[::1]:8443"));
        assert!(!origin_is_host("http://127.0.0.1:9091", "127.0.0.1:9090"));
        assert!(!origin_is_host(
            "http://evil.example:9090",
            "127.0.0.1:9090"
        ));
        assert!(!origin_is_host("null", "127.0.0.1:9090"));
        assert!(!origin_is_host("http://127.0.0.1:9090", ""));
    }

    #[test]
    fn only_loopback_names_are_loopback_hosts() {
        for host in [
            "127.0.0.1:9090",
            "localhost",
            "[::1]:9090",
            "127.0.0.2",
            "LocalHost:1",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "evil.example:9090",
            "10.0.0.1",
            "",
            "127.0.0.1.evil.example",
            "[::2]:1",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }
}
