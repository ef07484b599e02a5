//! A refused request and the gateway's own replies: the status, headers
//! and JSON body each [`Rejection`] is answered with (one place for every
//! 400, 401, 403, 404, 413, 429 and 503 of the policy), and gRPC's spelling
//! of them. Rendering only: nothing here decides.

use bytes::Bytes;
use http::HeaderValue;
use pingora::http::RequestHeader;

/// Why a request is answered by the gateway instead of the upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejection<'a> {
    /// The target or Host cannot be made canonical: 400.
    BadRequest,
    /// No route matches: 404.
    NotFound,
    /// A required identity is missing or invalid: 401, with the
    /// `WWW-Authenticate` challenge of the method that failed (or of each
    /// method a request could use, when it sent none), if it has one.
    Unauthorized {
        /// The challenge.
        challenge: Option<HeaderValue>,
    },
    /// An enforced limit denies (`response.status`, 429 by default).
    TooMany {
        /// The status to answer with.
        status: u16,
        /// The route's name.
        route: &'a str,
        /// The denying limit's name (empty when none can be named).
        limit: &'a str,
        /// The denying limit counts tokens (it reserves, or its response
        /// says its cost) rather than requests.
        counts_tokens: bool,
        /// Whole seconds to wait, at least 1.
        retry_after: u64,
        /// The rate-limit headers.
        headers: Vec<(&'static str, HeaderValue)>,
    },
    /// The limiter failed and `on_error: deny` refuses: 503.
    Unavailable {
        /// The route's name.
        route: &'a str,
    },
    /// The upstream could not be reached or answered wrongly (refused,
    /// reset, no healthy server): 502.
    BadGateway {
        /// The route's name, if one matched.
        route: Option<&'a str>,
    },
    /// The upstream did not connect or answer in time: 504.
    GatewayTimeout {
        /// The route's name, if one matched.
        route: Option<&'a str>,
    },
    /// The request body is larger than the route takes
    /// (`max_body_bytes`): 413.
    PayloadTooLarge {
        /// The route's name.
        route: Option<&'a str>,
    },
    /// The auth service refused the request (401 or 403): its answer,
    /// passed on.
    AuthRefused {
        /// 401 or 403.
        status: u16,
        /// The service's body.
        body: Bytes,
        /// The service's `WWW-Authenticate` and `Content-Type`.
        headers: Vec<(&'static str, HeaderValue)>,
    },
    /// A limit reserves by the request's JSON body (`reserve` with
    /// `required: true`) and the body does not say how much: 400.
    UnreadableBody {
        /// The route's name.
        route: &'a str,
        /// The limit that reads it.
        limit: &'a str,
        /// What is wrong with the body.
        reason: crate::config::usage::NoReservation,
    },
    /// A request body without a `Content-Length`, larger than a body read
    /// before the decision can be sent on: 411.
    LengthRequired {
        /// The route's name.
        route: &'a str,
    },
    /// Something in the gateway itself failed: 500.
    Internal,
}

/// A response the gateway writes itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// `Content-Type`.
    pub content_type: &'static str,
    /// Further headers, in order.
    pub headers: Vec<(&'static str, HeaderValue)>,
    /// The whole body.
    pub body: Bytes,
}

/// The JSON body of every rejection; absent fields are left out (written by
/// [`ErrorBody::to_json`]; the derive is the reference its test compares with).
#[derive(serde::Serialize)]
pub(super) struct ErrorBody<'a> {
    pub(super) error: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) route: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) limit: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) retry_after_seconds: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) reason: Option<&'a str>,
}

impl ErrorBody<'_> {
    pub(super) fn only(error: &'static str) -> Self {
        ErrorBody {
            error,
            route: None,
            limit: None,
            retry_after_seconds: None,
            reason: None,
        }
    }

    /// The body as JSON, fields in declaration order, written by hand: it is
    /// on every denial's path, where a serializer cost a thousand
    /// instructions for four fields. A test holds it equal to serde_json's.
    pub(super) fn to_json(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(96);
        out.extend_from_slice(b"{\"error\":");
        push_json_string(&mut out, self.error);
        if let Some(route) = self.route {
            out.extend_from_slice(b",\"route\":");
            push_json_string(&mut out, route);
        }
        if let Some(limit) = self.limit {
            out.extend_from_slice(b",\"limit\":");
            push_json_string(&mut out, limit);
        }
        if let Some(seconds) = self.retry_after_seconds {
            use std::io::Write as _;
            let _ = write!(out, ",\"retry_after_seconds\":{seconds}");
        }
        if let Some(reason) = self.reason {
            out.extend_from_slice(b",\"reason\":");
            push_json_string(&mut out, reason);
        }
        out.push(b'}');
        out
    }
}

