//! Bearer tokens (`identity.jwt`): verified with one key (a secret or a PEM
//! public key) or an identity provider's JWKS, by the configured algorithms,
//! `exp`/`nbf` with `leeway`, and `issuer`/`audiences`; the configured claim
//! becomes the user.

use super::{Claims, Established, User};
use crate::config::{JwtConfig, JwtKey};
use crate::observe::metrics::IdentityMetrics;
use crate::policy::identity::jwks::Jwks;
use jsonwebtoken::{decode, decode_header, DecodingKey, Validation};
use std::borrow::Cow;

/// Verifies bearer tokens and extracts the configured claim.
pub struct JwtVerifier {
    /// The lower-case header the token comes in.
    pub(super) header: String,
    keys: VerifierKeys,
    /// The rules for each accepted algorithm (one key: all in one).
    validations: Vec<(jsonwebtoken::Algorithm, Validation)>,
    claim: String,
    /// Answer 401 when the token is missing or invalid.
    pub(super) required: bool,
}

/// The key a token is verified with.
enum VerifierKeys {
    /// One key for every token.
    One(DecodingKey),
    /// An identity provider's keys, by the token's `kid`.
    Jwks(Jwks),
}

/// Longest token accepted; anything longer is refused unparsed.
const MAX_TOKEN: usize = 8 * 1024;

impl JwtVerifier {
    /// Prepares the keys and the validation rules; a JWKS URL's fetcher
    /// starts now, on a thread of its own.
    pub fn new(
        config: &JwtConfig,
        metrics: &IdentityMetrics,
    ) -> Result<Self, jsonwebtoken::errors::Error> {
        let keys = match &config.key {
            JwtKey::Secret(secret) => VerifierKeys::One(DecodingKey::from_secret(secret)),
            JwtKey::RsaPem(pem) => VerifierKeys::One(DecodingKey::from_rsa_pem(pem)?),
            JwtKey::EcPem(pem) => VerifierKeys::One(DecodingKey::from_ec_pem(pem)?),
            JwtKey::EdPem(pem) => VerifierKeys::One(DecodingKey::from_ed_pem(pem)?),
            JwtKey::Jwks(source) => VerifierKeys::Jwks(
                Jwks::start(source, &config.algorithms, metrics)
                    .map_err(|_| jsonwebtoken::errors::ErrorKind::InvalidKeyFormat)?,
            ),
        };
        let first = config
            .algorithms
            .first()
            .copied()
            .unwrap_or(jsonwebtoken::Algorithm::HS256);
        let mut validation = Validation::new(first);
        validation.algorithms = config.algorithms.clone();
        validation.validate_exp = true;
        validation.validate_nbf = true;
        validation.leeway = config.leeway.as_secs();
        let mut required = vec!["exp"];
        validation.validate_aud = !config.audiences.is_empty();
        if validation.validate_aud {
            validation.set_audience(&config.audiences);
            required.push("aud");
        }
        if let Some(issuer) = &config.issuer {
            validation.set_issuer(&[issuer]);
            required.push("iss");
        }
        validation.set_required_spec_claims(&required);
        let validations = match keys {
            // One key: its family's algorithms, checked together.
            VerifierKeys::One(_) => vec![(first, validation)],
            // A JWKS: each token's key decides which algorithm it may use,
            // so each algorithm has rules of its own.
            VerifierKeys::Jwks(_) => config
                .algorithms
                .iter()
                .map(|&algorithm| {
                    let mut own = validation.clone();
                    own.algorithms = vec![algorithm];
                    (algorithm, own)
                })
                .collect(),
        };
        Ok(Self {
            header: config.header.clone(),
            keys,
            validations,
            claim: config.claim.clone(),
            required: config.required,
        })
    }

    /// Verifies `Bearer <token>` and returns the claim, or why not.
    pub fn verify<'a>(&self, value: &[u8]) -> User<'a> {
        self.establish(value).user
    }

    /// Verifies `Bearer <token>`: the claim as the user (or why not), and
    /// the token's claims when it verifies.
    pub fn establish<'a>(&self, value: &[u8]) -> Established<'a> {
        match self.claims(value) {
            Ok(claims) => {
                let user = self.user_of(&claims);
                Established {
                    claims: Some(claims),
                    ..Established::user(user)
                }
            }
            Err(reason) => Established::user(User::Invalid(reason)),
        }
    }

    /// The configured claim of verified `claims`, as the user.
    fn user_of<'a>(&self, claims: &Claims) -> User<'a> {
        match claims.get(&self.claim) {
            Some(serde_json::Value::String(s)) if !s.is_empty() => {
                User::Known(Cow::Owned(s.clone().into_bytes()))
            }
            Some(serde_json::Value::Number(n)) => {
                User::Known(Cow::Owned(n.to_string().into_bytes()))
            }
            _ => User::Invalid("token lacks the configured claim"),
        }
    }

