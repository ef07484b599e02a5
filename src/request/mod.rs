//! The request layer: what the gateway reads off a request before any
//! policy. Here: the canonical target and host, a header's values, the
//! client's `X-Forwarded-For` chain and what goes upstream; below, the key
//! parts ([`parts`]), the request ID ([`id`]), CORS ([`cors`]), a route's
//! forwarding rules ([`forward`]) and the verified client certificate of
//! the connection ([`client_cert`]).
//!
//! Pure functions of the head and the connection (no session, no I/O,
//! no metrics), so each is unit-tested where it lives. May use `config`
//! and the leaves (`target`, `sync`); nothing above it.

pub mod client_cert;
pub mod cors;
pub mod forward;
pub mod id;
pub mod parts;

use crate::config::forward::HeaderEdits;
use crate::config::EscapedSlashes;
use crate::request::forward::{edit, Values};
use crate::request::parts::PartValue;
use crate::target::{canonical_host, canonical_target, TargetError};
use http::{header, HeaderName, HeaderValue};
use pingora::http::RequestHeader;
use std::borrow::Cow;
use std::net::IpAddr;

/// `tracestate`, parsed once (a `&str` name is parsed on every lookup).
const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// What the gateway works with instead of the target as received: the
/// canonical path and host, and what to send upstream instead.
#[derive(Debug)]
pub(crate) struct CanonicalRequest<'a> {
    /// Set when it differs from the path as received.
    pub rewritten_path: Option<String>,
    /// The canonical path (borrowed when the received one was canonical).
    pub path: Cow<'a, str>,
    /// The canonical host, from the authority or the `Host` header.
    pub host: Option<Cow<'a, str>>,
    /// The origin-form target to send upstream instead of the received one.
    pub upstream_target: Option<Vec<u8>>,
    /// The `Host` to send upstream for an absolute-form request without one.
    pub upstream_host: Option<Vec<u8>>,
}

/// Makes the request's target and host canonical, or says why it cannot be
/// (answer 400). An HTTP/1.1 request must name one host, the same in its
/// `Host` header and its absolute-form authority.
pub(crate) fn canonical_request(
    req: &RequestHeader,
    slashes: EscapedSlashes,
) -> Result<CanonicalRequest<'_>, TargetError> {
    let target = canonical_target(req.raw_path(), slashes)?;
    let mut hosts = req.headers.get_all(header::HOST).iter();
    let first_host = hosts.next();
    let host_header = match (first_host, hosts.next()) {
        (_, Some(_)) => return Err(TargetError::HostMismatch),
        (Some(value), None) => Some(canonical_host(value.as_bytes())?),
        (None, None) => None,
    };
    let authority = match target.authority {
        Some(authority) => Some(canonical_host(authority)?.ok_or(TargetError::Host)?),
        None => None,
    };
    let host = match (host_header, authority) {
        (Some(header), Some(authority)) if header.as_ref() != Some(&authority) => {
            return Err(TargetError::HostMismatch)
        }
        (None, None) if req.version == http::Version::HTTP_11 => {
            return Err(TargetError::HostMismatch)
        }
        (_, Some(authority)) => Some(authority),
        (header, None) => header.flatten(),
    };
    let rewrite = target.authority.is_some() || matches!(target.path, Cow::Owned(_));
    Ok(CanonicalRequest {
        upstream_target: rewrite.then(|| target.origin_form()),
        upstream_host: match (target.authority, first_host) {
            (Some(authority), None) => Some(authority.to_vec()),
            _ => None,
        },
        rewritten_path: rewrite.then(|| target.path.to_string()),
        path: target.path,
        host,
    })
}

/// The request's canonical path: the rewritten one, or the path as received
/// when that was canonical already.
pub(crate) fn request_path<'a>(rewritten: &'a Option<String>, req: &'a RequestHeader) -> &'a str {
    rewritten.as_deref().unwrap_or_else(|| req.uri.path())
}

impl<'a> From<HeaderValues<'a>> for PartValue<'a> {
    fn from(values: HeaderValues<'a>) -> Self {
        match values {
            HeaderValues::Absent => PartValue::Missing,
            HeaderValues::One(value) => PartValue::One(Cow::Borrowed(value)),
            HeaderValues::Several => PartValue::Ambiguous,
        }
    }
}

/// What a request carries under one header name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderValues<'a> {
    /// Not sent.
    Absent,
    /// Sent exactly once.
    One(&'a [u8]),
    /// Sent more than once: ambiguous, so never believed (an auth layer that
    /// appends instead of replacing would otherwise let the client choose).
    Several,
}

