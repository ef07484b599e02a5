//! Redis hiccups under steady load: paused for 50, 200 and 500 ms
//! (`CLIENT PAUSE`), then killed and restarted, with `on_error: allow` and
//! `local`. No request may fail, and the last fallback decision of each stall
//! (read from the access log's timestamps) must come within 250 ms of its end.
//! Prints the fallback decisions per stall (run with --nocapture).

mod common;

use common::*;
use std::thread;
use std::time::{Duration, Instant, SystemTime};

/// Fallback decisions must end within this of a stall's end.
const BACK_ON_REDIS: Duration = Duration::from_millis(250);

/// When the last request answered by `source` after `since` ended, from the
/// access log (one JSON line per request, `time` in RFC 3339).
fn last_fallback(log: &str, source: &str, since: SystemTime) -> Option<SystemTime> {
    log.lines()
        .filter(|line| line.starts_with('{'))
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|entry| entry["source"] == source)
        .filter_map(|entry| humantime::parse_rfc3339(entry["time"].as_str()?).ok())
        .filter(|&time| time >= since)
        .max()
}

fn config(redis: &RedisServer, upstream: &Upstream, on_error: &str) -> String {
    format!(
        r#"
limiter:
  redis: {{ url: "{url}", timeout: 20ms }}
  on_error: {on_error}
upstreams:
  api: {{ servers: ["{upstream}"] }}
routes:
  - name: api
    upstream: api
    limits:
      - {{ name: per-client, key: [{{header: X-Client}}], limit: 1000, window: 1m }}
"#,
        url = redis.url(),
        upstream = upstream.addr,
    )
}

fn pause(redis: &RedisServer, millis: u64) {
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(millis)
        .arg("ALL")
        .query(&mut redis.connection())
        .expect("CLIENT PAUSE");
}

fn stalls_cost_only_themselves(on_error: &str, source: &str) {
    let mut redis = RedisServer::start();
    let port = redis.port;
    let upstream = Upstream::start();
    let sluice = Sluice::start(&config(&redis, &upstream, on_error));
    let fallback = || sluice.decisions("api", "per-client", "allow", source);
    let load = Load::start(sluice.addr, 2, "/x");
    wait_until(Duration::from_secs(10), "load on Redis", || {
        sluice.decisions("api", "per-client", "allow", "redis") > 100
    });

    for stall in [50, 200, 500] {
        thread::sleep(Duration::from_millis(500));
        let before = fallback();
        let paused_at = SystemTime::now();
        pause(&redis, stall);
        let stall_end = paused_at + Duration::from_millis(stall);
        // Long enough for any late fallback to show in the log.
        thread::sleep(Duration::from_millis(stall + 1000));
        let during = fallback() - before;
        let late = last_fallback(&sluice.log(), source, paused_at)
            .map(|last| last.duration_since(stall_end).unwrap_or(Duration::ZERO));
        println!(
            "on_error: {on_error}, {stall} ms pause: {during} fallback decisions, the last {} ms after it ended",
            late.map_or(0, |d| d.as_millis())
        );
        assert!(
            late.is_none_or(|late| late <= BACK_ON_REDIS),
            "{stall} ms pause: decisions kept falling back {late:?} after Redis answered again"
        );
    }

    let down = fallback();
    redis.kill();
    thread::sleep(Duration::from_millis(1000));
    let restarted = RedisServer::start_on(port);
    let back = Instant::now();
    let from_redis = sluice.decisions("api", "per-client", "allow", "redis");
    wait_until(
        Duration::from_secs(10),
        "decisions from Redis again",
        || sluice.decisions("api", "per-client", "allow", "redis") > from_redis + 10,
    );
    println!(
        "on_error: {on_error}, Redis killed for 1 s: {} fallback decisions; back on Redis {} ms after the restart",
        fallback() - down,
        back.elapsed().as_millis()
    );
    load.stop()
        .assert_no_failures(&format!("on_error: {on_error}\n{}", sluice.log()));
    drop(restarted);
}

#[test]
fn stalls_under_load_with_on_error_allow() {
    stalls_cost_only_themselves("allow", "fail_open");
}

#[test]
fn stalls_under_load_with_on_error_local() {
    stalls_cost_only_themselves("local", "local");
}