    /// The claims of `Bearer <token>` once it verifies, or why it does not.
    fn claims(&self, value: &[u8]) -> Result<Claims, &'static str> {
        let Ok(text) = std::str::from_utf8(value) else {
            return Err("header is not UTF-8");
        };
        let text = text.trim();
        let token = match text.split_once(' ') {
            Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => token.trim(),
            _ => return Err("not a Bearer token"),
        };
        if token.is_empty() || token.len() > MAX_TOKEN {
            return Err("empty or oversized token");
        }
        if !understands_critical(token) {
            return Err("token names a critical extension sluice does not understand");
        }
        let verified = match &self.keys {
            VerifierKeys::One(key) => decode::<Claims>(token, key, &self.validations[0].1),
            VerifierKeys::Jwks(jwks) => return self.verify_with_jwks(token, jwks),
        };
        match verified {
            Ok(data) => Ok(data.claims),
            Err(e) => {
                log::debug!("JWT rejected: {e}");
                Err("token does not verify")
            }
        }
    }

    /// Verifies `token` with the JWKS key its `kid` names, by an algorithm
    /// that key may verify and the configuration lists.
    fn verify_with_jwks(&self, token: &str, jwks: &Jwks) -> Result<Claims, &'static str> {
        let header = decode_header(token).map_err(|_| "token does not verify")?;
        let kid = header.kid.ok_or("token names no key (kid)")?;
        let held = jwks.key(&kid).ok_or("token names an unknown key (kid)")?;
        let key = held.get().ok_or("token names an unknown key (kid)")?;
        if !key.algorithms.contains(&header.alg) {
            return Err("token's algorithm does not fit its key");
        }
        let (_, validation) = self
            .validations
            .iter()
            .find(|(algorithm, _)| *algorithm == header.alg)
            .ok_or("token's algorithm is not accepted")?;
        match decode::<Claims>(token, &key.key, validation) {
            Ok(data) => Ok(data.claims),
            Err(e) => {
                log::debug!("JWT rejected: {e}");
                Err("token does not verify")
            }
        }
    }
}

