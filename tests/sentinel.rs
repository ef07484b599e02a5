//! Redis Sentinel: three real sentinels watch a primary and its replica; the
//! primary is killed under load. With `on_error: local` no request fails
//! while the sentinels fail over, decisions come back to Redis on the new
//! primary within seconds, and a limit is exact there.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

const MASTER: &str = "sluicemaster";

/// A `redis-server FILE --sentinel` process, killed on drop.
struct Sentinel {
    child: Child,
    port: u16,
    /// Its `requirepass`, if any.
    password: Option<String>,
    _dir: tempfile::TempDir,
}

impl Sentinel {
    /// A sentinel of three (a quorum of 2), open to any client.
    fn start(primary_port: u16) -> Self {
        Self::start_with(primary_port, 2, "", None)
    }

    /// A sentinel watching the primary at `primary_port` with `quorum`,
    /// `extra` lines of configuration, and `password` required of clients.
    fn start_with(primary_port: u16, quorum: u32, extra: &str, password: Option<&str>) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let file = dir.path().join("sentinel.conf");
        let requirepass = password.map_or(String::new(), |p| format!("requirepass \"{p}\"\n"));
        std::fs::write(
            &file,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\n{requirepass}\
                 sentinel monitor {MASTER} 127.0.0.1 {primary_port} {quorum}\n\
                 sentinel down-after-milliseconds {MASTER} 1000\n\
                 sentinel failover-timeout {MASTER} 5000\n\
                 sentinel parallel-syncs {MASTER} 1\n{extra}",
                dir = dir.path().display()
            ),
        )
        .expect("write sentinel.conf");
        let child = Command::new("redis-server")
            .arg(&file)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server --sentinel");
        let sentinel = Self {
            child,
            port,
            password: password.map(str::to_string),
            _dir: dir,
        };
        wait_until(Duration::from_secs(10), "a sentinel to answer", || {
            sentinel.query::<String>(&mut redis::cmd("PING")).is_some()
        });
        sentinel
    }

    fn query<T: redis::FromRedisValue>(&self, command: &mut redis::Cmd) -> Option<T> {
        let mut info: redis::ConnectionInfo = redis::IntoConnectionInfo::into_connection_info(
            format!("redis://127.0.0.1:{}", self.port),
        )
        .ok()?;
        if let Some(password) = &self.password {
            let settings = info.redis_settings().clone().set_password(password);
            info = info.set_redis_settings(settings);
        }
        let client = redis::Client::open(info).ok()?;
        let mut connection = client
            .get_connection_with_timeout(Duration::from_millis(500))
            .ok()?;
        command.query(&mut connection).ok()
    }

    /// The port of the primary it names now.
    fn primary_port(&self) -> Option<u16> {
        let (_, port): (String, String) = self.query(
            redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(MASTER),
        )?;
        port.parse().ok()
    }

    /// How many other sentinels and replicas it knows.
    fn peers(&self) -> (usize, usize) {
        let count = |what: &str| {
            self.query::<Vec<redis::Value>>(redis::cmd("SENTINEL").arg(what).arg(MASTER))
                .map_or(0, |v| v.len())
        };
        (count("sentinels"), count("replicas"))
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_killed_primary_is_replaced_under_load_without_a_failed_request() {
    let mut primary = RedisServer::start();
    let replica_port = free_port();
    let primary_port = primary.port.to_string();
    let replica =
        RedisServer::start_with_args(replica_port, &["--replicaof", "127.0.0.1", &primary_port]);
    let sentinels: Vec<Sentinel> = (0..3).map(|_| Sentinel::start(primary.port)).collect();
    wait_until(
        Duration::from_secs(30),
        "sentinels to find each other",
        || sentinels.iter().all(|s| s.peers() == (2, 1)),
    );
    let nodes: Vec<String> = sentinels
        .iter()
        .map(|s| format!("\"127.0.0.1:{}\"", s.port))
        .collect();
    let upstream = Upstream::start();
    let sluice = Sluice::start(&format!(
        r#"
limiter:
  redis:
    url: "redis://127.0.0.1:1/0"
    timeout: 50ms
    sentinel: {{ master: {MASTER}, nodes: [{nodes}] }}
  on_error: local
upstreams:
  api: {{ servers: ["{upstream}"] }}
routes:
  - name: api
    upstream: api
    limits:
      - {{ name: per-key, key: [{{header: X-Key}}], limit: 5, window: 1m }}
"#,
        nodes = nodes.join(", "),
        upstream = upstream.addr,
    ));
    let redis_decisions = || {
        sluice.decisions("api", "per-key", "allow", "redis")
            + sluice.decisions("api", "per-key", "deny", "redis")
    };
    // The first connection asks the sentinels first: until it is up,
    // decisions are local.
    wait_until(Duration::from_secs(10), "a decision on Redis", || {
        sluice.get("/", &[("X-Key", "warm-up")]);
        redis_decisions() > 0
    });
    let local_decisions = || {
        sluice.decisions("api", "per-key", "allow", "local")
            + sluice.decisions("api", "per-key", "deny", "local")
    };
    let local_before = local_decisions();
    // Exact on the first primary.
    let admitted = (0..8)
        .filter(|_| sluice.get("/", &[("X-Key", "before")]).status == 200)
        .count();
    assert_eq!(admitted, 5);
    assert_eq!(local_decisions(), local_before, "decided on Redis");

    // Load: one request after another on rotating keys, every status kept.
    let stop = Arc::new(AtomicBool::new(false));
    let statuses = Arc::new(Mutex::new(Vec::new()));
    let sent = Arc::new(AtomicUsize::new(0));
    let load = {
        let (stop, statuses, sent) = (stop.clone(), statuses.clone(), sent.clone());
        let addr = sluice.addr;
        thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let n = sent.fetch_add(1, Ordering::SeqCst);
                let key = format!("load-{}", n % 1000);
                let status = get(addr, "/", &[("X-Key", key.as_str())]).status;
                statuses.lock().unwrap().push(status);
            }
        })
    };
    wait_until(Duration::from_secs(5), "load to start", || {
        sent.load(Ordering::SeqCst) > 20
    });
    let killed = Instant::now();
    primary.kill();
    wait_until(
        Duration::from_secs(30),
        "the sentinels to fail over",
        || sentinels[0].primary_port() == Some(replica_port),
    );
    let failed_over = killed.elapsed();
    let before = redis_decisions();
    wait_until(Duration::from_secs(30), "decisions back on Redis", || {
        redis_decisions() > before + 20
    });
    let back = killed.elapsed();
    stop.store(true, Ordering::SeqCst);
    load.join().expect("load thread");
    let statuses = statuses.lock().unwrap().clone();
    let failed: Vec<&u16> = statuses.iter().filter(|s| **s >= 500 || **s == 0).collect();
    assert!(
        failed.is_empty(),
        "{} of {} failed: {failed:?}",
        failed.len(),
        statuses.len()
    );
    eprintln!(
        "failover: the sentinels named the new primary {failed_over:?} after the kill; \
         decisions were on Redis again {back:?} after it; {} requests, none failed",
        statuses.len()
    );

    // Exact on the new primary.
    let admitted = (0..8)
        .filter(|_| sluice.get("/", &[("X-Key", "after")]).status == 200)
        .count();
    assert_eq!(admitted, 5);
    assert!(
        !replica.keys("sluice:*after*").is_empty(),
        "the new primary holds the counter"
    );
}