/// Appends `text` as a JSON string. Names (`[a-z0-9_-]+`) are copied as
/// they are; anything else goes through serde_json's escaping.
pub(super) fn push_json_string(out: &mut Vec<u8>, text: &str) {
    let plain = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b'-';
    if text.bytes().all(plain) {
        out.push(b'"');
        out.extend_from_slice(text.as_bytes());
        out.push(b'"');
    } else {
        let _ = serde_json::to_writer(&mut *out, text);
    }
}

impl Rejection<'_> {
    /// The response that says this rejection: its status, headers and a
    /// JSON body `{"error": ...}` with the route, limit and wait it concerns
    /// (an auth service's refusal: the service's own answer).
    pub fn reply(&self) -> Reply {
        if let Rejection::AuthRefused {
            status,
            body,
            headers,
        } = self
        {
            return Reply {
                status: *status,
                content_type: "text/plain",
                headers: headers.clone(),
                body: body.clone(),
            };
        }
        self.reply_in(crate::config::ErrorStyle::Sluice)
    }

    /// The response that says this rejection with its body in `style`
    /// (see `error_styles`); an auth service's refusal stays its own.
    pub fn reply_in(&self, style: crate::config::ErrorStyle) -> Reply {
        if let Rejection::AuthRefused { .. } = self {
            return self.reply();
        }
        let (status, headers, body) = self.error_parts();
        let styled = super::error_styles::body(style, self, status, body.error);
        Reply {
            status,
            content_type: "application/json",
            headers,
            body: styled.unwrap_or_else(|| body.to_json()).into(),
        }
    }

    /// The status, headers and JSON body of a rejection sluice words itself.
    pub(super) fn error_parts(&self) -> (u16, Vec<(&'static str, HeaderValue)>, ErrorBody<'_>) {
        match self {
            Rejection::BadRequest => (400, Vec::new(), ErrorBody::only("bad_request")),
            Rejection::NotFound => (404, Vec::new(), ErrorBody::only("not_found")),
            Rejection::Unauthorized { challenge } => (
                401,
                challenge
                    .iter()
                    .map(|c| ("www-authenticate", c.clone()))
                    .collect(),
                ErrorBody::only("unauthorized"),
            ),
            Rejection::TooMany {
                status,
                route,
                limit,
                retry_after,
                headers,
                ..
            } => {
                let mut all = Vec::with_capacity(headers.len() + 1);
                all.push(("retry-after", HeaderValue::from(*retry_after)));
                all.extend(headers.iter().cloned());
                let body = ErrorBody {
                    error: "too_many_requests",
                    route: Some(route),
                    limit: Some(limit),
                    retry_after_seconds: Some(*retry_after),
                    reason: None,
                };
                (*status, all, body)
            }
            Rejection::Unavailable { route } => (
                503,
                vec![("retry-after", HeaderValue::from_static("1"))],
                ErrorBody {
                    route: Some(route),
                    ..ErrorBody::only("rate_limiter_unavailable")
                },
            ),
            Rejection::BadGateway { route } => on_route(502, "bad_gateway", *route),
            Rejection::GatewayTimeout { route } => on_route(504, "gateway_timeout", *route),
            Rejection::PayloadTooLarge { route } => on_route(413, "payload_too_large", *route),
            Rejection::LengthRequired { route } => on_route(411, "length_required", Some(route)),
            Rejection::UnreadableBody {
                route,
                limit,
                reason,
            } => (
                400,
                Vec::new(),
                ErrorBody {
                    route: Some(route),
                    limit: Some(limit),
                    reason: Some(reason.as_str()),
                    ..ErrorBody::only("bad_body")
                },
            ),
            Rejection::Internal | Rejection::AuthRefused { .. } => {
                (500, Vec::new(), ErrorBody::only("internal_error"))
            }
        }
    }
}

