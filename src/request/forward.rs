//! Applies a route's forwarding rules (`crate::config::forward`): the path
//! and `Host` sent upstream, and the header edits both ways. Pure functions
//! of a head and the request's values, unit-tested here.

use crate::config::forward::{HeaderEdits, PathRewrite, Variable};
use http::{HeaderName, HeaderValue};
use pingora::http::{RequestHeader, ResponseHeader};

/// The origin-form target sent upstream under `rewrite`: the canonical
/// `path` rewritten, then the query of `sent` (the target that would be
/// sent otherwise) as it is. `None` when `path` does not have the shape the
/// route matched (it always has: the route matched it).
pub(crate) fn rewritten_target(rewrite: &PathRewrite, path: &str, sent: &[u8]) -> Option<Vec<u8>> {
    let rewritten = match rewrite {
        PathRewrite::Prefix { matched, with } => {
            let rest = path.strip_prefix(matched.as_str())?;
            let mut out = String::with_capacity(with.len() + rest.len() + 1);
            out.push_str(with);
            out.push_str(rest);
            if !out.starts_with('/') {
                out.insert(0, '/');
            }
            out
        }
        PathRewrite::Path { source, target } => target.fill(source, path)?,
    };
    let mut target = rewritten.into_bytes();
    if let Some(at) = sent.iter().position(|b| *b == b'?') {
        target.extend_from_slice(&sent[at..]);
    }
    Some(target)
}

/// The values a header template may name, for one request.
#[derive(Debug)]
pub struct Values<'a> {
    /// The client IP as the limits see it, as text.
    pub client_ip: String,
    /// The request's ID.
    pub request_id: &'a HeaderValue,
    /// The route's name.
    pub route: &'a str,
    /// The established identity, if any.
    pub user: Option<&'a [u8]>,
}

impl Values<'_> {
    /// The bytes of `variable`, or `None` when it has no value.
    pub fn get(&self, variable: Variable) -> Option<&[u8]> {
        match variable {
            Variable::ClientIp => Some(self.client_ip.as_bytes()),
            Variable::RequestId => Some(self.request_id.as_bytes()),
            Variable::Route => Some(self.route.as_bytes()),
            Variable::User => self.user,
        }
    }
}

/// A message head whose headers can be edited: the request sent upstream
/// or the response sent to the client.
pub trait EditableHead {
    /// Replaces every value of `name` by `value`.
    fn set(&mut self, name: HeaderName, value: HeaderValue) -> pingora::Result<()>;
    /// Adds a value of `name`.
    fn add(&mut self, name: HeaderName, value: HeaderValue) -> pingora::Result<()>;
    /// Removes every value of `name`.
    fn remove(&mut self, name: &HeaderName);
}

/// Implements [`EditableHead`] for a Pingora head type (both have the
/// same header methods, but no trait of their own).
macro_rules! editable_head {
    ($head:ty) => {
        impl EditableHead for $head {
            fn set(&mut self, name: HeaderName, value: HeaderValue) -> pingora::Result<()> {
                self.insert_header(name, value)
            }
            fn add(&mut self, name: HeaderName, value: HeaderValue) -> pingora::Result<()> {
                self.append_header(name, value).map(|_| ())
            }
            fn remove(&mut self, name: &HeaderName) {
                self.remove_header(name);
            }
        }
    };
}

editable_head!(RequestHeader);
editable_head!(ResponseHeader);

