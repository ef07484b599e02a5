//! A Redis stall costs only the decisions made during it. Redis is paused
//! (`CLIENT PAUSE`) for 2.5 s and for 30 s — past the decision budget and
//! past the connection's 2 s response timeout, so no reply ever comes —
//! while requests arrive, with `on_error: local` (the fallback
//! admits one and refuses one) and `on_error: allow` (both admitted), on
//! every algorithm and layout: `sliding_log` packed and as a sorted set,
//! `sliding_window`, `fixed_window`, `token_bucket`. When Redis resumes it
//! runs the timed-out calls; each limit must then count exactly the
//! requests that were admitted — none the fallback refused, no admitted one
//! twice — in Redis (the usage API, or the log's length) and by the next
//! requests.
//!
//! Every case runs at once, each with its own Redis and sluice, so the two
//! stalls cost about 2.5 s and 30 s of wall time.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use std::time::{Duration, Instant};

/// One limit under one `on_error`.
#[derive(Debug, Clone, Copy)]
struct Case {
    algorithm: &'static str,
    /// The limit: above 1,024 a sliding log is a sorted set.
    limit: u64,
    /// This instance's fallback share: one request's worth.
    share: &'static str,
    on_error: &'static str,
}

const CASES: [Case; 10] = {
    const fn case(
        algorithm: &'static str,
        limit: u64,
        share: &'static str,
        on_error: &'static str,
    ) -> Case {
        Case {
            algorithm,
            limit,
            share,
            on_error,
        }
    }
    [
        case("sliding_log", 3, "0.4", "local"),
        case("sliding_log", 2000, "0.0005", "local"),
        case("sliding_window", 3, "0.4", "local"),
        case("fixed_window", 3, "0.4", "local"),
        case("token_bucket", 3, "0.3", "local"),
        case("sliding_log", 3, "1", "allow"),
        case("sliding_log", 2000, "1", "allow"),
        case("sliding_window", 3, "1", "allow"),
        case("fixed_window", 3, "1", "allow"),
        case("token_bucket", 3, "1", "allow"),
    ]
};

/// How many units of `user`'s counter Redis holds, by the usage API.
fn used(sluice: &Sluice, user: &str) -> Option<u64> {
    let answer = get(
        sluice.admin,
        &format!("/v1/usage?route=api&limit=per-user&header.x-user={user}"),
        &[],
    );
    let json: serde_json::Value = serde_json::from_str(&answer.body).ok()?;
    json["used"].as_u64()
}

/// Runs `case` through a stall of `millis`; returns what went wrong, if
/// anything.
fn run(case: Case, millis: u64) -> Result<(), String> {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    // An hour's window: nothing frees (or refills) during the test.
    let body = format!(
        r#"
limiter:
  redis: {{ url: "{url}", timeout: 500ms }}
  on_error: {on_error}
  local: {{ share: "{share}" }}
upstreams:
  api: {{ servers: ["{upstream}"] }}
routes:
  - name: api
    upstream: api
    limits:
      - {{ name: per-user, key: [{{header: X-User}}], limit: {limit}, window: 1h, algorithm: {algorithm} }}
"#,
        url = redis.url(),
        upstream = upstream.addr,
        on_error = case.on_error,
        share = case.share,
        limit = case.limit,
        algorithm = case.algorithm,
    );
    let sluice = Sluice::start(&body);
    let check = |ok: bool, what: String| if ok { Ok(()) } else { Err(what) };
    // A first request Redis decides (with every case starting at once, a
    // first connection may miss the budget: then another user is taken).
    let name = (0..10)
        .map(|attempt| format!("erin-{attempt}"))
        .find(|name| {
            sluice.get("/x", &[("X-User", name)]).status == 200 && used(&sluice, name) == Some(1)
        })
        .ok_or("no request decided by Redis before the stall")?;
    let user = [("X-User", name.as_str())];

    redis.pause_clients(millis);
    let paused = Instant::now();
    let during: Vec<u16> = (0..2).map(|_| sluice.get("/x", &user).status).collect();
    check(
        paused.elapsed() < Duration::from_millis(millis),
        "answered within the stall".into(),
    )?;
    let expected_during = if case.on_error == "allow" {
        [200, 200]
    } else {
        [200, 429]
    };
    check(
        during == expected_during,
        format!("during the stall: {during:?}"),
    )?;
    let admitted = 1 + during.iter().filter(|&&s| s == 200).count() as u64;

    // Redis resumes and runs the stalled calls (then what they leave is
    // written): the count settles at what was admitted, and stays there.
    let settle = Duration::from_millis(millis) + Duration::from_secs(15);
    let deadline = Instant::now() + settle;
    while used(&sluice, &name) != Some(admitted) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    let counted = used(&sluice, &name);
    check(
        counted == Some(admitted),
        format!("Redis counts {counted:?}, {admitted} were admitted"),
    )?;
    // And the next requests see exactly the room left.
    let room = case.limit - admitted;
    let probes = room.min(3) + 1;
    let next: Vec<u16> = (0..probes)
        .map(|_| sluice.get("/x", &user).status)
        .collect();
    let mut expected = vec![200; room.min(3) as usize];
    if room <= 3 {
        expected.push(429);
    } else {
        expected.push(200);
    }
    check(next == expected, format!("after the stall: {next:?}"))
}

/// Runs every case at once through a stall of `millis`.
fn every_case(millis: u64) {
    let runs: Vec<_> = CASES
        .iter()
        .map(|&case| (case, std::thread::spawn(move || run(case, millis))))
        .collect();
    let failures: Vec<String> = runs
        .into_iter()
        .filter_map(|(case, run)| match run.join() {
            Ok(Ok(())) => None,
            Ok(Err(what)) => Some(format!("{case:?}: {what}")),
            Err(_) => Some(format!("{case:?}: panicked")),
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_stall_past_the_budget_counts_exactly_what_was_admitted() {
    every_case(2_500);
}

#[test]
fn a_stall_past_the_response_timeout_counts_exactly_what_was_admitted() {
    every_case(30_000);
}
