//! `routes:`: matching, action, the limits' names and shared counters.

use super::super::checker::Checker;
use super::super::file::{MatchFile, RouteFile};
use super::super::problem::{KeyPath, ProblemKind};
use super::super::template::PathTemplate;
use super::super::{PathMatch, RouteAction, RouteConfig, ServerConfig, UpstreamConfig};
use super::limit::limit;
use super::route_path;
use super::server::check_between;
use std::collections::{HashMap, HashSet};

/// `routes[r].limits[l]`.
pub(super) fn limit_path(r: usize, l: usize) -> KeyPath {
    route_path(r).key("limits").index(l)
}

/// What a route's checks need from the rest of the file.
pub(super) struct RouteContext<'a> {
    /// The validated `server:` (defaults a route may override).
    pub server: &'a ServerConfig,
    /// The validated upstreams, by name.
    pub upstreams: &'a [UpstreamConfig],
    /// The validated `response:` (its header style a route may override).
    pub response: &'a crate::config::ResponseConfig,
}

/// Every route, with unique names and consistent shared counters.
pub(super) fn routes(
    c: &mut Checker,
    files: &[RouteFile],
    context: &RouteContext,
) -> Vec<RouteConfig> {
    let mut routes = Vec::with_capacity(files.len());
    let mut names = HashSet::new();
    for (r, f) in files.iter().enumerate() {
        if !names.insert(f.name.as_str()) {
            let kind = ProblemKind::Duplicate {
                what: "route",
                name: f.name.clone(),
                within: None,
            };
            c.problem(&route_path(r).key("name"), kind);
        }
        routes.push(route(c, r, f, context));
    }
    check_shares(c, &routes);
    routes
}

fn route(c: &mut Checker, r: usize, f: &RouteFile, context: &RouteContext) -> RouteConfig {
    let (server, upstreams) = (context.server, context.upstreams);
    let path = route_path(r);
    c.name(&path.key("name"), &f.name, "route");
    let (path_match, methods, host) = matcher(c, &path.key("match"), &f.matcher);
    let action = action(c, &path, f, upstreams);
    let mut limits = Vec::with_capacity(f.limits.len());
    let mut names = HashSet::new();
    for (l, file) in f.limits.iter().enumerate() {
        if !names.insert(file.name.as_str()) {
            let kind = ProblemKind::Duplicate {
                what: "limit",
                name: file.name.clone(),
                within: Some(f.name.clone()),
            };
            c.problem(&limit_path(r, l).key("name"), kind);
        }
        let template = match &path_match {
            PathMatch::Template(t) => Some(t),
            _ => None,
        };
        limits.push(limit(c, &limit_path(r, l), file, template));
    }
    let forward = super::forward::forward(c, &path, f, &path_match, &server.request_id_header);
    RouteConfig {
        max_body_bytes: f.max_body_bytes.unwrap_or(server.max_body_bytes),
        forward,
        name: f.name.clone(),
        path: path_match,
        methods,
        host,
        action,
        limits,
        exempt: super::exempt::exempt(c, &path.key("exempt"), f.exempt.as_ref()),
        rate_headers: f.rate_headers.unwrap_or(context.response.headers),
        errors: f.errors.unwrap_or_default(),
    }
}

/// `match:`: the path, the methods (upper-cased) and the canonical host.
fn matcher(
    c: &mut Checker,
    path: &KeyPath,
    m: &MatchFile,
) -> (PathMatch, Vec<String>, Option<String>) {
    let path_match = match (&m.path, &m.path_prefix) {
        (Some(_), Some(_)) => {
            let (owner, a, b) = ("use", "path", "path_prefix");
            c.problem(path, ProblemKind::NotBoth { owner, a, b });
            PathMatch::Any
        }
        (Some(p), None) if PathTemplate::is_template(p) => template(c, &path.key("path"), p),
        (Some(p), None) => PathMatch::Exact(checked_path(c, &path.key("path"), p)),
        (None, Some(p)) if PathTemplate::is_template(p) => {
            c.problem(
                &path.key("path_prefix"),
                ProblemKind::TemplateInPrefix(p.clone()),
            );
            PathMatch::Any
        }
        (None, Some(p)) => PathMatch::Prefix(checked_path(c, &path.key("path_prefix"), p)),
        (None, None) => PathMatch::Any,
    };
    let mut methods = Vec::new();
    for (i, method) in m.methods.iter().flatten().enumerate() {
        if http::Method::from_bytes(method.as_bytes()).is_err() || method.is_empty() {
            let kind = ProblemKind::BadMethod(method.clone());
            c.problem(&path.key("methods").index(i), kind);
        }
        methods.push(method.to_ascii_uppercase());
    }
    if m.methods.as_ref().is_some_and(|v| v.is_empty()) {
        c.problem(&path.key("methods"), ProblemKind::NoMethods);
    }
    let host = m
        .host
        .as_ref()
        .map(|h| match crate::target::canonical_host(h.as_bytes()) {
            Ok(Some(canonical)) => canonical.into_owned(),
            Ok(None) | Err(_) => {
                c.problem(&path.key("host"), ProblemKind::BadHost(h.clone()));
                h.to_ascii_lowercase()
            }
        });
    (path_match, methods, host)
}

