//! A response's usage read from its body as it passes: the numbers at JSON
//! pointers (RFC 6901) in an `application/json` body, or in the events of a
//! `text/event-stream` (the last event that carries each pointer wins), summed.
//! This is how LLM APIs report what a request cost: OpenAI's
//! `usage.total_tokens` in the body or in the stream's last chunk, Anthropic's
//! `usage.input_tokens` in `message_start` and the running
//! `usage.output_tokens` in each `message_delta`.
//!
//! The reader only looks: it is fed each chunk after the chunk has been
//! passed on, and never holds a byte back. Its memory is bounded by `max`: a
//! JSON body over it, or one event over it, is passed on and not parsed.

use crate::config::usage::{units, JsonPointers};
use serde_json::Value;

/// The most of a response the reader holds at once: a JSON body, or one
/// event of a stream, larger than this is passed on unread.
pub const USAGE_READ_MAX: usize = 256 * 1024;

/// How a body is read, by its `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    /// One JSON document (`application/json`, `…+json`).
    Json,
    /// Server-sent events (`text/event-stream`), each `data` a JSON document.
    EventStream,
    /// Anything else: no usage is read from it.
    Other,
}

/// The usage of one response, read as its body passes.
#[derive(Debug)]
pub struct UsageReader {
    pointers: JsonPointers,
    format: Format,
    max: usize,
    /// The JSON body so far, or the current event's lines.
    pending: Vec<u8>,
    /// The current event's `data`, joined by newlines.
    data: Vec<u8>,
    /// Past `max`: the JSON body, or the rest of the current event, is
    /// passed on unread.
    skipping: bool,
    /// The last value seen at each pointer.
    values: Vec<Option<u64>>,
    /// The keys the pointers end in, quoted: an event none of them appears
    /// in carries no usage and is not parsed (`None`: every event is, as a
    /// pointer ends in an array index or names the whole document).
    needles: Option<Vec<memchr::memmem::Finder<'static>>>,
}

/// The quoted key each pointer ends in (`/usage/total_tokens` →
/// `"total_tokens"`), as it must appear, byte for byte, in a document
/// holding a value there (a key written with escapes is not looked for);
/// `None` when a pointer ends in an array index or is the whole document.
fn needles(pointers: &JsonPointers) -> Option<Vec<Vec<u8>>> {
    pointers
        .as_slice()
        .iter()
        .map(|p| {
            let last = p.rsplit('/').next().filter(|_| !p.is_empty())?;
            if last.is_empty() || last.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let key = last.replace("~1", "/").replace("~0", "~");
            let quoted = serde_json::to_vec(&key).ok()?;
            Some(quoted)
        })
        .collect()
}

impl UsageReader {
    /// A reader of a response whose `Content-Type` is `content_type`, for
    /// `pointers` (a pointer the answer lacks, or holds `null` at, adds
    /// nothing), holding at most `max` bytes of it at once.
    pub fn new(pointers: JsonPointers, content_type: &str, max: usize) -> Self {
        let count = pointers.as_slice().len();
        UsageReader {
            needles: needles(&pointers).map(|list| {
                list.iter()
                    .map(|n| memchr::memmem::Finder::new(n).into_owned())
                    .collect()
            }),
            pointers,
            format: format_of(content_type),
            max,
            pending: Vec::new(),
            data: Vec::new(),
            skipping: false,
            values: vec![None; count],
        }
    }

    /// Reads `chunk`, the next bytes of the body (already passed on).
    pub fn feed(&mut self, chunk: &[u8]) {
        match self.format {
            Format::Other => {}
            Format::Json => {
                if self.skipping || self.pending.len() + chunk.len() > self.max {
                    self.skipping = true;
                    self.pending = Vec::new();
                } else {
                    self.pending.extend_from_slice(chunk);
                }
            }
            Format::EventStream => self.feed_events(chunk),
        }
    }

    /// The body ended: the usage it reported, if any pointer had a value.
    pub fn finish(&mut self) -> Option<u64> {
        match self.format {
            Format::Json if !self.skipping => {
                let body = std::mem::take(&mut self.pending);
                if let Ok(document) = serde_json::from_slice::<Value>(&body) {
                    self.take_values(&document);
                }
            }
            // A last event without its blank line still counts (a browser
            // would drop it; the usage it reports was spent all the same).
            Format::EventStream => {
                self.line_ended();
                self.line_ended();
            }
            _ => {}
        }
        self.usage()
    }

