//! File schema → [`Config`], with every semantic check the reference
//! (docs/configuration.md) implies, one module per section. Each section
//! starts from its defaults (`config/defaults.rs`) and reports problems
//! through the [`Checker`] by typed [`KeyPath`]. Upstream names are resolved
//! afterwards, outside validation (`config/resolve.rs`).

mod api_key;
mod cors;
mod exempt;
mod forward;
mod limit;
mod limiter;
mod listeners;
mod rls;
mod route;
mod server;
mod tracing;
mod upstream;
mod usage;

use super::checker::{Checker, Secrets};
use super::file::FileConfig;
use super::position::PositionIndex;
use super::problem::{KeyPath, ProblemKind};
use super::{Config, IdentityConfig, KeyPart, PlanSource, Problem, RouteConfig};

/// Validates `file`; on success also returns the warnings.
pub(super) fn validate(
    file: FileConfig,
    index: &PositionIndex,
    env: &dyn Fn(&str) -> Option<String>,
    secrets: Secrets,
) -> Result<(Config, Vec<Problem>), Vec<Problem>> {
    let mut c = Checker::new(index, env).with_secrets(secrets);
    let server = server::server(&mut c, &file.server);
    let client_ip = server::client_ip(&mut c, &file.client_ip);
    let identity = server::identity(&mut c, file.identity.as_ref());
    let limiter = limiter::limiter(&mut c, &file.limiter);
    if let Some(keys) = identity.api_key() {
        let redis_store = matches!(keys.store, super::consumers::KeyStore::Redis { .. });
        if redis_store && limiter.backend == super::Backend::Local {
            let at = server::identity_path(file.identity.as_ref(), "api_key").key("store");
            c.problem(
                &at,
                ProblemKind::Needs("store: redis", "limiter.backend: redis"),
            );
        }
        if redis_store && file.server.admin_token_env.is_none() {
            let at = server::identity_path(file.identity.as_ref(), "api_key").key("store");
            c.warning(&at, ProblemKind::KeyStoreWithoutAdminToken);
        }
    }
    let certificates = identity
        .methods()
        .iter()
        .any(|m| matches!(m, IdentityConfig::ClientCert { .. }));
    if certificates && server.tls.iter().all(|l| l.client_auth.is_none()) {
        let at = server::identity_path(file.identity.as_ref(), "client_cert");
        c.problem(
            &at,
            ProblemKind::Needs(
                "identity.client_cert",
                "a server.tls listener with client_auth",
            ),
        );
    }
    let response = limiter::response(&mut c, &file.response);
    let upstreams = file
        .upstreams
        .iter()
        .map(|(name, u)| upstream::upstream(&mut c, name, u))
        .collect::<Vec<_>>();
    let context = route::RouteContext {
        server: &server,
        response: &response,
        upstreams: &upstreams,
    };
    let mut routes = route::routes(&mut c, &file.routes, &context);
    mark_credential_parts(&mut routes, &identity);
    if identity == IdentityConfig::None {
        warn_user_keys_without_identity(&mut c, &routes);
    }
    let top = KeyPath::root("exempt");
    let exempt = exempt::exempt(&mut c, &top, file.exempt.as_ref());
    let trusted = !client_ip.trusted_proxies.is_empty();
    exempt::check_sources(&mut c, &top, &exempt, &identity, trusted);
    check_route_sources(&mut c, &routes, &identity, trusted);
    let tracing = tracing::tracing(&mut c, file.tracing.as_ref());
    if !c.problems.is_empty() {
        return Err(c.problems);
    }
    let config = Config {
        server,
        client_ip,
        identity,
        limiter,
        response,
        upstreams,
        routes,
        exempt,
        tracing,
        warnings: Vec::new(),
    };
    Ok((config, c.warnings))
}

/// What the routes' and their limits' exemptions and `limit_from` read is
/// there to read (an identity, trusted proxies).
fn check_route_sources(
    c: &mut Checker,
    routes: &[RouteConfig],
    identity: &IdentityConfig,
    trusted: bool,
) {
    for (r, route) in routes.iter().enumerate() {
        let at = route_path(r).key("exempt");
        exempt::check_sources(c, &at, &route.exempt, identity, trusted);
        for (l, limit) in route.limits.iter().enumerate() {
            let at = route::limit_path(r, l);
            exempt::check_sources(c, &at.key("exempt"), &limit.exempt, identity, trusted);
            let at = at.key("limit_from");
            match &limit.limit_from {
                Some(PlanSource::Claim(_)) if identity.jwt().is_none() => {
                    c.problem(&at, ProblemKind::PlanClaimWithoutJwt);
                }
                Some(PlanSource::ConsumerPlan)
                    if identity.api_key().is_none() && !has_auth_request(identity) =>
                {
                    c.problem(&at, ProblemKind::ConsumerPlanWithoutApiKey);
                }
                Some(PlanSource::Header(_)) if !trusted => {
                    c.warning(&at, ProblemKind::PlanHeaderWithoutTrustedProxies);
                }
                _ => {}
            }
        }
    }
}

/// Marks, in every limit, the key parts that read a credential.
fn mark_credential_parts(routes: &mut [RouteConfig], identity: &IdentityConfig) {
    for limit in routes.iter_mut().flat_map(|route| route.limits.iter_mut()) {
        limit.credential_parts = limit
            .key
            .iter()
            .map(|part| identity.reads_credential(part))
            .collect();
    }
}

/// A `user` key part with no identity configured: every request is missing it.
fn warn_user_keys_without_identity(c: &mut Checker, routes: &[RouteConfig]) {
    for (r, route) in routes.iter().enumerate() {
        for (l, limit) in route.limits.iter().enumerate() {
            if limit.key.contains(&KeyPart::User) {
                let path = route::limit_path(r, l).key("key");
                c.warning(&path, ProblemKind::UserWithoutIdentity(limit.name.clone()));
            }
        }
    }
}

/// `routes[r]`.
fn route_path(r: usize) -> KeyPath {
    KeyPath::root("routes").index(r)
}

/// Whether an auth service is one of the identity methods (its answers name
/// plans too).
fn has_auth_request(identity: &IdentityConfig) -> bool {
    identity
        .methods()
        .iter()
        .any(|m| matches!(m, IdentityConfig::AuthRequest(_)))
}
