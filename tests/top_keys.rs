//! `/v1/top` on real Redis: among 10,000 denied keys, the five that flood
//! are listed first with counts within the documented error; the answer
//! names the key parts by label, shows hashed values hashed, and the API
//! refuses bad questions and callers without the admin token.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use std::collections::BTreeMap;
use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

const TOKEN: &str = "top-secret-token";

fn body(redis: &RedisServer) -> String {
    format!(
        r#"
limiter:
  redis: {{ url: "{url}", timeout: 2s }}
  on_error: deny
routes:
  - name: api
    respond: {{ status: 200, body: "ok" }}
    limits:
      - {{ name: per-key, key: [{{header: X-Key}}, method], limit: 1, window: 1h }}
      - {{ name: roomy, key: [ip], limit: 1000000, window: 1m }}
"#,
        url = redis.url()
    )
}

/// Sends `GET /` once with each of `keys` as X-Key, on one kept-alive
/// connection; returns the statuses answered, by status line.
fn send_keys(addr: SocketAddr, keys: &[String]) -> BTreeMap<String, usize> {
    let mut stream = TcpStream::connect(addr).expect("connect");
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut statuses = BTreeMap::new();
    for key in keys {
        let head = format!("GET / HTTP/1.1\r\nHost: t\r\nX-Key: {key}\r\n\r\n");
        stream.write_all(head.as_bytes()).expect("write");
        let (status_line, length) = read_head(&mut reader).expect("a response");
        let mut body = vec![0; length];
        reader.read_exact(&mut body).expect("body");
        *statuses
            .entry(status_line.trim_end().to_string())
            .or_insert(0) += 1;
    }
    statuses
}

fn top(admin: SocketAddr, query: &str, token: Option<&str>) -> (u16, serde_json::Value) {
    let bearer = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = bearer
        .iter()
        .map(|b| ("Authorization", b.as_str()))
        .collect();
    let response = get(admin, &format!("/v1/top?{query}"), &headers);
    let json = serde_json::from_str(&response.body).unwrap_or(serde_json::Value::Null);
    (response.status, json)
}

