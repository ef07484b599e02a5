//! `identity.auth_request`: an auth service that already exists (what nginx's
//! `auth_request`, Traefik's `ForwardAuth` and Envoy's `ext_authz` ask) says
//! who a request is.
//!
//! For each request that carries one of the configured headers (its
//! credential), sluice sends the service a `GET` with those headers and the
//! request's method and target (`X-Original-Method`, `X-Original-URI`). The
//! target is the canonical path (dot segments resolved, escapes decoded as
//! routes see them) with the query as sent: what the upstream is sent, so a
//! service that allows `/public/*` is never asked about `/public/../admin`
//! while the upstream serves `/admin`. A 2xx
//! answer admits it: its `user_header` becomes the `user` (an answer without
//! one is an invalid identity) and its `plan_header` the plan. A 401 or 403
//! is passed to the client with the service's body and `WWW-Authenticate`.
//! Anything else — a timeout, a refused connection, a 5xx, a redirect — is a
//! failure, never an open door: the request is not known (503 when the
//! identity is `required`). 2xx answers may be reused (`cache_ttl`, off by
//! default) for a request that tells the service exactly the same: the same
//! credential, method and target, keyed by a SHA-256 of all three — an
//! answer about one path is never replayed for another.

use crate::config::AuthRequestConfig;
use crate::observe::metrics::IdentityMetrics;
use bytes::Bytes;
use http::HeaderValue;
use prometheus::{Histogram, IntCounter};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The most of a refusal's body passed on to the client.
pub const MAX_BODY: usize = 4096;
/// The most answers cached at once (the cache is emptied when full).
const MAX_CACHED: usize = 10_000;

/// What the service said of one request.
#[derive(Debug, Clone)]
pub enum AuthAnswer {
    /// 2xx: the user it named (none: it named none) and the plan.
    Known {
        /// `user_header`'s value.
        user: Option<Arc<str>>,
        /// `plan_header`'s value.
        plan: Option<Arc<str>>,
    },
    /// 401 or 403: passed to the client as it is.
    Refused {
        /// 401 or 403.
        status: u16,
        /// The service's body (at most 4 KiB).
        body: Bytes,
        /// The service's `WWW-Authenticate`.
        www_authenticate: Option<HeaderValue>,
        /// The service's `Content-Type`.
        content_type: Option<HeaderValue>,
    },
    /// No usable answer (a timeout, an error, another status).
    Failed(&'static str),
}

/// The metrics of the auth service.
struct AuthMetrics {
    ok: IntCounter,
    denied: IntCounter,
    failed: IntCounter,
    timeout: IntCounter,
    cached: IntCounter,
    seconds: Histogram,
}

/// The auth service of one configuration: its settings, pooled connections
/// and answer cache.
pub struct AuthService {
    config: AuthRequestConfig,
    client: reqwest::Client,
    cache: Mutex<HashMap<[u8; 32], (Instant, AuthAnswer)>>,
    metrics: AuthMetrics,
}

impl AuthService {
    /// The service of `config`; its connections are pooled by one client.
    pub fn new(config: &AuthRequestConfig, metrics: &IdentityMetrics) -> Result<Self, String> {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .pool_idle_timeout(std::time::Duration::from_secs(60))
            .build()
            .map_err(|e| format!("identity.auth_request: {e}"))?;
        let result = |r: &str| metrics.auth_requests.with_label_values(&[r]);
        Ok(Self {
            config: config.clone(),
            client,
            cache: Mutex::default(),
            metrics: AuthMetrics {
                ok: result("ok"),
                denied: result("denied"),
                failed: result("error"),
                timeout: result("timeout"),
                cached: result("cached"),
                seconds: metrics.auth_request_seconds.clone(),
            },
        })
    }

    /// Whether a 401 without a credential, and 503 on a failure.
    pub fn required(&self) -> bool {
        self.config.required
    }

    /// The request headers the service is sent (lower-case names).
    pub fn headers(&self) -> &[String] {
        &self.config.headers
    }

