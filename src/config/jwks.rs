//! An identity provider's signing keys from a JWKS document (RFC 7517),
//! parsed into verification keys by `kid`. Read here when the config loads
//! (`identity.jwt.jwks_file`, so a bad document is a config error), and by
//! the fetcher of `jwks_url` (the top-level `jwks` module) for each document it fetches.
//!
//! What a key may verify is decided by the key, never by the token: an RSA
//! key verifies RS* and PS*, an EC key the one ES* of its curve, an Ed25519
//! key EdDSA; a key whose `alg` is given verifies that algorithm only; a key
//! for encryption (`use: enc`), a symmetric key (`kty: oct`) or a key without
//! `kid` is never used. A token's `alg` must be one its key may verify and one
//! the configuration lists, so neither `alg: none` nor an HMAC signature made
//! with a public key (algorithm confusion) gets through.

use jsonwebtoken::jwk::{
    AlgorithmParameters, EllipticCurve, Jwk, JwkSet, KeyAlgorithm, PublicKeyUse,
};
use jsonwebtoken::{Algorithm, DecodingKey};
use std::collections::HashMap;

/// Why a JWKS document was not taken.
#[derive(Debug, thiserror::Error)]
pub enum JwksError {
    /// Not a JWKS document.
    #[error("not a JWKS document: {0}")]
    Malformed(String),
    /// Two usable keys under one `kid`: which one a token means is not
    /// known.
    #[error("two usable keys share the kid `{0}`: a token naming it could mean either")]
    SharedKid(String),
    /// A document without one usable signing key.
    #[error("no usable signing key (keys need a kid, a signing use and an RSA, P-256, P-384 or Ed25519 key of an algorithm in `algorithms`)")]
    NoUsableKey,
}

/// One verification key and the algorithms it may verify.
pub struct VerificationKey {
    /// The key.
    pub key: DecodingKey,
    /// The algorithms this key verifies (its type's, narrowed by its `alg`
    /// and by the configuration's `algorithms`).
    pub algorithms: Vec<Algorithm>,
}

/// Verification keys by `kid`. A `kid` that names two usable keys names
/// none: it is kept apart ([`KeySet::ambiguous`]) and its tokens refused.
#[derive(Default)]
pub struct KeySet {
    keys: HashMap<String, VerificationKey>,
    ambiguous: Vec<String>,
}

impl KeySet {
    /// The usable keys of a JWKS document, each limited to `allowed`
    /// algorithms; fails when none is usable.
    pub fn parse(document: &[u8], allowed: &[Algorithm]) -> Result<Self, JwksError> {
        let set: JwkSet =
            serde_json::from_slice(document).map_err(|e| JwksError::Malformed(e.to_string()))?;
        let mut keys: HashMap<String, VerificationKey> = HashMap::new();
        let mut ambiguous: Vec<String> = Vec::new();
        let usable_keys = set
            .keys
            .iter()
            .filter_map(|jwk| Some((jwk.common.key_id.clone()?, usable(jwk, allowed)?)));
        for (kid, key) in usable_keys {
            if ambiguous.contains(&kid) {
                continue;
            }
            if keys.insert(kid.clone(), key).is_some() {
                keys.remove(&kid);
                ambiguous.push(kid);
            }
        }
        if keys.is_empty() && ambiguous.is_empty() {
            return Err(JwksError::NoUsableKey);
        }
        Ok(Self { keys, ambiguous })
    }

    /// The `kid`s that named more than one usable key (none of them is
    /// used).
    pub fn ambiguous(&self) -> &[String] {
        &self.ambiguous
    }

    /// The key named `kid`.
    pub fn get(&self, kid: &str) -> Option<&VerificationKey> {
        self.keys.get(kid)
    }

    /// How many keys the set holds.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the set holds no key.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// This set with `other`'s keys added (`other` wins on a shared `kid`;
    /// a `kid` ambiguous in either is in neither).
    pub fn merged(&self, other: &KeySet) -> KeySet {
        let mut keys: HashMap<String, VerificationKey> = HashMap::new();
        let ambiguous: Vec<String> = self
            .ambiguous
            .iter()
            .chain(&other.ambiguous)
            .cloned()
            .collect();
        let chained = self.keys.iter().chain(&other.keys);
        for (kid, key) in chained.filter(|(kid, _)| !ambiguous.contains(kid)) {
            keys.insert(
                kid.clone(),
                VerificationKey {
                    key: key.key.clone(),
                    algorithms: key.algorithms.clone(),
                },
            );
        }
        KeySet { keys, ambiguous }
    }
}

/// The algorithms a JWK's type may verify.
fn algorithms_of(jwk: &Jwk) -> &'static [Algorithm] {
    use Algorithm::*;
    match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => &[RS256, RS384, RS512, PS256, PS384, PS512],
        AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
            EllipticCurve::P256 => &[ES256],
            EllipticCurve::P384 => &[ES384],
            _ => &[],
        },
        AlgorithmParameters::OctetKeyPair(okp) if okp.curve == EllipticCurve::Ed25519 => &[EdDSA],
        // Symmetric keys (`oct`) never verify: a JWKS is public.
        _ => &[],
    }
}

