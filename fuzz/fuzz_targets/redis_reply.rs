//! A batch reply from Redis, any bytes (a foreign or broken server): each
//! decision's line gives numbers, an error, or the skip marker; numbers
//! decode into exactly the decisions asked for or an error. Never a panic.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice::limiter::redis::wire::{decode_reply, parse_batch_line};

fuzz_target!(|input: (u8, &[u8])| {
    let (limits, text) = input;
    let n = usize::from(limits % 8);
    let mut lines = text.split(|&b| b == b'\n');
    let Some(now) = lines
        .next()
        .and_then(|line| std::str::from_utf8(line).ok()?.parse::<i64>().ok())
    else {
        return;
    };
    for line in lines {
        if line == b"~" {
            continue;
        }
        let Ok(values) = parse_batch_line(line, now) else {
            continue;
        };
        assert_eq!(values.get(1), Some(&now), "now put back second");
        match decode_reply(&values, n) {
            Ok((decisions, at)) => {
                assert_eq!(decisions.len(), n);
                assert_eq!(at, now);
            }
            Err(_) => assert_ne!(values.len(), 2 + 4 * n, "a well-formed reply refused"),
        }
    }
});
