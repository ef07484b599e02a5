//! The start: the limiter connects to Redis before the proxy's listener
//! accepts, so the first request is decided by Redis, and `/readyz` is not
//! ready while the connection is still being made.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn config(redis: &RedisServer, extra: &str) -> String {
    format!(
        "limiter:\n  redis:\n    url: \"{}\"\n{extra}routes:\n  - name: demo\n    match: {{ path_prefix: / }}\n    respond: {{ status: 200, body: \"ok\" }}\n    limits:\n      - {{ name: per-ip, key: [ip], limit: 100, window: 10s }}\n",
        redis.url()
    )
}

/// Busy loops at niceness 10, one per core, killed on drop: the machine is
/// busy, as the one where a first decision once ran past its budget.
struct Hogs(Vec<Child>);

impl Hogs {
    fn start() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        Hogs(
            (0..cores)
                .map(|_| {
                    Command::new("nice")
                        .args(["-n", "10", "sh", "-c", "while :; do :; done"])
                        .stdout(Stdio::null())
                        .spawn()
                        .expect("start a busy loop")
                })
                .collect(),
        )
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        for hog in &mut self.0 {
            let _ = hog.kill();
            let _ = hog.wait();
        }
    }
}

/// 20 starts on a busy machine: each time the proxy accepts, the instance is
/// ready and its first request is decided by Redis, never by the in-process
/// fallback. The decision's own budget is 500 ms here: on a machine busy
/// enough, a 20 ms budget can run out in the scheduler alone, which says
/// nothing about the start (the paused-Redis test below is the one that
/// fails when the listeners do not wait for the connection).
#[test]
fn the_first_request_after_a_start_is_decided_by_redis() {
    let redis = RedisServer::start();
    let _hogs = Hogs::start();
    for start in 0..20 {
        let sluice = Sluice::start(&config(&redis, "    timeout: 500ms\n"));
        assert_eq!(
            get(sluice.admin, "/readyz", &[]).status,
            200,
            "start {start}: ready once the proxy accepts"
        );
        assert_eq!(sluice.get("/", &[]).status, 200, "start {start}");
        let metrics = sluice.metrics();
        let decided = |source: &str| sluice.decisions("demo", "per-ip", "allow", source);
        assert_eq!(
            (decided("redis"), decided("local")),
            (1, 0),
            "start {start}: the first decision comes from Redis\n{metrics}"
        );
    }
}

/// Redis paused (every command waits) while sluice starts: `/readyz` says
/// it is connecting and the proxy does not accept until Redis answers; then
/// the first request is decided by Redis.
#[test]
fn readyz_is_not_ready_before_the_connection() {
    let redis = RedisServer::start();
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let text = format!(
        "{}{}",
        server_section(addr, admin),
        config(&redis, "    connect_timeout: 10s\n")
    );
    let pause = Duration::from_millis(1500);
    let paused_at = Instant::now();
    redis.pause_clients(pause.as_millis() as u64);
    let starting = std::thread::spawn(move || Sluice::start_with(&text, addr, admin, &[]));

    let mut not_ready = Vec::new();
    while !starting.is_finished() {
        if TcpStream::connect(admin).is_ok() {
            let ready = get(admin, "/readyz", &[]);
            if ready.status == 200 {
                assert!(
                    paused_at.elapsed() >= pause,
                    "ready {:?} after the pause began, before Redis answered",
                    paused_at.elapsed()
                );
            } else {
                if paused_at.elapsed() < pause {
                    assert!(
                        TcpStream::connect(addr).is_err(),
                        "the proxy accepts while Redis is paused"
                    );
                }
                not_ready.push((ready.status, ready.body));
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let sluice = starting.join().expect("sluice started");
    assert!(
        !not_ready.is_empty(),
        "/readyz never answered while connecting"
    );
    for (status, body) in &not_ready {
        assert_eq!(*status, 503);
        assert_eq!(body, "not ready: connecting to Redis\n");
    }
    assert_eq!(get(admin, "/readyz", &[]).status, 200);
    assert_eq!(sluice.get("/", &[]).status, 200);
    assert_eq!(sluice.decisions("demo", "per-ip", "allow", "redis"), 1);
    assert_eq!(sluice.decisions("demo", "per-ip", "allow", "local"), 0);
}

/// Redis down at the start, `on_error: local`: the start goes on, `/readyz`
/// is ready and says what decides meanwhile, `sluice_redis_up` is 0; once
/// Redis listens, the instance connects by itself with no request to make it.
#[test]
fn a_start_without_redis_is_ready_and_connects_when_redis_comes() {
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}/0");
    let sluice = Sluice::start(&format!(
        "limiter:\n  redis: {{ url: \"{url}\" }}\n  on_error: local\nroutes:\n  - name: demo\n    respond: {{ status: 200, body: \"ok\" }}\n"
    ));
    let ready = get(sluice.admin, "/readyz", &[]);
    assert_eq!(
        (ready.status, ready.body.as_str()),
        (
            200,
            "degraded: Redis is unreachable, on_error: local limits in process\n"
        )
    );
    assert!(sluice.metrics().contains("sluice_redis_up 0"));
    let _redis = RedisServer::start_on(port);
    wait_until(
        Duration::from_secs(10),
        "sluice to connect to Redis",
        || get(sluice.admin, "/readyz", &[]).body == "ready\n",
    );
    assert!(sluice.metrics().contains("sluice_redis_up 1"));
}
