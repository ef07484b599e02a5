//! Configuration: the YAML file (docs/configuration.md), environment expansion, validation.
//!
//! Loading is three steps, in the spirit of River's split between file and
//! internal configuration: [`env::expand`] on the raw text, serde into the file
//! schema ([`file`](mod@file)), then `validate` into the [`Config`] the rest of sluice
//! uses. Every error names `path:line:column` where a position exists. This
//! module knows nothing of Redis or Pingora.
//!
//! The load pipeline is here; the model it produces has its own files:
//! [`model`] (the whole `Config` and the server-wide sections), [`route`]
//! (routes and limits), [`upstream`] (pools), [`identity`] (who a request
//! is); the limiter's settings are the limiter crate's, re-exported here.

mod checker;
pub mod consumers;
pub mod defaults;
pub mod diff;
pub mod duration;
pub mod env;
pub mod file;
pub mod forward;
pub mod identity;
pub mod jwks;
mod jwt;
pub mod model;
pub mod position;
pub mod problem;
mod resolve;
pub mod rls;
pub mod route;
pub mod template;
pub mod tls;
pub mod upstream;
pub mod usage;
mod validate;

// The model, named from here: `config::LimitConfig` wherever it is defined.
pub use crate::target::EscapedSlashes;
pub use duration::format_duration;
pub use identity::{AuthRequestConfig, IdentityConfig, JwksSource, JwtConfig, JwtKey};
pub use ipnet::IpNet;
pub use model::{
    ClientIpConfig, Config, ErrorStyle, FrontDoorConfig, HeaderStyle, ResponseConfig, ServerConfig,
    TracingConfig,
};
pub use resolve::resolve_server;
pub use route::{
    ExemptConfig, KeyPart, LimitConfig, OnMissing, Override, PathMatch, PlanSource, RouteAction,
    RouteConfig, StatusMatch,
};
pub use sluice_limiter::calendar;
pub use sluice_limiter::settings::{
    Algorithm, Backend, LimiterConfig, OnError, RedisConfig, RedisTlsConfig, SentinelConfig,
};
use std::fmt;
use std::path::{Path, PathBuf};
pub use upstream::{
    Balance, ResolvedServer, ServerSpec, UpstreamConfig, UpstreamProtocol, UpstreamTls,
};

/// One problem found in a configuration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// 1-based (line, column), when the problem has a place in the file.
    pub position: Option<(usize, usize)>,
    /// What is wrong, for a person.
    pub message: String,
}

/// Why a configuration could not be loaded. Its `Display` is one line per
/// problem, `PATH:LINE:COLUMN: message` (or `PATH: message`).
#[derive(Debug, thiserror::Error)]
pub struct ConfigError {
    /// The file.
    pub path: PathBuf,
    /// Every problem found (at least one).
    pub problems: Vec<Problem>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.problems.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            match problem.position {
                Some((line, column)) => write!(
                    f,
                    "{}:{line}:{column}: {}",
                    self.path.display(),
                    problem.message
                )?,
                None => write!(f, "{}: {}", self.path.display(), problem.message)?,
            }
        }
        Ok(())
    }
}

