//! The access log: one JSON object per request, one per line, on stderr
//! (`server.access_log: stderr`, the default; `off` disables it).
//!
//! It is written directly, not through `log`, so that `RUST_LOG` does not
//! filter it and every line is a complete JSON object a log shipper can parse.
//! It never holds request headers: no `Authorization`, no token, no cookie.
//! The path is written without its query string, which often carries secrets
//! (`?access_token=`).

use serde::Serialize;
use std::io::Write;
use std::net::IpAddr;
use std::time::SystemTime;

/// One request's line.
#[derive(Debug, Serialize)]
pub struct AccessLogLine<'a> {
    /// When the request ended, RFC 3339 UTC with milliseconds.
    pub time: String,
    /// The matched route, or `_unmatched`.
    pub route: &'a str,
    /// The request method.
    pub method: &'a str,
    /// The request path, without query.
    pub path: &'a str,
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

    /// Writes the line to stderr in one `write`, so lines from concurrent
    /// requests never interleave. A failed write is dropped: logging must
    /// never fail a request.
    pub fn write(&self) {
        let line = self.to_line();
        let _ = std::io::stderr().lock().write_all(&line);
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
            status: 429,
            upstream: None,
            upstream_addr: None,
            duration_ms: 1.5,
            decision: Some("deny"),
            limit: Some("per-user"),
            source: Some("redis"),
            client: IpAddr::from([192, 0, 2, 1]),
        }
        .to_line();
        assert_eq!(line.last(), Some(&b'\n'));
        assert_eq!(line.iter().filter(|b| **b == b'\n').count(), 1);
        let value: serde_json::Value = serde_json::from_slice(&line).expect("valid JSON");
        assert_eq!(value["route"], "sms");
        assert_eq!(value["status"], 429);
        assert_eq!(value["limit"], "per-user");
        assert_eq!(value["client"], "192.0.2.1");
        assert_eq!(value["path"], "/sms/\"quoted\"\n");
        assert!(value["upstream"].is_null());
        let time = value["time"].as_str().unwrap_or_default();
        assert!(humantime::parse_rfc3339(time).is_ok(), "{time}");
    }
}
