//! What a route changes on the way to its upstream and back: the path sent
//! (`rewrite`), the `Host` sent (`upstream_host`) and header edits
//! (`request_headers`, `response_headers`) whose values may name sluice's
//! own values (`{client_ip}`, `{request_id}`, `{route}`, `{user}`).
//!
//! These are the validated forms; the runtime that applies them is
//! the top-level `forward` module.

use super::template::PathTemplate;
use http::{HeaderName, HeaderValue};

/// A route's changes to what goes upstream and what comes back.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ForwardConfig {
    /// The path sent upstream instead of the request's (the query is kept).
    pub rewrite: Option<PathRewrite>,
    /// The `Host` sent upstream.
    pub upstream_host: UpstreamHost,
    /// Edits of the request head sent upstream.
    pub request_headers: HeaderEdits,
    /// Edits of the upstream's response head sent to the client.
    pub response_headers: HeaderEdits,
    /// The upstream's timeouts, overridden for this route.
    pub timeouts: RouteTimeouts,
    /// Further tries after a failed one.
    pub retries: Retries,
    /// Cross-origin requests from browsers (`cors:`), answered by sluice.
    pub cors: Option<CorsPolicy>,
}

/// `cors:` of a route, with its response header values made once.
#[derive(Debug, Clone, PartialEq)]
pub struct CorsPolicy {
    /// The origins whose pages may call the route.
    pub origins: CorsOrigins,
    /// `Access-Control-Allow-Methods` of a preflight's answer.
    pub allow_methods: HeaderValue,
    /// `Access-Control-Allow-Headers` of a preflight's answer; `None`: the
    /// headers the preflight asks for.
    pub allow_headers: Option<HeaderValue>,
    /// `Access-Control-Expose-Headers`: `expose`, `Retry-After`, the
    /// rate-limit headers and the request ID header.
    pub expose: HeaderValue,
    /// `Access-Control-Max-Age` (seconds); `None`: not sent.
    pub max_age: Option<HeaderValue>,
    /// `Access-Control-Allow-Credentials: true` is sent.
    pub credentials: bool,
}

/// `cors.origins`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CorsOrigins {
    /// `["*"]`: any origin (answered `*`; never with credentials).
    Any,
    /// These origins (`scheme://host[:port]`, lower case), each answered
    /// with itself.
    Listed(Vec<String>),
}

/// `timeouts:` of a route: each set one replaces the upstream's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RouteTimeouts {
    /// Connecting to a server.
    pub connect: Option<std::time::Duration>,
    /// Waiting for the server's response (between two reads).
    pub read: Option<std::time::Duration>,
}

/// `retries:` of a route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retries {
    /// Tries in all, the first included (1: no retry).
    pub attempts: u32,
    /// Retry a connection that failed before the request was sent.
    pub on_connect_error: bool,
    /// Retry these response statuses (idempotent methods only).
    pub statuses: Vec<u16>,
}

impl Default for Retries {
    /// One try: no retry.
    fn default() -> Self {
        Retries {
            attempts: 1,
            on_connect_error: true,
            statuses: Vec::new(),
        }
    }
}

impl ForwardConfig {
    /// Whether a header value names `{user}` (the identity must then be
    /// established even on a route without limits).
    pub fn uses_user(&self) -> bool {
        [&self.request_headers, &self.response_headers]
            .iter()
            .flat_map(|edits| edits.set.iter().chain(&edits.add))
            .any(|(_, value)| value.uses(Variable::User))
    }
}

/// `rewrite:`: how the canonical path becomes the path sent upstream.
#[derive(Debug, Clone, PartialEq)]
pub enum PathRewrite {
    /// The matched `path_prefix` replaced by `with` (`strip_prefix: true`
    /// is `with` empty); the result always starts with `/`.
    Prefix {
        /// The route's `path_prefix`.
        matched: String,
        /// What replaces it.
        with: String,
    },
    /// `path:`: a path whose `{name}` segments are filled from the route's
    /// `match.path` template.
    Path {
        /// The route's `match.path`.
        source: PathTemplate,
        /// The path to send.
        target: PathTemplate,
    },
}

/// `upstream_host:`: the `Host` the upstream is sent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum UpstreamHost {
    /// The client's `Host`, as received.
    #[default]
    Preserve,
    /// The chosen server's `host[:port]`, as written in `servers`.
    Upstream,
    /// This name.
    Literal(HeaderValue),
}

/// `request_headers:` or `response_headers:`. Applied in this order:
/// `remove`, then `set` (replaces every value the head had), then `add`
/// (appends a value).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HeaderEdits {
    /// Headers set, replacing what the head had.
    pub set: Vec<(HeaderName, HeaderTemplate)>,
    /// Headers appended.
    pub add: Vec<(HeaderName, HeaderTemplate)>,
    /// Headers removed.
    pub remove: Vec<HeaderName>,
}

impl HeaderEdits {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.add.is_empty() && self.remove.is_empty()
    }
}

/// A value sluice knows about the request, which a header value may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variable {
    /// `{client_ip}`: the client IP as the limits see it.
    ClientIp,
    /// `{request_id}`: the request's ID.
    RequestId,
    /// `{route}`: the route's name.
    Route,
    /// `{user}`: the established identity, if any.
    User,
}

