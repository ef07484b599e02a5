//! Every problem and warning the configuration can report, as a kind with
//! its own wording, and the typed path of the node it concerns.
//!
//! A [`KeyPath`] is built segment by segment (`KeyPath::root("routes")
//! .index(0).key("limits")`), so it is always spelled the way the position
//! index records nodes and a problem never loses its `line:column`.

mod rls;

pub use rls::RlsProblem;
use std::fmt;

/// The path of a node in the configuration file: keys joined by `.`, list
/// items as `[i]` (`routes[0].limits[1].window`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPath(String);

impl KeyPath {
    /// A top-level key.
    pub fn root(key: &str) -> Self {
        KeyPath(key.to_string())
    }

    /// The child `key` of this mapping.
    pub fn key(&self, key: &str) -> Self {
        KeyPath(format!("{}.{key}", self.0))
    }

    /// Item `i` of this list.
    pub fn index(&self, i: usize) -> Self {
        KeyPath(format!("{}[{i}]", self.0))
    }

    /// The path as the position index spells it.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The last key of the path (`server.listen[0]` → `listen[0]`,
    /// `server.listen` → `listen`).
    pub fn leaf(&self) -> &str {
        self.0.rsplit('.').next().unwrap_or(&self.0)
    }
}

impl fmt::Display for KeyPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What is wrong (or, for warnings, worth knowing) about a configuration.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum ProblemKind {
    /// A problem of the rate-limit service's rules.
    #[error("{0}")]
    Rls(#[from] RlsProblem),
    // ---- Shared shapes -------------------------------------------------
    /// An address two listeners would share.
    #[error("`{0}` is already a listener (server.listen, server.admin or another TLS listener)")]
    ListenTwice(String),
    /// A TLS certificate or key that cannot serve.
    #[error("{0}")]
    BadCertificate(String),
    /// A `server.server_header` that is not a header value.
    #[error("`server_header` must be 1 to 256 printable ASCII characters")]
    BadServerHeader,
    /// A list that must not be empty.
    #[error("`{key}` needs at least one {item}")]
    NeedsOne {
        /// The key.
        key: &'static str,
        /// What one item is.
        item: &'static str,
    },
    /// A number outside its range.
    #[error("`{key}` must be between {min} and {max}")]
    Between {
        /// The key.
        key: String,
        /// Smallest allowed.
        min: u64,
        /// Largest allowed.
        max: u64,
    },
    /// A number or duration below its minimum.
    #[error("`{key}` must be at least {min}")]
    AtLeast {
        /// The key.
        key: &'static str,
        /// The minimum, as written in the file (`1`, `1ms`).
        min: &'static str,
    },
    /// A duration above its maximum.
    #[error("`{key}` must be at most {max}")]
    AtMost {
        /// The key.
        key: &'static str,
        /// The maximum, as written in the file.
        max: &'static str,
    },
    /// A zero duration where time must pass.
    #[error("`{0}` must be greater than zero")]
    Zero(String),
    /// An empty string.
    #[error("`{0}` must not be empty")]
    Empty(String),
    /// A duration that does not parse.
    #[error("{key}: {message}")]
    BadDuration {
        /// The key.
        key: String,
        /// Why.
        message: String,
    },
    /// A name outside `[a-z0-9_-]+`.
    #[error("{what} name `{name}` must be non-empty and use only a-z, 0-9, `_` and `-`")]
    BadName {
        /// Route, limit, upstream or share.
        what: &'static str,
        /// The name as written.
        name: String,
    },
    /// Not a header field name.
    #[error("`{0}` is not a valid header name")]
    BadHeaderName(String),
    /// A query parameter name that no query could carry.
    #[error(
        "`{0}` is not a query parameter name (non-empty, without `&`, `=`, `#`, `?` or spaces)"
    )]
    BadQueryName(String),
    /// Not a cookie name (an HTTP token).
    #[error("`{0}` is not a valid cookie name")]
    BadCookieName(String),
    /// `{param: NAME}` that the route's path does not define.
    #[error("{}", unknown_param(.name, .template))]
    UnknownParam {
        /// The parameter named by the key part.
        name: String,
        /// The route's templated path, if it has one.
        template: Option<String>,
    },
    /// A templated path that cannot be parsed.
    #[error("{0}")]
    BadTemplate(#[from] super::template::TemplateError),
    /// `path_prefix` with braces.
    #[error("`path_prefix` cannot hold path parameters (`{0}`): use `path` for a template")]
    TemplateInPrefix(String),
    /// Two names that must differ.
    #[error("duplicate {what} name `{name}`{}", in_route(.within))]
    Duplicate {
        /// Route or limit.
        what: &'static str,
        /// The name.
        name: String,
        /// The route it is duplicated in, for limits.
        within: Option<String>,
    },
    /// Two keys of which one at most may be set.
    #[error("{owner} either `{a}` or `{b}`, not both")]
    NotBoth {
        /// The owner, as the sentence starts (`identity` has…, use…).
        owner: &'static str,
        /// The first key.
        a: &'static str,
        /// The second key.
        b: &'static str,
    },
    /// Keys of which exactly one must be set.
    #[error("{owner} takes exactly one of {keys}")]
    OneOf {
        /// The owner, as the sentence starts.
        owner: &'static str,
        /// The keys, as a phrase.
        keys: &'static str,
    },
    /// Two keys of which one must be set.
    #[error("{owner} needs `{a}` or `{b}`")]
    NeedsEither {
        /// The owner, as the sentence starts.
        owner: String,
        /// The first key.
        a: &'static str,
        /// The second key.
        b: &'static str,
    },

    // ---- server and client_ip -------------------------------------------
    /// A listen address that is not IP:port.
    #[error("`{0}` is not an IP:port listen address (for example 0.0.0.0:8080 or [::]:8080)")]
    BadListenAddress(String),
    /// The admin listener on a proxy port.
    #[error("admin address `{0}` is also a proxy listener")]
    AdminIsListener(String),
    /// `upgrade_sock` and `pid_file` naming one file.
    #[error("`upgrade_sock` and `pid_file` must be different files")]
    SameFile,
    /// The URI bound above the head bound.
    #[error("`max_uri_bytes` cannot exceed `max_header_bytes` (the target is part of the head)")]
    UriOverHead,
    /// Not a CIDR or an IP.
    #[error("`{0}` is not a CIDR (such as 10.0.0.0/8) or an IP address")]
    BadCidr(String),
    /// `plans` without `limit_from`, or the reverse.
    #[error("`{0}` needs `{1}`")]
    Needs(&'static str, &'static str),
    /// An override or plan naming a plan `plans` does not list.
    #[error("unknown plan `{name}` (plans: {})", list_or_none(.known))]
    UnknownPlan {
        /// As written.
        name: String,
        /// The plans listed.
        known: Vec<String>,
    },
    /// An override matching a part that is not in the limit's key.
    #[error("`{part}` is not a part of this limit's key ({})", list_or_none(.key))]
    OverridePartNotInKey {
        /// As written.
        part: String,
        /// The key's parts, named as `match` names them.
        key: Vec<String>,
    },
    /// A `request_json` / `response_json` entry that is not a JSON pointer.
    #[error("`{0}` is not a JSON pointer (RFC 6901: empty, or starting with `/`, such as /usage/total_tokens; `~` only as ~0 or ~1)")]
    BadJsonPointer(String),
    /// `reserve` reading the request without a number for requests that
    /// carry none.
    #[error("`reserve` needs a `default` (or a `max`) for requests that do not say how much they may use, or `required: true` to refuse them")]
    ReserveNeedsDefault,
    /// A `count_when` status that is not one.
    #[error("`{0}` is not a status (100–599) or a class (`4xx`, `5xx`)")]
    BadStatusMatch(String),
    /// `count_when` / `cost_from` where the response cannot decide.
    #[error("`{key}` cannot apply to {why}")]
    NotDeferrable {
        /// The key.
        key: &'static str,
        /// Why not.
        why: &'static str,
    },
    /// `block_for` where no denial can start it.
    #[error("`block_for` needs an enforced, timed limit: {0}")]
    BlockForNever(&'static str),
    /// An override with neither or both of `limit` and `plan`.
    #[error("an override sets either `limit` or `plan`")]
    OverrideLimitOrPlan,
    /// An override that matches everything.
    #[error("an override's `match` names at least one key part")]
    EmptyOverrideMatch,
    /// `limit_from: {claim}` without a verified token.
    #[error("`limit_from: {{claim: ...}}` needs `identity.jwt`: claims are believed only from a verified token")]
    PlanClaimWithoutJwt,
    /// `limit_from: {header}` that is never believed.
    #[error("a plan header is believed only from `client_ip.trusted_proxies`, and none is set: every request gets the default limit")]
    PlanHeaderWithoutTrustedProxies,
    /// An exemption criterion with nothing to match.
    #[error("`{0}` lists no values: it would exempt nothing")]
    NoExemptValues(String),
    /// `exempt.claims` without a verified token to take claims from.
    #[error(
        "exempting by claims needs `identity.jwt`: claims are believed only from a verified token"
    )]
    ClaimsWithoutJwt,
    /// `exempt.headers` that no request can be believed to carry.
    #[error("headers are believed only from `client_ip.trusted_proxies`, and none is set: this exemption never applies")]
    HeadersWithoutTrustedProxies,

    // ---- limiter and response ---------------------------------------------
    /// Not a `redis://` URL.
    #[error("`{0}` is not a Redis URL (redis://host:port/db)")]
    NotRedisUrl(String),
    /// `limiter.redis.url` empty: the variable it names is unset.
    #[error("the Redis URL is empty (the environment variable it names is unset or empty)")]
    RedisUrlEmpty,
    /// A URL scheme sluice does not speak.
    #[error("unknown Redis URL scheme `{0}` (use redis:// or rediss://)")]
    UnknownRedisScheme(String),
    /// An upstream protocol that its TLS setting contradicts.
    #[error("{0}")]
    ProtocolAndTls(&'static str),
    /// Not `host:port`.
    #[error("`{0}` is not host:port")]
    NotHostPort(String),
    /// `limiter.redis.tls` for a plain connection.
    #[error("`tls` applies to rediss:// URLs (TLS to Redis) and to sentinels with `tls: true`; this URL is redis://")]
    RedisTlsWithoutRediss,
    /// A file that holds no PEM block.
    #[error("`{0}` holds no PEM certificate or key (-----BEGIN ...)")]
    NotPem(String),
    /// A key prefix that would move keys between Cluster slots.
    #[error("`key_prefix` must be at most 64 bytes and contain no `{{` or `}}` (they would change Redis Cluster slots)")]
    BadKeyPrefix,
    /// `local.share` outside (0, 1].
    #[error("`share` must be a fraction in (0, 1], written as 1/3 or 0.33")]
    BadShare,
    /// A denial status that is not 4xx.
    #[error("`status` of a denied request must be a 4xx code")]
    DenyStatus,
    /// A `tracing.otlp_endpoint` that is not an http(s) URL.
    #[error("`otlp_endpoint` must be an http:// or https:// URL with a host, not `{0}`")]
    BadOtlpEndpoint(String),
    /// A `tracing.sample_ratio` outside 0..=1.
    #[error("`sample_ratio` must be a number from 0 to 1")]
    BadSampleRatio,

    // ---- upstreams ----------------------------------------------------------
    /// `http://host:port` where `host:port` is meant.
    #[error("`{0}`: write host:port without a scheme")]
    ServerWithScheme(String),
    /// DNS failed, or knows the name but gives no address.
    #[error("cannot resolve `{server}` (host:port): {error}")]
    Unresolvable {
        /// The server as written.
        server: String,
        /// Why.
        error: String,
    },

    // ---- routes -------------------------------------------------------------
    /// Not an HTTP method.
    #[error("`{0}` is not an HTTP method")]
    BadMethod(String),
    /// `methods: []`.
    #[error("`methods: []` matches nothing; omit it to match any method")]
    NoMethods,
    /// Not a host name or address.
    #[error("`{0}` is not a host name or address")]
    BadHost(String),
    /// A route naming an upstream that does not exist.
    #[error("unknown upstream `{name}` (defined: {})", list_or_none(.known))]
    UnknownUpstream {
        /// The name.
        name: String,
        /// The upstreams that do.
        known: Vec<String>,
    },
    /// A path pattern without its leading `/`.
    #[error("`{0}` must start with `/`")]
    PathWithoutSlash(String),
    /// A path pattern that requests could never spell.
    #[error("`{value}` is not a canonical path (requests are matched as `{canonical}`): write `{canonical}`")]
    NotCanonicalPath {
        /// As written.
        value: String,
        /// As requests are matched.
        canonical: String,
    },
    /// A path pattern that is not a path.
    #[error("`{value}` is not a valid path: {error}")]
    BadPath {
        /// As written.
        value: String,
        /// Why.
        error: String,
    },

    // ---- limits -------------------------------------------------------------
    /// A parameter of another algorithm.
    #[error("`{key}` applies to algorithm {algorithm} only")]
    OnlyFor {
        /// The key.
        key: &'static str,
        /// The algorithm it belongs to.
        algorithm: &'static str,
    },
    /// `limit: 0`.
    #[error("`limit` must be at least 1 (to block a route, use `respond` with a 403)")]
    ZeroLimit,
    /// `window` on a concurrency limit.
    #[error("a concurrency limit has no `window` (it limits requests in flight; `lease` bounds how long one is held)")]
    ConcurrencyWindow,
    /// A limit without its window.
    #[error("limit `{0}` needs a `window` (such as 10s or 1m)")]
    NeedsWindow(String),
    /// `max_delay` or `max_waiting` without `on_limit: delay`.
    #[error("`{0}` applies to `on_limit: delay` only")]
    OnlyWithDelay(&'static str),
    /// `on_limit: delay` where no wait can be reserved.
    #[error("`on_limit: delay` cannot apply to {0}")]
    CannotDelay(&'static str),
    /// `window` beside `calendar`.
    #[error("a calendar quota has no `window`: `calendar` sets its periods (day, week or month)")]
    CalendarWindow,
    /// `calendar` with an algorithm other than a counter.
    #[error("a calendar quota is a counter per period; `algorithm: {0}` cannot apply (omit it, or write fixed_window)")]
    CalendarAlgorithm(&'static str),
    /// `timezone` without `calendar`.
    #[error("`timezone` applies to calendar quotas only (`calendar: day | week | month`)")]
    TimezoneWithoutCalendar,
    /// A time zone the database does not know.
    #[error(
        "unknown time zone `{0}` (an IANA name such as UTC, Europe/Paris or America/New_York)"
    )]
    UnknownTimeZone(String),
    /// A sliding log too long to keep.
    #[error("a sliding_log limit keeps one entry per admitted unit; {limit} per window is too many (at most {max}); use algorithm: sliding_window")]
    LogTooLong {
        /// The limit.
        limit: u64,
        /// The longest log allowed.
        max: u64,
    },
    /// Warning: a long sliding log.
    #[error("a sliding_log limit of {limit} keeps up to {limit} entries (about {} KiB) per key in Redis; algorithm: sliding_window needs {counters} counters per key whatever the limit", .limit * 100 / 1024)]
    LogLong {
        /// The limit.
        limit: u64,
        /// Counters a sliding window would need instead.
        counters: u32,
    },
    /// A window not divisible into its buckets.
    #[error("`window` {window} does not divide into {buckets} equal sub-windows (whole microseconds); pick a window or a bucket count that divides it")]
    BucketsDoNotDivide {
        /// The window, as written back.
        window: String,
        /// The bucket count.
        buckets: u32,
    },
    /// A cost no bucket can ever hold.
    #[error("`cost` {cost} exceeds `burst` {burst}: no request could ever pass")]
    CostOverBurst {
        /// The cost.
        cost: u64,
        /// The burst.
        burst: u64,
    },
    /// A cost no window can ever admit.
    #[error("`cost` {cost} exceeds `limit` {limit}: no request could ever pass")]
    CostOverLimit {
        /// The cost.
        cost: u64,
        /// The limit.
        limit: u64,
    },
    /// One share twice in a route.
    #[error("route `{route}` uses share `{share}` twice")]
    ShareTwice {
        /// The route.
        route: String,
        /// The share.
        share: String,
    },
    /// Limits sharing a counter that count differently.
    #[error("share `{share}` is also used by route `{route}` limit `{limit}` with a different algorithm, limit, window or key; limits sharing a counter must count alike (only `cost` may differ)")]
    ShareMismatch {
        /// The share.
        share: String,
        /// The route of the first limit using it.
        route: String,
        /// That limit.
        limit: String,
    },
    /// Warning: a `user` key with no identity configured.
    #[error("limit `{0}` keys by `user` but no `identity` is configured: every request takes `on_missing`")]
    UserWithoutIdentity(String),

    // ---- identity.jwt --------------------------------------------------------
    /// An algorithm sluice does not verify.
    #[error("unknown or unsupported JWT algorithm `{0}` (use HS256/384/512, RS256/384/512, PS256/384/512, ES256/384, EdDSA; `none` is never accepted)")]
    UnknownJwtAlgorithm(String),
    /// Algorithms needing different kinds of key.
    #[error("`algorithms` must all use one kind of key: HS* (secret_env), RS*/PS* (an RSA public_key_file) or ES* (an EC public_key_file)")]
    MixedJwtKeys,
    /// `claim: ""`.
    #[error("`claim` must name a claim, such as sub")]
    EmptyClaim,
    /// A public key given to HS*.
    #[error("HS* algorithms verify with `secret_env`, not a public key")]
    HmacWithPublicKey,
    /// A secret given to RS*/PS*/ES*.
    #[error("RS*/PS*/ES* algorithms verify with `public_key_file`, not a secret")]
    PublicKeyWithSecret,
    /// RS*/PS*/ES* without a key file.
    #[error("RS*/PS*/ES*/EdDSA algorithms need `public_key_file` (a PEM public key), `jwks_url` or `jwks_file`")]
    NeedsPublicKey,
    /// A URL sluice cannot ask.
    #[error("`{0}` is not an http:// or https:// URL with a host")]
    BadUrl(String),
    /// Warning: an optional method in a list with a required one.
    #[error("`{0}` is optional but another method in the list is required: every request must then be known, so an invalid `{0}` credential is refused (401) and a request without any credential too; say `required: true` to make that plain")]
    OptionalBesideRequired(&'static str),
    /// An identity method listed twice.
    #[error("`identity` lists `{0}` twice: each kind of credential is tried once")]
    IdentityListedTwice(&'static str),
    /// HS* with a JWKS.
    #[error(
        "a JWKS holds public keys: `algorithms` may list RS*, PS*, ES256, ES384 and EdDSA, not HS*"
    )]
    HmacWithJwks,
    /// A JWKS and another key.
    #[error("`jwks_url` / `jwks_file` and `{0}` are exclusive: the JWKS names every key")]
    JwksWithOtherKey(&'static str),
    /// A `jwks_url` sluice would fetch in the clear from another host.
    #[error("`jwks_url` must be an https:// URL (http:// only to a loopback address): {0}")]
    JwksUrl(String),
    /// A `jwks_file` that is not a usable JWKS.
    #[error("`{file}`: {error}")]
    BadJwks {
        /// The file.
        file: String,
        /// Why.
        error: String,
    },
    /// Warning: provider keys without an audience check.
    #[error("tokens verified with a JWKS are accepted for any audience: set `audiences` (an identity provider signs every application's tokens with the same keys)")]
    NoAudiences,
    /// Warning: a short HMAC secret.
    #[error("the secret in `{var}` is {bytes} bytes; HS256 wants at least 32")]
    ShortSecret {
        /// The variable.
        var: String,
        /// Its length in bytes.
        bytes: usize,
    },
    /// Keys kept in Redis with no admin token to manage them.
    #[error("with store: redis, keys are made and revoked through the admin API, which needs server.admin_token_env: without it every call answers 403")]
    KeyStoreWithoutAdminToken,
    /// The admin token's variable unset or empty.
    #[error("environment variable `{0}` (the admin token) is not set or empty")]
    AdminTokenUnset(String),
    /// The secret's variable unset or empty.
    #[error("environment variable `{0}` (the JWT secret) is not set or empty")]
    SecretUnset(String),
    /// A key file that cannot be read.
    #[error("cannot read `{file}`: {error}")]
    CannotRead {
        /// The file.
        file: String,
        /// Why.
        error: String,
    },
    /// A key file that is not the key its algorithms need.
    #[error("`{file}` is not a PEM {family} public key: {error}")]
    NotPublicKey {
        /// The file.
        file: String,
        /// RSA or EC.
        family: &'static str,
        /// Why.
        error: String,
    },

    // ---- What goes upstream and back -------------------------------------
    /// A header sluice sets itself or whose meaning the exchange depends on.
    #[error("`{name}` cannot be set or removed here: {why}")]
    ReservedHeader {
        /// The header as written.
        name: String,
        /// Why, and what to use instead.
        why: &'static str,
    },
    /// A header value template that cannot be a value.
    #[error("the value of `{name}`: {error}")]
    BadHeaderValue {
        /// The header.
        name: String,
        /// Why.
        error: super::forward::HeaderTemplateError,
    },
    /// `rewrite` with none or several of its keys.
    #[error("`rewrite` takes exactly one of strip_prefix, prefix or path")]
    RewriteOne,
    /// `rewrite.strip_prefix` or `rewrite.prefix` without a prefix match.
    #[error("`rewrite.{0}` replaces the matched prefix: the route needs `match.path_prefix`")]
    RewriteNeedsPrefix(&'static str),
    /// `rewrite.path` naming a parameter the route's match does not define.
    #[error("`rewrite.path` names `{{{name}}}`, which {}", template.as_deref().map_or("needs a templated `match.path` (like /users/{id})".to_string(), |t| format!("the route's path `{t}` does not define")))]
    RewriteParam {
        /// The parameter.
        name: String,
        /// The route's template, if it has one.
        template: Option<String>,
    },
    /// A `retries.on` entry that is not a reason to retry.
    #[error("`retries.on` takes connect_error and 5xx statuses (502, 503, 504), not `{0}`")]
    BadRetryOn(String),
    /// `hash_key` on an upstream that does not hash.
    #[error("`hash_key` chooses a server only with `balance: consistent_hash`")]
    HashKeyWithoutHashing,
    /// A `cors.origins` entry that is not an origin.
    #[error("`{0}` is not an origin: write scheme://host[:port] (no path, no trailing slash), or \"*\" alone")]
    BadOrigin(String),
    /// `cors.origins: ["*"]` with `credentials: true`.
    #[error("browsers refuse credentials from a page of any origin: list the origins, or set `credentials: false`")]
    AnyOriginWithCredentials,
    /// A limit without a number.
    #[error("a limit needs `limit` (or `plans`: a request without a listed plan then gets the smallest)")]
    NoLimit,
    /// `api_key.store` that is neither file nor redis.
    #[error("`store` is file or redis, not `{0}`")]
    BadKeyStore(String),
    /// `limit_from: {consumer: plan}` without API keys.
    #[error(
        "`limit_from: {{consumer: plan}}` needs `identity.api_key` (a consumer is known by its key) or `identity.auth_request` (its plan_header)"
    )]
    ConsumerPlanWithoutApiKey,
    /// `limit_from: {consumer: X}` with X not `plan`.
    #[error("`limit_from: {{consumer: ...}}` takes `plan`, not `{0}`")]
    BadConsumerField(String),
    /// A consumer id that could not be a key part or a header value.
    #[error("consumer id `{0}` must be 1 to 128 of A-Z a-z 0-9 . _ - @ :")]
    BadConsumerId(String),
    /// Two consumers with one id.
    #[error("consumer `{0}` is listed twice")]
    DuplicateConsumer(String),
    /// A key that is not written as its hash.
    #[error("a key is written as `sha256:` and the 64 hex digits of its SHA-256 (`sluice key hash KEY` prints it), never as the key itself")]
    BadKeyHash,
    /// One key hash held twice.
    #[error("this key is listed twice (a key belongs to one consumer)")]
    DuplicateKey,
    /// A consumer's plan that no limit has.
    #[error(
        "plan `{0}` is in no `plans` of a limit with `limit_from: {{consumer: plan}}`: this consumer's requests get each limit's own number"
    )]
    UnknownConsumerPlan(String),
    /// `upstream_host` that is not a host name.
    #[error("`upstream_host` is preserve, upstream or a host name (host[:port]), not `{0}`")]
    BadUpstreamHost(String),
}

