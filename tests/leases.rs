//! A concurrency lease lives as long as its request: a WebSocket open longer
//! than `lease` keeps its slot (renewed, on Redis, a Redis Cluster and in
//! process), the slot comes back as soon as either side closes, renewal
//! costs one call per tick however many leases are held, and the leases of
//! an instance that dies still end after `lease`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use std::time::{Duration, Instant};

/// The lease every test uses: far shorter than the sockets stay open.
const LEASE: &str = "2s";

/// A gateway in front of a WebSocket echo server: `/ws/` limited to one
/// open socket per `X-User` (absent: the client IP), with `limiter` as its
/// `limiter:` section.
fn chat(limiter: &str) -> Sluice {
    let ws = websocket_echo_server();
    Sluice::start(&format!(
        r#"
limiter: {limiter}
upstreams:
  chat: {{ servers: ["{ws}"], read_timeout: 60s }}
routes:
  - name: chat
    match: {{ path_prefix: /ws/ }}
    upstream: chat
    limits:
      - {{ name: sockets, key: [{{ header: x-user }}], limit: 1, algorithm: concurrency, lease: {LEASE} }}
"#
    ))
}

fn redis_limiter(url: &str) -> String {
    format!("{{ redis: {{ url: \"{url}\", timeout: 500ms }}, on_error: deny }}")
}

/// The counter key of user `user`'s sockets.
fn key_of(user: &str) -> String {
    format!("sluice:{{chat:sockets:{user}}}")
}

/// Opens a socket for `user`; panics unless it opens.
fn open(sluice: &Sluice, user: &str) -> tungstenite::WebSocket<std::net::TcpStream> {
    let (status, socket) = open_websocket(sluice.addr, "/ws/room", &[("x-user", user)]);
    assert_eq!(status, 101, "{user}'s socket");
    socket.expect("an open socket")
}

/// Holds `socket` open for `hold` (five times the lease), checking every
/// few hundred milliseconds that it still echoes and that a second socket
/// of the same user is refused.
fn holds_its_slot(sluice: &Sluice, socket: &mut tungstenite::WebSocket<std::net::TcpStream>) {
    let hold = Duration::from_secs(10);
    let started = Instant::now();
    let mut checks = 0;
    while started.elapsed() < hold {
        let second = open_websocket(sluice.addr, "/ws/room", &[("x-user", "ana")]).0;
        let at = started.elapsed();
        assert_eq!(second, 429, "a second socket at {at:?}, lease {LEASE}");
        assert!(
            echoes(socket, &format!("at {at:?}")),
            "the socket at {at:?}"
        );
        checks += 1;
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(checks >= 10, "only {checks} checks in {hold:?}");
}

/// Redis's clock, µs.
fn redis_now(redis: &mut redis::Connection) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(redis).expect("TIME");
    secs * 1_000_000 + micros
}

/// The end of `user`'s lease, µs on Redis's clock.
fn lease_end(redis: &mut redis::Connection, user: &str) -> u64 {
    let ends: Vec<(String, f64)> = redis::cmd("ZRANGE")
        .arg(key_of(user))
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(redis)
        .expect("ZRANGE");
    assert_eq!(ends.len(), 1, "{user} holds one lease: {ends:?}");
    ends[0].1 as u64
}

/// Closes a socket with `close` and checks the slot came back before the
/// lease would have ended by itself: the lease is gone from Redis while
/// Redis's clock is still short of its end (read before the close; a
/// renewal only moves it later), and a new socket opens.
fn closing_frees_the_slot_at_once(
    sluice: &Sluice,
    redis: &RedisServer,
    close: impl FnOnce(),
    side: &str,
) {
    let mut conn = redis.connection();
    let end = lease_end(&mut conn, "ana");
    close();
    wait_until(Duration::from_secs(10), "the lease released", || {
        redis.log_len(&key_of("ana")) == 0
    });
    let now = redis_now(&mut conn);
    assert!(
        now < end,
        "{side} closed: the lease was gone only {} ms after it would have ended by itself",
        (now - end) / 1000
    );
    let (status, socket) = open_websocket(sluice.addr, "/ws/room", &[("x-user", "ana")]);
    assert_eq!(status, 101, "a new socket once {side} closed");
    drop(socket);
}

#[test]
fn on_redis_a_websocket_keeps_its_slot_while_open_and_frees_it_when_either_side_closes() {
    let redis = RedisServer::start();
    let sluice = chat(&redis_limiter(&redis.url()));
    let mut socket = open(&sluice, "ana");
    holds_its_slot(&sluice, &mut socket);
    closing_frees_the_slot_at_once(
        &sluice,
        &redis,
        move || {
            let _ = socket.close(None);
            while socket.read().is_ok() {}
        },
        "the client",
    );

    wait_until(
        Duration::from_secs(10),
        "the new socket's lease released",
        || redis.log_len(&key_of("ana")) == 0,
    );
    let mut socket = open(&sluice, "ana");
    assert!(echoes(&mut socket, "hello"));
    closing_frees_the_slot_at_once(
        &sluice,
        &redis,
        move || {
            // The upstream closes on `bye`.
            let _ = socket.send(tungstenite::Message::text("bye"));
            while socket.read().is_ok() {}
        },
        "the upstream",
    );
}

