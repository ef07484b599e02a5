//! `identity.api_key`: where the key is read and what an unknown one costs.
//! The consumers file itself is read after validation
//! (`config/consumers.rs`), so that its problems carry its own path.

use super::super::checker::Checker;
use super::super::consumers::{ApiKeyConfig, Failures};
use super::super::file::ApiKeyFile;
use super::super::problem::{KeyPath, ProblemKind};
use std::time::Duration;

/// Unknown keys one client IP may present per window, by default.
const FAILURES: Failures = Failures {
    limit: 20,
    window: Duration::from_secs(60),
};

pub(super) fn api_key(c: &mut Checker, at: &KeyPath, f: &ApiKeyFile) -> ApiKeyConfig {
    if f.query.is_some() {
        c.problem(
            &at.key("query"),
            ProblemKind::NotSupported("`api_key.query`"),
        );
    }
    let header = f.header.as_deref().unwrap_or("x-api-key");
    c.header_name(&at.key("header"), header);
    match f.store.as_deref().unwrap_or("file") {
        "file" => {}
        "redis" => c.problem(
            &at.key("store"),
            ProblemKind::NotSupported("`store: redis`"),
        ),
        other => c.problem(
            &at.key("store"),
            ProblemKind::BadKeyStore(other.to_string()),
        ),
    }
    if let Some(ttl) = f.cache_ttl.as_deref() {
        c.duration(&at.key("cache_ttl"), Some(ttl), Duration::from_secs(10));
    }
    let file = match &f.file {
        Some(file) => file.clone(),
        None => {
            c.problem(at, ProblemKind::Needs("api_key", "file"));
            String::new()
        }
    };
    ApiKeyConfig {
        header: header.to_ascii_lowercase(),
        file,
        consumers: Default::default(),
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