/// The parts of a rejection that names only its route.
fn on_route<'a>(
    status: u16,
    error: &'static str,
    route: Option<&'a str>,
) -> (u16, Vec<(&'static str, HeaderValue)>, ErrorBody<'a>) {
    let body = ErrorBody {
        route,
        ..ErrorBody::only(error)
    };
    (status, Vec::new(), body)
}

impl Rejection<'_> {
    /// The same rejection as a gRPC client understands it: HTTP 200,
    /// trailers-only (`grpc-status`, `grpc-message` in the one header block,
    /// no body). A denial is `RESOURCE_EXHAUSTED` (8) with the wait in
    /// `retry-after` and the message; a failed limiter or upstream is
    /// `UNAVAILABLE` (14), an upstream timeout `DEADLINE_EXCEEDED` (4).
    pub fn grpc_reply(&self) -> Reply {
        let (code, message, mut headers) = match self {
            Rejection::BadRequest => (13, "bad request".to_string(), Vec::new()),
            Rejection::UnreadableBody { reason, .. } => (3, reason.to_string(), Vec::new()),
            Rejection::LengthRequired { .. } => (3, "length required".to_string(), Vec::new()),
            Rejection::NotFound => (12, "no route".to_string(), Vec::new()),
            Rejection::Unauthorized { .. } => (16, "unauthorized".to_string(), Vec::new()),
            Rejection::AuthRefused { status: 403, .. } => {
                (7, "permission denied".to_string(), Vec::new())
            }
            Rejection::AuthRefused { .. } => (16, "unauthorized".to_string(), Vec::new()),
            Rejection::TooMany {
                route,
                limit,
                retry_after,
                headers,
                ..
            } => {
                let mut all = vec![("retry-after", HeaderValue::from(*retry_after))];
                all.extend(headers.iter().cloned());
                let message =
                    format!("rate limited: route {route}, limit {limit}; retry in {retry_after}s");
                (8, message, all)
            }
            Rejection::Unavailable { route } => (
                14,
                format!("rate limiter unavailable: route {route}"),
                Vec::new(),
            ),
            Rejection::BadGateway { route } => {
                let route = route.unwrap_or("-");
                (
                    14,
                    format!("upstream unavailable: route {route}"),
                    Vec::new(),
                )
            }
            Rejection::GatewayTimeout { route } => {
                let route = route.unwrap_or("-");
                (4, format!("upstream timed out: route {route}"), Vec::new())
            }
            Rejection::PayloadTooLarge { .. } => {
                (8, "request body too large".to_string(), Vec::new())
            }
            Rejection::Internal => (13, "internal error".to_string(), Vec::new()),
        };
        headers.insert(0, ("grpc-status", HeaderValue::from(code)));
        // Names and numbers only: printable ASCII without `%`, which
        // gRPC's percent-encoding leaves as it is.
        let message: String = message
            .chars()
            .map(|c| {
                if (c.is_ascii_graphic() && c != '%') || c == ' ' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        if let Ok(value) = HeaderValue::from_str(&message) {
            headers.insert(1, ("grpc-message", value));
        }
        Reply {
            status: 200,
            content_type: "application/grpc",
            headers,
            body: Bytes::new(),
        }
    }
}

/// Whether the request is a gRPC call (`content-type: application/grpc`,
/// `application/grpc+proto`, …), whose rejections take gRPC's form.
pub fn is_grpc(head: &RequestHeader) -> bool {
    head.headers
        .get(http::header::CONTENT_TYPE)
        .map(|v| v.as_bytes())
        .is_some_and(|v| v.len() >= 16 && v[..16].eq_ignore_ascii_case(b"application/grpc"))
}

/// A `respond:` route's answer, with the rate headers of its limits.
pub fn fixed_reply(status: u16, body: &str, headers: Vec<(&'static str, HeaderValue)>) -> Reply {
    Reply {
        status,
        content_type: "text/plain; charset=utf-8",
        headers,
        body: Bytes::copy_from_slice(body.as_bytes()),
    }
}
