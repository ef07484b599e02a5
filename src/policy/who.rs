//! Who a request is, for its limits and its headers: the identity method
//! that decides (a JWT, an API key, a trusted header, a client certificate
//! or the auth service), what it establishes, and the plan it names.

use super::{client_ip, fails_closed, RequestView};
use crate::config::consumers::KeySource;
use crate::config::PlanSource;
use crate::observe::trace::AuthSpan;
use crate::policy::exempt::Subject;
use crate::policy::identity::auth_request::{AuthAnswer, AuthService};
use crate::policy::identity::{ApiKeys, Claims, Established, Identity, User};
use crate::policy::rejection::Rejection;
use crate::policy::state::{CompiledRoute, GatewayState};
use crate::policy::verdict::LimitReport;
use crate::request::header_values;
use crate::request::parts::query_value;
use crate::request::parts::PartValue;
use crate::request::HeaderValues;
use pingora::http::RequestHeader;
use std::borrow::Cow;
use std::time::Instant;

/// The request's plan name from `source`: a verified claim (a string, or a
/// number as JSON writes it), or a header sent once by a trusted proxy.
pub(super) fn plan_name(source: &PlanSource, subject: &Subject<'_>) -> Option<String> {
    match source {
        PlanSource::Claim(name) => match subject.claims?.get(name)? {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Number(n) => Some(n.to_string()),
            _ => None,
        },
        PlanSource::Header(name) if subject.trusted_peer => match (subject.header)(name) {
            HeaderValues::One(value) => std::str::from_utf8(value).ok().map(str::to_string),
            _ => None,
        },
        PlanSource::Header(_) | PlanSource::ConsumerPlan => None,
    }
}

/// Who a request is: its `user` key part, its verified token's claims and
/// its consumer's plan.
#[derive(Default)]
pub(super) struct Who<'v> {
    pub(super) user: Option<Cow<'v, [u8]>>,
    pub(super) claims: Option<Claims>,
    pub(super) plan: Option<std::sync::Arc<str>>,
}

/// Establishes who the request is, when anything needs it: the route's
/// limits or header edits, a required identity, or API keys (whose
/// consumer goes upstream). Refuses it with 429 when its client is over its
/// API-key failures, with 401 when an identity is required and missing or
/// invalid.
pub(super) async fn identify<'v, 'r>(
    state: &GatewayState,
    route: &'r CompiledRoute,
    view: &RequestView<'v>,
    report: &mut LimitReport,
) -> Result<Who<'v>, Rejection<'r>> {
    let api_keys = state.identity.api_keys().is_some();
    let needed = state.identity.required() || api_keys || route.keeps_user;
    if !needed && route.limits.is_empty() {
        return Ok(Who::default());
    }
    let trusted = state.client_ip.is_trusted(view.peer);
    let method = deciding_method(state, view, trusted);
    report.identity = method.map(Identity::name);
    let (established, service_failed) = establish(state, method, view, trusted, report).await?;
    // Who must be known: once any method is required, every request — one
    // with no credential, or with an invalid one of any method, optional or
    // not — is refused unless it is known. An optional method never lets a
    // junk credential skip the required one.
    let required = state.identity.required();
    let method_name = method.map_or("none", Identity::name);
    state
        .identity_decisions
        .count(method_name, &established.user);
    // A failed store or auth service never lets a request in as anonymous
    // where an identity is required.
    let store_refuses = established.store_failed && (required || fails_closed(state));
    if store_refuses || (service_failed && required) {
        return Err(Rejection::Unavailable { route: &route.name });
    }
    let known = matches!(established.user, User::Known(_));
    let by_api_key = matches!(method, Some(Identity::ApiKey(_)));
    if by_api_key && (known || established.unknown_key) {
        let client = client_ip(state, view.head, view.peer);
        report.client = Some(client);
        let unknown = established.unknown_key;
        if let Some(retry_after) = super::key_failures::over_limit(state, client, unknown).await {
            return Err(Rejection::TooMany {
                status: state.config.response.status,
                route: &route.name,
                limit: super::key_failures::LIMIT_NAME,
                counts_tokens: false,
                retry_after,
                headers: Vec::new(),
            });
        }
    }
    let user = match established.user {
        User::Known(user) => Some(user),
        User::Invalid(_) | User::Absent if required => {
            let challenge = challenge(state, method, &established.user);
            return Err(Rejection::Unauthorized { challenge });
        }
        User::Invalid(reason) => {
            log::debug!("identity ignored: {reason}");
            None
        }
        User::Absent => None,
    };
    if route.keeps_user || api_keys {
        report.user = user.as_deref().map(<[u8]>::to_vec);
    }
    Ok(Who {
        user,
        claims: established.claims,
        plan: established.plan,
    })
}

/// The API key a request sends, where `keys` reads it.
pub(super) fn sent_key<'v>(keys: &ApiKeys, head: &'v RequestHeader) -> PartValue<'v> {
    match &keys.source {
        KeySource::Header(name) => header_values(head, name).api_key(name).into(),
        KeySource::Query(name) => query_value(head.uri.query().unwrap_or("").as_bytes(), name),
    }
}

