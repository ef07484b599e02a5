//! Who the key part `user` is (docs/configuration.md, `identity`): a verified JWT claim,
//! a header set by a trusted auth layer, or the consumer an API key belongs to.
//!
//! A token is believed only once its signature verifies with the configured
//! key and algorithms and its `exp` / `nbf` hold; only then is its claim used.
//! An unverified claim never becomes a key: a missing, malformed, expired,
//! wrongly signed or `alg: none` token means "no user" (or 401 when
//! `required`). Nothing here touches the network.

use crate::config::consumers::{Consumer, Consumers, Failures, KeySource, KeyStore};
use crate::config::file::CertField;
use crate::config::IdentityConfig;
use crate::limiter::Decider;
use crate::observe::metrics::IdentityMetrics;
use crate::policy::identity::auth_request::AuthService;
use crate::policy::identity::key_store::RedisKeys;
use crate::request::client_cert::ClientCert;
use crate::request::parts::PartValue;
use crate::request::HeaderValues;
use prometheus::IntCounter;
use std::borrow::Cow;
use std::sync::Arc;

pub mod auth_request;
pub mod jwks;
mod jwt;
pub mod key_store;
pub use jwt::JwtVerifier;

/// The identity of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum User<'a> {
    /// No identity offered (or none configured).
    Absent,
    /// The identity, as key-part bytes.
    Known(Cow<'a, [u8]>),
    /// A token was offered but does not verify; `reason` is for logs.
    Invalid(&'static str),
}

/// A verified token's claims.
pub(crate) type Claims = serde_json::Map<String, serde_json::Value>;

/// What a request establishes about itself: its identity and, when it came
/// from a verified token, that token's claims (never an unverified one's).
#[derive(Debug, Clone, PartialEq)]
pub struct Established<'a> {
    /// The `user` key part.
    pub user: User<'a>,
    /// The verified token's claims, if a token verified.
    pub claims: Option<Claims>,
    /// The plan of the consumer whose API key the request carries.
    pub plan: Option<Arc<str>>,
    /// An API key was sent that no consumer has (or sent twice): it counts
    /// against the client's `failures`.
    pub unknown_key: bool,
    /// An API key was sent and its store could not say whose it is.
    pub store_failed: bool,
}

impl<'a> Established<'a> {
    /// Just `user`: no claims, no plan, no unknown key.
    pub fn user(user: User<'a>) -> Self {
        Established {
            user,
            claims: None,
            plan: None,
            unknown_key: false,
            store_failed: false,
        }
    }
}

/// `sluice_identity_requests_total{method, result}`: which method decided
/// who each request is, and what it found.
pub struct IdentityDecisions {
    /// By method (`header`, `jwt`, `api_key`, `client_cert`,
    /// `auth_request`, `none`), then result.
    counters: Vec<(&'static str, [IntCounter; 3])>,
}

impl IdentityDecisions {
    /// The counters, made once per configuration.
    pub fn new(metrics: &IdentityMetrics) -> Self {
        let counters = [
            "header",
            "jwt",
            "api_key",
            "client_cert",
            "auth_request",
            "none",
        ]
        .into_iter()
        .map(|method| {
            let result = |r: &str| metrics.requests.with_label_values(&[method, r]);
            (
                method,
                [result("known"), result("invalid"), result("absent")],
            )
        })
        .collect();
        Self { counters }
    }

