//! Redis Cluster mode: a real 3-primary cluster on loopback.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;

fn config(cluster: &RedisCluster, limit: u64, on_error: &str) -> String {
    format!(
        r#"
limiter:
  redis:
    cluster: {nodes}
    timeout: 2s
  on_error: {on_error}
  deny_cache: false
routes:
  - name: login
    respond: {{ status: 200, body: "ok" }}
    limits:
      - {{ name: per-user, key: [{{header: X-User}}], limit: {limit}, window: 1m }}
"#,
        nodes = cluster.urls_yaml()
    )
}

#[test]
fn exact_across_three_instances_on_a_cluster() {
    let cluster = RedisCluster::start(3);
    let body = config(&cluster, 50, "deny");
    let instances: Vec<Sluice> = (0..3).map(|_| Sluice::start(&body)).collect();
    let addrs: Vec<_> = instances.iter().map(|s| s.addr).collect();
    let statuses = concurrent(240, move |i| {
        get(addrs[i % 3], "/login", &[("X-User", "user_1001")])
    });
    let admitted = statuses.iter().filter(|&&s| s == 200).count();
    let denied = statuses.iter().filter(|&&s| s == 429).count();
    assert_eq!((admitted, denied), (50, 190), "{statuses:?}");
    assert_eq!(cluster.log_len("sluice:{login:per-user:user_1001}"), 50);
}

#[test]
fn keys_spread_over_primaries_and_a_lost_primary_only_affects_its_keys() {
    let mut cluster = RedisCluster::start(3);
    let sluice = Sluice::start(&config(&cluster, 2, "allow"));
    let users: Vec<String> = (0..30).map(|i| format!("user{i}")).collect();
    for user in &users {
        assert_eq!(sluice.get("/login", &[("X-User", user)]).status, 200);
    }
    for &port in &cluster.ports {
        assert!(cluster.dbsize(port) > 0, "no key landed on node {port}");
    }

    let lost = cluster.ports[2];
    let owners: Vec<u16> = users
        .iter()
        .map(|u| cluster.owner(&format!("sluice:{{login:per-user:{u}}}")))
        .collect();
    cluster.kill(lost);
    for (user, owner) in users.iter().zip(&owners) {
        let statuses: Vec<u16> = (0..3)
            .map(|_| sluice.get("/login", &[("X-User", user)]).status)
            .collect();
        if *owner == lost {
            assert_eq!(
                statuses,
                [200, 200, 200],
                "{user} lives on the lost primary: on_error allow"
            );
        } else {
            assert_eq!(
                statuses,
                [200, 429, 429],
                "{user} lives on a live primary: still exact"
            );
        }
    }
    assert!(sluice.decisions("login", "per-user", "allow", "fail_open") > 0);
    assert!(sluice.decisions("login", "per-user", "deny", "redis") > 0);
}

#[test]
fn multi_limit_on_a_cluster_refunds_what_a_denied_request_took() {
    let cluster = RedisCluster::start(3);
    let sluice = Sluice::start(&format!(
        r#"
limiter:
  redis:
    cluster: {nodes}
    timeout: 2s
  on_error: deny
  deny_cache: false
routes:
  - name: login
    respond: {{ status: 200, body: "ok" }}
    limits:
      - {{ name: per-user, key: [{{header: X-User}}], limit: 10, window: 1m }}
      - {{ name: per-ip, key: [ip], limit: 3, window: 1m }}
"#,
        nodes = cluster.urls_yaml()
    ));
    let statuses: Vec<u16> = ["a", "b", "c", "a", "b", "c"]
        .iter()
        .map(|user| sluice.get("/login", &[("X-User", user)]).status)
        .collect();
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429]);
    assert_eq!(cluster.log_len("sluice:{login:per-ip:127.0.0.1}"), 3);
    // The user limit was taken first and given back when the IP limit denied
    // (asynchronously, so: eventually).
    for user in ["a", "b", "c"] {
        let key = format!("sluice:{{login:per-user:{user}}}");
        wait_until(std::time::Duration::from_secs(5), "the refund", || {
            cluster.log_len(&key) == 1
        });
    }
}