#[test]
fn the_flooding_keys_come_first_within_the_error() {
    let redis = RedisServer::start();
    let env = [("TOP_TOKEN", TOKEN)];
    let sluice = Sluice::start_with_server("  admin_token_env: TOP_TOKEN\n", &body(&redis), &env);
    // 10,000 keys twice in a row (the second denied), and five keys every
    // 33 keys (all but their first request denied): denials spread evenly
    // over the run, over four connections. The limit's window (an hour)
    // never lets a key in twice, however slow the machine.
    let mut keys: Vec<String> = Vec::new();
    for i in 0..10_000 {
        keys.extend([format!("k{i}"), format!("k{i}")]);
        if i % 33 == 0 {
            keys.extend((0..5).map(|f| format!("flood{f}")));
        }
    }
    let flooded = keys.len() - 20_000;
    let started = Instant::now();
    let chunks: Vec<Vec<String>> = keys
        .chunks(keys.len() / 4 + 1)
        .map(|c| c.to_vec())
        .collect();
    let addr = sluice.addr;
    let handles: Vec<_> = chunks
        .into_iter()
        .map(|chunk| thread::spawn(move || send_keys(addr, &chunk)))
        .collect();
    let mut statuses: BTreeMap<String, usize> = BTreeMap::new();
    for handle in handles {
        for (status, count) in handle.join().expect("sender") {
            *statuses.entry(status).or_insert(0) += count;
        }
    }
    let denied = statuses
        .get("HTTP/1.1 429 Too Many Requests")
        .copied()
        .unwrap_or(0);
    let per_flooder = flooded as u64 / 5;
    assert_eq!(
        denied as u64,
        10_000 + 5 * (per_flooder - 1),
        "{statuses:?}"
    );

    let (status, answer) = top(sluice.admin, "route=api&limit=per-key&n=8", Some(TOKEN));
    // The sketch reports the last 50 to 60 seconds. When the traffic fit in
    // that (an unloaded machine sends it in seconds), its counts are held to
    // the truth within the error; on a machine so loaded that it did not,
    // the window holds a suffix of the run: the same five lead, and no count
    // is over the truth by more than its error.
    let whole_run = started.elapsed() < Duration::from_secs(45);
    assert_eq!(status, 200, "{answer}");
    let listed = answer["keys"].as_array().expect("keys");
    assert_eq!(listed.len(), 8, "{answer}");
    let total = answer["limits"][0]["denied"].as_u64().expect("denied");
    match whole_run {
        true => assert_eq!(total, denied as u64, "{answer}"),
        false => assert!(total <= denied as u64 && total > 0, "{answer}"),
    }
    let bound = answer["limits"][0]["error_bound"].as_u64().expect("bound");
    assert_eq!(bound, total / 100);
    let mut first: Vec<String> = Vec::new();
    for entry in &listed[..5] {
        let (count, error) = (
            entry["count"].as_u64().unwrap(),
            entry["error"].as_u64().unwrap(),
        );
        assert!(error <= bound, "{entry}");
        match whole_run {
            true => assert!(count.abs_diff(per_flooder - 1) <= error, "{entry}"),
            false => assert!(count <= per_flooder - 1 + error, "{entry}"),
        }
        assert_eq!(entry["route"], "api");
        assert_eq!(entry["limit"], "per-key");
        assert_eq!(entry["parts"]["method"], "GET", "{entry}");
        first.push(
            entry["parts"]["header.x-key"]
                .as_str()
                .unwrap_or("")
                .to_string(),
        );
        assert_eq!(entry["key"], format!("{}|GET", first.last().unwrap()));
    }
    first.sort();
    assert_eq!(
        first,
        ["flood0", "flood1", "flood2", "flood3", "flood4"],
        "{answer}"
    );
    for entry in &listed[5..] {
        assert!(
            entry["count"].as_u64().unwrap() < per_flooder / 2,
            "{entry}"
        );
    }

    // Without a route: every limit's keys together; the roomy limit denied
    // nothing, so the same five lead.
    let (status, all) = top(sluice.admin, "n=5", Some(TOKEN));
    assert_eq!(status, 200, "{all}");
    assert_eq!(all["keys"].as_array().map(Vec::len), Some(5), "{all}");
    assert!(all["keys"]
        .as_array()
        .unwrap()
        .iter()
        .all(|k| k["limit"] == "per-key"));
    assert_eq!(all["limits"].as_array().map(Vec::len), Some(2), "{all}");
}

#[test]
fn hashed_values_stay_hashed_and_bad_questions_get_4xx() {
    let redis = RedisServer::start();
    let env = [("TOP_TOKEN", TOKEN)];
    let sluice = Sluice::start_with_server("  admin_token_env: TOP_TOKEN\n", &body(&redis), &env);
    let unsafe_key = "a key with spaces and {braces}".to_string();
    let statuses = send_keys(sluice.addr, &[unsafe_key.clone(), unsafe_key]);
    assert_eq!(
        statuses.get("HTTP/1.1 429 Too Many Requests"),
        Some(&1),
        "{statuses:?}"
    );
    let (status, answer) = top(sluice.admin, "route=api&limit=per-key", Some(TOKEN));
    assert_eq!(status, 200, "{answer}");
    let value = answer["keys"][0]["parts"]["header.x-key"]
        .as_str()
        .unwrap_or("");
    assert!(value.starts_with('#') && !value.contains(' '), "{answer}");
    assert_eq!(answer["window_seconds"], 60);

    for (query, token, want) in [
        ("route=api", None, 401),
        ("route=api", Some("wrong"), 401),
        ("route=nope", Some(TOKEN), 404),
        ("route=api&limit=nope", Some(TOKEN), 404),
        ("limit=per-key", Some(TOKEN), 400),
        ("route=api&n=0", Some(TOKEN), 400),
        ("route=api&n=101", Some(TOKEN), 400),
        ("route=api&n=x", Some(TOKEN), 400),
        ("route=api&route=other", Some(TOKEN), 400),
    ] {
        let (status, answer) = top(sluice.admin, query, token);
        assert_eq!(status, want, "{query}: {answer}");
        assert!(answer["error"].is_string(), "{query}: {answer}");
    }
    let response = request(
        sluice.admin,
        "DELETE",
        "/v1/top",
        &[("Authorization", &format!("Bearer {TOKEN}"))],
    );
    assert_eq!(response.status, 405);
}
