//! A JWT's header and claims, any bytes, signed with the verifier's own
//! secret (so the fuzzer reaches past the signature): a token is believed
//! only with HS256, no critical extension, an `exp` in the future and the
//! configured claim; any Authorization value at all never panics.

#![no_main]

use base64::Engine as _;
use libfuzzer_sys::fuzz_target;
use sluice::config::{JwtConfig, JwtKey};
use sluice::policy::identity::{JwtVerifier, User};
use std::sync::OnceLock;
use std::time::Duration;

const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

fn verifier() -> &'static JwtVerifier {
    static VERIFIER: OnceLock<JwtVerifier> = OnceLock::new();
    VERIFIER.get_or_init(|| {
        let metrics = sluice::observe::metrics::Metrics::new().expect("metrics");
        let config = JwtConfig {
            header: "authorization".into(),
            algorithms: vec![jsonwebtoken::Algorithm::HS256],
            key: JwtKey::Secret(SECRET.to_vec()),
            claim: "sub".into(),
            issuer: None,
            audiences: Vec::new(),
            required: false,
            leeway: Duration::ZERO,
        };
        JwtVerifier::new(&config, &metrics.identity).expect("a verifier")
    })
}

fuzz_target!(|input: (&[u8], &[u8], &[u8])| {
    let (header, claims, raw) = input;
    let v = verifier();
    // Any value at all.
    let _ = v.verify(raw);
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    let message = format!("{}.{}", b64(header), b64(claims));
    let key = jsonwebtoken::EncodingKey::from_secret(SECRET);
    let Ok(signature) =
        jsonwebtoken::crypto::sign(message.as_bytes(), &key, jsonwebtoken::Algorithm::HS256)
    else {
        return;
    };
    let token = format!("Bearer {message}.{signature}");
    if let User::Known(user) = v.verify(token.as_bytes()) {
        let header: serde_json::Value = serde_json::from_slice(header).expect("a JSON header");
        assert_eq!(header["alg"], "HS256");
        assert!(
            header
                .get("crit")
                .is_none_or(|c| c.as_array().is_some_and(Vec::is_empty)),
            "a critical extension was ignored: {header}"
        );
        let claims: serde_json::Value = serde_json::from_slice(claims).expect("JSON claims");
        assert!(claims["exp"].is_number(), "no exp: {claims}");
        let sub = match &claims["sub"] {
            serde_json::Value::String(s) => s.as_bytes().to_vec(),
            serde_json::Value::Number(n) => n.to_string().into_bytes(),
            other => panic!("user from {other}"),
        };
        assert_eq!(user.as_ref(), sub.as_slice());
    }
});
