//! `server.shutdown_delay`: on SIGTERM the process drains before its
//! graceful stop — `/readyz` answers 503 at once, the listeners keep
//! accepting and serving, kept-alive clients are told to go — then stops
//! within `shutdown_delay + grace_period`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

const DELAY: Duration = Duration::from_secs(3);
const GRACE: Duration = Duration::from_secs(1);

/// One request on a kept-alive connection: its status and whether the
/// response said `Connection: close`.
fn keep_alive_request(stream: &mut BufReader<TcpStream>) -> std::io::Result<(u16, bool)> {
    stream
        .get_mut()
        .write_all(b"GET /x HTTP/1.1\r\nHost: gateway\r\n\r\n")?;
    let mut status_line = String::new();
    if stream.read_line(&mut status_line)? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let (mut length, mut close) = (0, false);
    loop {
        let mut line = String::new();
        if stream.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let lower = line.to_ascii_lowercase();
        if lower == "\r\n" {
            break;
        }
        if let Some(v) = lower.strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
        if lower.starts_with("connection:") && lower.contains("close") {
            close = true;
        }
    }
    let mut body = vec![0; length];
    stream.read_exact(&mut body)?;
    Ok((status, close))
}

fn connect(addr: SocketAddr) -> std::io::Result<BufReader<TcpStream>> {
    let stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    Ok(BufReader::new(stream))
}

#[test]
fn sigterm_drains_for_the_delay_then_stops_without_refusing_anything() {
    let mut sluice = Sluice::start_with_server(
        &format!(
            "  shutdown_delay: {}s\n",
            DELAY.as_secs()
        ),
        "limiter: { backend: local }\nroutes:\n  - name: r\n    respond: { status: 200, body: \"ok\" }\n",
        &[],
    );
    assert_eq!(get(sluice.admin, "/readyz", &[]).status, 200);
    let addr = sluice.addr;
    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let served = Arc::new(AtomicUsize::new(0));

    // New connections, one request each.
    let fresh: Vec<_> = (0..2)
        .map(|_| {
            let (stop, failures, served) = (stop.clone(), failures.clone(), served.clone());
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match try_get(addr, "/x", &[]) {
                        Ok(r) if r.status == 200 => {
                            served.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(r) => failures
                            .lock()
                            .unwrap()
                            .push(format!("status {}", r.status)),
                        Err(e) => failures
                            .lock()
                            .unwrap()
                            .push(format!("new connection: {e}")),
                    }
                }
            })
        })
        .collect();
    // Kept-alive clients: reconnect when told to close, as clients do.
    let closes_seen = Arc::new(AtomicUsize::new(0));
    let kept: Vec<_> = (0..2)
        .map(|_| {
            let (stop, failures, served, closes) = (
                stop.clone(),
                failures.clone(),
                served.clone(),
                closes_seen.clone(),
            );
            thread::spawn(move || {
                let mut stream = connect(addr).expect("connect");
                while !stop.load(Ordering::Relaxed) {
                    match keep_alive_request(&mut stream) {
                        Ok((200, close)) => {
                            served.fetch_add(1, Ordering::Relaxed);
                            if close {
                                closes.fetch_add(1, Ordering::Relaxed);
                                match connect(addr) {
                                    Ok(next) => stream = next,
                                    Err(e) => {
                                        failures.lock().unwrap().push(format!("reconnect: {e}"));
                                        return;
                                    }
                                }
                            }
                        }
                        Ok((status, _)) => failures
                            .lock()
                            .unwrap()
                            .push(format!("kept-alive status {status}")),
                        Err(e) => {
                            failures.lock().unwrap().push(format!("kept-alive: {e}"));
                            return;
                        }
                    }
                }
            })
        })
        .collect();

    wait_until(Duration::from_secs(10), "the load to run", || {
        served.load(Ordering::Relaxed) >= 20
    });
    let before = closes_seen.load(Ordering::Relaxed);
    assert_eq!(before, 0, "no close before the drain");
    let signalled = Instant::now();
    sluice.signal("-TERM");
    let mut not_ready_after = None;
    while signalled.elapsed() < Duration::from_secs(2) {
        if get(sluice.admin, "/readyz", &[]).status == 503 {
            not_ready_after = Some(signalled.elapsed());
            break;
        }
        thread::sleep(Duration::from_millis(5));
    }
    let not_ready_after = not_ready_after.expect("/readyz turned 503");
    assert!(
        not_ready_after < Duration::from_millis(100),
        "{not_ready_after:?}"
    );
    let readyz = get(sluice.admin, "/readyz", &[]);
    assert!(readyz.body.contains("shutting down"), "{}", readyz.body);

    // Load through most of the delay.
    let served_at_signal = served.load(Ordering::Relaxed);
    thread::sleep(DELAY - Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    for t in fresh.into_iter().chain(kept) {
        t.join().unwrap();
    }
    let failures = failures.lock().unwrap().clone();
    assert!(failures.is_empty(), "{failures:?}\n{}", sluice.log());
    assert!(
        served.load(Ordering::Relaxed) > served_at_signal + 20,
        "served during the drain"
    );
    assert!(
        closes_seen.load(Ordering::Relaxed) >= 2,
        "kept-alive clients told to go"
    );

    // Then the graceful stop: within shutdown_delay + grace_period + 1 s.
    while !sluice.exited() {
        assert!(
            signalled.elapsed() < DELAY + GRACE + Duration::from_secs(1),
            "still running after {:?}\n{}",
            signalled.elapsed(),
            sluice.log()
        );
        thread::sleep(Duration::from_millis(20));
    }
    assert!(signalled.elapsed() >= DELAY, "stopped before the delay");
}