/// Whether sluice understands every extension `token`'s header marks
/// critical (`crit`, RFC 7515 §4.1.11): it understands none, so a `crit`
/// naming anything — or one that is not a list of names — refuses the
/// token. A header that does not decode is left to the verification.
fn understands_critical(token: &str) -> bool {
    use base64::Engine as _;
    let Some((header, _)) = token.split_once('.') else {
        return true;
    };
    let Ok(json) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(header) else {
        return true;
    };
    let Ok(serde_json::Value::Object(fields)) = serde_json::from_slice(&json) else {
        return true;
    };
    match fields.get("crit") {
        None => true,
        Some(serde_json::Value::Array(names)) => names.is_empty(),
        Some(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{encode, EncodingKey, Header};
    use std::time::Duration;

    fn verifier() -> JwtVerifier {
        JwtVerifier::new(
            &JwtConfig {
                header: "authorization".into(),
                algorithms: vec![jsonwebtoken::Algorithm::HS256],
                key: JwtKey::Secret(b"0123456789abcdef0123456789abcdef".to_vec()),
                claim: "sub".into(),
                issuer: None,
                audiences: Vec::new(),
                required: false,
                leeway: Duration::ZERO,
            },
            &test_metrics(),
        )
        .unwrap()
    }

    fn test_metrics() -> IdentityMetrics {
        crate::observe::metrics::Metrics::new()
            .expect("metrics")
            .identity
    }

    fn now() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    }

    fn token(secret: &[u8], claims: serde_json::Value) -> String {
        encode(
            &Header::new(jsonwebtoken::Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(secret),
        )
        .unwrap()
    }

    #[test]
    fn only_verified_claims_are_believed() {
        let v = verifier();
        let secret = b"0123456789abcdef0123456789abcdef";
        let good = token(
            secret,
            serde_json::json!({"sub": "alice", "exp": now() + 60}),
        );
        assert_eq!(
            v.verify(format!("Bearer {good}").as_bytes()),
            User::Known(Cow::Borrowed(b"alice".as_slice()))
        );
        let expired = token(
            secret,
            serde_json::json!({"sub": "alice", "exp": now() - 60}),
        );
        let early = token(
            secret,
            serde_json::json!({"sub": "alice", "exp": now() + 60, "nbf": now() + 30}),
        );
        let forged = token(
            b"another secret of enough length!",
            serde_json::json!({"sub": "alice", "exp": now() + 60}),
        );
        let no_exp = token(secret, serde_json::json!({"sub": "alice"}));
        // alg: none, unsigned.
        let none =
            "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJzdWIiOiJhbGljZSIsImV4cCI6OTk5OTk5OTk5OX0.";
        for bad in [&expired, &early, &forged, &no_exp, none, "garbage", "a.b.c"] {
            assert!(
                matches!(
                    v.verify(format!("Bearer {bad}").as_bytes()),
                    User::Invalid(_)
                ),
                "{bad}"
            );
        }
        assert!(matches!(v.verify(good.as_bytes()), User::Invalid(_)));
        assert!(matches!(v.verify(b"Bearer \xff\xfe"), User::Invalid(_)));
    }

    /// A token signed with the secret whose header is `header` as written.
    fn token_with_header(secret: &[u8], header: &str, claims: serde_json::Value) -> String {
        use base64::Engine as _;
        let b64 = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
        let message = format!(
            "{}.{}",
            b64(header.as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let key = EncodingKey::from_secret(secret);
        let signature =
            jsonwebtoken::crypto::sign(message.as_bytes(), &key, jsonwebtoken::Algorithm::HS256)
                .unwrap();
        format!("{message}.{signature}")
    }

    #[test]
    fn a_critical_extension_refuses_the_token() {
        let v = verifier();
        let secret = b"0123456789abcdef0123456789abcdef";
        let claims = serde_json::json!({"sub": "alice", "exp": now() + 60});
        let verify = |header: &str| {
            let token = token_with_header(secret, header, claims.clone());
            v.verify(format!("Bearer {token}").as_bytes())
        };
        let alice = User::Known(Cow::Borrowed(b"alice".as_slice()));
        assert_eq!(verify(r#"{"alg":"HS256","typ":"JWT"}"#), alice);
        assert_eq!(verify(r#"{"alg":"HS256","crit":[]}"#), alice);
        for refused in [
            r#"{"alg":"HS256","crit":["b64"],"b64":false}"#,
            r#"{"alg":"HS256","crit":["exp"]}"#,
            r#"{"alg":"HS256","crit":["x-unknown"],"x-unknown":1}"#,
            r#"{"alg":"HS256","crit":"b64"}"#,
            r#"{"alg":"HS256","crit":null}"#,
            r#"{"alg":"HS256","crit":[],"crit":["b64"]}"#,
        ] {
            assert!(matches!(verify(refused), User::Invalid(_)), "{refused}");
        }
    }

    /// With `issuer` and `audiences`, a token issued by another issuer, or
    /// for another application of the same provider (same keys), or naming
    /// neither, is refused; `aud` may be a string or an array.
    #[test]
    fn issuer_and_audience_must_match() {
        let secret = b"0123456789abcdef0123456789abcdef";
        let mut config = JwtConfig {
            header: "authorization".into(),
            algorithms: vec![jsonwebtoken::Algorithm::HS256],
            key: JwtKey::Secret(secret.to_vec()),
            claim: "sub".into(),
            issuer: Some("https://id.example.com/".into()),
            audiences: vec!["orders-api".into(), "billing-api".into()],
            required: true,
            leeway: Duration::ZERO,
        };
        let v = JwtVerifier::new(&config, &test_metrics()).unwrap();
        let verify = |v: &JwtVerifier, claims: serde_json::Value| {
            let mut claims = claims;
            claims["sub"] = "alice".into();
            claims["exp"] = (now() + 60).into();
            v.verify(format!("Bearer {}", token(secret, claims)).as_bytes())
        };
        let alice = User::Known(Cow::Borrowed(b"alice".as_slice()));
        let iss = "https://id.example.com/";
        for good in [
            serde_json::json!({"iss": iss, "aud": "orders-api"}),
            serde_json::json!({"iss": iss, "aud": ["spa", "billing-api"]}),
        ] {
            assert_eq!(verify(&v, good.clone()), alice, "{good}");
        }
        for bad in [
            serde_json::json!({"iss": "https://evil.example.com/", "aud": "orders-api"}),
            serde_json::json!({"iss": "https://id.example.com", "aud": "orders-api"}),
            serde_json::json!({"iss": iss, "aud": "another-teams-spa"}),
            serde_json::json!({"iss": iss, "aud": ["spa", "test-tenant"]}),
            serde_json::json!({"iss": iss, "aud": []}),
            serde_json::json!({"iss": iss}),
            serde_json::json!({"aud": "orders-api"}),
        ] {
            assert!(matches!(verify(&v, bad.clone()), User::Invalid(_)), "{bad}");
        }
        // Without them, neither is looked at.
        config.issuer = None;
        config.audiences.clear();
        let v = JwtVerifier::new(&config, &test_metrics()).unwrap();
        let other = serde_json::json!({"iss": "https://elsewhere/", "aud": "x"});
        assert_eq!(verify(&v, other), alice);
    }
}
