//! DNS refresh: a server's name is resolved again every `dns_refresh`, so
//! sluice follows a moved server; a name that stops resolving keeps its last
//! addresses; a name that does not resolve at start is a warning, and 502
//! until it resolves. The names live in `/etc/hosts` (each test its own, so
//! tests running side by side never see each other's), which the system
//! resolver reads on every lookup; the tests need write access to it, as
//! CI (root) has.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom, Write};
use std::time::Duration;

const HOSTS: &str = "/etc/hosts";

/// One line of `/etc/hosts` owned by a test: `IP NAME`. Changes rewrite its
/// address in place with one of the same length (readers never see a half
/// line) and dropping it comments it out.
struct HostsEntry {
    name: String,
    /// Byte offset of the line's start.
    at: u64,
    len: usize,
}

impl HostsEntry {
    /// Appends `ip name` with a name unique to this test and process.
    fn add(test: &str, ip: &str) -> HostsEntry {
        let name = format!("sluice-{test}-{}.test", std::process::id());
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .open(HOSTS)
            .unwrap_or_else(|e| {
                panic!("{HOSTS} must be writable for the DNS tests (run as root, as CI does): {e}")
            });
        let mut text = String::new();
        file.read_to_string(&mut text).expect("read /etc/hosts");
        let mut line = String::new();
        if !text.is_empty() && !text.ends_with('\n') {
            line.push('\n');
        }
        let at = (text.len() + line.len()) as u64;
        let len = ip.len();
        line.push_str(&format!("{ip} {name}\n"));
        file.write_all(line.as_bytes())
            .expect("append to /etc/hosts");
        HostsEntry { name, at, len }
    }

    /// Points the name at `ip` (as long as the first one).
    fn point_to(&self, ip: &str) {
        assert_eq!(ip.len(), self.len, "same-length addresses only");
        self.overwrite(ip.as_bytes());
    }

    /// Comments the line out: the name stops resolving.
    fn remove(&self) {
        self.overwrite(b"#");
    }

    fn overwrite(&self, bytes: &[u8]) {
        let mut file = OpenOptions::new()
            .write(true)
            .open(HOSTS)
            .expect("open /etc/hosts");
        file.seek(SeekFrom::Start(self.at)).expect("seek");
        file.write_all(bytes).expect("write /etc/hosts");
    }
}

impl Drop for HostsEntry {
    fn drop(&mut self) {
        self.remove();
    }
}

fn config(server: &str) -> String {
    format!(
        "upstreams:\n  api:\n    servers: [\"{server}\"]\n    dns_refresh: 1s\n    max_fails: 0\nroutes:\n  - name: api\n    upstream: api\n"
    )
}

/// The server that answered `GET /`, or the status when none did.
fn served_by(sluice: &Sluice) -> Result<String, u16> {
    let response = sluice.get("/", &[]);
    match (response.status, response.header("x-served-by")) {
        (200, Some(server)) => Ok(server.to_string()),
        (status, _) => Err(status),
    }
}

#[test]
fn a_server_whose_name_moves_is_followed_and_a_name_that_stops_resolving_keeps_its_address() {
    let port = free_port();
    let old = Upstream::start_at("127.0.0.2", port);
    let new = Upstream::start_at("127.0.0.3", port);
    let hosts = HostsEntry::add("moves", "127.0.0.2");
    let sluice = Sluice::start(&config(&format!("{}:{port}", hosts.name)));
    assert_eq!(served_by(&sluice), Ok(old.addr.to_string()));

    hosts.point_to("127.0.0.3");
    wait_until(Duration::from_secs(15), "sluice to follow the name", || {
        served_by(&sluice) == Ok(new.addr.to_string())
    });
    for _ in 0..20 {
        assert_eq!(served_by(&sluice), Ok(new.addr.to_string()));
    }
    let old_hits = old.hits();

    // The name stops resolving: a warning, and the last address stays.
    hosts.remove();
    wait_until(
        Duration::from_secs(15),
        "the failed lookup's warning",
        || sluice.log().contains("does not resolve"),
    );
    for _ in 0..20 {
        assert_eq!(served_by(&sluice), Ok(new.addr.to_string()));
    }
    assert_eq!(old.hits(), old_hits, "the old address got requests");
    assert!(
        sluice.log().contains(&format!("keeping {}", new.addr)),
        "{}",
        sluice.log()
    );
}

#[test]
fn a_name_that_does_not_resolve_at_start_is_502_until_it_does() {
    let upstream = Upstream::start();
    let port = upstream.addr.port();
    let name = format!("sluice-later-{}.test", std::process::id());
    let sluice = Sluice::start(&config(&format!("{name}:{port}")));
    assert!(
        sluice.log().contains("does not resolve"),
        "{}",
        sluice.log()
    );
    let response = sluice.get("/", &[]);
    assert_eq!(response.status, 502, "{}", response.body);
    assert!(response.body.contains("bad_gateway"), "{}", response.body);

    let _hosts = HostsEntry::add("later", "127.0.0.1");
    wait_until(Duration::from_secs(15), "the name to resolve", || {
        served_by(&sluice) == Ok(upstream.addr.to_string())
    });
}

#[test]
fn without_dns_refresh_a_name_that_does_not_resolve_is_refused_at_load() {
    let name = format!("sluice-never-{}.test", std::process::id());
    let text = format!(
        "upstreams:\n  api:\n    servers: [\"{name}:80\"]\nroutes:\n  - name: api\n    upstream: api\n"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("sluice.yaml");
    std::fs::write(&path, text).expect("write config");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("--check")
        .arg("--config")
        .arg(&path)
        .output()
        .expect("run sluice --check");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("sluice.yaml:3:15: cannot resolve `{name}:80`")),
        "{stderr}"
    );
}
