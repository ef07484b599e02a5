//! The compiled route table: first match wins, in file order (DESIGN §2).

use crate::config::{PathMatch, RouteConfig};

/// Matches requests against the configured routes.
#[derive(Debug, Clone)]
pub struct RouteTable {
    matchers: Vec<Matcher>,
}

#[derive(Debug, Clone)]
struct Matcher {
    path: PathMatch,
    methods: Vec<String>,
    host: Option<String>,
}

impl RouteTable {
    /// Compiles the routes; index `i` of a match is `routes[i]`.
    pub fn new(routes: &[RouteConfig]) -> Self {
        let matchers = routes
            .iter()
            .map(|r| Matcher {
                path: r.path.clone(),
                methods: r.methods.clone(),
                host: r.host.clone(),
            })
            .collect();
        Self { matchers }
    }

    /// Index of the first route matching `method`, `host` (the Host header or
    /// URI authority, port allowed, any case) and `path` (no query).
    pub fn find(&self, method: &str, host: Option<&str>, path: &str) -> Option<usize> {
        let host = host.map(strip_port);
        self.matchers
            .iter()
            .position(|m| m.matches(method, host, path))
    }
}

impl Matcher {
    fn matches(&self, method: &str, host: Option<&str>, path: &str) -> bool {
        let path_ok = match &self.path {
            PathMatch::Any => true,
            PathMatch::Exact(p) => path == p,
            PathMatch::Prefix(p) => path.starts_with(p.as_str()),
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
}
