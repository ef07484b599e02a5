//! The front door's head scanner on any bytes, fed in any chunks: the
//! verdict does not depend on how the bytes were split (a head over both
//! caps may be refused for either), a complete head holds an empty line,
//! and a refusal is for a head over its cap.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice::config::FrontDoorConfig;
use sluice::edge::front_door::{HeadProgress, HeadRefusal, HeadScan};
use sluice::target::EscapedSlashes;
use std::time::Duration;

/// Feeds `chunks` until the scan decides; the verdict and the bytes fed.
fn scan<'a>(
    chunks: impl Iterator<Item = &'a [u8]>,
    limits: &FrontDoorConfig,
) -> (HeadProgress, usize) {
    let mut head = HeadScan::default();
    let mut fed = 0;
    for chunk in chunks {
        fed += chunk.len();
        match head.feed(chunk, limits) {
            HeadProgress::Partial => {}
            decided => return (decided, fed),
        }
    }
    (HeadProgress::Partial, fed)
}

fuzz_target!(|input: (u8, u8, u16, u16, &[u8])| {
    let (cut_a, cut_b, max_uri, max_header, bytes) = input;
    let limits = FrontDoorConfig {
        escaped_slashes: EscapedSlashes::Reject,
        client_header_timeout: Duration::from_secs(10),
        keepalive_timeout: Duration::from_secs(60),
        client_body_timeout: Duration::from_secs(60),
        send_timeout: Duration::from_secs(60),
        max_header_bytes: usize::from(max_header).max(16),
        max_uri_bytes: usize::from(max_uri).max(1),
        max_connections: 1,
    };
    let (whole, _) = scan(std::iter::once(bytes), &limits);
    // The same bytes in up to three chunks, cut anywhere.
    let a = usize::from(cut_a).min(bytes.len());
    let b = (a + usize::from(cut_b)).min(bytes.len());
    let pieces = [&bytes[..a], &bytes[a..b], &bytes[b..]];
    let (split, fed) = scan(pieces.into_iter(), &limits);
    let _ = fed;
    // A complete head may be seen in the chunk where it ends; a refusal as
    // soon as a cap is certainly passed: the verdict is the same however
    // the bytes come.
    // (A head over both caps may be refused for either.)
    let both_refused = matches!(
        (whole, split),
        (HeadProgress::Refused(_), HeadProgress::Refused(_))
    );
    assert!(
        both_refused || whole == split,
        "chunked at {a} and {b}: {whole:?} / {split:?}"
    );
    match whole {
        HeadProgress::Complete => {
            let ends =
                bytes.windows(2).any(|w| w == b"\n\n") || bytes.windows(3).any(|w| w == b"\n\r\n");
            assert!(ends, "complete without an empty line");
        }
        HeadProgress::Refused(HeadRefusal::HeaderTooLarge) => {
            assert!(
                bytes.len() > limits.max_header_bytes,
                "refused under the cap"
            );
        }
        HeadProgress::Refused(HeadRefusal::UriTooLong) => {
            assert!(
                bytes.len() > limits.max_uri_bytes,
                "a target under the cap refused"
            );
        }
        HeadProgress::Partial => {}
    }
});