/// ` in route `NAME``, or nothing.
fn unknown_param(name: &str, template: &Option<String>) -> String {
    match template {
        Some(t) => format!("the route's path `{t}` defines no parameter `{name}`"),
        None => format!(
            "`{{param: {name}}}` needs a templated route path, like `match: {{path: /users/{{{name}}}}}`"
        ),
    }
}

fn in_route(within: &Option<String>) -> String {
    within
        .as_ref()
        .map(|route| format!(" in route `{route}`"))
        .unwrap_or_default()
}

/// `a, b` or `none`.
fn list_or_none(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_spelled_as_the_position_index_spells_them() {
        let limit = KeyPath::root("routes").index(2).key("limits").index(0);
        assert_eq!(limit.key("window").as_str(), "routes[2].limits[0].window");
        assert_eq!(limit.key("window").leaf(), "window");
        let index = super::super::position::PositionIndex::build(
            "routes:\n  - name: a\n  - name: b\n  - name: c\n    limits:\n      - window: 1s\n",
        );
        let found = index.find(limit.key("window").as_str()).expect("indexed");
        assert_eq!((found.line, found.column), (6, 17));
    }

    #[test]
    fn kinds_say_what_to_write() {
        let kind = ProblemKind::NotCanonicalPath {
            value: "/a//b".into(),
            canonical: "/a/b".into(),
        };
        assert!(kind.to_string().ends_with("write `/a/b`"));
        let kind = ProblemKind::UnknownUpstream {
            name: "x".into(),
            known: vec![],
        };
        assert_eq!(kind.to_string(), "unknown upstream `x` (defined: none)");
    }
}
