//! Choosing a server: weights, consistent hashing, with real upstream
//! servers and the real binary.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// A kept-alive client connection to sluice.
struct Client {
    writer: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Client {
    fn connect(addr: SocketAddr) -> Self {
        let stream = TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let reader = BufReader::new(stream.try_clone().expect("clone"));
        Client {
            writer: stream,
            reader,
        }
    }

    /// Sends `GET path` with `headers`; the status and the server that
    /// answered (`X-Served-By`).
    fn get(&mut self, path: &str, headers: &str) -> (u16, String) {
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\n{headers}\r\n");
        self.writer.write_all(request.as_bytes()).expect("write");
        let mut status_line = String::new();
        self.reader.read_line(&mut status_line).expect("status");
        let status = status_line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let (mut length, mut served_by) = (0usize, String::new());
        loop {
            let mut line = String::new();
            self.reader.read_line(&mut line).expect("header");
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                match name.trim().to_ascii_lowercase().as_str() {
                    "content-length" => length = value.trim().parse().unwrap_or(0),
                    "x-served-by" => served_by = value.trim().to_string(),
                    _ => {}
                }
            }
        }
        let mut body = vec![0; length];
        self.reader.read_exact(&mut body).expect("body");
        (status, served_by)
    }
}

fn servers_yaml(servers: &[(&Upstream, u32)]) -> String {
    servers
        .iter()
        .map(|(u, weight)| format!("{{ addr: \"{}\", weight: {weight} }}", u.addr))
        .collect::<Vec<_>>()
        .join(", ")
}

#[test]
fn weights_split_the_requests_in_proportion() {
    let (small, big) = (Upstream::start(), Upstream::start());
    let config = format!(
        "upstreams:\n  api:\n    servers: [{}]\nroutes:\n  - name: api\n    upstream: api\n",
        servers_yaml(&[(&small, 1), (&big, 3)])
    );
    let sluice = Sluice::start(&config);
    let mut client = Client::connect(sluice.addr);
    let mut counts: HashMap<String, usize> = HashMap::new();
    let total = 10_000;
    for _ in 0..total {
        let (status, server) = client.get("/", "");
        assert_eq!(status, 200);
        *counts.entry(server).or_default() += 1;
    }
    let big_share = counts[&big.addr.to_string()] as f64 / total as f64;
    assert!(
        (big_share - 0.75).abs() <= 0.05 * 0.75,
        "the weight-3 server took {big_share:.3} of the requests, not 0.75 ± 5 %: {counts:?}"
    );
    assert_eq!(counts.len(), 2, "{counts:?}");
}

fn hashed_config(sluice: Option<&Sluice>, servers: &[&Upstream]) -> String {
    let list = servers
        .iter()
        .map(|u| format!("\"{}\"", u.addr))
        .collect::<Vec<_>>()
        .join(", ");
    let server = sluice.map_or(String::new(), |s| server_section(s.addr, s.admin));
    format!(
        "{server}upstreams:\n  api:\n    servers: [{list}]\n    balance: consistent_hash\n    hash_key: [{{header: x-user}}]\nroutes:\n  - name: api\n    upstream: api\n"
    )
}

/// The server each of `keys` users is sent to.
fn placement(sluice: &Sluice, keys: usize) -> Vec<String> {
    let mut client = Client::connect(sluice.addr);
    (0..keys)
        .map(|k| {
            let (status, server) = client.get("/", &format!("X-User: user-{k}\r\n"));
            assert_eq!(status, 200);
            server
        })
        .collect()
}

#[test]
fn consistent_hashing_keeps_a_key_on_its_server_and_moves_few_when_one_leaves() {
    let servers = [Upstream::start(), Upstream::start(), Upstream::start()];
    let all: Vec<&Upstream> = servers.iter().collect();
    let sluice = Sluice::start(&hashed_config(None, &all));
    let keys = 10_000;
    let first = placement(&sluice, keys);
    assert_eq!(placement(&sluice, keys), first, "a key keeps its server");
    let held = |server: &Upstream| {
        first
            .iter()
            .filter(|s| **s == server.addr.to_string())
            .count()
    };
    for server in &servers {
        assert!(
            held(server) > keys / 6,
            "each server has its part: {}",
            held(server)
        );
    }

    // The server that leaves is the one holding the median share: the
    // ring's points fall differently with each run's ports, and the
    // property under test is what moves, not how even the ring is.
    let mut by_share: Vec<&Upstream> = servers.iter().collect();
    by_share.sort_by_key(|s| held(s));
    let gone = by_share[1].addr.to_string();
    let staying: Vec<&Upstream> = servers
        .iter()
        .filter(|s| s.addr.to_string() != gone)
        .collect();
    assert!(sluice.reload(&hashed_config(Some(&sluice), &staying)));
    let after = placement(&sluice, keys);
    assert!(
        after.iter().all(|s| *s != gone),
        "nothing goes to the server that left"
    );
    let moved = first.iter().zip(&after).filter(|(a, b)| a != b).count();
    let bound = keys / 3 + keys * 5 / 100;
    assert!(
        moved <= bound,
        "{moved} of {keys} keys moved when one of 3 servers left (bound {bound})"
    );
    let moved_from_staying = first
        .iter()
        .zip(&after)
        .filter(|(a, b)| a != b && **a != gone)
        .count();
    assert_eq!(
        moved_from_staying, 0,
        "only the keys of the server that left move"
    );
}
