//! The auth service's answer, any status and headers: a user only from a
//! 2xx, exactly the header's text trimmed and never empty; a refusal only
//! from a 401 or 403, its body capped; anything else a failure — never an
//! open door.

#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use sluice::policy::identity::auth_request::{read_answer, AuthAnswer, MAX_BODY};

fuzz_target!(|input: (u16, Vec<(String, Vec<u8>)>, Vec<u8>)| {
    let (status, pairs, body) = input;
    let mut headers = http::HeaderMap::new();
    for (name, value) in &pairs {
        let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(name.as_bytes()),
            http::HeaderValue::from_bytes(value),
        ) else {
            continue;
        };
        headers.append(name, value);
    }
    let answer = read_answer(
        status,
        &headers,
        "x-auth-user",
        Some("x-auth-plan"),
        Bytes::from(body),
    );
    match answer {
        AuthAnswer::Known { user, plan } => {
            assert!((200..=299).contains(&status), "known from {status}");
            for (name, read) in [("x-auth-user", user), ("x-auth-plan", plan)] {
                let Some(read) = read else { continue };
                assert!(!read.is_empty());
                let sent = headers.get(name).expect("read from a header");
                assert_eq!(sent.to_str().expect("text").trim(), &*read);
            }
        }
        AuthAnswer::Refused {
            status: s, body, ..
        } => {
            assert!(s == status && (status == 401 || status == 403));
            assert!(body.len() <= MAX_BODY);
        }
        AuthAnswer::Failed(_) => {
            assert!(!(200..=299).contains(&status) && status != 401 && status != 403);
        }
    }
});