    /// Counts one request whose identity `method` found `user`.
    pub fn count(&self, method: &str, user: &User<'_>) {
        let result = match user {
            User::Known(_) => 0,
            User::Invalid(_) => 1,
            User::Absent => 2,
        };
        if let Some((_, counters)) = self.counters.iter().find(|(m, _)| *m == method) {
            counters[result].inc();
        }
    }
}

/// Establishes request identities from the validated `identity` settings.
pub enum Identity {
    /// No identity configured: `user` is always absent.
    None,
    /// A header, believed only from trusted proxies.
    Header(String),
    /// A verified bearer token.
    Jwt(Box<JwtVerifier>),
    /// An API key a consumers store knows.
    ApiKey(ApiKeys),
    /// The connection's verified client certificate.
    ClientCert {
        /// What of it becomes the user.
        from: CertField,
        /// Answer 401 without one.
        required: bool,
    },
    /// An auth service asked about each request.
    AuthRequest(Box<AuthService>),
    /// Several methods, in order: the first whose credential a request
    /// carries decides.
    Several(Vec<Identity>),
}

/// API keys, looked up by their hash in a consumers store.
pub struct ApiKeys {
    /// Where a request carries its key.
    pub source: KeySource,
    store: Store,
    required: bool,
    /// Unknown keys one client IP may send per window.
    pub failures: Failures,
    hits: IntCounter,
    misses: IntCounter,
    errors: IntCounter,
    /// `sluice_identity_failures_total`.
    pub failed: IntCounter,
}

/// Where the consumers are.
enum Store {
    /// Read from the consumers file with the config.
    File(Arc<Consumers>),
    /// In Redis, looked up through a cache.
    Redis(RedisKeys),
}

impl ApiKeys {
    /// The Redis store, if the keys are kept there.
    pub fn redis_store(&self) -> Option<&RedisKeys> {
        match &self.store {
            Store::Redis(keys) => Some(keys),
            Store::File(_) => None,
        }
    }

    /// The plan the requests of consumer `id` get: from the consumers file,
    /// or from Redis (the consumer's plan, else the one its keys name).
    pub async fn plan_of_consumer(
        &self,
        id: &str,
        decider: &crate::limiter::Decider,
    ) -> Result<Option<String>, crate::limiter::LimiterError> {
        match &self.store {
            Store::File(consumers) => Ok(consumers
                .by_id(id)
                .and_then(|c| c.plan.as_deref().map(str::to_string))),
            Store::Redis(keys) => keys.plan_of(id, decider).await,
        }
    }

    /// The key a request sent (`sent`: its header's or query parameter's
    /// value), or what its absence (or ambiguity) establishes.
    fn key<'h, 'a>(&self, sent: PartValue<'h>) -> Result<Cow<'h, [u8]>, Established<'a>> {
        match sent {
            PartValue::Missing => Err(Established::user(User::Absent)),
            PartValue::One(key) if !key.is_empty() => Ok(key),
            _ => {
                let mut unknown = Established::user(User::Invalid("API key sent more than once"));
                unknown.unknown_key = true;
                Err(unknown)
            }
        }
    }

    /// What a lookup's answer establishes (and counts).
    fn answer<'a>(&self, found: Result<Option<Consumer>, ()>) -> Established<'a> {
        match found {
            Ok(Some(consumer)) => {
                self.hits.inc();
                let id = Cow::Owned(consumer.id.as_bytes().to_vec());
                let mut known = Established::user(User::Known(id));
                known.plan = consumer.plan;
                known
            }
            Ok(None) => {
                self.misses.inc();
                let mut unknown = Established::user(User::Invalid("unknown API key"));
                unknown.unknown_key = true;
                unknown
            }
            Err(()) => {
                self.errors.inc();
                let mut failed =
                    Established::user(User::Invalid("the API-key store did not answer"));
                failed.store_failed = true;
                failed
            }
        }
    }

    /// The identity the key a request sent establishes, from the consumers
    /// file (a Redis store is asked by [`ApiKeys::establish_remote`]; here
    /// its answer is a failed lookup).
    pub fn establish_local<'a>(&self, sent: PartValue<'_>) -> Established<'a> {
        let key = match self.key(sent) {
            Ok(key) => key,
            Err(established) => return established,
        };
        match &self.store {
            Store::File(consumers) => self.answer(Ok(consumers.find(&key).cloned())),
            Store::Redis(_) => self.answer(Err(())),
        }
    }

    /// The identity the key a request sent establishes, asking the Redis
    /// store through `decider` when its cache has no answer.
    pub async fn establish_remote<'a>(
        &self,
        sent: PartValue<'_>,
        decider: &Decider,
    ) -> Established<'a> {
        let Store::Redis(store) = &self.store else {
            return self.establish_local(sent);
        };
        let key = match self.key(sent) {
            Ok(key) => key,
            Err(established) => return established,
        };
        let found = store.find(&key, decider).await.map_err(|e| {
            log::debug!("API-key lookup failed: {e}");
        });
        self.answer(found)
    }
}

