//! `server.watch_config: true`: the configuration is reloaded when its file
//! changes — written in place, or swapped by a symlink as Kubernetes updates
//! a mounted ConfigMap — exactly as on SIGHUP; a broken edit is refused
//! once and the running config keeps serving.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod common;

use common::*;
use std::path::Path;
use std::time::Duration;

/// A config whose `/hello` route answers `body`.
fn config(server: &str, body: &str) -> String {
    format!(
        "{server}  watch_config: true\nlimiter: {{ backend: local }}\nroutes:\n  - name: hello\n    match: {{ path: /hello }}\n    respond: {{ status: 200, body: \"{body}\" }}\n"
    )
}

fn start(body: &str) -> (Sluice, String) {
    let addr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let admin = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let server = server_section(addr, admin);
    (
        Sluice::start_with(&config(&server, body), addr, admin, &[]),
        server,
    )
}

fn wait_for_body(sluice: &Sluice, body: &str) {
    wait_until(
        Duration::from_secs(15),
        &format!("/hello to answer {body}"),
        || sluice.get("/hello", &[]).body == body,
    );
}

#[test]
fn an_edited_file_is_reloaded_and_a_broken_edit_is_refused_once() {
    let (sluice, server) = start("one");
    assert_eq!(sluice.get("/hello", &[]).body, "one");
    std::fs::write(sluice.config_path(), config(&server, "two")).unwrap();
    wait_for_body(&sluice, "two");
    // The new state serves a moment before its reload is counted.
    wait_until(Duration::from_secs(5), "the reload to be counted", || {
        sluice.reloads("success") == 1
    });

    // A broken edit: refused (counted once, however long it stays), and
    // the running config keeps serving.
    std::fs::write(sluice.config_path(), "routes: [oops\n").unwrap();
    wait_until(
        Duration::from_secs(15),
        "the broken edit to be refused",
        || sluice.reloads("failure") == 1,
    );
    // An absence can only be checked over time: 2 s is four more polls of
    // the same broken file, none of which may count again.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(sluice.reloads("failure"), 1, "{}", sluice.log());
    assert_eq!(sluice.get("/hello", &[]).body, "two");

    std::fs::write(sluice.config_path(), config(&server, "three")).unwrap();
    wait_for_body(&sluice, "three");
    wait_until(Duration::from_secs(5), "the reload to be counted", || {
        sluice.reloads("success") == 2
    });
    assert!(
        sluice.log().contains("config file changed: reloading"),
        "{}",
        sluice.log()
    );
}

/// Points `dir/..data` at `dir/version` by a rename, atomically, as the
/// kubelet does.
fn swap_data(dir: &Path, version: &str, text: &str) {
    std::fs::create_dir_all(dir.join(version)).unwrap();
    std::fs::write(dir.join(version).join("sluice.yaml"), text).unwrap();
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(version, &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
}

#[test]
fn a_config_map_swapped_by_symlink_is_reloaded() {
    let (sluice, server) = start("one");
    let dir = sluice.dir().to_path_buf();
    // The file becomes what a ConfigMap volume holds:
    // sluice.yaml -> ..data/sluice.yaml, ..data -> ..v2.
    swap_data(&dir, "..v2", &config(&server, "two"));
    let link = dir.join("sluice.yaml.link");
    std::os::unix::fs::symlink("..data/sluice.yaml", &link).unwrap();
    std::fs::rename(&link, sluice.config_path()).unwrap();
    wait_for_body(&sluice, "two");

    // The update: a new directory, and ..data swapped to it. The file's
    // own path and the symlink it is do not change.
    swap_data(&dir, "..v3", &config(&server, "three"));
    wait_for_body(&sluice, "three");
    wait_until(Duration::from_secs(5), "the reload to be counted", || {
        sluice.reloads("success") == 2
    });
    assert_eq!(sluice.reloads("failure"), 0, "{}", sluice.log());
}