/// A config whose Redis is the primary the sentinel on `sentinel_port` names: `redis` gives the
/// URL (and TLS) lines, `sentinel_keys` more keys of `sentinel:`; one route
/// answering 200, `limit` a minute per `X-Key`, decided on Redis only.
fn behind_a_sentinel(redis: &str, sentinel_port: u16, sentinel_keys: &str, limit: u64) -> String {
    format!(
        r#"
limiter:
  redis:
{redis}    timeout: 1s
    sentinel: {{ master: {MASTER}, nodes: ["127.0.0.1:{sentinel_port}"]{sentinel_keys} }}
  on_error: deny
  deny_cache: false
routes:
  - name: api
    respond: {{ status: 200, body: ok }}
    limits:
      - {{ name: per-key, key: [{{header: X-Key}}], limit: {limit}, window: 1m }}
"#
    )
}

#[test]
fn a_sentinel_password_that_needs_escaping_and_an_acl_user_on_the_primary() {
    // Characters that mean something in a URL's user information.
    const SENTINEL_PASSWORD: &str = "s3nt:@/#?inel";
    // The primary's ACL user; the sentinel watches it as the default user.
    let primary = RedisServer::start_with_args(
        free_port(),
        &["--user", "gate", "on", ">pr1mary", "~*", "&*", "+@all"],
    );
    let sentinel = Sentinel::start_with(primary.port, 1, "", Some(SENTINEL_PASSWORD));
    assert_eq!(sentinel.primary_port(), Some(primary.port));
    let config = |password: &str| {
        behind_a_sentinel(
            "    url: \"redis://gate:pr1mary@127.0.0.1:1/0\"\n",
            sentinel.port,
            &format!(", password: \"{password}\""),
            3,
        )
    };

    let sluice = Sluice::start(&config(SENTINEL_PASSWORD));
    let statuses: Vec<u16> = (0..5)
        .map(|_| sluice.get("/", &[("X-Key", "k")]).status)
        .collect();
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    assert_eq!(sluice.decisions("api", "per-key", "deny", "redis"), 2);
    // Decided on the primary the sentinel named, as its ACL user.
    assert_eq!(primary.keys("sluice:*").len(), 1);
    let clients = primary.client_list();
    assert!(
        clients.lines().any(|l| l.contains("user=gate")),
        "{clients}"
    );
    assert!(!sluice.log().contains("s3nt"), "{}", sluice.log());

    // The sentinel refuses a wrong password: no primary, so on_error decides.
    let refused = Sluice::start(&config("guess"));
    assert_eq!(refused.get("/", &[("X-Key", "k")]).status, 503);
    let log = refused.log();
    assert!(log.contains("sentinel"), "{log}");
    assert!(!log.contains("guess") && !log.contains("pr1mary"), "{log}");
}

