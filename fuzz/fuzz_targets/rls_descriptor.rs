//! The rate-limit service's request descriptors, any domain and entries,
//! against the shipped example rules: a descriptor finds a limit or none;
//! its counter key is bounded, holds no byte a client chose raw outside
//! the safe set, and two different descriptors never share one unless a
//! shared wildcard made them.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice::config::rls::{read_rules, RlsRules};
use sluice::config::Algorithm;
use sluice::rls::matching::{counter_key, find};
use sluice::rls::proto::rate_limit_descriptor::Entry;
use std::sync::OnceLock;

fn rules() -> &'static RlsRules {
    static RULES: OnceLock<RlsRules> = OnceLock::new();
    RULES.get_or_init(|| {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../conf/examples/ratelimit");
        read_rules(path, Algorithm::SlidingLog)
            .expect("the shipped rules")
            .0
    })
}

fn entries(pairs: &[(String, String)]) -> Vec<Entry> {
    pairs
        .iter()
        .map(|(key, value)| Entry {
            key: key.clone(),
            value: value.clone(),
        })
        .collect()
}

fuzz_target!(
    |input: (bool, String, Vec<(String, String)>, Vec<(String, String)>)| {
        let (known_domain, domain, first, second) = input;
        let domain = if known_domain {
            "api".to_string()
        } else {
            domain
        };
        let (a, b) = (entries(&first), entries(&second));
        let Some(found) = find(rules(), &domain, &a) else {
            return;
        };
        assert!(found.limit < rules().limits.len());
        let key = counter_key("sluice:", &domain, &a, &found.shared);
        assert!(
            key.starts_with("sluice:{!rls|") && key.ends_with('}'),
            "{key}"
        );
        let inner = &key["sluice:{".len()..key.len() - 1];
        assert!(!inner.contains(['{', '}', '\r', '\n', ' ']), "{key}");
        assert!(inner.len() <= 5 + 64 + a.len() * 130, "{key}");
        if let Some(other) = find(rules(), &domain, &b) {
            let other_key = counter_key("sluice:", &domain, &b, &other.shared);
            let shared = !found.shared.is_empty() || !other.shared.is_empty();
            if first != second && !shared {
                assert_ne!(key, other_key, "two descriptors, one counter");
            }
        }
    }
);
