//! A route's `rewrite`, `upstream_host`, `request_headers`,
//! `response_headers`, `timeouts` and `retries`: what it changes on the way
//! upstream and back, and how it tries (`cors` has its own module).

use super::super::checker::Checker;
use super::super::file::{HeaderEditsFile, RetriesFile, RewriteFile, RouteFile, RouteTimeoutsFile};
use super::super::forward::{
    ForwardConfig, HeaderEdits, HeaderTemplate, PathRewrite, Retries, RouteTimeouts, UpstreamHost,
};
use super::super::problem::{KeyPath, ProblemKind};
use super::super::template::PathTemplate;
use super::super::PathMatch;
use http::{HeaderName, HeaderValue};
use serde_yaml::Value;
use std::collections::BTreeMap;
use std::time::Duration;

/// Why a header cannot be edited by configuration (`None`: it can). The
/// framing and hop-by-hop headers are the connection's, `host` has its own
/// key, and the request ID header is sluice's.
pub(super) fn reserved(name: &HeaderName) -> Option<&'static str> {
    const HOP_BY_HOP: [&str; 8] = [
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
    ];
    if HOP_BY_HOP.contains(&name.as_str()) {
        return Some("it frames the message or belongs to one connection");
    }
    if name == http::header::HOST {
        return Some("the Host sent upstream is `upstream_host`");
    }
    None
}

/// The route's changes to what goes upstream and back.
pub(super) fn forward(
    c: &mut Checker,
    at: &KeyPath,
    f: &RouteFile,
    path_match: &PathMatch,
    request_id: &HeaderName,
) -> ForwardConfig {
    ForwardConfig {
        rewrite: f
            .rewrite
            .as_ref()
            .and_then(|r| rewrite(c, &at.key("rewrite"), r, path_match)),
        upstream_host: f
            .upstream_host
            .as_deref()
            .map(|h| upstream_host(c, &at.key("upstream_host"), h))
            .unwrap_or_default(),
        request_headers: f
            .request_headers
            .as_ref()
            .map(|e| edits(c, &at.key("request_headers"), e, request_id))
            .unwrap_or_default(),
        response_headers: f
            .response_headers
            .as_ref()
            .map(|e| edits(c, &at.key("response_headers"), e, request_id))
            .unwrap_or_default(),
        timeouts: f
            .timeouts
            .as_ref()
            .map(|t| timeouts(c, &at.key("timeouts"), t))
            .unwrap_or_default(),
        retries: f
            .retries
            .as_ref()
            .map(|r| retries(c, &at.key("retries"), r))
            .unwrap_or_default(),
        cors: f
            .cors
            .as_ref()
            .map(|f| super::cors::cors(c, &at.key("cors"), f, request_id)),
    }
}

/// `timeouts:`: each one set must be more than zero.
fn timeouts(c: &mut Checker, at: &KeyPath, f: &RouteTimeoutsFile) -> RouteTimeouts {
    let mut one = |key: &str, text: &Option<String>| {
        let text = text.as_deref()?;
        let value = c.duration(&at.key(key), Some(text), Duration::ZERO);
        if value.is_zero() {
            c.problem(&at.key(key), ProblemKind::Zero(key.to_string()));
        }
        Some(value)
    };
    RouteTimeouts {
        connect: one("connect", &f.connect),
        read: one("read", &f.read),
    }
}

/// `retries:`: 1 to 10 attempts, on `connect_error` and 5xx statuses.
fn retries(c: &mut Checker, at: &KeyPath, f: &RetriesFile) -> Retries {
    let attempts = f.attempts.unwrap_or(2);
    if !(1..=10).contains(&attempts) {
        let key = "attempts".to_string();
        c.problem(
            &at.key("attempts"),
            ProblemKind::Between {
                key,
                min: 1,
                max: 10,
            },
        );
    }
    let mut retries = Retries {
        attempts: attempts.clamp(1, 10),
        on_connect_error: f.on.is_none(),
        statuses: Vec::new(),
    };
    for (i, value) in f.on.iter().flatten().enumerate() {
        match value {
            Value::String(word) if word == "connect_error" => retries.on_connect_error = true,
            Value::Number(n) if n.as_u64().is_some_and(|n| (500..=599).contains(&n)) => {
                retries.statuses.extend(n.as_u64().map(|n| n as u16));
            }
            other => {
                let written = serde_yaml::to_string(other).unwrap_or_default();
                let kind = ProblemKind::BadRetryOn(written.trim().to_string());
                c.problem(&at.key("on").index(i), kind);
            }
        }
    }
    retries
}

