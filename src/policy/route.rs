//! The compiled route table: first match wins, in file order (docs/configuration.md).

use crate::config::{PathMatch, RouteConfig};
use std::collections::HashMap;

/// Matches requests against the configured routes.
///
/// Routes are indexed by the complete path segments their pattern fixes (a
/// trie: `/api/v1/users/` sits under `api` → `v1` → `users`; a pattern's
/// unfinished last segment, `/api/us`, stops at `api`). A lookup walks the
/// request path's segments down the trie and tests only the routes met on
/// the way, plus those no segment indexes (any path, or a pattern that does
/// not start with `/`). Every candidate is tested in full, and the lowest
/// index wins, so the answer is exactly the linear scan's (first match in file
/// order) while the work depends on the path's depth, not the number of
/// routes.
#[derive(Debug, Clone)]
pub struct RouteTable {
    matchers: Vec<Matcher>,
    root: Node,
    /// Routes not in the trie, ascending.
    unindexed: Vec<usize>,
}

#[derive(Debug, Clone)]
struct Matcher {
    path: PathMatch,
    methods: Vec<String>,
    host: Option<String>,
}

/// One trie node: the routes whose fixed segments end here (ascending) and
/// the next segments.
#[derive(Debug, Clone, Default)]
struct Node {
    routes: Vec<usize>,
    children: HashMap<Box<str>, Node>,
}

impl RouteTable {
    /// Compiles the routes; index `i` of a match is `routes[i]`.
    pub fn new(routes: &[RouteConfig]) -> Self {
        let mut table = Self {
            matchers: Vec::with_capacity(routes.len()),
            root: Node::default(),
            unindexed: Vec::new(),
        };
        for (i, r) in routes.iter().enumerate() {
            table.matchers.push(Matcher {
                path: r.path.clone(),
                methods: r.methods.clone(),
                host: r.host.clone(),
            });
            let fixed = match &r.path {
                PathMatch::Exact(p) => p.strip_prefix('/').map(|rest| {
                    // Every segment must equal the request's.
                    rest.split('/').collect::<Vec<_>>()
                }),
                PathMatch::Prefix(p) => p.strip_prefix('/').map(|rest| {
                    // The last piece may be the start of a longer segment.
                    let mut pieces: Vec<&str> = rest.split('/').collect();
                    pieces.pop();
                    pieces
                }),
                // The literal segments before the first parameter.
                PathMatch::Template(t) => Some(t.fixed_segments().collect()),
                PathMatch::Any => None,
            };
            match fixed {
                Some(segments) => {
                    let mut node = &mut table.root;
                    for segment in segments {
                        node = node.children.entry(segment.into()).or_default();
                    }
                    node.routes.push(i);
                }
                None => table.unindexed.push(i),
            }
        }
        table
    }

    /// Index of the first route matching `method`, `host` (the Host header or
    /// URI authority, port allowed, any case) and `path` (no query).
    pub fn find(&self, method: &str, host: Option<&str>, path: &str) -> Option<usize> {
        let host = host.map(strip_port);
        let mut best = self.first_match(&self.unindexed, None, method, host, path);
        let mut node = &self.root;
        best = self.first_match(&node.routes, best, method, host, path);
        if let Some(rest) = path.strip_prefix('/') {
            for segment in rest.split('/') {
                match node.children.get(segment) {
                    Some(next) => node = next,
                    None => break,
                }
                best = self.first_match(&node.routes, best, method, host, path);
            }
        }
        best
    }

    /// The first of `candidates` (ascending) below `best` that matches.
    fn first_match(
        &self,
        candidates: &[usize],
        best: Option<usize>,
        method: &str,
        host: Option<&str>,
        path: &str,
    ) -> Option<usize> {
        candidates
            .iter()
            .take_while(|&&i| best.is_none_or(|b| i < b))
            .find(|&&i| self.matchers[i].matches(method, host, path))
            .copied()
            .or(best)
    }
}

impl Matcher {
    fn matches(&self, method: &str, host: Option<&str>, path: &str) -> bool {
        let path_ok = match &self.path {
            PathMatch::Any => true,
            PathMatch::Exact(p) => path == p,
            PathMatch::Prefix(p) => path.starts_with(p.as_str()),
            PathMatch::Template(t) => t.matches(path),
        };
        path_ok
            && (self.methods.is_empty() || self.methods.iter().any(|m| m == method))
            && match (&self.host, host) {
                (None, _) => true,
                (Some(want), Some(got)) => want.eq_ignore_ascii_case(got),
                (Some(_), None) => false,
            }
    }
}

fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        // [v6]:port
        return host
            .split_once(']')
            .map(|(h, _)| &host[..h.len() + 1])
            .unwrap_or(host);
    }
    match host.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RouteAction;

    fn route(path: PathMatch, methods: &[&str], host: Option<&str>) -> RouteConfig {
        RouteConfig {
            name: "r".into(),
            path,
            methods: methods.iter().map(|m| m.to_string()).collect(),
            host: host.map(str::to_string),
            action: RouteAction::Respond {
                status: 200,
                body: String::new(),
            },
            limits: vec![],
            exempt: Default::default(),
            max_body_bytes: 0,
            forward: Default::default(),
            rate_headers: crate::config::HeaderStyle::Legacy,
            errors: Default::default(),
        }
    }

    #[test]
    fn first_match_wins() {
        let table = RouteTable::new(&[
            route(PathMatch::Exact("/a".into()), &["POST"], None),
            route(PathMatch::Prefix("/a".into()), &[], Some("api.example.com")),
            route(PathMatch::Any, &[], None),
        ]);
        assert_eq!(table.find("POST", None, "/a"), Some(0));
        assert_eq!(
            table.find("GET", Some("API.example.com:8080"), "/a"),
            Some(1)
        );
        assert_eq!(table.find("GET", Some("other"), "/ab"), Some(2));
        assert_eq!(table.find("GET", None, "/ab"), Some(2));
        let strict =
            RouteTable::new(&[route(PathMatch::Prefix("/sms/".into()), &[], Some("[::1]"))]);
        assert_eq!(strict.find("GET", Some("[::1]:80"), "/sms/x"), Some(0));
        assert_eq!(strict.find("GET", None, "/sms/x"), None);
        assert_eq!(strict.find("GET", Some("[::1]"), "/sms"), None);
    }

    fn template(path: &str) -> PathMatch {
        PathMatch::Template(crate::config::template::PathTemplate::parse(path).unwrap())
    }

    /// The first matching route in file order, the plain way.
    fn linear(
        routes: &[RouteConfig],
        method: &str,
        host: Option<&str>,
        path: &str,
    ) -> Option<usize> {
        let table = RouteTable::new(routes);
        let host = host.map(strip_port);
        table
            .matchers
            .iter()
            .position(|m| m.matches(method, host, path))
    }

    #[test]
    fn index_finds_what_a_linear_scan_finds() {
        let patterns = [
            PathMatch::Prefix("/api/v1/".into()),
            PathMatch::Exact("/api/v1".into()),
            PathMatch::Prefix("/api/v1/us".into()),
            PathMatch::Exact("/".into()),
            PathMatch::Prefix("/".into()),
            PathMatch::Prefix("/api".into()),
            PathMatch::Exact("/api/v1/users/".into()),
            PathMatch::Prefix("/api//x".into()),
            PathMatch::Any,
            PathMatch::Prefix("/static/".into()),
            PathMatch::Exact("/api/v1/users".into()),
            PathMatch::Prefix("".into()),
            template("/api/{version}/users"),
            template("/api/v1/users/{id}"),
            template("/{anything}"),
        ];
        let paths = [
            "/",
            "",
            "/api",
            "/api/",
            "/api/v1",
            "/api/v1/",
            "/api/v1/users",
            "/api/v1/users/",
            "/api/v1/user",
            "/api/v1/users/7",
            "/api//x/y",
            "/apix",
            "/static",
            "/static/a.css",
            "//",
            "/api/v2/users",
            "/api//users",
            "/api/v1/users/7/",
            "*",
        ];
        let methods = [&["GET"][..], &[], &["POST"]];
        let hosts = [None, Some("a.example")];
        // Every order of a few patterns, with varied methods and hosts.
        for start in 0..patterns.len() {
            let routes: Vec<RouteConfig> = (0..patterns.len())
                .map(|j| {
                    let k = (start + j * 5) % patterns.len();
                    route(patterns[k].clone(), methods[j % 3], hosts[j % 2])
                })
                .collect();
            let table = RouteTable::new(&routes);
            for path in paths {
                for method in ["GET", "POST"] {
                    for host in [None, Some("a.example:80"), Some("b.example")] {
                        assert_eq!(
                            table.find(method, host, path),
                            linear(&routes, method, host, path),
                            "{method} {host:?} {path} with {routes:?}"
                        );
                    }
                }
            }
        }
    }
}
