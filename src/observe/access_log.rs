//! The access log: one JSON object per request, one per line, on stderr
//! (`server.access_log: stderr`, the default; `off` disables it).
//!
//! It is written directly, not through `log`, so that `RUST_LOG` does not
//! filter it and every line is a complete JSON object a log shipper can parse.
//! It never holds request headers: no `Authorization`, no token, no cookie.
//! The path is written without its query string, which often carries secrets
//! (`?access_token=`), and capped at [`MAX_PATH`] bytes (`"truncated":true`).
//!
//! Lines never block a worker: they go into a bounded queue that a thread of
//! its own writes to stderr. A stderr that cannot keep up (a stalled pipe, a
//! slow terminal) fills the queue; then lines are dropped and counted
//! (`sluice_access_log_dropped_total`) instead of slowing requests down.

use prometheus::IntCounter;
use serde::Serialize;
use std::io::Write;
use std::net::IpAddr;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::OnceLock;
use std::time::SystemTime;

/// The longest path written, in bytes; a longer one is cut and flagged.
pub const MAX_PATH: usize = 2048;

/// Lines that may wait for the writer thread.
pub const QUEUE_LINES: usize = 8192;

/// One request's line.
#[derive(Debug, Serialize)]
pub struct AccessLogLine<'a> {
    /// When the request ended, RFC 3339 UTC with milliseconds.
    pub time: String,
    /// The matched route, or `_unmatched`.
    pub route: &'a str,
    /// The request method.
    pub method: &'a str,
    /// The canonical request path, without query, at most [`MAX_PATH`] bytes.
    pub path: &'a str,
    /// Whether `path` was cut to [`MAX_PATH`] bytes.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    /// The response status (0 if none was sent).
    pub status: u16,
    /// The upstream pool the request was proxied to, if any.
    pub upstream: Option<&'a str>,
    /// The server of the pool that was chosen, if any.
    pub upstream_addr: Option<&'a str>,
    /// Time from the request's start to the end of its response.
    pub duration_ms: f64,
    /// `allow`, `deny`, `shadow_deny` (admitted; a shadow limit would have
    /// denied), or absent when no limit applied.
    pub decision: Option<&'static str>,
    /// The limit that denied (or, for `shadow_deny`, would have).
    pub limit: Option<&'a str>,
    /// Who decided (the `source` label of the decision metric).
    pub source: Option<&'static str>,
    /// The client IP, as the limiter sees it (after trusted proxies).
    pub client: IpAddr,
    /// The request's ID, as returned to the client and sent upstream.
    pub request_id: Option<&'a str>,
    /// The consumer whose API key the request carried (never the key).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consumer: Option<&'a str>,
    /// The identity method whose credential decided who the request is
    /// (`jwt`, `api_key`, `header`), when one was present.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub identity: Option<&'static str>,
    /// The request's trace ID (32 hex digits), when tracing is on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// The pod that served it, in Kubernetes (`k8s.pod.name`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<&'static str>,
    /// Its namespace (`k8s.namespace.name`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<&'static str>,
    /// Units its limits reserved before it was proxied (`reserve`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserved: Option<u64>,
    /// The cost its response reported, which settled the reservation
    /// (absent: none reported, the reservation stands).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<u64>,
}

impl AccessLogLine<'_> {
    /// The current time in the access log's format.
    pub fn now() -> String {
        humantime::format_rfc3339_millis(SystemTime::now()).to_string()
    }

    /// The line as JSON, newline-terminated.
    pub fn to_line(&self) -> Vec<u8> {
        // Serializing plain strings and numbers cannot fail; an empty object
        // would still be a valid line.
        let mut line = serde_json::to_vec(self).unwrap_or_else(|_| b"{}".to_vec());
        line.push(b'\n');
        line
    }

    /// `path` cut to at most [`MAX_PATH`] bytes on a character boundary,
    /// and whether it was cut.
    pub fn capped(path: &str) -> (&str, bool) {
        if path.len() <= MAX_PATH {
            return (path, false);
        }
        let mut end = MAX_PATH;
        while !path.is_char_boundary(end) {
            end -= 1;
        }
        (&path[..end], true)
    }
}

/// The queue in front of the writer thread.
pub struct AccessLog {
    /// Made on the first line, so that the thread is started in the process
    /// that serves (after a `--daemon` fork, which keeps no threads).
    lines: OnceLock<Option<SyncSender<Vec<u8>>>>,
    capacity: usize,
    dropped: IntCounter,
}

impl AccessLog {
    /// An access log with a queue of `capacity` lines; lines that find it
    /// full are counted on `dropped`. The writer thread starts with the
    /// first line.
    pub fn new(capacity: usize, dropped: IntCounter) -> Self {
        Self {
            lines: OnceLock::new(),
            capacity,
            dropped,
        }
    }

