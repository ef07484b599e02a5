//! The request head as it arrives, byte by byte: where it ends, and
//! whether its request line or its headers are over the caps (414, 431),
//! without parsing what Pingora parses.

use crate::config::FrontDoorConfig;

/// Why the front door refused a request head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadRefusal {
    /// The request target is longer than `max_uri_bytes`: 414.
    UriTooLong,
    /// The head is larger than `max_header_bytes`: 431.
    HeaderTooLarge,
}

impl HeadRefusal {
    pub(super) fn reason(self) -> &'static str {
        match self {
            HeadRefusal::UriTooLong => "uri_too_long",
            HeadRefusal::HeaderTooLarge => "header_too_large",
        }
    }

    pub(super) fn response(self) -> &'static [u8] {
        match self {
            HeadRefusal::UriTooLong => {
                b"HTTP/1.1 414 URI Too Long\r\nContent-Type: application/json\r\nContent-Length: 24\r\nConnection: close\r\n\r\n{\"error\":\"uri_too_long\"}"
            }
            HeadRefusal::HeaderTooLarge => {
                b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: application/json\r\nContent-Length: 28\r\nConnection: close\r\n\r\n{\"error\":\"header_too_large\"}"
            }
        }
    }
}

/// Where a request head is, byte by byte: its size, its target's size, and
/// whether it is complete.
#[derive(Debug, Clone, Default)]
pub struct HeadScan {
    /// Bytes of the head so far (leading empty lines not counted).
    bytes: usize,
    /// The request line has ended.
    line_done: bool,
    /// Offset of the first space of the request line, once seen.
    first_space: Option<usize>,
    /// Offset of the last space of the request line so far.
    last_space: Option<usize>,
    /// 0: inside a line; 1: just after LF; 2: after LF then CR.
    after_newline: u8,
}

/// What a scanned chunk says about the head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadProgress {
    /// The head goes on.
    Partial,
    /// The head ended within this chunk.
    Complete,
    /// The head breaks a limit.
    Refused(HeadRefusal),
}

impl HeadScan {
    /// Feeds the next bytes of the head. Looks only at line ends and the
    /// request line's spaces (memchr), so a head costs a few instructions
    /// per line rather than per byte.
    pub fn feed(&mut self, chunk: &[u8], limits: &FrontDoorConfig) -> HeadProgress {
        let mut rest = chunk;
        if self.bytes == 0 {
            // Empty lines before a request line are ignored.
            let start = rest
                .iter()
                .position(|&b| b != b'\r' && b != b'\n')
                .unwrap_or(rest.len());
            rest = &rest[start..];
            if rest.is_empty() {
                return HeadProgress::Partial;
            }
        }
        if !self.line_done {
            match self.request_line(rest, limits) {
                Ok(Some(after)) => rest = &rest[after..],
                Ok(None) => return HeadProgress::Partial,
                Err(refusal) => return HeadProgress::Refused(refusal),
            }
        }
        self.header_lines(rest, limits)
    }

    /// Follows the request line through `part`: `Ok(Some(n))` when it ends
    /// within `part` (n bytes of it belong to the line, LF included).
    pub(super) fn request_line(
        &mut self,
        part: &[u8],
        limits: &FrontDoorConfig,
    ) -> Result<Option<usize>, HeadRefusal> {
        let end = memchr::memchr(b'\n', part);
        let line = &part[..end.unwrap_or(part.len())];
        if let Some(i) = memchr::memchr(b' ', line) {
            self.first_space.get_or_insert(self.bytes + i);
        }
        if let Some(i) = memchr::memrchr(b' ', line) {
            self.last_space = Some(self.bytes + i);
        }
        let Some(end) = end else {
            self.bytes += part.len();
            // Still in the target: refused as soon as it is certainly too
            // long (" HTTP/1.1\r\n" is all that may follow it).
            let too_long = self.first_space.is_some_and(|first| {
                self.bytes - first > limits.max_uri_bytes + " HTTP/1.1\r\n".len()
            });
            return match () {
                _ if too_long => Err(HeadRefusal::UriTooLong),
                _ if self.bytes > limits.max_header_bytes => Err(HeadRefusal::HeaderTooLarge),
                _ => Ok(None),
            };
        };
        self.bytes += end + 1;
        self.line_done = true;
        self.after_newline = 1;
        if let (Some(first), Some(last)) = (self.first_space, self.last_space) {
            if last > first && last - first - 1 > limits.max_uri_bytes {
                return Err(HeadRefusal::UriTooLong);
            }
        }
        // What the partial check above would have refused, had the line come
        // in pieces: the verdict never depends on how the bytes arrive (a
        // line with more than two spaces, or a long version, is malformed
        // anyway). The LF is counted here, not there.
        let after_first = self.first_space.map(|first| self.bytes - first);
        if after_first.is_some_and(|n| n > limits.max_uri_bytes + " HTTP/1.1\r\n".len() + 1) {
            return Err(HeadRefusal::UriTooLong);
        }
        if self.bytes > limits.max_header_bytes {
            return Err(HeadRefusal::HeaderTooLarge);
        }
        Ok(Some(end + 1))
    }

    /// Looks for the empty line that ends the head (LF, optional CR, LF).
    pub(super) fn header_lines(&mut self, part: &[u8], limits: &FrontDoorConfig) -> HeadProgress {
        let mut state = self.after_newline;
        let mut at = 0;
        while at < part.len() {
            match (state, part[at]) {
                (1 | 2, b'\n') => {
                    self.bytes += at + 1;
                    if self.bytes > limits.max_header_bytes {
                        return HeadProgress::Refused(HeadRefusal::HeaderTooLarge);
                    }
                    return HeadProgress::Complete;
                }
                (1, b'\r') => {
                    state = 2;
                    at += 1;
                }
                _ => match memchr::memchr(b'\n', &part[at..]) {
                    // The LF that ends this line: the next byte decides.
                    Some(i) => {
                        state = 1;
                        at += i + 1;
                    }
                    None => {
                        state = 0;
                        at = part.len();
                    }
                },
            }
        }
        self.bytes += part.len();
        self.after_newline = state;
        if self.bytes > limits.max_header_bytes {
            return HeadProgress::Refused(HeadRefusal::HeaderTooLarge);
        }
        HeadProgress::Partial
    }
}