/// Without a delay, SIGTERM stops accepting at once, as before; a delay
/// above ten minutes is refused.
#[test]
fn without_a_delay_sigterm_stops_as_before() {
    let mut sluice =
        Sluice::start("limiter: { backend: local }\nroutes:\n  - name: r\n    respond: {}\n");
    let took = sluice.stop_with("-TERM");
    assert!(took < GRACE + Duration::from_secs(2), "{took:?}");
    let (code, stderr) = check_config("server:\n  shutdown_delay: 11m\n");
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(":2:19: `shutdown_delay` must be at most 10m"),
        "{stderr}"
    );
}

/// An HTTP/2 connection is sent GOAWAY when the drain starts, so its client
/// moves on while the listener still accepts new connections (which are
/// served, then sent GOAWAY too).
#[test]
fn an_http2_connection_is_sent_goaway_when_the_drain_starts() {
    use http_body_util::{BodyExt, Empty};
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let sluice = Sluice::start_with_server(
        &format!("  h2c: true\n  shutdown_delay: {}s\n", DELAY.as_secs()),
        "limiter: { backend: local }\nroutes:\n  - name: r\n    respond: { status: 200, body: \"ok\" }\n",
        &[],
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let addr = sluice.addr;
    runtime.block_on(async move {
        let open = || async move {
            let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
            let (sender, connection) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
                    .await
                    .expect("h2 handshake");
            (sender, tokio::spawn(connection))
        };
        let call = |mut sender: hyper::client::conn::http2::SendRequest<Empty<bytes::Bytes>>| async move {
            let request = http::Request::builder()
                .uri(format!("http://{addr}/x"))
                .body(Empty::<bytes::Bytes>::new())
                .expect("request");
            let response = sender.send_request(request).await.expect("send");
            let status = response.status().as_u16();
            let _ = response.into_body().collect().await;
            status
        };
        let (sender, connection) = open().await;
        assert_eq!(call(sender.clone()).await, 200);
        let signalled = Instant::now();
        sluice.signal("-TERM");
        // GOAWAY, and the connection ends, long before the drain does.
        tokio::time::timeout(Duration::from_millis(1500), connection)
            .await
            .expect("the connection ended at the start of the drain")
            .expect("join")
            .expect("a clean end (GOAWAY), not an error");
        assert!(signalled.elapsed() < DELAY);
        // A new connection is still accepted and served during the drain.
        let (sender, connection) = open().await;
        assert_eq!(call(sender).await, 200);
        tokio::time::timeout(Duration::from_millis(1500), connection)
            .await
            .expect("the new connection also told to go")
            .expect("join")
            .expect("a clean end");
        assert!(signalled.elapsed() < DELAY, "{:?}", signalled.elapsed());
    });
}