impl<'a> HeaderValues<'a> {
    /// Whether the header was not sent at all.
    pub fn is_absent(&self) -> bool {
        matches!(self, HeaderValues::Absent)
    }

    /// The API key these values of header `name` carry: an `Authorization`
    /// header's key is what follows its `Bearer` scheme (as OpenAI- and
    /// Anthropic-style clients send it); any other header's, its value.
    pub fn api_key(self, name: &str) -> HeaderValues<'a> {
        match self {
            HeaderValues::One(value) if name == "authorization" => {
                let scheme = value
                    .get(..7)
                    .filter(|s| s.eq_ignore_ascii_case(b"bearer "));
                match scheme {
                    Some(_) => HeaderValues::One(value[7..].trim_ascii()),
                    None => HeaderValues::One(value),
                }
            }
            other => other,
        }
    }
}

/// The values of header `name`, as the identity sees them: a header sent
/// twice is [`HeaderValues::Several`], never its first value.
pub(crate) fn header_values<'a>(req: &'a RequestHeader, name: &str) -> HeaderValues<'a> {
    let mut values = req.headers.get_all(name).iter();
    match (values.next(), values.next()) {
        (None, _) => HeaderValues::Absent,
        (Some(one), None) => HeaderValues::One(one.as_bytes()),
        (Some(_), Some(_)) => HeaderValues::Several,
    }
}

/// Removes an `Upgrade` other than WebSocket (`h2c`, `TLS/1.0`, …) and the
/// `Connection` tokens that go with it, so the request is an ordinary one:
/// only WebSocket is tunnelled, whose handshake the limits have counted.
pub(crate) fn drop_foreign_upgrade(req: &mut RequestHeader) {
    let Some(upgrade) = req.headers.get(header::UPGRADE) else {
        return;
    };
    let several = req.headers.get_all(header::UPGRADE).iter().count() > 1;
    if !several && upgrade.as_bytes().eq_ignore_ascii_case(b"websocket") {
        return;
    }
    req.remove_header(&header::UPGRADE);
    req.remove_header("http2-settings");
    let kept: Vec<String> = req
        .headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| {
            !t.is_empty()
                && !t.eq_ignore_ascii_case("upgrade")
                && !t.eq_ignore_ascii_case("http2-settings")
        })
        .map(str::to_string)
        .collect();
    req.remove_header(&header::CONNECTION);
    if !kept.is_empty() {
        let _ = req.insert_header(header::CONNECTION, kept.join(", "));
    }
}

/// The `X-Forwarded-For` value to send upstream: the received ones, in
/// order, then `peer`, as Envoy and most proxies write it.
pub(crate) fn forwarded_for(req: &RequestHeader, peer: IpAddr) -> Vec<u8> {
    use std::io::Write as _;
    let mut value = Vec::with_capacity(48);
    for existing in req.headers.get_all("x-forwarded-for") {
        value.extend_from_slice(existing.as_bytes());
        value.extend_from_slice(b", ");
    }
    let _ = write!(value, "{peer}");
    value
}

/// What the upstream is sent instead of the request head as received.
#[derive(Debug, Default)]
pub struct UpstreamRewrite<'a> {
    /// The origin-form target the gateway routed and keyed on.
    pub target: Option<Vec<u8>>,
    /// A `Host` to set (absolute-form requests without one).
    pub host: Option<Vec<u8>>,
    /// A header to remove (an identity header from an untrusted peer).
    pub remove: Option<&'a str>,
    /// The socket peer to append to `X-Forwarded-For`.
    pub forwarded_for: Option<IpAddr>,
    /// The request ID header and the request's ID, replacing any sent.
    pub request_id: Option<(&'a HeaderName, &'a HeaderValue)>,
    /// With API keys: the key's header (if it comes in one), removed, and
    /// the consumer, sent as `x-consumer-id` (replacing any the client sent).
    pub consumer: Option<(Option<&'a str>, Option<&'a [u8]>)>,
    /// The route's request header edits, with the request's values (last:
    /// what the operator configured wins).
    pub edits: Option<(&'a HeaderEdits, Values<'a>)>,
    /// With tracing: the `traceparent` to send (this trace, the upstream
    /// try's span) and the caller's `tracestate`, replacing any sent.
    pub trace: Option<(HeaderValue, Option<&'a HeaderValue>)>,
}

