//! Collects configuration problems and warnings by path, resolved to
//! `line:column` positions, with the small checks every section shares. Both
//! the general validation and the JWT section use it; it depends on neither.

use super::duration::parse_duration;
use super::position::PositionIndex;
use super::Problem;
use std::time::Duration;

/// How a key that sluice names but does not implement yet is refused.
pub(super) const NOT_YET: &str = "is not supported yet";

/// Collects problems with their paths, resolved to positions at the end.
pub(super) struct Checker<'a> {
    index: &'a PositionIndex,
    env: &'a dyn Fn(&str) -> Option<String>,
    pub(super) problems: Vec<Problem>,
    pub(super) warnings: Vec<Problem>,
}

impl<'a> Checker<'a> {
    /// A checker resolving positions in `index` and reading environment
    /// variables through `env` (injectable, like the `${VAR}` expansion).
    pub(super) fn new(index: &'a PositionIndex, env: &'a dyn Fn(&str) -> Option<String>) -> Self {
        Self {
            index,
            env,
            problems: Vec::new(),
            warnings: Vec::new(),
        }
    }

    /// The environment variable `name`, through the injected lookup.
    pub(super) fn env(&self, name: &str) -> Option<String> {
        (self.env)(name)
    }

    pub(super) fn warning(&mut self, path: &str, message: impl Into<String>) {
        let position = self.index.find(path).map(|p| (p.line, p.column));
        self.warnings.push(Problem {
            position,
            message: format!("warning: {}", message.into()),
        });
    }

    pub(super) fn problem(&mut self, path: &str, message: impl Into<String>) {
        let position = self.index.find(path).map(|p| (p.line, p.column));
        self.problems.push(Problem {
            position,
            message: message.into(),
        });
    }

    pub(super) fn duration(
        &mut self,
        path: &str,
        text: Option<&str>,
        default: Duration,
    ) -> Duration {
        match text {
            None => default,
            Some(text) => match parse_duration(text) {
                Ok(d) => d,
                Err(message) => {
                    self.problem(path, format!("{}: {message}", leaf(path)));
                    default
                }
            },
        }
    }

    pub(super) fn not_supported<T>(&mut self, path: &str, value: &Option<T>, what: &str) {
        if value.is_some() {
            self.problem(path, format!("{what} {NOT_YET}"));
        }
    }

    pub(super) fn name(&mut self, path: &str, name: &str, what: &str) {
        let ok = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
        if !ok {
            self.problem(
                path,
                format!(
                    "{what} name `{name}` must be non-empty and use only a-z, 0-9, `_` and `-`"
                ),
            );
        }
    }
}

/// The last segment of a config path (`server.listen` → `listen`).
pub(super) fn leaf(path: &str) -> &str {
    path.rsplit('.').next().unwrap_or(path)
}