    /// Asks about a request with `method` and `target` (its canonical path
    /// and query) that carries the `sent` values of the configured headers
    /// (in their order; `None` for one it lacks).
    pub async fn ask(&self, method: &str, target: &[u8], sent: &[Option<&[u8]>]) -> AuthAnswer {
        let key = question_key(method, target, sent);
        if let Some(answer) = self.cached(&key) {
            self.metrics.cached.inc();
            return answer;
        }
        let started = Instant::now();
        let answer = match tokio::time::timeout(
            self.config.timeout,
            self.call(method, target, sent),
        )
        .await
        {
            Ok(answer) => answer,
            Err(_) => {
                self.metrics.timeout.inc();
                AuthAnswer::Failed("the auth service did not answer in time")
            }
        };
        self.metrics
            .seconds
            .observe(started.elapsed().as_secs_f64());
        match &answer {
            AuthAnswer::Known { .. } => {
                self.metrics.ok.inc();
                self.remember(key, &answer);
            }
            AuthAnswer::Refused { .. } => self.metrics.denied.inc(),
            AuthAnswer::Failed(why) if !why.contains("in time") => self.metrics.failed.inc(),
            AuthAnswer::Failed(_) => {}
        }
        answer
    }

    async fn call(&self, method: &str, target: &[u8], sent: &[Option<&[u8]>]) -> AuthAnswer {
        let mut request = self
            .client
            .get(&self.config.url)
            .header("x-original-method", method)
            .header("x-original-uri", target);
        for (name, value) in self.config.headers.iter().zip(sent) {
            if let Some(value) = value {
                request = request.header(name.as_str(), *value);
            }
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(e) => {
                log::warn!("identity.auth_request: {}", e.without_url());
                return AuthAnswer::Failed("the auth service could not be asked");
            }
        };
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = match status {
            401 | 403 => read_capped(response).await,
            _ => Bytes::new(),
        };
        let answer = read_answer(
            status,
            &headers,
            &self.config.user_header,
            self.config.plan_header.as_deref(),
            body,
        );
        if let AuthAnswer::Failed(_) = answer {
            log::warn!("identity.auth_request: the service answered {status}");
        }
        answer
    }

    fn cached(&self, key: &[u8; 32]) -> Option<AuthAnswer> {
        if self.config.cache_ttl.is_zero() {
            return None;
        }
        let cache = self.cache.lock().ok()?;
        let (at, answer) = cache.get(key)?;
        (at.elapsed() < self.config.cache_ttl).then(|| answer.clone())
    }

    fn remember(&self, key: [u8; 32], answer: &AuthAnswer) {
        if self.config.cache_ttl.is_zero() {
            return;
        }
        if let Ok(mut cache) = self.cache.lock() {
            if cache.len() >= MAX_CACHED {
                cache.retain(|_, (at, _)| at.elapsed() < self.config.cache_ttl);
                if cache.len() >= MAX_CACHED {
                    cache.clear();
                }
            }
            cache.insert(key, (Instant::now(), answer.clone()));
        }
    }
}

/// What the service's answer says: a 2xx names the user (`user_header`,
/// trimmed; none when absent, empty or not text) and the plan; a 401 or 403
/// is passed on with `body` (at most [`MAX_BODY`] bytes), `WWW-Authenticate`
/// and `Content-Type`; anything else is a failure, never an open door.
pub fn read_answer(
    status: u16,
    headers: &http::HeaderMap,
    user_header: &str,
    plan_header: Option<&str>,
    body: Bytes,
) -> AuthAnswer {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok().map(str::trim).map(Arc::<str>::from))
            .filter(|v| !v.is_empty())
    };
    match status {
        200..=299 => AuthAnswer::Known {
            user: text(user_header),
            plan: plan_header.and_then(text),
        },
        401 | 403 => AuthAnswer::Refused {
            status,
            body: body.slice(..body.len().min(MAX_BODY)),
            www_authenticate: headers.get("www-authenticate").cloned(),
            content_type: headers.get("content-type").cloned(),
        },
        _ => AuthAnswer::Failed("the auth service failed"),
    }
}

/// The cache key of one question to the service: everything it is told
/// (method, target, each credential header's value or its absence), each
/// length-prefixed so that no two questions share a key.
fn question_key(method: &str, target: &[u8], sent: &[Option<&[u8]>]) -> [u8; 32] {
    let mut hash = Sha256::new();
    for field in [method.as_bytes(), target] {
        hash.update((field.len() as u64).to_be_bytes());
        hash.update(field);
    }
    for value in sent {
        match value {
            Some(value) => {
                hash.update([1]);
                hash.update((value.len() as u64).to_be_bytes());
                hash.update(value);
            }
            None => hash.update([0]),
        }
    }
    hash.finalize().into()
}

/// The first [`MAX_BODY`] bytes of a response's body.
async fn read_capped(mut response: reqwest::Response) -> Bytes {
    let mut body = Vec::new();
    while let Ok(Some(chunk)) = response.chunk().await {
        let room = MAX_BODY - body.len();
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if body.len() >= MAX_BODY {
            break;
        }
    }
    Bytes::from(body)
}