#[test]
fn in_process_a_websocket_keeps_its_slot_while_open_and_frees_it_when_it_closes() {
    let sluice = chat("{ backend: local }");
    let mut socket = open(&sluice, "ana");
    holds_its_slot(&sluice, &mut socket);
    let _ = socket.close(None);
    while socket.read().is_ok() {}
    wait_until(Duration::from_secs(10), "the slot back", || {
        open_websocket(sluice.addr, "/ws/room", &[("x-user", "ana")]).0 == 101
    });
    // The socket that proved it was dropped too: no lease is held.
    wait_until(Duration::from_secs(10), "no lease held", || {
        metric_value(&sluice.metrics(), "sluice_ratelimit_leases_held") == 0
    });
}

#[test]
fn on_a_redis_cluster_a_websocket_keeps_its_slot_while_open() {
    let cluster = RedisCluster::start(3);
    let limiter = format!(
        "{{ redis: {{ cluster: {}, timeout: 500ms }}, on_error: deny }}",
        cluster.urls_yaml()
    );
    let sluice = chat(&limiter);
    let mut socket = open(&sluice, "ana");
    holds_its_slot(&sluice, &mut socket);
    assert_eq!(cluster.log_len(&key_of("ana")), 1);
    let _ = socket.close(None);
    while socket.read().is_ok() {}
    wait_until(Duration::from_secs(10), "the lease released", || {
        cluster.log_len(&key_of("ana")) == 0
    });
}

/// Redis `FCALL`s and `EVALSHA`s so far: calls of the decide code.
fn decide_calls(redis: &RedisServer) -> u64 {
    redis.command_calls("fcall") + redis.command_calls("evalsha")
}

#[test]
fn renewing_a_hundred_leases_costs_one_redis_call_per_tick() {
    let redis = RedisServer::start();
    let sluice = chat(&redis_limiter(&redis.url()));
    let users: Vec<String> = (0..100).map(|i| format!("user-{i}")).collect();
    let mut sockets: Vec<_> = users.iter().map(|user| open(&sluice, user)).collect();
    assert_eq!(
        metric_value(&sluice.metrics(), "sluice_ratelimit_leases_held"),
        100
    );

    // Over a window of several leases, with nothing else asking Redis.
    let window = Duration::from_secs(6);
    let before = decide_calls(&redis);
    let started = Instant::now();
    std::thread::sleep(window);
    let calls = decide_calls(&redis) - before;
    let elapsed = started.elapsed();
    eprintln!("{calls} decide calls renewed 100 leases over {elapsed:?}");
    // A tick is a third of the 2 s lease: at most one call per tick (and
    // one more for a tick under way at either end); one call per lease
    // would be a hundred per renewal.
    let tick = Duration::from_millis(2000) / 3;
    let most = (elapsed.as_millis() / tick.as_millis()) as u64 + 2;
    assert!(
        (1..=most).contains(&calls),
        "{calls} decide calls renewing 100 leases over {elapsed:?} (at most {most})"
    );
    // Every socket still holds its slot, three leases later.
    for user in &users {
        assert_eq!(redis.log_len(&key_of(user)), 1, "{user}'s lease");
    }
    assert_eq!(
        open_websocket(sluice.addr, "/ws/room", &[("x-user", "user-7")]).0,
        429
    );
    for socket in &mut sockets {
        assert!(echoes(socket, "still here"));
    }
    for mut socket in sockets {
        let _ = socket.close(None);
        while socket.read().is_ok() {}
    }
    wait_until(Duration::from_secs(10), "every lease released", || {
        metric_value(&sluice.metrics(), "sluice_ratelimit_leases_held") == 0
    });
    for user in &users {
        assert_eq!(redis.log_len(&key_of(user)), 0, "{user}'s lease");
    }
}

#[test]
fn the_leases_of_an_instance_that_dies_end_after_lease() {
    let redis = RedisServer::start();
    let mut doomed = chat(&redis_limiter(&redis.url()));
    let other = chat(&redis_limiter(&redis.url()));
    let mut socket = open(&doomed, "ana");
    assert!(echoes(&mut socket, "hello"));
    let mut conn = redis.connection();
    // A renewal after this read only moves the end later.
    let end = lease_end(&mut conn, "ana");
    doomed.signal("-KILL");
    wait_until(Duration::from_secs(10), "the instance dead", || {
        doomed.exited()
    });
    // Its lease still counts until it ends…
    assert_eq!(
        open_websocket(other.addr, "/ws/room", &[("x-user", "ana")]).0,
        429
    );
    // …and nothing renews it: it ends within one lease of the death.
    let last = lease_end(&mut conn, "ana");
    assert!(
        last <= redis_now(&mut conn) + 2_000_000,
        "renewed past one lease"
    );
    wait_until(
        Duration::from_secs(10),
        "the dead instance's lease ended",
        || open_websocket(other.addr, "/ws/room", &[("x-user", "ana")]).0 == 101,
    );
    assert!(
        redis_now(&mut conn) >= end,
        "admitted before the lease ended"
    );
}
