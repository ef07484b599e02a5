//! An API key (or any key part) read from the query: whatever the query,
//! a parameter is missing, one value, or ambiguous; a value found is
//! never empty, and removing the parameter (with any value, an empty one
//! too) leaves a target where it is missing and every other pair as sent.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice::request::parts::{query_value, without_query_param, PartValue};

fuzz_target!(|input: (&str, &[u8])| {
    let (name, query) = input;
    if name.is_empty() {
        return;
    }
    let found = query_value(query, name);
    if let PartValue::One(value) = &found {
        assert!(!value.is_empty(), "an empty value is missing");
    }
    let mut target = b"/p?".to_vec();
    target.extend_from_slice(query);
    match without_query_param(&target, name) {
        Some(stripped) => {
            let rest = stripped
                .splitn(2, |&b| b == b'?')
                .nth(1)
                .unwrap_or_default();
            assert_eq!(query_value(rest, name), PartValue::Missing, "still there");
            for pair in rest.split(|&b| b == b'&').filter(|p| !p.is_empty()) {
                assert!(
                    query.split(|&b| b == b'&').any(|sent| sent == pair),
                    "a pair that was not sent"
                );
            }
        }
        None => assert!(
            matches!(found, PartValue::Missing),
            "found but not removable"
        ),
    }
});
