//! Templated path matches: `match: {path: /users/{id}/orders}`.
//!
//! A template is a canonical path whose whole segments may be parameters,
//! `{name}`. It matches a request path with the same number of segments, the
//! literal ones equal and each parameter segment non-empty; a parameter's
//! value is that segment of the canonical path, as it is (a key part hashes
//! what is not safe to keep raw).

use std::fmt;

/// One segment of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// Must equal the request's segment.
    Literal(String),
    /// Any non-empty segment, captured under this name.
    Param(String),
}

/// A parsed path template: at least one parameter, names unique.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathTemplate {
    source: String,
    /// The segments after the leading `/`.
    segments: Vec<Segment>,
}

/// Why a path cannot be a template.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// `/a{id}` or `/{id}x`: a parameter takes a whole segment.
    #[error("a path parameter takes a whole segment (`/{{name}}/`), not `{0}`")]
    PartialSegment(String),
    /// `{}` or `{a b}`.
    #[error("a path parameter's name is [a-z0-9_]+, not `{0}`")]
    BadName(String),
    /// `/{id}/{id}`.
    #[error("the path parameter `{0}` appears twice")]
    Duplicate(String),
}

impl PathTemplate {
    /// Whether `path` is written as a template (contains a brace).
    pub fn is_template(path: &str) -> bool {
        path.contains(['{', '}'])
    }

    /// Parses `path` (which starts with `/`).
    pub fn parse(path: &str) -> Result<Self, TemplateError> {
        let rest = path.strip_prefix('/').unwrap_or(path);
        let mut segments = Vec::new();
        let mut names: Vec<&str> = Vec::new();
        for segment in rest.split('/') {
            if !segment.contains(['{', '}']) {
                segments.push(Segment::Literal(segment.to_string()));
                continue;
            }
            let name = segment
                .strip_prefix('{')
                .and_then(|s| s.strip_suffix('}'))
                .filter(|inner| !inner.contains(['{', '}']))
                .ok_or_else(|| TemplateError::PartialSegment(segment.to_string()))?;
            let valid = !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
            if !valid {
                return Err(TemplateError::BadName(name.to_string()));
            }
            if names.contains(&name) {
                return Err(TemplateError::Duplicate(name.to_string()));
            }
            names.push(name);
            segments.push(Segment::Param(name.to_string()));
        }
        Ok(Self {
            source: path.to_string(),
            segments,
        })
    }

    /// The template as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// The literal segments before the first parameter (for the route index).
    pub fn fixed_segments(&self) -> impl Iterator<Item = &str> {
        self.segments.iter().map_while(|s| match s {
            Segment::Literal(text) => Some(text.as_str()),
            Segment::Param(_) => None,
        })
    }

    /// The parameters' names, in order.
    pub fn params(&self) -> impl Iterator<Item = &str> {
        self.segments.iter().filter_map(|s| match s {
            Segment::Param(name) => Some(name.as_str()),
            Segment::Literal(_) => None,
        })
    }

    /// Its segments after the leading `/`, in order.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// This template with each parameter replaced by the same-named
    /// parameter of `source` captured from `path` (a rewrite's target);
    /// `None` when `path` does not match `source` or a parameter is
    /// missing from it.
    pub fn fill(&self, source: &PathTemplate, path: &str) -> Option<String> {
        let mut filled = String::with_capacity(path.len() + self.source.len());
        for segment in &self.segments {
            filled.push('/');
            match segment {
                Segment::Literal(text) => filled.push_str(text),
                Segment::Param(name) => filled.push_str(source.param(path, name)?),
            }
        }
        Some(filled)
    }

    /// Whether the template defines the parameter `name`.
    pub fn has_param(&self, name: &str) -> bool {
        self.params().any(|p| p == name)
    }

    /// Whether the canonical `path` matches.
    pub fn matches(&self, path: &str) -> bool {
        self.captures(path).is_some()
    }

    /// The value of parameter `name` in `path`, if the path matches.
    pub fn param<'p>(&self, path: &'p str, name: &str) -> Option<&'p str> {
        self.captures(path)?
            .find(|(param, _)| *param == name)
            .map(|(_, value)| value)
    }

    /// Each parameter with its value, if `path` matches.
    fn captures<'s, 'p>(
        &'s self,
        path: &'p str,
    ) -> Option<impl Iterator<Item = (&'s str, &'p str)>> {
        let rest = path.strip_prefix('/')?;
        let mut count = 0;
        for (i, got) in rest.split('/').enumerate() {
            count = i + 1;
            match self.segments.get(i)? {
                Segment::Literal(want) if want != got => return None,
                Segment::Param(_) if got.is_empty() => return None,
                _ => {}
            }
        }
        if count != self.segments.len() {
            return None;
        }
        Some(self.segments.iter().zip(rest.split('/')).filter_map(
            |(segment, value)| match segment {
                Segment::Param(name) => Some((name.as_str(), value)),
                Segment::Literal(_) => None,
            },
        ))
    }
}

impl fmt::Display for PathTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_whole_segments_and_captures_them() {
        let t = PathTemplate::parse("/users/{id}/orders/{order}").unwrap();
        assert_eq!(t.param("/users/42/orders/7", "id"), Some("42"));
        assert_eq!(t.param("/users/42/orders/7", "order"), Some("7"));
        assert_eq!(t.param("/users/42/orders/7", "nope"), None);
        for miss in [
            "/users/42/orders",
            "/users/42/orders/7/",
            "/users//orders/7",
            "/users/42/order/7",
            "/users/42/orders/7/x",
            "users/42/orders/7",
            "/",
        ] {
            assert!(!t.matches(miss), "{miss}");
        }
        assert_eq!(t.fixed_segments().collect::<Vec<_>>(), ["users"]);
        assert_eq!(t.params().collect::<Vec<_>>(), ["id", "order"]);
    }

    #[test]
    fn a_rewrite_template_is_filled_from_the_match() {
        let source = PathTemplate::parse("/api/users/{id}/orders/{order}").unwrap();
        let target = PathTemplate::parse("/internal/{order}/of/{id}").unwrap();
        assert_eq!(
            target.fill(&source, "/api/users/7/orders/9").as_deref(),
            Some("/internal/9/of/7")
        );
        assert_eq!(target.fill(&source, "/api/users/7"), None);
        let unknown = PathTemplate::parse("/x/{nope}").unwrap();
        assert_eq!(unknown.fill(&source, "/api/users/7/orders/9"), None);
    }

    #[test]
    fn a_parameter_value_is_the_canonical_segment() {
        let t = PathTemplate::parse("/files/{name}").unwrap();
        assert_eq!(t.param("/files/a%2Fb", "name"), Some("a%2Fb"));
        assert!(!t.matches("/files/a/b"));
    }

    #[test]
    fn bad_templates_say_why() {
        assert_eq!(
            PathTemplate::parse("/a{id}"),
            Err(TemplateError::PartialSegment("a{id}".into()))
        );
        assert_eq!(
            PathTemplate::parse("/{id"),
            Err(TemplateError::PartialSegment("{id".into()))
        );
        assert_eq!(
            PathTemplate::parse("/{}"),
            Err(TemplateError::BadName(String::new()))
        );
        assert_eq!(
            PathTemplate::parse("/{Id}"),
            Err(TemplateError::BadName("Id".into()))
        );
        assert_eq!(
            PathTemplate::parse("/{a}/{a}"),
            Err(TemplateError::Duplicate("a".into()))
        );
        assert_eq!(
            PathTemplate::parse("/{{a}}"),
            Err(TemplateError::PartialSegment("{{a}}".into()))
        );
    }
}