/// The identity method whose credential the request carries first (a
/// header identity counts only from a trusted proxy), if any.
/// The `WWW-Authenticate` challenge of a 401: that of the method that
/// decided (a bearer token's says whether it was invalid; an API key's
/// names where the key goes), or, when the request sent no credential, one
/// for each configured method that has a scheme. Methods without one
/// (a trusted header, a client certificate) add none.
fn challenge(
    state: &GatewayState,
    method: Option<&Identity>,
    user: &User<'_>,
) -> Option<http::HeaderValue> {
    let of = |method: &Identity, invalid: bool| match method {
        Identity::Jwt(_) if invalid => Some(r#"Bearer error="invalid_token""#.to_string()),
        Identity::Jwt(_) => Some("Bearer".to_string()),
        Identity::ApiKey(keys) => Some(match &keys.source {
            KeySource::Header(name) => format!(r#"ApiKey header="{name}""#),
            KeySource::Query(name) => format!(r#"ApiKey query="{name}""#),
        }),
        _ => None,
    };
    let challenges: Vec<String> = match method {
        Some(method) => of(method, matches!(user, User::Invalid(_)))
            .into_iter()
            .collect(),
        None => state
            .identity
            .methods()
            .iter()
            .filter_map(|m| of(m, false))
            .collect(),
    };
    if challenges.is_empty() {
        return None;
    }
    http::HeaderValue::from_str(&challenges.join(", ")).ok()
}

pub(super) fn deciding_method<'s>(
    state: &'s GatewayState,
    view: &RequestView<'_>,
    trusted: bool,
) -> Option<&'s Identity> {
    let head = view.head;
    let sent = |name: &str| !header_values(head, name).is_absent();
    state.identity.deciding(|method| match method {
        Identity::Header(name) => trusted && sent(name),
        Identity::Jwt(_) => method.token_header().is_some_and(sent),
        Identity::ApiKey(keys) => !matches!(sent_key(keys, head), PartValue::Missing),
        Identity::ClientCert { .. } => view.client_cert.is_some(),
        Identity::AuthRequest(service) => service.headers().iter().any(|name| sent(name)),
        _ => false,
    })
}

/// Who the request is by `method`, and whether an auth service failed to
/// say; an auth service's refusal is the answer.
pub(super) async fn establish<'v, 'r>(
    state: &GatewayState,
    method: Option<&Identity>,
    view: &RequestView<'v>,
    trusted: bool,
    report: &mut LimitReport,
) -> Result<(Established<'v>, bool), Rejection<'r>> {
    let head = view.head;
    Ok(match (method, view.client_cert) {
        (Some(Identity::ApiKey(keys)), _) => {
            let established = keys
                .establish_remote(sent_key(keys, head), &state.decider)
                .await;
            (established, false)
        }
        (Some(Identity::ClientCert { from, .. }), Some(cert)) => (
            Established::user(Identity::certificate_user(*from, cert)),
            false,
        ),
        (Some(Identity::AuthRequest(service)), _) => {
            return ask_auth_service(state, service, view, report).await;
        }
        (Some(method), _) => (
            method.establish(|name| header_values(head, name), trusted),
            false,
        ),
        (None, _) => (Established::user(User::Absent), false),
    })
}

/// The target the auth service is told: the canonical path the routes and
/// the upstream see, and the query exactly as sent (everything after the
/// request target's first `?`; a `?` never occurs before the query).
fn asked_target(view: &RequestView<'_>) -> Vec<u8> {
    let raw = view.head.raw_path();
    let query = raw.iter().position(|&b| b == b'?').map(|q| &raw[q..]);
    let mut target = Vec::with_capacity(view.path.len() + query.map_or(0, <[u8]>::len));
    target.extend_from_slice(view.path.as_bytes());
    target.extend_from_slice(query.unwrap_or_default());
    target
}

/// Asks the auth service about the request: who it is, or the service's
/// refusal as the answer; `true` with an unknown user when it failed.
pub(super) async fn ask_auth_service<'v, 'r>(
    state: &GatewayState,
    service: &AuthService,
    view: &RequestView<'_>,
    report: &mut LimitReport,
) -> Result<(Established<'v>, bool), Rejection<'r>> {
    let head = view.head;
    // A credential header sent twice is never believed: the service would
    // vouch for one value while the upstream might read the other.
    let twice = service
        .headers()
        .iter()
        .any(|name| matches!(header_values(head, name), HeaderValues::Several));
    if twice {
        let user = User::Invalid("a credential header sent more than once");
        return Ok((Established::user(user), false));
    }
    let sent: Vec<Option<&[u8]>> = service
        .headers()
        .iter()
        .map(|name| head.headers.get(name.as_str()).map(|v| v.as_bytes()))
        .collect();
    let target = asked_target(view);
    let start = Instant::now();
    let answer = service.ask(head.method.as_str(), &target, &sent).await;
    let result = match &answer {
        AuthAnswer::Known { .. } => "ok",
        AuthAnswer::Refused { .. } => "denied",
        AuthAnswer::Failed(_) => "failed",
    };
    let end = Instant::now();
    report.auth = Some(AuthSpan { start, end, result });
    match answer {
        AuthAnswer::Known { user, plan } => {
            let user = match user {
                Some(user) => User::Known(Cow::Owned(user.as_bytes().to_vec())),
                None => User::Invalid("the auth service named no user"),
            };
            Ok((
                Established {
                    plan,
                    ..Established::user(user)
                },
                false,
            ))
        }
        AuthAnswer::Refused {
            status,
            body,
            www_authenticate,
            content_type,
        } => {
            let headers = [
                ("content-type", content_type),
                ("www-authenticate", www_authenticate),
            ]
            .into_iter()
            .filter_map(|(name, value)| Some((name, value?)))
            .collect();
            state
                .identity_decisions
                .count("auth_request", &User::Invalid("refused"));
            Err(Rejection::AuthRefused {
                status,
                body,
                headers,
            })
        }
        AuthAnswer::Failed(why) => Ok((Established::user(User::Invalid(why)), true)),
    }
}