/// `rewrite:`: exactly one way, and one the route's match supports.
fn rewrite(
    c: &mut Checker,
    at: &KeyPath,
    r: &RewriteFile,
    path_match: &PathMatch,
) -> Option<PathRewrite> {
    let strip = r.strip_prefix.filter(|strip| *strip);
    let given = [strip.is_some(), r.prefix.is_some(), r.path.is_some()];
    if given.iter().filter(|g| **g).count() != 1 {
        c.problem(at, ProblemKind::RewriteOne);
        return None;
    }
    if let Some(target) = &r.path {
        return rewrite_path(c, &at.key("path"), target, path_match);
    }
    let (key, with) = match &r.prefix {
        Some(with) => ("prefix", with.clone()),
        None => ("strip_prefix", String::new()),
    };
    let PathMatch::Prefix(matched) = path_match else {
        c.problem(&at.key(key), ProblemKind::RewriteNeedsPrefix(key));
        return None;
    };
    if !with.is_empty() && !with.starts_with('/') {
        c.problem(&at.key(key), ProblemKind::PathWithoutSlash(with));
        return None;
    }
    Some(PathRewrite::Prefix {
        matched: matched.clone(),
        with,
    })
}

/// `rewrite.path`: a path whose parameters all come from `match.path`.
fn rewrite_path(
    c: &mut Checker,
    at: &KeyPath,
    target: &str,
    path_match: &PathMatch,
) -> Option<PathRewrite> {
    if !target.starts_with('/') {
        c.problem(at, ProblemKind::PathWithoutSlash(target.to_string()));
        return None;
    }
    let parsed = match PathTemplate::parse(target) {
        Ok(parsed) => parsed,
        Err(e) => {
            c.problem(at, ProblemKind::BadTemplate(e));
            return None;
        }
    };
    let source = match path_match {
        PathMatch::Template(source) => source.clone(),
        // A fixed path fills nothing; any match may send one fixed path.
        _ => PathTemplate::parse("/").ok()?,
    };
    let named = path_match_template(path_match);
    for name in parsed.params() {
        if !source.has_param(name) {
            let kind = ProblemKind::RewriteParam {
                name: name.to_string(),
                template: named.clone(),
            };
            c.problem(at, kind);
            return None;
        }
    }
    Some(PathRewrite::Path {
        source,
        target: parsed,
    })
}

/// The route's template as written, if its match is one.
fn path_match_template(path_match: &PathMatch) -> Option<String> {
    match path_match {
        PathMatch::Template(t) => Some(t.as_str().to_string()),
        _ => None,
    }
}

/// `upstream_host:`: preserve, upstream, or a host name.
fn upstream_host(c: &mut Checker, at: &KeyPath, value: &str) -> UpstreamHost {
    match value {
        "preserve" => UpstreamHost::Preserve,
        "upstream" => UpstreamHost::Upstream,
        name => {
            let host = crate::target::canonical_host(name.as_bytes());
            match (host, HeaderValue::from_str(name)) {
                (Ok(Some(_)), Ok(header)) => UpstreamHost::Literal(header),
                _ => {
                    c.problem(at, ProblemKind::BadUpstreamHost(name.to_string()));
                    UpstreamHost::Preserve
                }
            }
        }
    }
}

/// `set`, `add` and `remove`: valid names, none reserved, values whose
/// variables sluice knows.
fn edits(
    c: &mut Checker,
    at: &KeyPath,
    f: &HeaderEditsFile,
    request_id: &HeaderName,
) -> HeaderEdits {
    let mut valued = |key: &str, map: &BTreeMap<String, String>| {
        let mut out = Vec::with_capacity(map.len());
        for (written, value) in map {
            let at = at.key(key).key(written);
            let Some(header) = edited_name(c, &at, written, request_id) else {
                continue;
            };
            match HeaderTemplate::parse(value) {
                Ok(template) => out.push((header, template)),
                Err(error) => {
                    let name = written.clone();
                    c.problem(&at, ProblemKind::BadHeaderValue { name, error });
                }
            }
        }
        out
    };
    let set = valued("set", &f.set);
    let add = valued("add", &f.add);
    let remove = f
        .remove
        .iter()
        .enumerate()
        .filter_map(|(i, written)| edited_name(c, &at.key("remove").index(i), written, request_id))
        .collect();
    HeaderEdits { set, add, remove }
}

/// A header name an edit may name: valid, and neither reserved nor the
/// request ID header.
fn edited_name(
    c: &mut Checker,
    at: &KeyPath,
    written: &str,
    request_id: &HeaderName,
) -> Option<HeaderName> {
    let Ok(header) = HeaderName::from_bytes(written.as_bytes()) else {
        c.problem(at, ProblemKind::BadHeaderName(written.to_string()));
        return None;
    };
    let why = reserved(&header)
        .or_else(|| (header == *request_id).then_some("sluice sets the request ID header itself"));
    if let Some(why) = why {
        let name = written.to_string();
        c.problem(at, ProblemKind::ReservedHeader { name, why });
        return None;
    }
    Some(header)
}
