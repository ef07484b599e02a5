//! An open-loop client: `connections` keep-alive connections, each sending on
//! its own schedule so that together they send `rate` requests a second. A
//! request's latency runs from when it was due, so a slow response that
//! delays the next request counts against the server (no coordinated
//! omission).

use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One paced run's figures.
pub struct Paced {
    pub achieved: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

pub fn run(addr: SocketAddr, rate: f64, seconds: u64, connections: usize) -> Paced {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let interval = Duration::from_secs_f64(connections as f64 / rate);
        let start = Instant::now() + Duration::from_millis(50);
        let end = start + Duration::from_secs(seconds);
        let tasks: Vec<_> = (0..connections)
            .map(|c| {
                let offset = interval.mul_f64(c as f64 / connections as f64);
                tokio::spawn(connection(addr, start + offset, interval, end, c as u64))
            })
            .collect();
        let mut latencies = Vec::new();
        for task in tasks {
            latencies.extend(task.await.unwrap_or_default());
        }
        latencies.sort_unstable();
        let at = |q: f64| {
            latencies
                .get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)))
                .map_or(f64::NAN, |us| *us as f64 / 1e3)
        };
        Paced {
            achieved: latencies.len() as f64 / seconds as f64,
            p50_ms: at(0.50),
            p99_ms: at(0.99),
        }
    })
}

async fn connection(
    addr: SocketAddr,
    first: Instant,
    interval: Duration,
    end: Instant,
    seed: u64,
) -> Vec<u64> {
    let mut latencies = Vec::new();
    let Some(mut stream) = open(addr).await else {
        return latencies;
    };
    let mut buffer = vec![0u8; 16 * 1024];
    let mut key = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    let mut due = first;
    while due < end {
        tokio::time::sleep_until(due.into()).await;
        let now = Instant::now();
        // Timers tick in milliseconds: a request sent up to 2 ms after it
        // was due is timed from its send; a later one (held up by a slow
        // response) from when it was due.
        let from = if now > due + Duration::from_millis(2) {
            due
        } else {
            now
        };
        key = key
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let request = format!(
            "GET /bench HTTP/1.1\r\nHost: bench\r\nX-Key: {}\r\n\r\n",
            (key >> 33) % 100_000
        );
        // A server may close a keep-alive connection after so many requests
        // (nginx: 1,000): open a new one and send again; the time that takes
        // counts against the request, as it would for a real client.
        let mut answered = false;
        for _ in 0..2 {
            if stream.write_all(request.as_bytes()).await.is_ok()
                && read_response(&mut stream, &mut buffer).await
            {
                answered = true;
                break;
            }
            match open(addr).await {
                Some(fresh) => stream = fresh,
                None => break,
            }
        }
        if !answered {
            break;
        }
        latencies.push(from.elapsed().as_micros() as u64);
        due += interval;
    }
    latencies
}

/// A new connection to `addr`, with `TCP_NODELAY`.
async fn open(addr: SocketAddr) -> Option<TcpStream> {
    let stream = TcpStream::connect(addr).await.ok()?;
    let _ = stream.set_nodelay(true);
    Some(stream)
}

/// Reads one response with a Content-Length body; false on error.
async fn read_response(stream: &mut TcpStream, buffer: &mut [u8]) -> bool {
    let mut filled = 0;
    loop {
        let Ok(n) = stream.read(&mut buffer[filled..]).await else {
            return false;
        };
        if n == 0 {
            return false;
        }
        filled += n;
        let Some(head_end) = find(&buffer[..filled], b"\r\n\r\n") else {
            if filled == buffer.len() {
                return false;
            }
            continue;
        };
        let head = String::from_utf8_lossy(&buffer[..head_end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        let total = (head_end + 4 + length).min(buffer.len());
        while filled < total {
            let Ok(n) = stream.read(&mut buffer[filled..total]).await else {
                return false;
            };
            if n == 0 {
                return false;
            }
            filled += n;
        }
        return true;
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