/// `upstream:` or `respond:`.
fn action(
    c: &mut Checker,
    path: &KeyPath,
    f: &RouteFile,
    upstreams: &[UpstreamConfig],
) -> RouteAction {
    let nothing = RouteAction::Respond {
        status: 200,
        body: String::new(),
    };
    let (a, b) = ("upstream", "respond");
    match (&f.upstream, &f.respond) {
        (Some(_), Some(_)) => {
            let owner = "a route has";
            c.problem(path, ProblemKind::NotBoth { owner, a, b });
            nothing
        }
        (None, None) => {
            let owner = format!("route `{}`", f.name);
            c.problem(path, ProblemKind::NeedsEither { owner, a, b });
            nothing
        }
        (Some(name), None) => match upstreams.iter().position(|u| &u.name == name) {
            Some(i) => RouteAction::Upstream(i),
            None => {
                let kind = ProblemKind::UnknownUpstream {
                    name: name.clone(),
                    known: upstreams.iter().map(|u| u.name.clone()).collect(),
                };
                c.problem(&path.key("upstream"), kind);
                nothing
            }
        },
        (None, Some(r)) => {
            let status = r.status.unwrap_or(200);
            check_between(c, &path.key("respond").key("status"), status, (200, 599));
            RouteAction::Respond {
                status,
                body: r.body.clone(),
            }
        }
    }
}

/// What a template's parameter segment starts with.
const PARAMETER_OPENS: char = '{';

/// `path: /users/{id}/orders`: its literal segments canonical, each
/// parameter a whole segment with a unique name.
fn template(c: &mut Checker, path: &KeyPath, value: &str) -> PathMatch {
    match PathTemplate::parse(value) {
        Ok(template) => {
            // Its literal segments must be canonical, as any path's: each
            // parameter stands for one plain segment.
            let probe: Vec<&str> = value
                .split('/')
                .map(|s| {
                    if s.starts_with(PARAMETER_OPENS) {
                        "p"
                    } else {
                        s
                    }
                })
                .collect();
            let probe = probe.join("/");
            let slashes = crate::target::EscapedSlashes::Keep;
            match crate::target::canonical_path(probe.as_bytes(), slashes) {
                Ok(canonical) if canonical == probe => PathMatch::Template(template),
                Ok(_) => {
                    let kind = ProblemKind::BadPath {
                        value: value.to_string(),
                        error: "its literal segments are not canonical (no `//`, `.`, `..` or needless escapes)".into(),
                    };
                    c.problem(path, kind);
                    PathMatch::Any
                }
                Err(e) => {
                    let kind = ProblemKind::BadPath {
                        value: value.to_string(),
                        error: e.to_string(),
                    };
                    c.problem(path, kind);
                    PathMatch::Any
                }
            }
        }
        Err(e) => {
            c.problem(path, ProblemKind::BadTemplate(e));
            PathMatch::Any
        }
    }
}

/// A path pattern: it must be spelled as requests are matched (canonical).
fn checked_path(c: &mut Checker, path: &KeyPath, value: &str) -> String {
    if !value.starts_with('/') {
        c.problem(path, ProblemKind::PathWithoutSlash(value.to_string()));
        return value.to_string();
    }
    // Requests are matched on their canonical path: a pattern in any other
    // spelling would never match (or match less than it says).
    let slashes = crate::target::EscapedSlashes::Keep;
    match crate::target::canonical_path(value.as_bytes(), slashes) {
        Ok(canonical) if canonical == value => {}
        Ok(canonical) => {
            let kind = ProblemKind::NotCanonicalPath {
                value: value.to_string(),
                canonical: canonical.into_owned(),
            };
            c.problem(path, kind);
        }
        Err(e) => {
            let kind = ProblemKind::BadPath {
                value: value.to_string(),
                error: e.to_string(),
            };
            c.problem(path, kind);
        }
    }
    value.to_string()
}

/// Limits naming the same `share` use one counter, so they must count the
/// same way: same algorithm, limit, window and key parts (cost may differ).
fn check_shares(c: &mut Checker, routes: &[RouteConfig]) {
    let mut first: HashMap<&str, (usize, usize)> = HashMap::new();
    for (r, route) in routes.iter().enumerate() {
        let mut in_route = HashSet::new();
        for (l, limit) in route.limits.iter().enumerate() {
            let Some(share) = limit.share.as_deref() else {
                continue;
            };
            let path = limit_path(r, l).key("share");
            if !in_route.insert(share) {
                let kind = ProblemKind::ShareTwice {
                    route: route.name.clone(),
                    share: share.to_string(),
                };
                c.problem(&path, kind);
                continue;
            }
            let Some(&(fr, fl)) = first.get(share) else {
                first.insert(share, (r, l));
                continue;
            };
            let other = &routes[fr].limits[fl];
            let same = other.algorithm == limit.algorithm
                && other.limit == limit.limit
                && other.window == limit.window
                && other.key == limit.key;
            if !same {
                let kind = ProblemKind::ShareMismatch {
                    share: share.to_string(),
                    route: routes[fr].name.clone(),
                    limit: other.name.clone(),
                };
                c.problem(&path, kind);
            }
        }
    }
}