/// Every algorithm gives back what it took when a later limit (on another
/// slot) denies the request: the refund mode of each script, on a cluster.
#[test]
fn every_algorithm_refunds_on_a_cluster() {
    let cluster = RedisCluster::start(3);
    let sluice = Sluice::start(&format!(
        r#"
client_ip:
  trusted_proxies: [127.0.0.1]
limiter:
  redis:
    cluster: {nodes}
    timeout: 2s
  on_error: deny
  deny_cache: false
routes:
  - name: login
    respond: {{ status: 200, body: "ok" }}
    limits:
      - {{ name: log, key: [{{header: X-User}}], limit: 1, window: 1m }}
      - {{ name: window, key: [{{header: X-User}}], limit: 1, window: 1m, algorithm: sliding_window }}
      - {{ name: fixed, key: [{{header: X-User}}], limit: 1, window: 1h, algorithm: fixed_window }}
      - {{ name: bucket, key: [{{header: X-User}}], limit: 1, window: 1h, algorithm: token_bucket }}
      - {{ name: flight, key: [{{header: X-User}}], limit: 1, algorithm: concurrency }}
      - {{ name: per-ip, key: [ip], limit: 1, window: 1m }}
"#,
        nodes = cluster.urls_yaml()
    ));
    let send = |user: &str, ip: &str| {
        sluice
            .get("/login", &[("X-User", user), ("X-Forwarded-For", ip)])
            .status
    };
    assert_eq!(send("a", "10.0.0.1"), 200);
    assert_eq!(send("a", "10.0.0.2"), 429, "a's own limits are used up");
    // b's five user limits take a unit each; the IP limit then denies.
    assert_eq!(send("b", "10.0.0.1"), 429);
    // Once the refunds have run, b passes from a fresh address. An attempt
    // that comes too early is denied and, again, consumes nothing.
    let mut next_ip = 10;
    wait_until(std::time::Duration::from_secs(5), "b's refunds", || {
        next_ip += 1;
        send("b", &format!("10.0.1.{next_ip}")) == 200
    });
}

/// Decisions whose keys live on one primary go to that primary in shared
/// calls of the decide function (loaded on every primary), with their keys
/// spread over many slots, and stay exact.
#[test]
fn decisions_for_one_primary_share_calls_of_its_function() {
    let cluster = RedisCluster::start(3);
    let sluice = Sluice::start(&config(&cluster, 3, "deny"));
    let addr = sluice.addr;
    // 40 users, 5 requests each, 50 at a time: batches form on every node.
    let statuses = concurrent(200, move |i| {
        get(addr, "/login", &[("X-User", &format!("user{}", i % 40))])
    });
    let admitted = statuses.iter().filter(|&&s| s == 200).count();
    assert_eq!(admitted, 40 * 3, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|&&s| s == 429).count(), 40 * 2);
    for user in 0..40 {
        assert_eq!(
            cluster.log_len(&format!("sluice:{{login:per-user:user{user}}}")),
            3
        );
    }
    let mut calls = 0;
    for &port in &cluster.ports {
        assert_eq!(
            cluster.command_calls(port, "evalsha"),
            0,
            "node {port}: {}",
            sluice.log()
        );
        let libraries: redis::Value = cluster.query(port, redis::cmd("FUNCTION").arg("LIST"));
        assert!(
            format!("{libraries:?}").contains("sluice_decide_"),
            "node {port} has no sluice function: {libraries:?}"
        );
        calls += cluster.command_calls(port, "fcall");
    }
    assert!(calls >= 3, "every node decided something");
    assert!(
        calls < 200,
        "200 concurrent decisions took {calls} calls: none were shared"
    );
}

/// A slot moved to another primary (a resharding) while sluice holds the
/// old map: the old primary refuses the key, the decision is made where the
/// key now lives, and the count carries on exactly.
#[test]
fn a_moved_slot_is_followed_and_its_count_carries_on() {
    let cluster = RedisCluster::start(3);
    let sluice = Sluice::start(&config(&cluster, 10, "deny"));
    let send = || sluice.get("/login", &[("X-User", "mover")]).status;
    let key = "sluice:{login:per-user:mover}";
    assert_eq!((0..4).map(|_| send()).collect::<Vec<_>>(), [200; 4]);
    let from = cluster.owner(key);
    let to = *cluster
        .ports
        .iter()
        .find(|&&p| p != from)
        .expect("other node");
    cluster.move_slot_of(key, to);
    assert_eq!(cluster.log_len(key), 4, "the key moved with its entries");
    let after: Vec<u16> = (0..8).map(|_| send()).collect();
    assert_eq!(
        after,
        [200, 200, 200, 200, 200, 200, 429, 429],
        "{}",
        sluice.log()
    );
    assert_eq!(cluster.log_len(key), 10);
    assert!(
        cluster.command_calls(to, "evalsha") > 0,
        "the first decision after the move was made on the routed path"
    );
    assert!(
        cluster.command_calls(to, "fcall") > 0,
        "decisions came back to the batched path on the new owner"
    );
}
