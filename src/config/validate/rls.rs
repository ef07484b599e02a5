//! `server.rls`: the rate-limit service's listener and defaults. Its rules
//! are read after validation, from their own files (see `config::rls`).

use super::super::checker::Checker;
use super::super::defaults::limit as defaults;
use super::super::file::{AlgorithmFile, RlsFile, RlsHeadersFile};
use super::super::problem::RlsProblem;
use super::super::problem::{KeyPath, ProblemKind};
use super::super::rls::{RlsConfig, RlsHeaders};
use super::super::tls::TlsListenerConfig;
use super::super::Algorithm;
use super::listeners::{check_listen_addr, load_certs};

/// `server.rls`, its listener checked against the addresses already
/// `taken` by the other listeners. Its rules are left empty.
pub(super) fn rls(c: &mut Checker, f: &RlsFile, taken: &[&str]) -> RlsConfig {
    let at = KeyPath::root("server").key("rls");
    check_listen_addr(c, &at.key("listen"), &f.listen);
    if taken.contains(&f.listen.as_str()) {
        c.problem(
            &at.key("listen"),
            ProblemKind::ListenTwice(f.listen.clone()),
        );
    }
    if f.config.is_empty() {
        c.problem(&at.key("config"), ProblemKind::Empty("config".into()));
    }
    let algorithm = match f.algorithm.unwrap_or(AlgorithmFile::SlidingLog) {
        AlgorithmFile::SlidingLog => Algorithm::SlidingLog,
        AlgorithmFile::FixedWindow => Algorithm::FixedWindow,
        AlgorithmFile::SlidingWindow => Algorithm::SlidingWindow {
            buckets: defaults::BUCKETS,
        },
        // Each entry's bucket holds its own number (see `config::rls`).
        AlgorithmFile::TokenBucket => Algorithm::TokenBucket { burst: 1 },
        AlgorithmFile::Concurrency => {
            c.problem(&at.key("algorithm"), RlsProblem::Concurrency.into());
            Algorithm::SlidingLog
        }
    };
    let tls = f.certs.as_ref().map(|certs| {
        if certs.is_empty() {
            let item = "certificate ({cert: PATH, key: PATH})";
            c.problem(
                &at.key("certs"),
                ProblemKind::NeedsOne { key: "certs", item },
            );
        }
        TlsListenerConfig {
            listen: f.listen.clone(),
            certs: load_certs(c, &at.key("certs"), certs),
            client_auth: None,
        }
    });
    RlsConfig {
        listen: f.listen.clone(),
        config_path: f.config.clone(),
        algorithm,
        response_headers: match f.response_headers {
            Some(RlsHeadersFile::None) => RlsHeaders::None,
            Some(RlsHeadersFile::Draft) | None => RlsHeaders::Draft,
        },
        tls,
        rules: Default::default(),
    }
}
