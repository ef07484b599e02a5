use super::*;

fn pointers(list: &[&str]) -> JsonPointers {
    JsonPointers::new(list.iter().map(|p| p.to_string()).collect()).unwrap()
}

/// Feeds `body` in chunks of `size` bytes and finishes.
fn read(list: &[&str], content_type: &str, body: &str, size: usize) -> Option<u64> {
    let mut reader = UsageReader::new(pointers(list), content_type, 4096);
    for chunk in body.as_bytes().chunks(size.max(1)) {
        reader.feed(chunk);
    }
    reader.finish()
}

const OPENAI_JSON: &str = r#"{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":30,"total_tokens":42}}"#;

const OPENAI_STREAM: &str = "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n\
data: {\"id\":\"c\",\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n\
data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":30,\"total_tokens\":42}}\n\n\
data: [DONE]\n\n";

const ANTHROPIC_JSON: &str = r#"{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":25,"output_tokens":17}}"#;

const ANTHROPIC_STREAM: &str = "event: message_start\r\n\
data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\r\n\r\n\
event: content_block_delta\r\n\
data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\r\n\r\n\
event: message_delta\r\n\
data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":9}}\r\n\r\n\
event: message_delta\r\n\
data: {\"type\":\"message_delta\",\"delta\":{},\"usage\":{\"output_tokens\":17}}\r\n\r\n\
event: message_stop\r\n\
data: {\"type\":\"message_stop\"}\r\n\r\n";

const ANTHROPIC: [&str; 3] = [
    "/usage/input_tokens",
    "/usage/output_tokens",
    "/message/usage/input_tokens",
];

#[test]
fn openai_usage_is_read_from_the_body_and_from_the_stream_in_any_chunking() {
    for size in [1, 2, 7, 64, 4096] {
        let json = read(
            &["/usage/total_tokens"],
            "application/json",
            OPENAI_JSON,
            size,
        );
        assert_eq!(json, Some(42), "chunks of {size}");
        let stream = read(
            &["/usage/total_tokens"],
            "text/event-stream; charset=utf-8",
            OPENAI_STREAM,
            size,
        );
        assert_eq!(stream, Some(42), "chunks of {size}");
    }
}

#[test]
fn anthropic_usage_is_read_from_the_body_and_the_stream_with_one_list() {
    for size in [1, 3, 50, 4096] {
        assert_eq!(
            read(&ANTHROPIC, "application/json", ANTHROPIC_JSON, size),
            Some(42)
        );
        // message_start's input (25) + the last message_delta's output (17).
        assert_eq!(
            read(&ANTHROPIC, "text/event-stream", ANTHROPIC_STREAM, size),
            Some(42)
        );
    }
}

#[test]
fn a_stream_cut_short_has_the_usage_seen_so_far() {
    let mut reader = UsageReader::new(pointers(&ANTHROPIC), "text/event-stream", 4096);
    let cut = ANTHROPIC_STREAM.find("event: message_delta").unwrap();
    reader.feed(&ANTHROPIC_STREAM.as_bytes()[..cut]);
    assert_eq!(reader.usage(), Some(25), "message_start's input only");
    let mut openai = UsageReader::new(
        pointers(&["/usage/total_tokens"]),
        "text/event-stream",
        4096,
    );
    openai.feed(&OPENAI_STREAM.as_bytes()[..40]);
    assert_eq!(openai.usage(), None, "null usage is no value");
}

#[test]
fn no_usage_where_the_body_does_not_say_it() {
    let total = ["/usage/total_tokens"];
    for (content_type, body) in [
        ("application/json", r#"{"usage":null}"#),
        ("application/json", r#"{"usage":{"total_tokens":"42"}}"#),
        ("application/json", r#"{"usage":{"total_tokens":-1}}"#),
        ("application/json", r#"{"usage":{"total_tokens":1.5}}"#),
        ("application/json", "not json {"),
        ("application/json", ""),
        ("text/plain", OPENAI_JSON),
        ("text/html", OPENAI_STREAM),
        ("text/event-stream", "data: [DONE]\n\n"),
        ("text/event-stream", ": a comment\n\nevent: ping\n\n"),
    ] {
        assert_eq!(
            read(&total, content_type, body, 5),
            None,
            "{content_type}: {body}"
        );
    }
    assert_eq!(read(&total, "Application/JSON", OPENAI_JSON, 9), Some(42));
    assert_eq!(
        read(&total, "application/vnd.api+json", OPENAI_JSON, 9),
        Some(42)
    );
    assert_eq!(
        read(
            &total,
            "application/json",
            r#"{"usage":{"total_tokens":42.0}}"#,
            9
        ),
        Some(42)
    );
}

#[test]
fn memory_stays_bounded_and_an_oversized_event_is_skipped_not_the_stream() {
    let total = ["/usage/total_tokens"];
    // A JSON body over the cap is not read at all.
    let mut big = UsageReader::new(pointers(&total), "application/json", 64);
    let body = format!(
        r#"{{"pad":"{}","usage":{{"total_tokens":7}}}}"#,
        "x".repeat(100)
    );
    big.feed(body.as_bytes());
    assert_eq!(big.finish(), None);
    assert!(big.pending.capacity() <= 64);
    // In a stream, one event over the cap is skipped; the next one is read.
    let mut stream = UsageReader::new(pointers(&total), "text/event-stream", 64);
    let huge = format!(
        "data: {{\"pad\":\"{}\",\"usage\":{{\"total_tokens\":99}}}}\n\n",
        "y".repeat(10_000)
    );
    for chunk in huge.as_bytes().chunks(1000) {
        stream.feed(chunk);
        assert!(stream.pending.len() + stream.data.len() <= 64);
    }
    stream.feed(b"data: {\"usage\":{\"total_tokens\":5}}\n\n");
    assert_eq!(stream.finish(), Some(5));
}

#[test]
fn multi_line_data_is_one_document_and_a_missing_blank_line_still_ends_it() {
    let total = ["/usage/total_tokens"];
    let split = "data: {\"usage\":\ndata: {\"total_tokens\": 8}}\n\n";
    assert_eq!(read(&total, "text/event-stream", split, 3), Some(8));
    let unterminated = "data: {\"usage\":{\"total_tokens\":9}}";
    assert_eq!(read(&total, "text/event-stream", unterminated, 4), Some(9));
    // The last event that carries a pointer wins.
    let two =
        "data: {\"usage\":{\"total_tokens\":3}}\n\ndata: {\"usage\":{\"total_tokens\":11}}\n\n";
    assert_eq!(read(&total, "text/event-stream", two, 6), Some(11));
}

#[test]
fn pointers_are_json_pointers() {
    assert!(JsonPointers::new(vec!["/usage/total_tokens".into()]).is_ok());
    assert!(JsonPointers::new(vec!["".into()]).is_ok());
    assert!(JsonPointers::new(vec!["usage.total_tokens".into()]).is_err());
    assert!(JsonPointers::new(vec![]).is_err());
    // A huge sum saturates instead of wrapping.
    let doc = r#"{"a":18446744073709551615,"b":5}"#;
    assert_eq!(
        read(&["/a", "/b"], "application/json", doc, 4),
        Some(u64::MAX)
    );
}

/// Events are parsed only when a key a pointer ends in appears in them;
/// keys that need escaping, array indices and the whole document are still
/// found.
#[test]
fn only_events_that_may_carry_usage_are_parsed_and_none_is_missed() {
    let stream = |data: &str| format!("data: {data}\n\n");
    // A text event that mentions the key inside its content is parsed and
    // yields nothing; the usage event is found.
    let body = stream(r#"{"content":"say \"total_tokens\" twice","usage":null}"#)
        + &stream(r#"{"usage":{"total_tokens":7}}"#);
    assert_eq!(
        read(&["/usage/total_tokens"], "text/event-stream", &body, 5),
        Some(7)
    );
    for (pointer, data, want) in [
        ("/a~1b", r#"{"a/b":5}"#, 5),
        ("/a~0b", r#"{"a~b":6}"#, 6),
        ("/q\"k", r#"{"q\"k":8}"#, 8),
        ("/counts/1", r#"{"counts":[1,9]}"#, 9),
        ("", "11", 11),
    ] {
        let body = stream(r#"{"other":1}"#) + &stream(data);
        assert_eq!(
            read(&[pointer], "text/event-stream", &body, 3),
            Some(want),
            "{pointer}"
        );
    }
    assert_eq!(
        needles(&pointers(&[
            "/usage/total_tokens",
            "/message/usage/input_tokens"
        ])),
        Some(vec![
            b"\"total_tokens\"".to_vec(),
            b"\"input_tokens\"".to_vec()
        ])
    );
    assert_eq!(
        needles(&pointers(&["/usage/total_tokens", "/list/0"])),
        None
    );
}

/// The fuzz target's property (fuzz/fuzz_targets/usage_stream.rs) over a
/// deterministic corpus of streams built to sit on the reader's edges: one-
/// and multi-line events, `\r\n`, `event:` lines, lines and events around
/// the size cap, usage in and out of oversized events — the same usage
/// however the stream is cut into chunks.
#[test]
fn the_usage_does_not_depend_on_how_the_stream_is_cut() {
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move |n: u64| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) % n.max(1)
    };
    let list = [
        "/usage/total_tokens",
        "/usage/input_tokens",
        "/message/usage/input_tokens",
    ];
    for case in 0..400 {
        let mut body = String::new();
        for _ in 0..(1 + next(6)) {
            let pad = "x".repeat(match next(4) {
                0 => 0,
                1 => next(40) as usize,
                2 => 4096 - 60 + next(120) as usize,
                _ => 5000,
            });
            let value = next(1000);
            let newline = if next(3) == 0 { "\r\n" } else { "\n" };
            match next(5) {
                0 => body += &format!("data: {{\"t\":\"{pad}\",\"usage\":{{\"total_tokens\":{value}}}}}{newline}{newline}"),
                1 => body += &format!("event: message_start{newline}data: {{\"message\":{{\"usage\":{{\"input_tokens\":{value}}}}},\"p\":\"{pad}\"}}{newline}{newline}"),
                2 => body += &format!("data: {{\"usage\":{newline}data: {{\"input_tokens\":{value}}},\"p\":\"{pad}\"}}{newline}{newline}"),
                3 => body += &format!(": comment {pad}{newline}data: {{\"usage\":null}}{newline}{newline}"),
                _ => body += &format!("data: {{\"text\":\"{pad}\"}}{newline}{newline}"),
            }
        }
        let whole = read(&list, "text/event-stream", &body, body.len());
        for size in [1, 2, 3, 7, 64, 1000, 4095, 4096, 4097] {
            assert_eq!(
                read(&list, "text/event-stream", &body, size),
                whole,
                "case {case}, chunks of {size}"
            );
        }
    }
}
