//! The canonical host of any Host value: refused, absent, or lower-case,
//! without port or trailing dot, and its own canonical form.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice::target::canonical_host;

fuzz_target!(|value: &[u8]| {
    if let Ok(Some(host)) = canonical_host(value) {
        assert!(!host.is_empty());
        assert_eq!(host.to_ascii_lowercase(), *host, "not lower-case");
        assert!(!host.ends_with('.'), "{host:?}");
        let again = canonical_host(host.as_bytes()).expect("canonical again");
        assert_eq!(again.as_deref(), Some(&*host), "not idempotent");
    }
});
