//! The request target's canonical form, from any bytes a client can send:
//! either refused, or a path that starts with `/`, holds no empty, `.` or
//! `..` segment, and is its own canonical form (idempotent), whichever way
//! escaped slashes are treated.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice::target::{canonical_target, EscapedSlashes};

fuzz_target!(|raw: &[u8]| {
    for slashes in [EscapedSlashes::Reject, EscapedSlashes::Keep] {
        let Ok(target) = canonical_target(raw, slashes) else {
            continue;
        };
        let path: &str = &target.path;
        assert!(path.starts_with('/'), "{path:?}");
        for segment in path[1..].split('/') {
            assert!(segment != "." && segment != "..", "{path:?}");
        }
        assert!(!path.contains("//"), "{path:?}");
        let again = canonical_target(path.as_bytes(), slashes).expect("canonical again");
        assert_eq!(again.path, target.path, "not idempotent");
        let origin = target.origin_form();
        let sent = canonical_target(&origin, slashes).expect("its origin form");
        assert_eq!(sent.path, target.path);
        assert_eq!(sent.query, target.query);
    }
});
