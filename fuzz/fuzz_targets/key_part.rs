//! Header values as key parts: any bytes give a bounded key with no byte
//! that could reach Redis raw or choose a Cluster slot; a value kept as it
//! is comes back out of the key unchanged (the top keys read it so), and
//! two different values never share a key. A credential is never in it.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice::config::KeyPart;
use sluice::observe::top_keys::parts_of;
use sluice::policy::keys::build_key;
use sluice::request::parts::{PartValue, RequestParts};

fn key(value: &[u8], credential: bool) -> Option<String> {
    let header = move |_: &str| Some(value);
    let parts = RequestParts {
        ip: "192.0.2.1",
        user: None,
        method: "GET",
        path: b"/",
        header: &header,
        query: b"",
        cookie: &|_| PartValue::Missing,
        param: &|_| None,
        client_cert: None,
    };
    let part = [KeyPart::Header("x-key".into())];
    build_key(
        "sluice:",
        "api",
        "per-key",
        &part,
        &[credential],
        &parts,
        false,
    )
    .expect("one header value is never ambiguous")
}

fuzz_target!(|input: (&[u8], &[u8])| {
    let (value, other) = input;
    let Some(plain) = key(value, false) else {
        assert!(value.is_empty(), "a value made no key");
        return;
    };
    let inner = parts_of(&plain, ("api", "per-key"));
    assert!(inner.len() <= 64, "{inner:?}");
    assert!(
        inner
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:/@-#".contains(&b)),
        "{inner:?}"
    );
    if inner.starts_with('#') {
        assert_eq!(inner.len(), 33);
    } else {
        assert_eq!(inner.as_bytes(), value, "a kept value round-trips");
    }
    let hidden = key(value, true).expect("a credential's key");
    let hidden_inner = parts_of(&hidden, ("api", "per-key"));
    assert!(hidden_inner.starts_with('#') && hidden_inner.len() == 33);
    if other != value && !other.is_empty() {
        assert_ne!(key(other, false), Some(plain), "two values, one key");
        assert_ne!(key(other, true), Some(hidden), "two credentials, one key");
    }
});
