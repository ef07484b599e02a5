//! Redis hiccups under steady load: paused for 50, 200 and 500 ms
//! (`CLIENT PAUSE`), then killed and restarted, with `on_error: allow` and
//! `local`. No request may fail, and fallback decisions must end soon after
//! each stall. Prints the fallback decisions per stall (run with --nocapture).

mod common;

use common::*;
use std::thread;
use std::time::{Duration, Instant};

/// Checked 250 ms after a stall ends, plus room for a loaded machine to run
/// this test's own threads.
const SETTLE: Duration = Duration::from_millis(350);

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
        let started = Instant::now();
        pause(&redis, stall);
        thread::sleep(Duration::from_millis(stall) + SETTLE - started.elapsed().min(SETTLE));
        let during = fallback() - before;
        thread::sleep(Duration::from_millis(500));
        let after = fallback() - before - during;
        println!(
            "on_error: {on_error}, {stall} ms pause: {during} fallback decisions, {after} more after it ended"
        );
        assert_eq!(
            after, 0,
            "{stall} ms pause: decisions kept falling back after Redis answered again"
        );
    }

    redis.kill();
    thread::sleep(Duration::from_millis(1000));
    let down = fallback();
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