/// Applies `edits` to `head`: `remove`, then `set`, then `add`. A `set`
/// whose value cannot be rendered (a variable without a value) still
/// removes what the head had, so a client cannot supply a header the
/// gateway owns; an `add` that cannot be rendered adds nothing.
pub fn edit(
    head: &mut impl EditableHead,
    edits: &HeaderEdits,
    values: &Values<'_>,
) -> pingora::Result<()> {
    for name in &edits.remove {
        head.remove(name);
    }
    for (name, template) in &edits.set {
        match template.render(|v| values.get(v)) {
            Some(value) => head.set(name.clone(), value)?,
            None => head.remove(name),
        }
    }
    for (name, template) in &edits.add {
        if let Some(value) = template.render(|v| values.get(v)) {
            head.add(name.clone(), value)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::forward::HeaderTemplate;
    use crate::config::template::PathTemplate;

    fn prefix(matched: &str, with: &str) -> PathRewrite {
        PathRewrite::Prefix {
            matched: matched.into(),
            with: with.into(),
        }
    }

    fn target(rewrite: &PathRewrite, path: &str, sent: &str) -> String {
        let out = rewritten_target(rewrite, path, sent.as_bytes()).expect("rewritten");
        String::from_utf8(out).expect("utf-8")
    }

    #[test]
    fn a_stripped_prefix_leaves_a_path_and_the_query() {
        let strip = prefix("/api/users/", "");
        assert_eq!(target(&strip, "/api/users/7", "/api/users/7?x=1"), "/7?x=1");
        assert_eq!(target(&strip, "/api/users/", "/api/users/"), "/");
        let strip = prefix("/api", "");
        assert_eq!(target(&strip, "/api/users", "/api/users"), "/users");
        assert_eq!(target(&strip, "/api", "/api?q"), "/?q");
        // The query as sent, even a strange one; the path canonical.
        assert_eq!(
            target(&strip, "/api/a/c", "/api/a//b/../c?x=%2F&y"),
            "/a/c?x=%2F&y"
        );
    }

    #[test]
    fn a_replaced_prefix_and_a_filled_template() {
        let replace = prefix("/api/users/", "/v2/users/");
        assert_eq!(
            target(&replace, "/api/users/7", "/api/users/7"),
            "/v2/users/7"
        );
        let source = PathTemplate::parse("/api/users/{id}").unwrap();
        let to = PathTemplate::parse("/internal/users/{id}/profile").unwrap();
        let path = PathRewrite::Path { source, target: to };
        assert_eq!(
            target(&path, "/api/users/7", "/api/users/7?a=b"),
            "/internal/users/7/profile?a=b"
        );
        assert_eq!(rewritten_target(&path, "/elsewhere", b"/elsewhere"), None);
    }

    #[test]
    fn edits_remove_then_set_then_add_and_a_client_cannot_keep_a_set_header() {
        let mut req = RequestHeader::build("GET", b"/", None).unwrap();
        req.append_header("x-debug", "1").unwrap();
        req.append_header("x-user", "forged").unwrap();
        req.append_header("x-tag", "client").unwrap();
        let name = HeaderName::from_static;
        let edits = HeaderEdits {
            set: vec![
                (name("x-user"), HeaderTemplate::parse("{user}").unwrap()),
                (
                    name("x-client-ip"),
                    HeaderTemplate::parse("{client_ip}").unwrap(),
                ),
                (name("x-route"), HeaderTemplate::parse("r={route}").unwrap()),
            ],
            add: vec![(
                name("x-tag"),
                HeaderTemplate::parse("{request_id}").unwrap(),
            )],
            remove: vec![name("x-debug")],
        };
        let id = HeaderValue::from_static("id-1");
        let values = Values {
            client_ip: "10.0.0.1".into(),
            request_id: &id,
            route: "users",
            user: None,
        };
        edit(&mut req, &edits, &values).unwrap();
        let get = |n: &str| -> Vec<&[u8]> {
            req.headers
                .get_all(n)
                .iter()
                .map(|v| v.as_bytes())
                .collect()
        };
        assert!(get("x-debug").is_empty());
        assert!(get("x-user").is_empty(), "no user: the forged one is gone");
        assert_eq!(get("x-client-ip"), [b"10.0.0.1"]);
        assert_eq!(get("x-route"), [b"r=users"]);
        assert_eq!(get("x-tag"), [&b"client"[..], b"id-1"]);
    }
}
