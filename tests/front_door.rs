//! What a hostile or broken client can hold of the gateway: idle keep-alive
//! connections, trickled heads, oversized heads and targets, stalled bodies,
//! too many connections. Short configured values; real binary and upstream.
//! Also WebSocket, the one upgrade that passes, counted once per connection.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

/// sluice with `limits` added to `server:`, one upstream, no limits.
fn start(upstream: &Upstream, limits: &str) -> Sluice {
    let body = format!(
        "limiter:\n  backend: local\nupstreams:\n  api: {{ servers: [\"{}\"] }}\nroutes:\n  - name: all\n    upstream: api\n",
        upstream.addr
    );
    Sluice::start_with_server(limits, &body, &[])
}

/// Reads until EOF, reset or `limit`; returns what was read and when it ended.
fn read_until_closed(stream: &mut TcpStream, limit: Duration) -> (Vec<u8>, Duration) {
    let start = Instant::now();
    stream.set_read_timeout(Some(limit)).expect("timeout");
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return (bytes, start.elapsed()),
            Ok(n) => bytes.extend_from_slice(&buf[..n]),
        }
    }
}

fn rejected(sluice: &Sluice, reason: &str) -> u64 {
    metric_value(
        &sluice.metrics(),
        &format!("sluice_downstream_rejected_total{{reason=\"{reason}\"}}"),
    )
}