impl Config {
    /// Reads, expands, parses and validates the file at `path`, using the
    /// process environment for `${VAR}`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = read_config(path)?;
        Self::from_text(path, &text, |name| std::env::var(name).ok())
    }

    /// Like [`Config::load`] for `--check`: an unset environment variable
    /// (`${VAR}` without a default, `server.admin_token_env`, a JWT
    /// secret) is a warning naming it, and the file is checked with it
    /// empty — so CI can check a file without holding its secrets.
    pub fn load_for_check(path: &Path) -> Result<Config, ConfigError> {
        let text = read_config(path)?;
        Self::from_text_with(
            path,
            &text,
            |name| std::env::var(name).ok(),
            checker::Secrets::MayBeUnset,
        )
    }

    /// Like [`Config::load`] on `text` already read from `path`, with `lookup`
    /// for environment variables.
    pub fn from_text(
        path: &Path,
        text: &str,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        Self::from_text_with(path, text, lookup, checker::Secrets::Required)
    }

    /// [`Config::from_text`], with unset secrets treated as `secrets` says.
    fn from_text_with(
        path: &Path,
        text: &str,
        lookup: impl Fn(&str) -> Option<String>,
        secrets: checker::Secrets,
    ) -> Result<Config, ConfigError> {
        let fail = |problems: Vec<Problem>| ConfigError {
            path: path.to_path_buf(),
            problems,
        };
        let (expanded, unset) =
            expand_variables(text, &lookup, secrets).map_err(|p| fail(vec![p]))?;
        let parsed: file::FileConfig = if expanded.trim().is_empty() {
            file::FileConfig::default()
        } else {
            serde_yaml::from_str(&expanded).map_err(|e| fail(vec![serde_problem(&e)]))?
        };
        let index = position::PositionIndex::build(&expanded);
        let (mut config, mut warnings) =
            validate::validate(parsed, &index, &lookup, secrets).map_err(fail)?;
        warnings.splice(0..0, unset);
        resolve::resolve(&mut config, &index, &lookup).map_err(fail)?;
        let mut consumer_warnings = config.read_consumers()?;
        consumer_warnings.extend(config.read_rls_rules()?);
        config.warnings = fail(warnings)
            .to_string()
            .lines()
            .filter(|line| !line.is_empty())
            .map(str::to_string)
            .chain(consumer_warnings)
            .collect();
        Ok(config)
    }

    /// The plans a consumer may have: those listed by the limits that take
    /// their number from the consumer's plan (`limit_from: {consumer:
    /// plan}`). Any other plan name would change nothing.
    pub fn consumer_plans(&self) -> std::collections::BTreeSet<String> {
        self.routes
            .iter()
            .flat_map(|r| &r.limits)
            .filter(|l| l.limit_from == Some(PlanSource::ConsumerPlan))
            .flat_map(|l| l.plans.iter().map(|(name, _)| name.clone()))
            .collect()
    }

    /// Reads the rules of `server.rls` into it; their warnings. Their
    /// problems are reported against their own files.
    fn read_rls_rules(&mut self) -> Result<Vec<String>, ConfigError> {
        let Some(rls) = &mut self.server.rls else {
            return Ok(Vec::new());
        };
        let (rules, warnings) = rls::read_rules(&rls.config_path, rls.algorithm)?;
        rls.rules = std::sync::Arc::new(rules);
        Ok(warnings)
    }

    /// Reads the consumers file of `identity.api_key` into it; its
    /// warnings. Its problems are reported against that file.
    fn read_consumers(&mut self) -> Result<Vec<String>, ConfigError> {
        let plans = self.consumer_plans();
        let Some(api_key) = self.identity.api_key_mut() else {
            return Ok(Vec::new());
        };
        let consumers::KeyStore::File { path, consumers } = &mut api_key.store else {
            return Ok(Vec::new());
        };
        let (read, warnings) = consumers::load(path, &plans)?;
        *consumers = std::sync::Arc::new(read);
        Ok(warnings)
    }
}

/// The text of the config file at `path`.
fn read_config(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|e| ConfigError {
        path: path.to_path_buf(),
        problems: vec![Problem {
            position: None,
            message: format!("cannot read: {e}"),
        }],
    })
}

/// `text` with its `${VAR}`s expanded through `lookup`. A variable that is
/// unset (and has no default) is a problem; with `Secrets::MayBeUnset` it
/// is a warning instead (returned), and expands to nothing.
fn expand_variables(
    text: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
    secrets: checker::Secrets,
) -> Result<(String, Vec<Problem>), Problem> {
    let mut unset: Vec<String> = Vec::new();
    let mut warnings = Vec::new();
    loop {
        let known =
            |name: &str| lookup(name).or_else(|| unset.iter().any(|u| u == name).then(String::new));
        match env::expand(text, known) {
            Ok(expanded) => return Ok((expanded, warnings)),
            Err(env::ExpandError::Unset(v)) => {
                let message = format!(
                    "environment variable `{}` is not set (write ${{{}:-default}} to give a default)",
                    v.name, v.name
                );
                let position = Some((v.line, v.column));
                if secrets == checker::Secrets::Required || unset.contains(&v.name) {
                    return Err(Problem { position, message });
                }
                warnings.push(Problem {
                    position,
                    message: format!("warning: {message}; checked as empty, and the gateway refuses to start until it is set"),
                });
                unset.push(v.name);
            }
            Err(env::ExpandError::Unterminated(line, column)) => {
                return Err(Problem {
                    position: Some((line, column)),
                    message: "`${` without a closing `}`".into(),
                })
            }
        }
    }
}

pub(crate) fn serde_problem(error: &serde_yaml::Error) -> Problem {
    let text = error.to_string();
    // serde_yaml appends " at line L column C" to its message; we print the
    // position in front instead.
    let message = match text.find(" at line ") {
        Some(cut) => text[..cut].to_string(),
        None => text,
    };
    let message = message.trim_start_matches(": ").to_string();
    Problem {
        position: error.location().map(|l| (l.line(), l.column())),
        message,
    }
}

#[cfg(test)]
mod tests;