impl Identity {
    /// Builds the verifier. Fails only if key material that validation
    /// accepted cannot be parsed again (it can not, in practice).
    pub fn new(
        config: &IdentityConfig,
        key_prefix: &str,
        metrics: &IdentityMetrics,
    ) -> Result<Self, jsonwebtoken::errors::Error> {
        Ok(match config {
            IdentityConfig::None => Identity::None,
            IdentityConfig::Header(name) => Identity::Header(name.clone()),
            IdentityConfig::Jwt(jwt) => Identity::Jwt(Box::new(JwtVerifier::new(jwt, metrics)?)),
            IdentityConfig::ClientCert { from, required } => Identity::ClientCert {
                from: *from,
                required: *required,
            },
            IdentityConfig::AuthRequest(auth) => Identity::AuthRequest(Box::new(
                AuthService::new(auth, metrics)
                    .map_err(|_| jsonwebtoken::errors::ErrorKind::InvalidKeyFormat)?,
            )),
            IdentityConfig::Several(methods) => Identity::Several(
                methods
                    .iter()
                    .map(|m| Identity::new(m, key_prefix, metrics))
                    .collect::<Result<_, _>>()?,
            ),
            IdentityConfig::ApiKey(keys) => {
                let (store, label) = match &keys.store {
                    KeyStore::File { consumers, .. } => {
                        (Store::File(Arc::clone(consumers)), "file")
                    }
                    KeyStore::Redis { cache_ttl } => (
                        Store::Redis(RedisKeys::new(key_prefix, *cache_ttl)),
                        "redis",
                    ),
                };
                let lookups = |result: &str| metrics.lookups.with_label_values(&[label, result]);
                Identity::ApiKey(ApiKeys {
                    source: keys.source.clone(),
                    store,
                    required: keys.required,
                    failures: keys.failures,
                    hits: lookups("hit"),
                    misses: lookups("miss"),
                    errors: lookups("error"),
                    failed: metrics.failures.clone(),
                })
            }
        })
    }

    /// Whether a request without a valid identity must be refused (401): of
    /// one method, whether it is `required`; of several, whether any is —
    /// then a request with no credential, or an invalid one of any method,
    /// is refused.
    pub fn required(&self) -> bool {
        match self {
            Identity::Jwt(v) => v.required,
            Identity::ApiKey(keys) => keys.required,
            Identity::ClientCert { required, .. } => *required,
            Identity::AuthRequest(service) => service.required(),
            Identity::Several(methods) => methods.iter().any(Identity::required),
            _ => false,
        }
    }