impl Variable {
    /// Every variable with its name as written between braces.
    pub const ALL: [(&'static str, Variable); 4] = [
        ("client_ip", Variable::ClientIp),
        ("request_id", Variable::RequestId),
        ("route", Variable::Route),
        ("user", Variable::User),
    ];
}

/// One piece of a header value template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Written as is.
    Text(String),
    /// Replaced by the variable's value.
    Var(Variable),
}

/// A header value as configured: fixed, or pieces with variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderTemplate {
    /// No variable: the value itself, checked once.
    Fixed(HeaderValue),
    /// Text and variables, rendered per request.
    Pieces(Vec<Piece>),
}

/// Why a header value template is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderTemplateError {
    /// `{name}` that is not one of sluice's variables.
    #[error("`{{{0}}}` is not a variable (sluice knows {{client_ip}}, {{request_id}}, {{route}} and {{user}})")]
    UnknownVariable(String),
    /// A `{` without its `}`.
    #[error("a `{{` opens a variable that is never closed")]
    Unclosed,
    /// Bytes no header value may hold (control characters, line breaks).
    #[error("a header value is visible ASCII, spaces and tabs only")]
    BadText,
}

impl HeaderTemplate {
    /// Parses `text`: `{name}` is a variable, everything else is literal.
    pub fn parse(text: &str) -> Result<Self, HeaderTemplateError> {
        let mut pieces = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                pieces.push(Piece::Text(rest[..open].to_string()));
            }
            let after = &rest[open + 1..];
            let close = after.find('}').ok_or(HeaderTemplateError::Unclosed)?;
            let name = &after[..close];
            let variable = Variable::ALL
                .iter()
                .find(|(known, _)| *known == name)
                .map(|(_, v)| *v)
                .ok_or_else(|| HeaderTemplateError::UnknownVariable(name.to_string()))?;
            pieces.push(Piece::Var(variable));
            rest = &after[close + 1..];
        }
        if !rest.is_empty() {
            pieces.push(Piece::Text(rest.to_string()));
        }
        let texts_are_values = pieces.iter().all(|piece| match piece {
            Piece::Text(text) => HeaderValue::from_str(text).is_ok(),
            Piece::Var(_) => true,
        });
        if !texts_are_values {
            return Err(HeaderTemplateError::BadText);
        }
        match pieces.as_slice() {
            [] => Ok(HeaderTemplate::Fixed(HeaderValue::from_static(""))),
            [Piece::Text(text)] => HeaderValue::from_str(text)
                .map(HeaderTemplate::Fixed)
                .map_err(|_| HeaderTemplateError::BadText),
            _ => Ok(HeaderTemplate::Pieces(pieces)),
        }
    }

    /// Whether it names `variable`.
    pub fn uses(&self, variable: Variable) -> bool {
        match self {
            HeaderTemplate::Fixed(_) => false,
            HeaderTemplate::Pieces(pieces) => pieces.contains(&Piece::Var(variable)),
        }
    }

    /// The value for one request, with each variable's value from `value`;
    /// `None` when a variable has no value (no `{user}` established) or
    /// its value cannot be sent in a header.
    pub fn render<'v>(&self, value: impl Fn(Variable) -> Option<&'v [u8]>) -> Option<HeaderValue> {
        let pieces = match self {
            HeaderTemplate::Fixed(fixed) => return Some(fixed.clone()),
            HeaderTemplate::Pieces(pieces) => pieces,
        };
        let mut bytes = Vec::with_capacity(64);
        for piece in pieces {
            match piece {
                Piece::Text(text) => bytes.extend_from_slice(text.as_bytes()),
                Piece::Var(variable) => bytes.extend_from_slice(value(*variable)?),
            }
        }
        HeaderValue::from_bytes(&bytes).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_name_only_sluices_variables() {
        let t = HeaderTemplate::parse("ip={client_ip}; route={route}").unwrap();
        let value = |v: Variable| match v {
            Variable::ClientIp => Some(&b"10.0.0.1"[..]),
            Variable::Route => Some(&b"users"[..]),
            _ => None,
        };
        assert_eq!(
            t.render(value).unwrap().as_bytes(),
            b"ip=10.0.0.1; route=users"
        );
        assert!(t.uses(Variable::Route) && !t.uses(Variable::User));
        assert_eq!(
            HeaderTemplate::parse("prod").unwrap(),
            HeaderTemplate::Fixed(HeaderValue::from_static("prod"))
        );
        assert_eq!(
            HeaderTemplate::parse("{host}"),
            Err(HeaderTemplateError::UnknownVariable("host".into()))
        );
        assert_eq!(
            HeaderTemplate::parse("a{user"),
            Err(HeaderTemplateError::Unclosed)
        );
        assert_eq!(
            HeaderTemplate::parse("a\r\nb: c"),
            Err(HeaderTemplateError::BadText)
        );
    }

    #[test]
    fn a_value_that_cannot_be_a_header_is_not_rendered() {
        let t = HeaderTemplate::parse("{user}").unwrap();
        assert_eq!(t.render(|_| None), None);
        assert_eq!(t.render(|_| Some(&b"a\nb"[..])), None);
        assert_eq!(t.render(|_| Some(&b"alice"[..])).unwrap(), "alice");
    }
}
