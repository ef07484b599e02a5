//! `exempt:` at the top level, on a route and on a limit.

use super::super::checker::Checker;
use super::super::file::ExemptFile;
use super::super::problem::{KeyPath, ProblemKind};
use super::super::{ExemptConfig, IdentityConfig};
use super::server::cidr;

/// One `exempt:` block at `path`; absent is the empty exemption.
pub(super) fn exempt(c: &mut Checker, path: &KeyPath, f: Option<&ExemptFile>) -> ExemptConfig {
    let Some(f) = f else {
        return ExemptConfig::default();
    };
    let mut cidrs = Vec::with_capacity(f.cidrs.len());
    for (i, text) in f.cidrs.iter().enumerate() {
        if let Some(net) = cidr(c, &path.key("cidrs").index(i), text) {
            cidrs.push(net);
        }
    }
    let mut headers = Vec::with_capacity(f.headers.len());
    for (name, values) in &f.headers {
        let at = path.key("headers").key(name);
        c.header_name(&at, name);
        if values.is_empty() {
            c.problem(&at, ProblemKind::NoExemptValues(format!("headers.{name}")));
        }
        headers.push((name.to_ascii_lowercase(), values.clone()));
    }
    let mut claims = Vec::with_capacity(f.claims.len());
    for (name, values) in &f.claims {
        if values.is_empty() {
            let at = path.key("claims").key(name);
            c.problem(&at, ProblemKind::NoExemptValues(format!("claims.{name}")));
        }
        claims.push((name.clone(), values.clone()));
    }
    ExemptConfig {
        cidrs,
        headers,
        claims,
    }
}

/// What an exemption at `path` needs from the rest of the file: claims need a
/// verified token; headers are believed only from trusted proxies.
pub(super) fn check_sources(
    c: &mut Checker,
    path: &KeyPath,
    exempt: &ExemptConfig,
    identity: &IdentityConfig,
    has_trusted_proxies: bool,
) {
    if !exempt.claims.is_empty() && identity.jwt().is_none() {
        c.problem(&path.key("claims"), ProblemKind::ClaimsWithoutJwt);
    }
    if !exempt.headers.is_empty() && !has_trusted_proxies {
        c.warning(
            &path.key("headers"),
            ProblemKind::HeadersWithoutTrustedProxies,
        );
    }
}
