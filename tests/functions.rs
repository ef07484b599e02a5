//! The decide code runs as a Redis Function (`FCALL`) where the server has
//! them, as a script (`EVALSHA`) where it does not, and is loaded again when
//! Redis loses it; the limit is the same on every path.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::{free_port, RedisServer, Sluice, Upstream};

fn config(redis: &RedisServer, upstream: &Upstream) -> String {
    format!(
        r#"
limiter:
  redis: {{ url: "{url}", timeout: 2s }}
  on_error: deny
  deny_cache: false
upstreams:
  api: {{ servers: ["{upstream}"] }}
routes:
  - name: r
    upstream: api
    limits:
      - {{ name: l, key: [{{header: X-Key}}], limit: 3, window: 1m }}
"#,
        url = redis.url(),
        upstream = upstream.addr,
    )
}

/// Statuses of `n` requests with key `key`, one after the other.
fn statuses(sluice: &Sluice, key: &str, n: usize) -> Vec<u16> {
    (0..n)
        .map(|_| sluice.get("/x", &[("X-Key", key)]).status)
        .collect()
}

#[test]
fn decisions_run_as_a_function_on_redis_7() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let sluice = Sluice::start(&config(&redis, &upstream));
    assert_eq!(statuses(&sluice, "a", 5), [200, 200, 200, 429, 429]);
    assert_eq!(redis.command_calls("fcall"), 5);
    assert_eq!(redis.command_calls("evalsha"), 0);
    let libraries: redis::Value = redis::cmd("FUNCTION")
        .arg("LIST")
        .query(&mut redis.connection())
        .expect("FUNCTION LIST");
    assert!(
        format!("{libraries:?}").contains("sluice_decide_"),
        "{libraries:?}"
    );
}

#[test]
fn without_functions_the_script_decides_alike() {
    // A server whose FUNCTION command is disabled, as an older Redis or a
    // restrictive ACL would leave it.
    let redis = RedisServer::start_with_args(free_port(), &["--rename-command", "FUNCTION", ""]);
    let upstream = Upstream::start();
    let sluice = Sluice::start(&config(&redis, &upstream));
    let got = statuses(&sluice, "a", 5);
    assert_eq!(got, [200, 200, 200, 429, 429], "{}", sluice.log());
    assert_eq!(redis.command_calls("fcall"), 0);
    assert_eq!(redis.command_calls("evalsha"), 5);
}

#[test]
fn a_flushed_function_is_loaded_again_and_counts_carry_on() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let sluice = Sluice::start(&config(&redis, &upstream));
    assert_eq!(statuses(&sluice, "a", 2), [200, 200]);
    let _: () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query(&mut redis.connection())
        .expect("FUNCTION FLUSH");
    // The first call after the flush finds no function: the library is
    // loaded again and the call re-run, so the key still holds its two units.
    assert_eq!(statuses(&sluice, "a", 3), [200, 429, 429]);
    assert_eq!(
        sluice.decisions("r", "l", "allow", "redis") + sluice.decisions("r", "l", "deny", "redis"),
        5,
        "every decision came from Redis"
    );
}
