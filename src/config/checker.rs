//! Collects configuration problems and warnings by [`KeyPath`], resolved to
//! `line:column` positions, with the small checks every section shares. Both
//! the general validation and the JWT section use it; it depends on neither.

use super::duration::parse_duration;
use super::position::PositionIndex;
use super::problem::{KeyPath, ProblemKind};
use super::Problem;
use std::time::Duration;

/// Whether the secrets a file names in environment variables must be set:
/// to run, yes; to check the file (`--check`, in CI), they may be unset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Secrets {
    /// An unset secret is a problem.
    Required,
    /// An unset secret is a warning naming it.
    MayBeUnset,
}

/// Collects problems with their paths, resolved to positions at the end.
pub(super) struct Checker<'a> {
    index: &'a PositionIndex,
    env: &'a dyn Fn(&str) -> Option<String>,
    secrets: Secrets,
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
            secrets: Secrets::Required,
            problems: Vec::new(),
            warnings: Vec::new(),
        }
    }

    /// This checker with unset secrets reported as `secrets` says.
    pub(super) fn with_secrets(mut self, secrets: Secrets) -> Self {
        self.secrets = secrets;
        self
    }

    /// A secret's variable that is unset or empty (`kind` says which): a
    /// problem, or, when only checking, a warning — the file is checked
    /// all the same, and the gateway still refuses to start without it.
    pub(super) fn secret_unset(&mut self, path: &KeyPath, kind: ProblemKind) {
        match self.secrets {
            Secrets::Required => self.problem(path, kind),
            Secrets::MayBeUnset => {
                let warning = self.at(
                    path,
                    format!("warning: {kind} (checked without it; the gateway refuses to start until it is set)"),
                );
                self.warnings.push(warning);
            }
        }
    }

    /// The environment variable `name`, through the injected lookup.
    pub(super) fn env(&self, name: &str) -> Option<String> {
        (self.env)(name)
    }

    fn at(&self, path: &KeyPath, message: String) -> Problem {
        let position = self.index.find(path.as_str()).map(|p| (p.line, p.column));
        Problem { position, message }
    }

    /// Something that works but deserves the operator's attention.
    pub(super) fn warning(&mut self, path: &KeyPath, kind: ProblemKind) {
        let warning = self.at(path, format!("warning: {kind}"));
        self.warnings.push(warning);
    }

    /// Something that makes the configuration unusable.
    pub(super) fn problem(&mut self, path: &KeyPath, kind: ProblemKind) {
        let problem = self.at(path, kind.to_string());
        self.problems.push(problem);
    }

    /// The bytes of `file` (a key, certificate or CA named at `path`), read
    /// when the configuration loads; `None`, with the problem reported,
    /// when it cannot be read.
    pub(super) fn read_file(&mut self, path: &KeyPath, file: &str) -> Option<Vec<u8>> {
        match std::fs::read(file) {
            Ok(bytes) => Some(bytes),
            Err(e) => {
                let kind = ProblemKind::CannotRead {
                    file: file.to_string(),
                    error: e.to_string(),
                };
                self.problem(path, kind);
                None
            }
        }
    }

    /// The duration at `path`, or `default` when it is absent or wrong.
    pub(super) fn duration(
        &mut self,
        path: &KeyPath,
        text: Option<&str>,
        default: Duration,
    ) -> Duration {
        match text.map(parse_duration) {
            None => default,
            Some(Ok(d)) => d,
            Some(Err(message)) => {
                let key = path.leaf().to_string();
                self.problem(path, ProblemKind::BadDuration { key, message });
                default
            }
        }
    }

    /// Checks a route, limit, upstream or share name: `[a-z0-9_-]+`.
    pub(super) fn name(&mut self, path: &KeyPath, name: &str, what: &'static str) {
        let ok = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
        if !ok {
            let name = name.to_string();
            self.problem(path, ProblemKind::BadName { what, name });
        }
    }

    /// Checks a header field name.
    pub(super) fn header_name(&mut self, path: &KeyPath, name: &str) {
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            self.problem(path, ProblemKind::BadHeaderName(name.to_string()));
        }
    }
}
