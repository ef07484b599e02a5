//! A JWKS document, any bytes: it parses or is refused; a parsed set holds
//! keys only for the algorithms allowed, and a kid that named two usable
//! keys names none.

#![no_main]

use jsonwebtoken::Algorithm;
use libfuzzer_sys::fuzz_target;
use sluice::config::jwks::KeySet;

fuzz_target!(|document: &[u8]| {
    let allowed = [Algorithm::RS256, Algorithm::ES256, Algorithm::EdDSA];
    let Ok(set) = KeySet::parse(document, &allowed) else {
        return;
    };
    for kid in set.ambiguous() {
        assert!(set.get(kid).is_none(), "ambiguous kid {kid} kept a key");
    }
    if let Ok(serde_json::Value::Object(doc)) =
        serde_json::from_slice::<serde_json::Value>(document)
    {
        let keys = doc
            .get("keys")
            .and_then(|k| k.as_array())
            .cloned()
            .unwrap_or_default();
        for key in keys {
            let Some(kid) = key.get("kid").and_then(|k| k.as_str()) else {
                continue;
            };
            if let Some(held) = set.get(kid) {
                assert!(!held.algorithms.is_empty());
                assert!(held.algorithms.iter().all(|a| allowed.contains(a)), "{kid}");
            }
        }
    }
});