    /// The method's name, as the access log, traces and metrics give it.
    pub fn name(&self) -> &'static str {
        match self {
            Identity::None | Identity::Several(_) => "none",
            Identity::Header(_) => "header",
            Identity::Jwt(_) => "jwt",
            Identity::ApiKey(_) => "api_key",
            Identity::ClientCert { .. } => "client_cert",
            Identity::AuthRequest(_) => "auth_request",
        }
    }

    /// The user a verified client certificate makes, by `from`.
    pub fn certificate_user<'a>(from: CertField, cert: &'a ClientCert) -> User<'a> {
        let value = match from {
            CertField::SanUri => cert.san_uri.first(),
            CertField::SanDns => cert.san_dns.first(),
            CertField::SubjectCn => cert.subject_cn.as_ref(),
            CertField::Fingerprint => Some(&cert.fingerprint),
        };
        match value {
            Some(value) if !value.is_empty() => User::Known(Cow::Borrowed(value.as_bytes())),
            _ => User::Invalid("the client certificate lacks the configured name"),
        }
    }

    /// The methods in the order they are tried.
    pub fn methods(&self) -> &[Identity] {
        match self {
            Identity::None => &[],
            Identity::Several(methods) => methods,
            one => std::slice::from_ref(one),
        }
    }

    /// The method that decides who a request is: the first whose
    /// credential it carries (`carries` says), if any. A credential that
    /// is present but invalid still decides: it never falls through to the
    /// next method, or a client could pick the weakest.
    pub fn deciding(&self, carries: impl Fn(&Identity) -> bool) -> Option<&Identity> {
        self.methods().iter().find(|m| carries(m))
    }

    /// The API keys, when an API key is one of the methods.
    pub fn api_keys(&self) -> Option<&ApiKeys> {
        self.methods().iter().find_map(|m| match m {
            Identity::ApiKey(keys) => Some(keys),
            _ => None,
        })
    }

    /// The identity header that only trusted proxies may set, if identity
    /// comes from a header: removed from requests of other peers before they
    /// go upstream, so the upstream never believes a client's own claim.
    pub fn trusted_header(&self) -> Option<&str> {
        self.methods().iter().find_map(|m| match m {
            Identity::Header(name) => Some(name.as_str()),
            _ => None,
        })
    }

    /// The header a `jwt` method reads its token from, if it is one.
    pub fn token_header(&self) -> Option<&str> {
        match self {
            Identity::Jwt(verifier) => Some(&verifier.header),
            _ => None,
        }
    }

    /// The identity of a request. `header` looks up a request header by
    /// lower-case name; `from_trusted_proxy` says whether the peer is one.
    /// A header sent more than once is [`User::Invalid`]: never a key.
    pub fn user<'a>(
        &self,
        header: impl Fn(&str) -> HeaderValues<'a>,
        from_trusted_proxy: bool,
    ) -> User<'a> {
        self.establish(header, from_trusted_proxy).user
    }

    /// The identity of a request, as [`Identity::user`], with the verified
    /// token's claims.
    pub fn establish<'a>(
        &self,
        header: impl Fn(&str) -> HeaderValues<'a>,
        from_trusted_proxy: bool,
    ) -> Established<'a> {
        let user = match self {
            Identity::Several(methods) => {
                let carries = |m: &Identity| match m {
                    Identity::Header(name) => {
                        from_trusted_proxy && !matches!(header(name), HeaderValues::Absent)
                    }
                    Identity::Jwt(v) => !matches!(header(&v.header), HeaderValues::Absent),
                    Identity::ApiKey(keys) => match &keys.source {
                        KeySource::Header(name) => !matches!(header(name), HeaderValues::Absent),
                        KeySource::Query(_) => false,
                    },
                    _ => false,
                };
                return match methods.iter().find(|m| carries(m)) {
                    Some(method) => method.establish(header, from_trusted_proxy),
                    None => Established::user(User::Absent),
                };
            }
            // The policy step reads the certificate itself (it is the
            // connection's, not the request head's).
            Identity::None | Identity::ClientCert { .. } | Identity::AuthRequest(_) => User::Absent,
            Identity::Header(name) if from_trusted_proxy => match header(name) {
                HeaderValues::One(value) if !value.is_empty() => User::Known(Cow::Borrowed(value)),
                HeaderValues::Several => User::Invalid("identity header sent more than once"),
                _ => User::Absent,
            },
            Identity::Header(_) => User::Absent,
            Identity::Jwt(verifier) => match header(&verifier.header) {
                HeaderValues::Absent => User::Absent,
                HeaderValues::One(value) => return verifier.establish(value),
                HeaderValues::Several => User::Invalid("token header sent more than once"),
            },
            // The policy step hands an API key to [`ApiKeys`] itself (it may
            // sit in the query, and the store may be remote).
            Identity::ApiKey(keys) => match &keys.source {
                KeySource::Header(name) => {
                    return keys.establish_local(header(name).api_key(name).into())
                }
                KeySource::Query(_) => User::Absent,
            },
        };
        Established::user(user)
    }
}