/// How a request is named in the error log: its method, its path without
/// the query (which may carry an API key or a token), its Host and its ID.
pub fn summary(req: &RequestHeader, request_id: Option<&HeaderValue>) -> String {
    let target = req.raw_path();
    let path = target.split(|&b| b == b'?').next().unwrap_or(target);
    let host = req
        .headers
        .get(header::HOST)
        .map(|h| h.as_bytes())
        .unwrap_or(b"");
    format!(
        "{} {}, Host: {}, request ID: {}",
        req.method,
        String::from_utf8_lossy(path),
        String::from_utf8_lossy(host),
        request_id.and_then(|id| id.to_str().ok()).unwrap_or("-"),
    )
}

/// The header the upstream learns a request's consumer from.
pub(crate) const CONSUMER_HEADER: &str = "x-consumer-id";

impl UpstreamRewrite<'_> {
    /// Applies the rewrite to the head going upstream.
    pub fn apply(self, req: &mut RequestHeader) -> pingora::Result<()> {
        if let Some(target) = self.target {
            req.set_raw_path(&target)?;
        }
        if let Some(host) = self.host {
            req.insert_header(header::HOST, host)?;
        }
        if let Some(name) = self.remove {
            req.remove_header(name);
        }
        if let Some(peer) = self.forwarded_for {
            let value = forwarded_for(req, peer);
            req.insert_header("x-forwarded-for", value)?;
        }
        if let Some((name, id)) = self.request_id {
            req.insert_header(name.clone(), id.clone())?;
        }
        if let Some((key_header, consumer)) = self.consumer {
            if let Some(name) = key_header {
                req.remove_header(name);
            }
            req.remove_header(CONSUMER_HEADER);
            if let Some(id) = consumer {
                req.insert_header(CONSUMER_HEADER, id)?;
            }
        }
        if let Some((edits, values)) = &self.edits {
            edit(req, edits, values)?;
        }
        if let Some((traceparent, tracestate)) = self.trace {
            req.insert_header("traceparent", traceparent)?;
            match tracestate {
                Some(state) => req.insert_header("tracestate", state.clone())?,
                // A lookup first: removing costs a search of both header maps.
                None if req.headers.contains_key(&TRACESTATE) => {
                    drop(req.remove_header(&TRACESTATE))
                }
                None => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(target: &str, headers: &[(&str, &str)]) -> RequestHeader {
        let mut req = RequestHeader::build("GET", target.as_bytes(), None).expect("head");
        for (name, value) in headers {
            req.append_header(name.to_string(), *value).expect("header");
        }
        req
    }

    #[test]
    fn an_api_key_in_authorization_is_the_bearer_token() {
        let one = |value: &'static str| HeaderValues::One(value.as_bytes());
        for (name, sent, key) in [
            ("authorization", "Bearer sk-1", "sk-1"),
            ("authorization", "bearer  sk-2 ", "sk-2"),
            ("authorization", "Basic abc", "Basic abc"),
            ("authorization", "sk-3", "sk-3"),
            ("x-api-key", "Bearer sk-4", "Bearer sk-4"),
        ] {
            assert_eq!(one(sent).api_key(name), one(key), "{name}: {sent}");
        }
        assert_eq!(
            HeaderValues::Several.api_key("authorization"),
            HeaderValues::Several
        );
        assert_eq!(
            HeaderValues::Absent.api_key("authorization"),
            HeaderValues::Absent
        );
        // `Bearer ` alone carries no key (an empty one is missing).
        assert_eq!(one("Bearer ").api_key("authorization"), one(""));
    }

    #[test]
    fn canonical_path_and_host_are_what_routes_see() {
        let req = head("/a//b/../c?q=1", &[("host", "API.Example.COM.:8080")]);
        let c = canonical_request(&req, EscapedSlashes::Reject).expect("canonical");
        assert_eq!(c.path, "/a/c");
        assert_eq!(c.host.as_deref(), Some("api.example.com"));
        assert_eq!(c.rewritten_path.as_deref(), Some("/a/c"));
        assert_eq!(c.upstream_target.as_deref(), Some(&b"/a/c?q=1"[..]));
        assert_eq!(c.upstream_host, None);
    }

    #[test]
    fn a_canonical_request_is_not_rewritten() {
        let req = head("/a/c?q=1", &[("host", "api")]);
        let c = canonical_request(&req, EscapedSlashes::Reject).expect("canonical");
        assert!(matches!(c.path, Cow::Borrowed("/a/c")));
        assert_eq!(c.rewritten_path, None);
        assert_eq!(c.upstream_target, None);
        assert_eq!(request_path(&c.rewritten_path, &req), "/a/c");
    }

    #[test]
    fn absolute_form_takes_its_authority_and_goes_upstream_in_origin_form() {
        let req = head("http://Api.Example/x", &[]);
        let c = canonical_request(&req, EscapedSlashes::Reject).expect("canonical");
        assert_eq!(c.host.as_deref(), Some("api.example"));
        assert_eq!(c.upstream_target.as_deref(), Some(&b"/x"[..]));
        assert_eq!(c.upstream_host.as_deref(), Some(&b"Api.Example"[..]));
    }

    #[test]
    fn hosts_that_disagree_or_are_missing_are_refused() {
        let cases: [(&str, &[(&str, &str)]); 3] = [
            ("/x", &[("host", "a"), ("host", "b")]),
            ("http://a/x", &[("host", "b")]),
            ("/x", &[]),
        ];
        for (target, headers) in cases {
            let req = head(target, headers);
            let got = canonical_request(&req, EscapedSlashes::Reject);
            assert!(
                matches!(got, Err(TargetError::HostMismatch)),
                "{target} {headers:?}: {got:?}"
            );
        }
    }

    #[test]
    fn header_values_never_pick_one_of_several() {
        let req = head("/", &[("x-user", "a"), ("x-user", "b"), ("x-one", "c")]);
        assert!(matches!(
            header_values(&req, "x-user"),
            HeaderValues::Several
        ));
        assert!(matches!(
            header_values(&req, "x-one"),
            HeaderValues::One(b"c")
        ));
        assert!(matches!(
            header_values(&req, "x-none"),
            HeaderValues::Absent
        ));
    }

    #[test]
    fn only_a_websocket_upgrade_survives() {
        let mut ws = head("/", &[("upgrade", "websocket"), ("connection", "Upgrade")]);
        drop_foreign_upgrade(&mut ws);
        assert!(ws.headers.get("upgrade").is_some());
        assert!(ws.headers.get("connection").is_some());

        let mut h2c = head(
            "/",
            &[
                ("upgrade", "h2c"),
                ("connection", "Upgrade, HTTP2-Settings, keep-alive"),
                ("http2-settings", "AAMAAABkAAQAAP__"),
            ],
        );
        drop_foreign_upgrade(&mut h2c);
        assert!(h2c.headers.get("upgrade").is_none());
        assert!(h2c.headers.get("http2-settings").is_none());
        assert_eq!(
            h2c.headers.get("connection").map(|v| v.as_bytes()),
            Some(&b"keep-alive"[..])
        );

        let mut twice = head("/", &[("upgrade", "websocket"), ("upgrade", "websocket")]);
        drop_foreign_upgrade(&mut twice);
        assert!(twice.headers.get("upgrade").is_none());
    }

    #[test]
    fn the_error_log_names_a_request_without_its_query() {
        let req = head("/orders?api_key=s3cret&x=1", &[("host", "api.example")]);
        let id = HeaderValue::from_static("0190-id");
        let summary = summary(&req, Some(&id));
        assert_eq!(
            summary,
            "GET /orders, Host: api.example, request ID: 0190-id"
        );
    }

    #[test]
    fn the_upstream_gets_the_canonical_target_without_an_untrusted_identity() {
        let mut req = head(
            "/a//b",
            &[("x-user", "forged"), ("x-forwarded-for", "1.1.1.1")],
        );
        let rewrite = UpstreamRewrite {
            target: Some(b"/a/b?x".to_vec()),
            host: Some(b"api".to_vec()),
            remove: Some("x-user"),
            forwarded_for: "10.0.0.1".parse().ok(),
            ..Default::default()
        };
        rewrite.apply(&mut req).expect("rewrite");
        assert_eq!(req.raw_path(), b"/a/b?x");
        assert_eq!(
            req.headers.get("host").map(|v| v.as_bytes()),
            Some(&b"api"[..])
        );
        assert!(req.headers.get("x-user").is_none());
        let xff: Vec<&[u8]> = req
            .headers
            .get_all("x-forwarded-for")
            .iter()
            .map(|v| v.as_bytes())
            .collect();
        assert_eq!(xff, [&b"1.1.1.1, 10.0.0.1"[..]]);
    }

    #[test]
    fn the_peer_is_appended_to_forwarded_for() {
        let req = head(
            "/",
            &[
                ("x-forwarded-for", "1.2.3.4"),
                ("x-forwarded-for", "5.6.7.8"),
            ],
        );
        let peer: IpAddr = "10.0.0.1".parse().expect("ip");
        assert_eq!(forwarded_for(&req, peer), b"1.2.3.4, 5.6.7.8, 10.0.0.1");
        assert_eq!(forwarded_for(&head("/", &[]), peer), b"10.0.0.1");
    }
}
