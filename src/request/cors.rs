//! CORS for a route with `cors:`: sluice answers a browser's preflight
//! itself (before any limit counts it) and tells the page, on every answer
//! to an allowed origin (proxied, 429, 413, 502), that it may read the
//! response, `Retry-After` and the rate-limit headers included. An origin
//! not listed gets no CORS header at all, so the browser blocks the page.
//! The upstream's own `Access-Control-*` headers are replaced: two sources
//! of CORS answers on one response are refused by browsers.

use crate::config::forward::{CorsOrigins, CorsPolicy};
use crate::request::forward::EditableHead;
use http::header::{self, HeaderName, HeaderValue};
use pingora::http::RequestHeader;

/// The method a CORS preflight asks about: an `OPTIONS` with `Origin` and
/// `Access-Control-Request-Method`; `None` for any other request.
pub(crate) fn preflight_method(head: &RequestHeader) -> Option<&str> {
    if head.method != http::Method::OPTIONS || !head.headers.contains_key(header::ORIGIN) {
        return None;
    }
    head.headers
        .get(header::ACCESS_CONTROL_REQUEST_METHOD)?
        .to_str()
        .ok()
}

/// The `Access-Control-Allow-Origin` of an answer to `head` under
/// `policy`: `*` for any origin, the request's `Origin` when listed (one
/// value; compared without case), `None` when the request has no allowed
/// origin.
pub(crate) fn allowed_origin(policy: &CorsPolicy, head: &RequestHeader) -> Option<HeaderValue> {
    let mut origins = head.headers.get_all(header::ORIGIN).iter();
    let origin = origins.next()?;
    if origins.next().is_some() {
        return None;
    }
    match &policy.origins {
        CorsOrigins::Any => Some(HeaderValue::from_static("*")),
        CorsOrigins::Listed(listed) => {
            let sent = origin.to_str().ok()?;
            listed
                .iter()
                .any(|o| o.eq_ignore_ascii_case(sent))
                .then(|| origin.clone())
        }
    }
}

/// The CORS headers of every answer on a route with `policy`: the upstream's
/// own removed; for an allowed origin (`allowed`), the origin, the headers
/// the page may read and whether credentials are allowed; `Vary: Origin`
/// whenever the answer depends on the origin (listed origins), so a cache
/// never serves one origin's answer to another.
pub(crate) fn dress(
    head: &mut impl EditableHead,
    policy: &CorsPolicy,
    allowed: Option<&HeaderValue>,
) -> pingora::Result<()> {
    for name in UPSTREAM_OWNED {
        head.remove(&name);
    }
    if let CorsOrigins::Listed(_) = policy.origins {
        head.add(header::VARY, HeaderValue::from_static("Origin"))?;
    }
    let Some(origin) = allowed else {
        return Ok(());
    };
    head.set(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone())?;
    head.set(header::ACCESS_CONTROL_EXPOSE_HEADERS, policy.expose.clone())?;
    if policy.credentials {
        let yes = HeaderValue::from_static("true");
        head.set(header::ACCESS_CONTROL_ALLOW_CREDENTIALS, yes)?;
    }
    Ok(())
}

/// The response headers only sluice writes on a route with `cors`.
const UPSTREAM_OWNED: [HeaderName; 6] = [
    header::ACCESS_CONTROL_ALLOW_ORIGIN,
    header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
    header::ACCESS_CONTROL_EXPOSE_HEADERS,
    header::ACCESS_CONTROL_ALLOW_METHODS,
    header::ACCESS_CONTROL_ALLOW_HEADERS,
    header::ACCESS_CONTROL_MAX_AGE,
];

/// The headers of a preflight's `204` beyond [`dress`]'s, for an allowed
/// origin: the methods, the headers (those configured, or else those the
/// preflight asks for) and how long the browser may keep the answer.
pub(crate) fn preflight_headers(
    policy: &CorsPolicy,
    head: &RequestHeader,
) -> Vec<(&'static str, HeaderValue)> {
    let mut out = vec![("access-control-allow-methods", policy.allow_methods.clone())];
    let asked = head
        .headers
        .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
        .cloned();
    if let Some(headers) = policy.allow_headers.clone().or(asked) {
        out.push(("access-control-allow-headers", headers));
    }
    if let Some(max_age) = &policy.max_age {
        out.push(("access-control-max-age", max_age.clone()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use pingora::http::ResponseHeader;

    fn policy(origins: CorsOrigins) -> CorsPolicy {
        CorsPolicy {
            origins,
            allow_methods: HeaderValue::from_static("GET, POST"),
            allow_headers: None,
            expose: HeaderValue::from_static("retry-after"),
            max_age: None,
            credentials: false,
        }
    }

    fn request(method: &str, headers: &[(&str, &str)]) -> RequestHeader {
        let mut head = RequestHeader::build(method, b"/", None).unwrap();
        for (name, value) in headers {
            head.append_header(name.to_string(), *value).unwrap();
        }
        head
    }

    #[test]
    fn a_preflight_is_an_options_with_origin_and_a_requested_method() {
        let origin = ("origin", "https://a.example");
        let asks = ("access-control-request-method", "POST");
        assert_eq!(
            preflight_method(&request("OPTIONS", &[origin, asks])),
            Some("POST")
        );
        assert_eq!(preflight_method(&request("OPTIONS", &[asks])), None);
        assert_eq!(preflight_method(&request("OPTIONS", &[origin])), None);
        assert_eq!(preflight_method(&request("GET", &[origin, asks])), None);
    }

    #[test]
    fn only_a_listed_origin_is_allowed_and_it_is_echoed() {
        let listed = policy(CorsOrigins::Listed(vec!["https://a.example".into()]));
        let from = |o: &str| request("GET", &[("origin", o)]);
        let echoed = allowed_origin(&listed, &from("https://A.example"));
        assert_eq!(echoed.unwrap(), "https://A.example");
        assert!(allowed_origin(&listed, &from("https://b.example")).is_none());
        assert!(allowed_origin(&listed, &from("https://a.example.evil")).is_none());
        assert!(allowed_origin(&listed, &request("GET", &[])).is_none());
        let two = request(
            "GET",
            &[
                ("origin", "https://a.example"),
                ("origin", "https://a.example"),
            ],
        );
        assert!(allowed_origin(&listed, &two).is_none());
        let any = policy(CorsOrigins::Any);
        assert_eq!(
            allowed_origin(&any, &from("https://b.example")).unwrap(),
            "*"
        );
    }

    #[test]
    fn the_upstreams_cors_headers_are_replaced_and_a_refused_origin_gets_none() {
        let listed = policy(CorsOrigins::Listed(vec!["https://a.example".into()]));
        let mut response = ResponseHeader::build(200, None).unwrap();
        response
            .insert_header("access-control-allow-origin", "*")
            .unwrap();
        response.insert_header("vary", "Accept").unwrap();
        dress(&mut response, &listed, None).unwrap();
        assert!(response
            .headers
            .get("access-control-allow-origin")
            .is_none());
        let vary: Vec<_> = response.headers.get_all("vary").iter().collect();
        assert_eq!(vary, ["Accept", "Origin"]);
        let origin = HeaderValue::from_static("https://a.example");
        dress(&mut response, &listed, Some(&origin)).unwrap();
        assert_eq!(
            response.headers["access-control-allow-origin"],
            "https://a.example"
        );
        assert_eq!(
            response.headers["access-control-expose-headers"],
            "retry-after"
        );
        assert!(response
            .headers
            .get("access-control-allow-credentials")
            .is_none());
    }
}
