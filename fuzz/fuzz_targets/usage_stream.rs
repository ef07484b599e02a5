//! A response body, any bytes, read for its usage as an event stream and
//! as JSON: never a panic, and the same usage however the body is cut into
//! chunks (a proxy reads it as the network delivers it). The first byte
//! picks the chunk size; the rest is the body.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice::config::usage::JsonPointers;
use sluice::policy::usage::UsageReader;

const POINTERS: [&str; 4] = [
    "/usage/total_tokens",
    "/usage/input_tokens",
    "/usage/output_tokens",
    "/message/usage/input_tokens",
];

fn read(content_type: &str, body: &[u8], chunk: usize) -> Option<u64> {
    let pointers = JsonPointers::new(POINTERS.iter().map(|p| p.to_string()).collect())
        .expect("pointers");
    let mut reader = UsageReader::new(pointers, content_type, 512);
    for part in body.chunks(chunk) {
        reader.feed(part);
    }
    reader.finish()
}

fuzz_target!(|input: &[u8]| {
    let Some((&first, body)) = input.split_first() else {
        return;
    };
    let chunk = usize::from(first % 17) + 1;
    for content_type in ["text/event-stream", "application/json"] {
        let whole = read(content_type, body, body.len().max(1));
        let cut = read(content_type, body, chunk);
        assert_eq!(whole, cut, "{content_type}, chunks of {chunk}");
    }
});
