//! `identity.api_key`: where the key is read and what an unknown one costs.
//! The consumers file itself is read after validation
//! (`config/consumers.rs`), so that its problems carry its own path.

use super::super::checker::Checker;
use super::super::consumers::{ApiKeyConfig, Failures, KeySource, KeyStore};
use super::super::file::ApiKeyFile;
use super::super::problem::{KeyPath, ProblemKind};
use std::time::Duration;

/// Unknown keys one client IP may present per window, by default.
const FAILURES: Failures = Failures {
    limit: 20,
    window: Duration::from_secs(60),
};

pub(super) fn api_key(c: &mut Checker, at: &KeyPath, f: &ApiKeyFile) -> ApiKeyConfig {
    let source = match (&f.header, &f.query) {
        (Some(_), Some(_)) => {
            let (owner, a, b) = ("`api_key` reads", "header", "query");
            c.problem(at, ProblemKind::NotBoth { owner, a, b });
            KeySource::Header(String::new())
        }
        (None, Some(name)) if !name.is_empty() => KeySource::Query(name.clone()),
        (None, Some(name)) => {
            c.problem(&at.key("query"), ProblemKind::BadQueryName(name.clone()));
            KeySource::Query(String::new())
        }
        (header, None) => {
            let header = header.as_deref().unwrap_or("x-api-key");
            c.header_name(&at.key("header"), header);
            KeySource::Header(header.to_ascii_lowercase())
        }
    };
    let store = match f.store.as_deref().unwrap_or("file") {
        "file" => {
            if f.cache_ttl.is_some() {
                c.problem(
                    &at.key("cache_ttl"),
                    ProblemKind::Needs("cache_ttl", "store: redis"),
                );
            }
            let path = f.file.clone().unwrap_or_else(|| {
                c.problem(at, ProblemKind::Needs("store: file", "file"));
                String::new()
            });
            KeyStore::File {
                path,
                consumers: Default::default(),
            }
        }
        "redis" => {
            if f.file.is_some() {
                c.problem(&at.key("file"), ProblemKind::Needs("file", "store: file"));
            }
            let at = at.key("cache_ttl");
            let cache_ttl = c.duration(&at, f.cache_ttl.as_deref(), Duration::from_secs(10));
            if cache_ttl.is_zero() {
                c.problem(&at, ProblemKind::Zero("cache_ttl".to_string()));
            }
            KeyStore::Redis { cache_ttl }
        }
        other => {
            c.problem(
                &at.key("store"),
                ProblemKind::BadKeyStore(other.to_string()),
            );
            KeyStore::Redis {
                cache_ttl: Duration::from_secs(10),
            }
        }
    };
    ApiKeyConfig {
        source,
        store,
        required: f.required,
        failures: f.failures.as_ref().map_or(FAILURES, |failures| {
            let at = at.key("failures");
            let limit = failures.limit.unwrap_or(FAILURES.limit);
            if limit == 0 {
                c.problem(&at.key("limit"), ProblemKind::ZeroLimit);
            }
            let window = c.duration(
                &at.key("window"),
                failures.window.as_deref(),
                FAILURES.window,
            );
            if window.is_zero() {
                c.problem(&at.key("window"), ProblemKind::Zero("window".to_string()));
            }
            Failures { limit, window }
        }),
    }
}
