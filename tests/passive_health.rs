//! Passive health: a server that fails is taken out for `fail_timeout` and
//! comes back after it; when every server is out, all are tried.

mod common;

use common::*;
use std::time::Duration;

fn config(servers: &[String], fail_timeout: &str) -> String {
    let list = servers
        .iter()
        .map(|s| format!("\"{s}\""))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "upstreams:\n  api:\n    servers: [{list}]\n    max_fails: 1\n    fail_timeout: {fail_timeout}\nroutes:\n  - name: api\n    upstream: api\n"
    )
}

fn server_up(sluice: &Sluice, server: &str) -> u64 {
    let series = format!("sluice_upstream_server_up{{server=\"{server}\",upstream=\"api\"}}");
    metric_value(&sluice.metrics(), &series)
}

#[test]
fn a_failing_server_is_taken_out_and_comes_back_after_fail_timeout() {
    let good = Upstream::start();
    let port = free_port();
    let dead = format!("127.0.0.1:{port}");
    let sluice = Sluice::start(&config(&[dead.clone(), good.addr.to_string()], "2s"));
    let statuses: Vec<u16> = (0..10)
        .map(|i| sluice.get(&format!("/{i}"), &[]).status)
        .collect();
    // Its first failure takes it out: one 502 at most, then the good server.
    assert!(
        statuses.iter().filter(|s| **s == 502).count() <= 1,
        "{statuses:?}"
    );
    assert!(statuses[2..].iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(server_up(&sluice, &dead), 0);
    assert_eq!(server_up(&sluice, &good.addr.to_string()), 1);

    // It comes back; after fail_timeout it is in selection again.
    let revived = Upstream::start_on(port);
    wait_until(
        Duration::from_secs(10),
        "the revived server to serve",
        || sluice.get("/again", &[]).status == 200 && revived.hits() > 0,
    );
    assert_eq!(server_up(&sluice, &dead), 1);
}

#[test]
fn when_every_server_is_out_all_are_tried() {
    let (a, b) = (free_port(), free_port());
    let servers = [format!("127.0.0.1:{a}"), format!("127.0.0.1:{b}")];
    // Out for far longer than the test: only "all out, all tried" lets a
    // request through.
    let sluice = Sluice::start(&config(&servers, "5m"));
    for i in 0..4 {
        assert_eq!(sluice.get(&format!("/{i}"), &[]).status, 502);
    }
    assert_eq!(server_up(&sluice, &servers[0]), 0);
    assert_eq!(server_up(&sluice, &servers[1]), 0);
    let revived = Upstream::start_on(a);
    let served = (0..4)
        .filter(|i| sluice.get(&format!("/late/{i}"), &[]).status == 200)
        .count();
    assert!(served >= 1, "an all-out upstream still tries its servers");
    assert!(revived.hits() >= 1);
}