    /// The usage seen so far (a response cut short): the sum of the last
    /// value at each pointer, `None` when none had one.
    pub fn usage(&self) -> Option<u64> {
        let found: Vec<u64> = self.values.iter().flatten().copied().collect();
        (!found.is_empty()).then(|| found.iter().fold(0u64, |a, v| a.saturating_add(*v)))
    }

    /// Splits `chunk` into lines; each complete line is taken.
    fn feed_events(&mut self, mut chunk: &[u8]) {
        while let Some(end) = memchr::memchr(b'\n', chunk) {
            let line = &chunk[..end];
            chunk = &chunk[end + 1..];
            if !self.pending.is_empty() || self.skipping {
                self.append(line);
                self.line_ended();
                continue;
            }
            // A whole line in this chunk: taken where it is, exactly as
            // `append` then `line_ended` would take it.
            if self.data.len() + line.len() > self.max {
                // An oversized line ends its event, unread.
                self.data.clear();
                continue;
            }
            if self.data.is_empty() {
                // The usual event, `data: …` and a blank line in one
                // chunk: read without a copy.
                if let (Some(value), Some(blank)) = (data_value(line), blank_line(chunk)) {
                    self.event(value);
                    chunk = &chunk[blank..];
                    continue;
                }
            }
            self.line(line);
        }
        self.append(chunk);
    }

    /// An event's whole `data`: its values read if it may carry usage.
    fn event(&mut self, data: &[u8]) {
        if data.is_empty() || !self.may_carry_usage(data) {
            return;
        }
        if let Ok(document) = serde_json::from_slice::<Value>(data) {
            self.take_values(&document);
        }
    }

    /// Adds `bytes` to the current line, unless the event is over `max`.
    fn append(&mut self, bytes: &[u8]) {
        if self.skipping {
            return;
        }
        if self.pending.len() + self.data.len() + bytes.len() > self.max {
            self.skipping = true;
            self.pending = Vec::new();
            self.data = Vec::new();
            return;
        }
        self.pending.extend_from_slice(bytes);
    }

    /// A line ended: a `data` field is kept; a blank line ends the event
    /// (an event over `max` ends there too, unread).
    fn line_ended(&mut self) {
        let line = std::mem::take(&mut self.pending);
        self.line(&line);
        // Its buffer is kept for the next line that spans chunks.
        self.pending = line;
        self.pending.clear();
    }

    /// A whole line of the stream (its newline removed).
    fn line(&mut self, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            if !self.skipping {
                let data = std::mem::take(&mut self.data);
                self.event(&data);
                self.data = data;
            }
            self.data.clear();
            self.skipping = false;
            return;
        }
        if self.skipping {
            return;
        }
        if let Some(value) = line.strip_prefix(b"data:") {
            let value = value.strip_prefix(b" ").unwrap_or(value);
            if !self.data.is_empty() {
                self.data.push(b'\n');
            }
            self.data.extend_from_slice(value);
        }
    }

    /// Whether an event's `data` may hold a value at a pointer: one of the
    /// keys they end in appears in it (most events of a stream are text,
    /// and are not parsed).
    fn may_carry_usage(&self, data: &[u8]) -> bool {
        let Some(needles) = &self.needles else {
            return true;
        };
        needles.iter().any(|needle| needle.find(data).is_some())
    }

    /// Keeps the value at each pointer `document` has a number at.
    fn take_values(&mut self, document: &Value) {
        for (pointer, value) in self.pointers.as_slice().iter().zip(&mut self.values) {
            if let Some(found) = document.pointer(pointer).and_then(units) {
                *value = Some(found);
            }
        }
    }
}

/// The value of a `data` line (`data: VALUE`, its `\r` and one space
/// after the colon removed); `None` for any other line.
fn data_value(line: &[u8]) -> Option<&[u8]> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let value = line.strip_prefix(b"data:")?;
    Some(value.strip_prefix(b" ").unwrap_or(value))
}

/// The length of the blank line `rest` starts with (`\n` or `\r\n`), if
/// it starts with one.
fn blank_line(rest: &[u8]) -> Option<usize> {
    if rest.starts_with(b"\n") {
        Some(1)
    } else if rest.starts_with(b"\r\n") {
        Some(2)
    } else {
        None
    }
}

/// The format a `Content-Type` names (its media type, any case, parameters
/// ignored).
fn format_of(content_type: &str) -> Format {
    let media = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    if media == "text/event-stream" {
        Format::EventStream
    } else if media == "application/json" || media.ends_with("+json") {
        Format::Json
    } else {
        Format::Other
    }
}

#[cfg(test)]
#[path = "usage_tests.rs"]
mod tests;
