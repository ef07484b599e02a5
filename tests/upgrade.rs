//! Zero-downtime binary upgrade through Pingora: a new sluice started with
//! `--upgrade` takes the listeners of the running one (`SIGQUIT`) while
//! requests flow, and none of them fails.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn upgrade_under_load_fails_no_request() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let addr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let admin = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("upgrade.sock");
    let text = format!(
        r#"{server}  upgrade_sock: "{sock}"
  pid_file: "{pid}"
limiter:
  redis: {{ url: "{url}", timeout: 2s }}
upstreams:
  api: {{ servers: ["{upstream}"] }}
routes:
  - name: api
    upstream: api
    limits:
      - name: per-client
        key: [{{header: x-client}}]
        limit: 5
        window: 1m
"#,
        server = server_section(addr, admin),
        sock = sock.display(),
        pid = dir.path().join("sluice.pid").display(),
        url = redis.url(),
        upstream = upstream.addr,
    );
    let mut old = Sluice::start_with(&text, addr, admin, &[]);
    let load = Load::start(addr, 4, "/load");
    wait_until(Duration::from_secs(10), "load flowing", || {
        upstream.hits() > 20
    });

    let new_log = dir.path().join("new.log");
    let mut new = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("--upgrade")
        .arg("--config")
        .arg(old.config_path())
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&new_log).unwrap())
        .spawn()
        .map(KillOnDrop)
        .expect("start the new sluice");
    let new_log_text = || std::fs::read_to_string(&new_log).unwrap_or_default();
    // The new process waits for the listeners on the upgrade socket.
    wait_until(Duration::from_secs(20), "the upgrade socket", || {
        assert!(
            new.0.try_wait().unwrap().is_none(),
            "the new sluice exited:\n{}",
            new_log_text()
        );
        sock.exists()
    });
    let hits_before = upstream.hits();
    old.signal("-QUIT");
    // The old one hands over the listeners, drains and exits (Pingora keeps
    // accepting for 5 s after the hand-over, then the 1 s grace period).
    let handover = Instant::now();
    wait_until(Duration::from_secs(30), "the old sluice to exit", || {
        old.exited()
    });
    let after_exit = upstream.hits();
    wait_until(
        Duration::from_secs(10),
        "load served by the new sluice",
        || upstream.hits() > after_exit + 20,
    );
    let report = load.stop();

    report.assert_no_failures(&format!("new sluice:\n{}", new_log_text()));
    assert!(upstream.hits() > hits_before + 40);
    assert!(handover.elapsed() < Duration::from_secs(30));
    // The new process serves the admin listener too, and limits still apply.
    assert_eq!(get(admin, "/readyz", &[]).status, 200);
    let statuses: Vec<u16> = (0..6)
        .map(|_| get(addr, "/x", &[("X-Client", "after")]).status)
        .collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);
    assert!(
        new_log_text().contains("sluice listening on"),
        "{}",
        new_log_text()
    );
}

/// A child process killed when the test ends, pass or fail.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The pid in `path`, once the file holds one.
fn read_pid(path: &std::path::Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

/// A daemon (by pid) killed when the test ends.
struct KillPid(u32);

impl Drop for KillPid {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-9")
            .arg(self.0.to_string())
            .status();
    }
}

/// The commands of `conf/sluice.service` (systemd `Type=forking`): start with
/// `--daemon`; upgrade with `kill -QUIT $MAINPID` then `--upgrade --daemon`.
/// Each `--daemon` command returns once its daemon has bootstrapped and
/// written the pid file, which then names the new daemon.
#[test]
fn daemon_upgrade_as_the_systemd_unit_runs_it() {
    let upstream = Upstream::start();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let admin: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("sluice.pid");
    let config = dir.path().join("sluice.yaml");
    std::fs::write(
        &config,
        format!(
            r#"{server}  upgrade_sock: "{sock}"
  pid_file: "{pid}"
limiter: {{ backend: local }}
upstreams:
  api: {{ servers: ["{upstream}"] }}
routes:
  - name: api
    upstream: api
"#,
            server = server_section(addr, admin),
            sock = dir.path().join("upgrade.sock").display(),
            pid = pid_file.display(),
            upstream = upstream.addr,
        ),
    )
    .unwrap();
    let logs = || {
        ["first.log", "second.log"]
            .iter()
            .map(|name| {
                let text = std::fs::read_to_string(dir.path().join(name)).unwrap_or_default();
                format!("--- {name}\n{text}")
            })
            .collect::<String>()
    };
    let sluice = |args: &[&str], log: &str| {
        let status = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(args)
            .arg("--config")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join(log)).unwrap())
            .status()
            .expect("run sluice");
        assert!(status.success(), "sluice {args:?}: {status}\n{}", logs());
    };

    sluice(&["--daemon"], "first.log");
    let first = read_pid(&pid_file).expect("the daemon's pid file");
    let _first_guard = KillPid(first);
    wait_until(Duration::from_secs(10), "the daemon to listen", || {
        try_get(admin, "/healthz", &[]).is_ok_and(|r| r.status == 200)
    });
    // The admin listener answers from the bootstrap on; the proxy's listeners
    // open after the warm-up, a moment later on a loaded machine.
    wait_until(
        Duration::from_secs(10),
        "the daemon's proxy to listen",
        || try_get(addr, "/load", &[]).is_ok_and(|r| r.status == 200),
    );

    let load = Load::start(addr, 4, "/load");
    wait_until(Duration::from_secs(10), "load flowing", || {
        upstream.hits() > 20
    });
    let status = Command::new("kill")
        .arg("-QUIT")
        .arg(first.to_string())
        .status()
        .unwrap();
    assert!(status.success());
    sluice(&["--upgrade", "--daemon"], "second.log");
    let second = read_pid(&pid_file).expect("the new daemon's pid file");
    let _second_guard = KillPid(second);
    assert_ne!(first, second, "the pid file must name the new daemon");
    wait_until(Duration::from_secs(30), "the old daemon to exit", || {
        !alive(first)
    });
    let after_exit = upstream.hits();
    wait_until(
        Duration::from_secs(10),
        "load served by the new daemon",
        || upstream.hits() > after_exit + 20,
    );
    let report = load.stop();
    report.assert_no_failures("daemon upgrade");
    assert!(alive(second));
}