#[test]
fn an_idle_keep_alive_connection_is_closed() {
    let upstream = Upstream::start();
    let sluice = start(&upstream, "  keepalive_timeout: 1s\n");
    let mut stream = TcpStream::connect(sluice.addr).expect("connect");
    stream
        .write_all(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("write");
    let mut response = [0u8; 512];
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let n = stream.read(&mut response).expect("response");
    assert!(response[..n].starts_with(b"HTTP/1.1 200"));
    // The connection stays open for another request...
    let (rest, idle) = read_until_closed(&mut stream, Duration::from_secs(20));
    // ...until it has been idle for keepalive_timeout.
    assert!(
        rest.is_empty() || rest.ends_with(b"upstream ok"),
        "{rest:?}"
    );
    assert!(idle >= Duration::from_millis(800), "closed after {idle:?}");
    assert!(idle < Duration::from_secs(8), "closed after {idle:?}");
}

#[test]
fn a_trickled_head_is_cut_off_while_others_are_served() {
    let upstream = Upstream::start();
    let sluice = start(&upstream, "  client_header_timeout: 1s\n");
    let mut slow = TcpStream::connect(sluice.addr).expect("connect");
    slow.write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n")
        .expect("write");
    let mut writer = slow.try_clone().expect("clone");
    let trickle = thread::spawn(move || {
        for _ in 0..40 {
            thread::sleep(Duration::from_millis(250));
            if writer.write_all(b"X-Trickle: 1\r\n").is_err() {
                return;
            }
        }
    });
    // A normal request is answered meanwhile.
    let normal = sluice.get("/normal", &[]);
    assert_eq!(normal.status, 200);
    assert!(
        normal.elapsed < Duration::from_secs(1),
        "{:?}",
        normal.elapsed
    );

    let (_, closed_after) = read_until_closed(&mut slow, Duration::from_secs(20));
    assert!(
        closed_after < Duration::from_secs(5),
        "a trickled head was held for {closed_after:?} (client_header_timeout: 1s)"
    );
    trickle.join().expect("trickle");
    assert!(rejected(&sluice, "header_timeout") >= 1);
    assert_eq!(
        upstream.hits(),
        1,
        "the trickled request never reached the upstream"
    );
}

#[test]
fn oversized_heads_get_431_and_long_targets_414() {
    let upstream = Upstream::start();
    let sluice = start(
        &upstream,
        "  max_header_bytes: 4096\n  max_uri_bytes: 1024\n",
    );
    let mut head = b"GET /a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n".to_vec();
    for i in 0..200 {
        head.extend_from_slice(format!("X-Pad-{i}: 0123456789abcdef\r\n").as_bytes());
    }
    head.extend_from_slice(b"\r\n");
    let response = raw_request(sluice.addr, &head);
    assert_eq!(response.status, 431, "{}", response.body);

    let long = format!("/{}", "a".repeat(6000));
    let response = sluice.get(&long, &[]);
    assert_eq!(response.status, 414, "{}", response.body);

    // Just under both limits is fine.
    let fits = format!("/{}", "a".repeat(900));
    assert_eq!(sluice.get(&fits, &[]).status, 200);
    assert_eq!(upstream.hits(), 1);
    assert_eq!(rejected(&sluice, "header_too_large"), 1);
    assert_eq!(rejected(&sluice, "uri_too_long"), 1);
}

#[test]
fn a_stalled_body_is_cut_off() {
    let upstream = Upstream::start();
    let sluice = start(&upstream, "  client_body_timeout: 1s\n");
    let mut stream = TcpStream::connect(sluice.addr).expect("connect");
    stream
        .write_all(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n0123456789")
        .expect("write");
    let (_, closed_after) = read_until_closed(&mut stream, Duration::from_secs(30));
    assert!(
        closed_after < Duration::from_secs(6),
        "a stalled body was held for {closed_after:?} (client_body_timeout: 1s)"
    );
}

#[test]
fn a_client_that_stops_reading_is_cut_off() {
    let upstream = Upstream::start();
    let sluice = start(&upstream, "  send_timeout: 1s\n");
    let mut stream = TcpStream::connect(sluice.addr).expect("connect");
    // 256 MiB: far more than the socket buffers on both sides hold.
    stream
        .write_all(b"GET /big/268435456 HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("write");
    // Read nothing: sluice's writes block, and send_timeout ends them.
    wait_until(
        Duration::from_secs(20),
        "send_timeout to cut the client off",
        || rejected(&sluice, "send_timeout") >= 1,
    );
    let (bytes, _) = read_until_closed(&mut stream, Duration::from_secs(20));
    assert!(
        bytes.len() < 268_435_456,
        "the whole body was sent: {}",
        bytes.len()
    );
}

#[test]
fn connections_beyond_the_cap_are_closed_at_once() {
    let upstream = Upstream::start();
    let sluice = start(&upstream, "  max_connections: 3\n");
    let held: Vec<TcpStream> = (0..3)
        .map(|_| TcpStream::connect(sluice.addr).expect("connect"))
        .collect();
    wait_until(Duration::from_secs(10), "3 connections counted", || {
        metric_value(&sluice.metrics(), "sluice_downstream_connections") == 3
    });
    let mut extra = TcpStream::connect(sluice.addr).expect("connect");
    let _ = extra.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    let (bytes, closed_after) = read_until_closed(&mut extra, Duration::from_secs(10));
    assert!(bytes.is_empty(), "{}", String::from_utf8_lossy(&bytes));
    assert!(closed_after < Duration::from_secs(2), "{closed_after:?}");
    assert!(rejected(&sluice, "max_connections") >= 1);

    drop(held);
    wait_until(Duration::from_secs(10), "a free slot", || {
        try_get(sluice.addr, "/again", &[]).is_ok_and(|r| r.status == 200)
    });
}

/// A sluice with a `/ws/` route to a WebSocket echo server, limited by
/// `limit` (a limit entry).
fn chat_gateway(limit: &str) -> Sluice {
    let ws = websocket_echo_server();
    let body = format!(
        r#"limiter:
  backend: local
upstreams:
  chat: {{ servers: ["{ws}"] }}
routes:
  - name: chat
    match: {{ path_prefix: /ws/ }}
    upstream: chat
    limits:
      - {limit}
"#
    );
    Sluice::start_with_server("", &body, &[])
}

/// A WebSocket handshake to `/ws/room`: its status, and the socket when it
/// opened.
fn open_socket(sluice: &Sluice) -> (u16, Option<tungstenite::WebSocket<TcpStream>>) {
    open_websocket(sluice.addr, "/ws/room", &[])
}

#[test]
fn websocket_passes_and_its_limit_counts_connections() {
    let sluice = chat_gateway("{ name: per-ip, key: [ip], limit: 1, window: 1m }");
    let (status, socket) = open_socket(&sluice);
    assert_eq!(status, 101);
    let mut socket = socket.expect("an open socket");
    for i in 0..5 {
        let text = format!("message {i}");
        socket
            .send(tungstenite::Message::text(text.clone()))
            .expect("send");
        let echo = socket.read().expect("echo");
        assert_eq!(echo.into_text().expect("text").as_str(), text);
    }
    // Five messages, one connection: the limit counted the handshake once.
    assert_eq!(open_socket(&sluice).0, 429, "a second connection");
    let _ = socket.close(None);
}

/// A `concurrency` limit on a WebSocket route holds its lease for the life
/// of the connection, and gives it back when either side closes.
#[test]
fn a_websocket_holds_its_concurrency_lease_until_either_side_closes() {
    let sluice = chat_gateway("{ name: open, key: [ip], limit: 1, algorithm: concurrency }");
    let open = || open_socket(&sluice);

    // The client closes: the lease comes back.
    let mut first = open().1.expect("first connection");
    first
        .send(tungstenite::Message::text("hello"))
        .expect("send");
    first.read().expect("echo");
    assert_eq!(open().0, 429, "the lease is held while it is open");
    first.close(None).expect("close");
    while first.read().is_ok() {}
    drop(first);
    let mut second = None;
    wait_until(
        Duration::from_secs(5),
        "the lease released on close",
        || {
            second = open().1;
            second.is_some()
        },
    );

    // The upstream closes: the lease comes back too, while this client
    // still holds its end.
    let mut second = second.expect("second connection");
    assert_eq!(open().0, 429);
    second
        .send(tungstenite::Message::text("bye"))
        .expect("send bye");
    while second.read().is_ok() {}
    wait_until(Duration::from_secs(5), "the lease released again", || {
        open().0 == 101
    });
    drop(second);
}