#[test]
fn sentinels_and_the_primary_over_tls_are_verified_against_the_configured_ca() {
    let dir = tempfile::tempdir().expect("tempdir");
    make_ca(dir.path(), "ca");
    make_cert(dir.path(), "ca", "server", "DNS:localhost,IP:127.0.0.1");
    let file = |name: &str| dir.path().join(name).display().to_string();
    let tls_port = free_port();
    let tls_args = [
        "--tls-cert-file".to_string(),
        file("server.crt"),
        "--tls-key-file".to_string(),
        file("server.key"),
        "--tls-ca-cert-file".to_string(),
        file("ca.crt"),
        "--tls-auth-clients".to_string(),
        "no".to_string(),
    ];
    let mut args = vec!["--tls-port".to_string(), tls_port.to_string()];
    args.extend(tls_args.iter().cloned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let primary = RedisServer::start_with_args(free_port(), &args);
    // The sentinel watches (and names) the primary's TLS port.
    let sentinel_tls: String = tls_args
        .chunks(2)
        .map(|pair| format!("{} \"{}\"\n", pair[0].trim_start_matches("--"), pair[1]))
        .collect();
    // It also serves TLS on a port of its own, which sluice uses.
    let sentinel_tls_port = free_port();
    let sentinel = Sentinel::start_with(
        tls_port,
        1,
        &format!("tls-port {sentinel_tls_port}\ntls-replication yes\n{sentinel_tls}"),
        None,
    );
    assert_eq!(sentinel.primary_port(), Some(tls_port));
    let config = |ca: &str| {
        let redis =
            format!("    url: \"rediss://127.0.0.1:1/0\"\n    tls: {{ ca_file: \"{ca}\" }}\n");
        behind_a_sentinel(&redis, sentinel_tls_port, ", tls: true", 2)
    };
    let sluice = Sluice::start(&config(&file("ca.crt")));
    let statuses: Vec<u16> = (0..3)
        .map(|_| sluice.get("/", &[("X-Key", "k")]).status)
        .collect();
    assert_eq!(statuses, [200, 200, 429]);
    assert_eq!(primary.keys("sluice:*").len(), 1);

    // A CA that did not sign the certificates: refused, so on_error decides.
    let other = tempfile::tempdir().expect("tempdir");
    make_ca(other.path(), "ca");
    let other_ca = other.path().join("ca.crt").display().to_string();
    let refused = Sluice::start(&config(&other_ca));
    assert_eq!(refused.get("/", &[("X-Key", "k")]).status, 503);
    assert!(refused.log().contains("certificate"), "{}", refused.log());
}

#[test]
fn check_refuses_a_sentinel_without_nodes_or_beside_a_cluster() {
    let check = check_config;
    let (code, stderr) =
        check("limiter:\n  redis:\n    sentinel: { master: m, nodes: [], password: hunter2 }\n");
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains(":3:") && stderr.contains("`nodes` needs at least one"),
        "{stderr}"
    );
    assert!(!stderr.contains("hunter2"), "{stderr}");
    let (code, stderr) = check(
        "limiter:\n  redis:\n    cluster: [\"redis://127.0.0.1:7000\"]\n    sentinel: { master: m, nodes: [\"127.0.0.1:26379\"] }\n",
    );
    assert_eq!(code, Some(1));
    assert!(stderr.contains("not both"), "{stderr}");
    let (code, stderr) =
        check("limiter:\n  redis:\n    sentinel: { master: m, nodes: [\"redis://h:1\"] }\n");
    assert_eq!(code, Some(1));
    assert!(stderr.contains("is not host:port"), "{stderr}");
}