    fn sender(&self) -> Option<&SyncSender<Vec<u8>>> {
        self.lines
            .get_or_init(|| {
                let (lines, queue) = sync_channel(self.capacity);
                let started = std::thread::Builder::new()
                    .name("sluice-access-log".into())
                    .spawn(move || write_lines(queue));
                match started {
                    Ok(_) => Some(lines),
                    Err(e) => {
                        log::error!("access log disabled: cannot start its writer thread: {e}");
                        None
                    }
                }
            })
            .as_ref()
    }

    /// Queues `line` without ever waiting: dropped and counted when full.
    pub fn write(&self, line: &AccessLogLine<'_>) {
        let sent = self.sender().map(|lines| lines.try_send(line.to_line()));
        match sent {
            Some(Ok(())) => {}
            Some(Err(TrySendError::Full(_) | TrySendError::Disconnected(_))) | None => {
                self.dropped.inc()
            }
        }
    }
}

/// The writer thread: whatever is queued goes out in one `write` per batch,
/// whole lines only, so lines never interleave. A failed write is dropped.
fn write_lines(queue: Receiver<Vec<u8>>) {
    let mut batch = Vec::with_capacity(64 * 1024);
    while let Ok(line) = queue.recv() {
        batch.extend_from_slice(&line);
        while batch.len() < 64 * 1024 {
            match queue.try_recv() {
                Ok(line) => batch.extend_from_slice(&line),
                Err(_) => break,
            }
        }
        let _ = std::io::stderr().lock().write_all(&batch);
        batch.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_one_json_object_with_the_fields() {
        let line = AccessLogLine {
            time: AccessLogLine::now(),
            route: "sms",
            method: "POST",
            path: "/sms/\"quoted\"\n",
            truncated: false,
            status: 429,
            upstream: None,
            upstream_addr: None,
            duration_ms: 1.5,
            decision: Some("deny"),
            limit: Some("per-user"),
            source: Some("redis"),
            client: IpAddr::from([192, 0, 2, 1]),
            request_id: Some("0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"),
            trace_id: None,
            consumer: Some("acme"),
            identity: Some("api_key"),
            pod: Some("sluice-0"),
            namespace: None,
            reserved: Some(100),
            cost: Some(37),
        }
        .to_line();
        assert_eq!(line.last(), Some(&b'\n'));
        assert_eq!(line.iter().filter(|b| **b == b'\n').count(), 1);
        let value: serde_json::Value = serde_json::from_slice(&line).expect("valid JSON");
        assert_eq!(value["route"], "sms");
        assert_eq!(
            (value["reserved"].as_u64(), value["cost"].as_u64()),
            (Some(100), Some(37))
        );
        assert_eq!(value["status"], 429);
        assert_eq!(value["limit"], "per-user");
        assert_eq!(value["client"], "192.0.2.1");
        assert_eq!(value["request_id"], "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b");
        assert_eq!(value["path"], "/sms/\"quoted\"\n");
        assert!(value["upstream"].is_null());
        let time = value["time"].as_str().unwrap_or_default();
        assert!(humantime::parse_rfc3339(time).is_ok(), "{time}");
    }

    #[test]
    fn long_paths_are_capped_on_a_character_boundary() {
        assert_eq!(AccessLogLine::capped("/short"), ("/short", false));
        let long = format!("/{}", "\u{e9}".repeat(MAX_PATH));
        let (cut, truncated) = AccessLogLine::capped(&long);
        assert!(truncated);
        assert!(cut.len() <= MAX_PATH && cut.len() >= MAX_PATH - 1);
    }

    #[test]
    fn a_full_queue_drops_and_counts_instead_of_waiting() {
        let dropped = IntCounter::new("dropped", "test").expect("counter");
        // No writer thread: nothing drains, so the queue fills at once.
        let (lines, _queue) = sync_channel(2);
        let log = AccessLog {
            lines: OnceLock::from(Some(lines)),
            capacity: 2,
            dropped: dropped.clone(),
        };
        let line = AccessLogLine {
            time: AccessLogLine::now(),
            route: "r",
            method: "GET",
            path: "/",
            truncated: false,
            status: 200,
            upstream: None,
            upstream_addr: None,
            duration_ms: 0.1,
            decision: None,
            limit: None,
            source: None,
            client: IpAddr::from([127, 0, 0, 1]),
            request_id: None,
            trace_id: None,
            consumer: None,
            identity: None,
            pod: None,
            namespace: None,
            reserved: None,
            cost: None,
        };
        for _ in 0..5 {
            log.write(&line);
        }
        assert_eq!(dropped.get(), 3);
    }
}
