//! `identity:` as validated: the methods that say who a request is (a
//! verified JWT and its keys, an API key, a trusted header, a client
//! certificate, an auth service) and their settings.

use std::fmt;
use std::time::Duration;

/// What the key part `user` means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdentityConfig {
    /// No identity configured: `user` is always missing.
    None,
    /// A header (lower-case name) set by a trusted auth layer in front of sluice.
    Header(String),
    /// A verified bearer token's claim.
    Jwt(JwtConfig),
    /// An API key whose hash a consumers store knows: the consumer's id.
    ApiKey(super::consumers::ApiKeyConfig),
    /// The connection's verified client certificate (`server.tls[].client_auth`).
    ClientCert {
        /// What of the certificate becomes the user.
        from: super::file::CertField,
        /// Answer 401 without a verified certificate.
        required: bool,
    },
    /// An auth service asked about each request (`identity.auth_request`).
    AuthRequest(AuthRequestConfig),
    /// Several methods, tried in order (at most one of each kind): the
    /// first whose credential a request carries decides.
    Several(Vec<IdentityConfig>),
}

impl IdentityConfig {
    /// The methods in the order they are tried (none for `None`).
    pub fn methods(&self) -> &[IdentityConfig] {
        match self {
            IdentityConfig::None => &[],
            IdentityConfig::Several(methods) => methods,
            one => std::slice::from_ref(one),
        }
    }

    /// The `jwt` method, if one is configured.
    pub fn jwt(&self) -> Option<&JwtConfig> {
        self.methods().iter().find_map(|m| match m {
            IdentityConfig::Jwt(jwt) => Some(jwt),
            _ => None,
        })
    }

    /// The `api_key` method, if one is configured.
    pub fn api_key(&self) -> Option<&super::consumers::ApiKeyConfig> {
        self.methods().iter().find_map(|m| match m {
            IdentityConfig::ApiKey(keys) => Some(keys),
            _ => None,
        })
    }

    /// The `api_key` method, to fill in its consumers file.
    /// Whether this method refuses a request without a valid credential;
    /// of a list, whether any method does — and then every method does:
    /// an invalid credential of an optional method in such a list is
    /// refused too, never served as anonymous.
    pub fn required(&self) -> bool {
        match self {
            IdentityConfig::Jwt(jwt) => jwt.required,
            IdentityConfig::ApiKey(keys) => keys.required,
            IdentityConfig::ClientCert { required, .. } => *required,
            IdentityConfig::AuthRequest(auth) => auth.required,
            IdentityConfig::Several(methods) => methods.iter().any(IdentityConfig::required),
            IdentityConfig::None | IdentityConfig::Header(_) => false,
        }
    }

    /// Whether key part `part` reads a credential: the `Authorization` or
    /// `Proxy-Authorization` header, the `Cookie` header or any cookie, the
    /// JWT's header, the API key's header or query parameter, or a header
    /// the auth service is sent. Such a value is only ever kept, shown or
    /// stored as its hash.
    pub fn reads_credential(&self, part: &super::KeyPart) -> bool {
        use super::consumers::KeySource;
        use super::KeyPart;
        let methods = self.methods();
        match part {
            KeyPart::Cookie(_) => true,
            KeyPart::Header(name) => {
                let is = |other: &str| name.eq_ignore_ascii_case(other);
                is("authorization")
                    || is("proxy-authorization")
                    || is("cookie")
                    || methods.iter().any(|m| match m {
                        IdentityConfig::Jwt(jwt) => is(&jwt.header),
                        IdentityConfig::ApiKey(keys) => {
                            matches!(&keys.source, KeySource::Header(h) if is(h))
                        }
                        IdentityConfig::AuthRequest(auth) => auth.headers.iter().any(|h| is(h)),
                        _ => false,
                    })
            }
            KeyPart::Query(name) => methods.iter().any(|m| {
                matches!(m, IdentityConfig::ApiKey(keys)
                    if matches!(&keys.source, KeySource::Query(q) if q == name))
            }),
            _ => false,
        }
    }

    pub(super) fn api_key_mut(&mut self) -> Option<&mut super::consumers::ApiKeyConfig> {
        match self {
            IdentityConfig::ApiKey(keys) => Some(keys),
            IdentityConfig::Several(methods) => methods.iter_mut().find_map(|m| m.api_key_mut()),
            _ => None,
        }
    }
}

/// `identity.auth_request`: an auth service that says who a request is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthRequestConfig {
    /// Where it is asked (http or https).
    pub url: String,
    /// How long an answer may take; past it, the request is not known.
    pub timeout: Duration,
    /// The request headers sent along (lower-case names): the credential.
    pub headers: Vec<String>,
    /// The service's answer header naming the user.
    pub user_header: String,
    /// The service's answer header naming the plan, if any.
    pub plan_header: Option<String>,
    /// How long a 2xx answer is reused for the same credential (zero: never).
    pub cache_ttl: Duration,
    /// Answer 401 without a credential, 503 when the service fails.
    pub required: bool,
}

/// `identity.jwt`: how bearer tokens are verified.
#[derive(Clone, PartialEq, Eq)]
pub struct JwtConfig {
    /// Lower-case header carrying `Bearer <token>`.
    pub header: String,
    /// Accepted signature algorithms (one key family).
    pub algorithms: Vec<jsonwebtoken::Algorithm>,
    /// The verification key: the HMAC secret, or a PEM public key.
    pub key: JwtKey,
    /// The claim whose value becomes the key part `user`.
    pub claim: String,
    /// When set, a token's `iss` must equal it.
    pub issuer: Option<String>,
    /// When not empty, a token's `aud` (a string or an array) must contain
    /// one of them.
    pub audiences: Vec<String>,
    /// Answer 401 when the token is missing or invalid.
    pub required: bool,
    /// Clock skew tolerated on `exp` and `nbf`.
    pub leeway: Duration,
}

/// Key material for JWT verification. Never printed.
#[derive(Clone, PartialEq, Eq)]
pub enum JwtKey {
    /// HMAC secret bytes (HS256/384/512).
    Secret(Vec<u8>),
    /// RSA public key, PEM (RS*, PS*).
    RsaPem(Vec<u8>),
    /// EC public key, PEM (ES256/384).
    EcPem(Vec<u8>),
    /// Ed25519 public key, PEM (EdDSA).
    EdPem(Vec<u8>),
    /// An identity provider's keys, by `kid`, from a JWKS document.
    Jwks(JwksSource),
}

/// Where `identity.jwt`'s JWKS keys come from, and how often they are
/// refreshed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JwksSource {
    /// The provider's JWKS URL (https, or http to a loopback address).
    pub url: Option<String>,
    /// A JWKS document read when the config loaded (`jwks_file`).
    pub file: Option<Vec<u8>>,
    /// How often the URL is fetched.
    pub refresh: Duration,
    /// The least time between fetches for an unknown `kid`.
    pub min_refresh: Duration,
}

impl fmt::Debug for JwtConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JwtConfig")
            .field("header", &self.header)
            .field("algorithms", &self.algorithms)
            .field("claim", &self.claim)
            .field("issuer", &self.issuer)
            .field("audiences", &self.audiences)
            .field("required", &self.required)
            .field("leeway", &self.leeway)
            .finish_non_exhaustive()
    }
}