/// The signature algorithm a JWK's `alg` names (none for an encryption
/// algorithm or one sluice does not know).
fn signing_algorithm(alg: KeyAlgorithm) -> Option<Algorithm> {
    use Algorithm as A;
    use KeyAlgorithm as K;
    Some(match alg {
        K::HS256 => A::HS256,
        K::HS384 => A::HS384,
        K::HS512 => A::HS512,
        K::ES256 => A::ES256,
        K::ES384 => A::ES384,
        K::RS256 => A::RS256,
        K::RS384 => A::RS384,
        K::RS512 => A::RS512,
        K::PS256 => A::PS256,
        K::PS384 => A::PS384,
        K::PS512 => A::PS512,
        K::EdDSA => A::EdDSA,
        _ => return None,
    })
}

/// The verification key of `jwk`, if it is a signing key of a type and
/// algorithm that `allowed` accepts.
fn usable(jwk: &Jwk, allowed: &[Algorithm]) -> Option<VerificationKey> {
    if matches!(
        jwk.common.public_key_use,
        Some(PublicKeyUse::Encryption | PublicKeyUse::Other(_))
    ) {
        return None;
    }
    let named = match jwk.common.key_algorithm {
        Some(alg) => Some(signing_algorithm(alg)?),
        None => None,
    };
    let algorithms: Vec<Algorithm> = algorithms_of(jwk)
        .iter()
        .copied()
        .filter(|a| named.is_none_or(|n| n == *a) && allowed.contains(a))
        .collect();
    if algorithms.is_empty() {
        return None;
    }
    let key = DecodingKey::from_jwk(jwk).ok()?;
    Some(VerificationKey { key, algorithms })
}

#[cfg(test)]
mod tests {
    use super::*;

    const RSA_N: &str = "u1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gunVTLw7onLRnrq0_IzW7yWR7QkrmBL7jTKEn5u-qKhbwKfBstIs-bMY2Zkp18gnTxKLxoS2tFczGkPLPgizskuemMghRniWaoLcyehkd3qqGElvW_VDL5AaWTg0nLVkjRo9z-40RQzuVaE8AkAFmxZzow3x-VJYKdjykkJ0iT9wCS0DRTXu269V264Vf_3jvredZiKRkgwlL9xNAwxXFg0x_XFw005UWVRIkdgcKWTjpBP2dPwVZ4WWC-9aGVd-Gyn1o0CLelf4rEjGoXbAAEgAqeGUxrcIlbjXfbcmw";

    fn rsa(kid: &str, extra: &str) -> String {
        format!(r#"{{"kty":"RSA","kid":"{kid}","n":"{RSA_N}","e":"AQAB"{extra}}}"#)
    }

    fn set(keys: &[String]) -> Vec<u8> {
        format!(r#"{{"keys":[{}]}}"#, keys.join(",")).into_bytes()
    }

    #[test]
    fn keys_verify_only_what_their_type_and_alg_allow() {
        use Algorithm::*;
        let allowed = [RS256, PS256, ES256, EdDSA];
        let doc = set(&[
            rsa("plain", ""),
            rsa("named", r#","alg":"PS256""#),
            rsa("for-encryption", r#","use":"enc""#),
            rsa("not-allowed", r#","alg":"RS512""#),
            r#"{"kty":"oct","kid":"secret","k":"c2VjcmV0"}"#.to_string(),
            format!(r#"{{"kty":"RSA","n":"{RSA_N}","e":"AQAB"}}"#),
        ]);
        let keys = KeySet::parse(&doc, &allowed).expect("a usable key");
        assert_eq!(
            keys.get("plain").map(|k| k.algorithms.clone()),
            Some(vec![RS256, PS256])
        );
        assert_eq!(
            keys.get("named").map(|k| k.algorithms.clone()),
            Some(vec![PS256])
        );
        for refused in ["for-encryption", "not-allowed", "secret", ""] {
            assert!(keys.get(refused).is_none(), "{refused}");
        }
        assert_eq!(keys.len(), 2);
    }

    #[test]
    fn a_document_without_a_usable_key_is_refused() {
        let only_secret = set(&[r#"{"kty":"oct","kid":"s","k":"c2VjcmV0"}"#.to_string()]);
        assert!(matches!(
            KeySet::parse(&only_secret, &[Algorithm::HS256, Algorithm::RS256]),
            Err(JwksError::NoUsableKey)
        ));
        for garbage in [&b"{}"[..], b"[]", b"not json", b"{\"keys\": 5}"] {
            assert!(KeySet::parse(garbage, &[Algorithm::RS256]).is_err());
        }
    }
}
