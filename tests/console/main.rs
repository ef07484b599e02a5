//! The operator console, driven in a real headless Chromium through its
//! DevTools protocol: what the overview, the top keys and the upstreams
//! show after real traffic, a refused reload, a key that is an HTML/JS
//! payload, the locked page without the token, a reset and the consumers
//! from the page — and, on the wire, the headers of every console answer
//! and the refusal of state changes another site sends.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test may panic on what it did not expect

mod cdp;
#[path = "../common/mod.rs"]
mod common;

use cdp::{Chromium, Tab};
use common::*;
use serde_json::{json, Value};
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::time::Duration;

const TOKEN: &str = "console-test-token";

/// Long enough for a loaded 2-core machine: the console polls every 2 s.
const PATIENCE: Duration = Duration::from_secs(60);

/// A route limited per `X-User` (5 a minute, plus a shadow limit of 3) on an
/// upstream of `servers`, and the consumers API on the limiter's Redis.
fn config(redis: &RedisServer, servers: &[String]) -> String {
    let list = servers
        .iter()
        .map(|s| format!("\"{s}\""))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        r#"identity:
  api_key: {{ header: x-api-key, store: redis }}
limiter:
  redis: {{ url: "{url}", timeout: 500ms }}
upstreams:
  api:
    servers: [{list}]
    max_fails: 1
    fail_timeout: 1m
routes:
  - name: api
    match: {{ path_prefix: /api/ }}
    upstream: api
    limits:
      - {{ name: per-user, key: [{{header: X-User}}], limit: 5, window: 1m }}
      - {{ name: trial, key: [{{header: X-User}}], limit: 3, window: 1m, shadow: true }}
"#,
        url = redis.url()
    )
}

/// The pod the console's sluice believes it is (as Kubernetes's downward
/// API tells it).
const POD: &str = "k8s.pod.name=sluice-6c9d-console,k8s.namespace.name=edge";

/// Sluice with [`config`] and the admin token set.
fn start(redis: &RedisServer, servers: &[String]) -> Sluice {
    Sluice::start_with_server(
        "  admin_token_env: CONSOLE_TOKEN\n",
        &config(redis, servers),
        &[("CONSOLE_TOKEN", TOKEN), ("OTEL_RESOURCE_ATTRIBUTES", POD)],
    )
}

/// Redis, an upstream, and sluice ([`start`]) proxying to it.
fn rig() -> (RedisServer, Upstream, Sluice) {
    let (redis, upstream) = (RedisServer::start(), Upstream::start());
    let sluice = start(&redis, &[upstream.addr.to_string()]);
    (redis, upstream, sluice)
}

/// The page opened no dialog and broke no rule of its policy.
fn assert_nothing_ran(tab: &mut Tab) {
    assert_eq!(tab.dialogs(), Vec::<String>::new());
    assert_eq!(tab.violations(), json!([]));
}

fn console_url(sluice: &Sluice) -> String {
    format!("http://{}/console/", sluice.admin)
}

/// A tab on the console, logged in through the URL fragment.
fn logged_in(chromium: &Chromium, sluice: &Sluice) -> Tab {
    let mut tab = chromium.tab();
    tab.open(&format!("{}#token={TOKEN}", console_url(sluice)));
    tab.wait_for(
        PATIENCE,
        "the overview",
        "document.body.dataset.loaded === 'overview'",
    );
    tab
}

/// `count` requests as user `user`; their statuses.
fn send_as(sluice: &Sluice, user: &str, count: usize) -> Vec<u16> {
    (0..count)
        .map(|_| sluice.get("/api/x", &[("X-User", user)]).status)
        .collect()
}

/// An admin API call with the token; status and JSON body.
fn admin(sluice: &Sluice, method: &str, path: &str) -> (u16, Value) {
    let auth = format!("Bearer {TOKEN}");
    let response = request(sluice.admin, method, path, &[("Authorization", &auth)]);
    let body = serde_json::from_str(&response.body).unwrap_or(Value::Null);
    (response.status, body)
}

fn shows_text(tab: &mut Tab, selector: &str) -> String {
    let expression = format!(
        "(document.querySelector({}) || {{}}).textContent || ''",
        json!(selector)
    );
    tab.eval(&expression).as_str().unwrap_or("").to_string()
}

#[test]
fn every_console_and_api_answer_carries_the_security_headers() {
    let (_redis, _upstream, sluice) = rig();
    let auth = format!("Bearer {TOKEN}");
    let with_token = [("Authorization", auth.as_str())];
    let answers = [
        ("/console/", 200, "text/html"),
        ("/console/index.html", 200, "text/html"),
        ("/console/console.js", 200, "text/javascript"),
        ("/console/console.css", 200, "text/css"),
        ("/console/missing.js", 404, "text/plain"),
        ("/", 302, "text/plain"),
        ("/v1/status", 200, "application/json"),
        ("/v1/rates", 200, "application/json"),
        ("/v1/upstreams", 200, "application/json"),
        ("/v1/top", 200, "application/json"),
        ("/v1/consumers", 200, "application/json"),
        ("/v1/usage", 400, "application/json"),
        ("/v1/nothing", 404, "application/json"),
    ];
    for (path, status, content_type) in answers {
        for headers in [&with_token[..], &[]] {
            let response = get(sluice.admin, path, headers);
            let expected = if headers.is_empty() && path.starts_with("/v1/") && status != 404 {
                401
            } else {
                status
            };
            assert_eq!(response.status, expected, "{path}: {}", response.body);
            let csp = response.header("content-security-policy").unwrap_or("");
            for directive in [
                "default-src 'self'",
                "script-src 'self'",
                "frame-ancestors 'none'",
            ] {
                assert!(csp.contains(directive), "{path}: CSP {csp:?}");
            }
            assert!(!csp.contains("unsafe"), "{path}: CSP {csp:?}");
            assert_eq!(
                response.header("x-content-type-options"),
                Some("nosniff"),
                "{path}"
            );
            assert_eq!(
                response.header("referrer-policy"),
                Some("no-referrer"),
                "{path}"
            );
            assert_eq!(response.header("cache-control"), Some("no-store"), "{path}");
            assert_eq!(response.header("x-frame-options"), Some("DENY"), "{path}");
            if expected == status {
                let got = response.header("content-type").unwrap_or("");
                assert!(got.starts_with(content_type), "{path}: {got}");
            }
        }
    }
    assert_eq!(
        get(sluice.admin, "/", &[]).header("location"),
        Some("/console/")
    );
    let script = get(sluice.admin, "/console/console.js", &[]).body;
    assert!(!script.contains("innerHTML"), "the script writes markup");
}

#[test]
fn without_the_token_the_page_is_locked_and_shows_no_data() {
    let (_redis, _upstream, sluice) = rig();
    let chromium = Chromium::start();
    let mut tab = chromium.tab();
    tab.open(&console_url(&sluice));
    tab.wait_for(
        PATIENCE,
        "the lock",
        "!document.getElementById('locked').hidden",
    );
    assert!(shows_text(&mut tab, "#locked-why").contains("401"));
    for data in ["#routes", "#config", "#limiter", "#upstreams", "#top tbody"] {
        assert_eq!(
            shows_text(&mut tab, data),
            "",
            "{data} shows data while locked"
        );
    }
    assert_eq!(
        tab.eval("document.getElementById('views').hidden"),
        json!(true)
    );

    // A wrong token is refused and stays in the tab only.
    tab.eval("document.getElementById('token').value = 'wrong'; document.getElementById('login').requestSubmit(); 1");
    tab.wait_for(
        PATIENCE,
        "the refusal",
        "document.getElementById('locked-why').textContent.includes('refused this token')",
    );
    assert_eq!(shows_text(&mut tab, "#routes"), "");

    // The right one, handed in the fragment: moved to the tab's storage and
    // out of the address bar at once; the overview shows.
    tab.open(&format!("{}#token={TOKEN}", console_url(&sluice)));
    tab.wait_for(
        PATIENCE,
        "the overview",
        "document.body.dataset.loaded === 'overview'",
    );
    assert_eq!(tab.eval("location.hash"), json!(""));
    assert_eq!(tab.eval("location.href"), json!(console_url(&sluice)));
    assert_eq!(
        tab.eval("sessionStorage.getItem('sluice.console.token')"),
        json!(TOKEN)
    );
    assert_eq!(tab.eval("document.cookie"), json!(""));
    assert!(shows_text(&mut tab, "#routes").contains("per-user"));
    assert_eq!(
        tab.eval("document.getElementById('locked').hidden"),
        json!(true)
    );
    // The token never reached a URL the server saw.
    assert!(!sluice.log().contains(TOKEN), "the token is in the log");
    assert_eq!(tab.violations(), json!([]));
}

#[test]
fn a_flood_shows_the_limit_denying_and_the_flooder_first() {
    let (_redis, _upstream, sluice) = rig();
    let chromium = Chromium::start();
    let mut tab = logged_in(&chromium, &sluice);
    // Nothing denied yet: the limit is quiet.
    let quiet =
        "document.querySelector('[data-route=\"api\"] tr[data-limit=\"per-user\"]').dataset.state";
    assert_eq!(
        tab.wait_for(PATIENCE, "the limit's row", quiet),
        json!("quiet")
    );
    // Which instance the page reads: a port-forward reaches one pod.
    let instance = shows_text(&mut tab, "#instance");
    let expected = format!(
        "pod sluice-6c9d-console in edge \u{b7} pid {}",
        sluice.pid()
    );
    assert_eq!(instance, expected);

    let statuses = send_as(&sluice, "flooder", 30);
    assert_eq!(
        statuses.iter().filter(|s| **s == 429).count(),
        25,
        "{statuses:?}"
    );
    let other = send_as(&sluice, "bystander", 7);
    assert_eq!(other.iter().filter(|s| **s == 429).count(), 2, "{other:?}");

    let denying = format!("{quiet} === 'denying'");
    tab.wait_for(PATIENCE, "the limit to show denying", &denying);
    let shadow =
        "document.querySelector('[data-route=\"api\"] tr[data-limit=\"trial\"]').dataset.state";
    assert_eq!(tab.eval(shadow), json!("shadow-denying"));
    let denied_rate = "Number(document.querySelector('[data-route=\"api\"] tr[data-limit=\"per-user\"] td.denied').textContent)";
    tab.wait_for(PATIENCE, "a denied rate", &format!("{denied_rate} > 0"));

    tab.click("nav button[data-view='limited']");
    tab.wait_for(
        PATIENCE,
        "the top keys",
        "document.querySelectorAll('#top tbody tr').length >= 2",
    );
    let first = shows_text(&mut tab, "#top tbody tr[data-rank='1'] td.key");
    assert_eq!(first, "header.x-user=flooder");
    let count = shows_text(&mut tab, "#top tbody tr[data-rank='1'] td.num:nth-child(5)");
    assert!(count.starts_with("25"), "{count}");
    assert_eq!(
        shows_text(&mut tab, "#top tbody tr[data-rank='2'] td.key"),
        "header.x-user=bystander"
    );
    // Per limit: the filter lists each with its denials; the shadow limit
    // denied nobody, so its list is empty.
    let options = tab.eval(
        "Array.from(document.querySelectorAll('#top-filter option')).map(o => o.textContent)",
    );
    assert_eq!(
        options,
        json!([
            "every limit",
            "api / per-user — 27 denied",
            "api / trial — 0 denied"
        ])
    );
    let choose = |limit: &str| {
        format!("(() => {{ const s = document.getElementById('top-filter'); s.value = 'route=api&limit={limit}'; s.dispatchEvent(new Event('change')); return true; }})()")
    };
    tab.eval(&choose("trial"));
    tab.wait_for(
        PATIENCE,
        "the shadow limit's empty list",
        "!document.getElementById('top-empty').hidden",
    );
    assert_eq!(
        tab.eval("document.querySelectorAll('#top tbody tr').length"),
        json!(0)
    );
    tab.eval(&choose("per-user"));
    tab.wait_for(
        PATIENCE,
        "the limit's keys",
        "document.querySelectorAll('#top tbody tr').length === 2",
    );
    assert_eq!(
        shows_text(&mut tab, "#top tbody tr[data-rank='1'] td.key"),
        "header.x-user=flooder"
    );
    assert_nothing_ran(&mut tab);
}

#[test]
fn a_key_that_is_markup_renders_as_text_and_runs_nothing() {
    let (_redis, _upstream, sluice) = rig();
    let payloads = [
        "<img src=x onerror=alert(1)>",
        "\"><script>window.__pwned=1</script>",
        "<svg onload=\"window.__pwned2=1;alert(2)\">",
    ];
    for payload in payloads {
        send_as(&sluice, payload, 7);
    }
    let chromium = Chromium::start();
    let mut tab = logged_in(&chromium, &sluice);
    tab.click("nav button[data-view='limited']");
    tab.wait_for(
        PATIENCE,
        "the three keys",
        "document.querySelectorAll('#top tbody tr').length >= 3",
    );
    let shown = tab
        .eval("Array.from(document.querySelectorAll('#top td.key code')).map(c => c.textContent)");
    for payload in payloads {
        assert!(
            shown.as_array().unwrap().contains(&json!(payload)),
            "{payload} not shown as text: {shown}"
        );
    }
    // The characters were text: no element came from them.
    assert_eq!(
        tab.eval("document.querySelectorAll('#top img, #top script, #top svg').length"),
        json!(0)
    );
    assert_eq!(tab.eval("typeof window.__pwned"), json!("undefined"));
    assert_eq!(tab.eval("typeof window.__pwned2"), json!("undefined"));
    assert_nothing_ran(&mut tab);
}

#[test]
fn a_reset_from_the_page_clears_the_keys_usage() {
    let (_redis, _upstream, sluice) = rig();
    send_as(&sluice, "mallory", 8);
    let usage = "/v1/usage?route=api&limit=per-user&header.x-user=mallory";
    assert_eq!(admin(&sluice, "GET", usage).1["remaining"], 0);

    let chromium = Chromium::start();
    let mut tab = logged_in(&chromium, &sluice);
    tab.click("nav button[data-view='limited']");
    tab.wait_for(
        PATIENCE,
        "the key",
        "document.querySelector(\"#top tr[data-rank='1'] button\")",
    );
    tab.click("#top tr[data-rank='1'] button");
    tab.wait_for(
        PATIENCE,
        "its usage",
        "(document.querySelector('#top tr.usage') || {}).textContent",
    );
    assert!(shows_text(&mut tab, "#top tr.usage").contains("Used 5 of 5; 0 remaining"));
    // Reset acts on its second click.
    tab.click("#top tr[data-rank='1'] button.danger");
    assert_eq!(
        admin(&sluice, "GET", usage).1["remaining"],
        0,
        "reset on one click"
    );
    tab.click("#top tr[data-rank='1'] button.danger");
    tab.wait_for(
        PATIENCE,
        "the reset",
        "(document.querySelector('#top tr.usage') || {}).textContent.includes('Reset')",
    );
    let (status, after) = admin(&sluice, "GET", usage);
    assert_eq!(
        (status, after["remaining"].clone()),
        (200, json!(5)),
        "{after}"
    );
    assert_eq!(send_as(&sluice, "mallory", 1), vec![200]);
    assert!(
        sluice.log().contains("admin API: DELETE /v1/usage from"),
        "no audit line"
    );
}

#[test]
fn an_ejected_upstream_server_shows_as_out_and_why() {
    let (redis, upstream) = (RedisServer::start(), Upstream::start());
    let dead = format!("127.0.0.1:{}", free_port());
    let servers = [upstream.addr.to_string(), dead.clone()];
    let sluice = start(&redis, &servers);
    // Round robin tries the dead server within a few requests: refused, it
    // is out for a minute (max_fails 1), and the request is answered 502.
    let (mut tries, mut bad_gateways) = (0, 0);
    while admin(&sluice, "GET", "/v1/upstreams").1["upstreams"][0]["servers"][1]["up"]
        != json!(false)
    {
        if sluice
            .get("/api/x", &[("X-User", &format!("u{tries}"))])
            .status
            == 502
        {
            bad_gateways += 1;
        }
        tries += 1;
        assert!(tries < 20, "the dead server was never tried");
    }
    assert_eq!(
        bad_gateways, 1,
        "without retries the one try at the dead server is a 502"
    );
    let chromium = Chromium::start();
    let mut tab = logged_in(&chromium, &sluice);
    tab.click("nav button[data-view='upstreams']");
    let dead_row = format!("document.querySelector('#upstreams tr[data-address=\"{dead}\"]')");
    tab.wait_for(
        PATIENCE,
        "the dead server",
        &format!("{dead_row}.dataset.state === 'out'"),
    );
    let row = tab
        .eval(&format!("{dead_row}.textContent"))
        .as_str()
        .unwrap()
        .to_string();
    assert!(row.contains("out"), "{row}");
    assert!(
        row.contains("1 failure within fail_timeout, the last Connect"),
        "{row}"
    );
    assert!(row.contains("back in"), "{row}");
    let live = format!(
        "document.querySelector('#upstreams tr[data-address=\"{}\"]').dataset.state",
        upstream.addr
    );
    assert_eq!(tab.eval(&live), json!("up"));
    let counted = "document.querySelector('#upstreams article').textContent.includes('(1 × 502, 0 × 504 in all)')";
    tab.wait_for(PATIENCE, "the 502 counted", counted);
    let recent = "document.querySelector('#upstreams article').textContent.includes('1 × 502, 0 × 504 in the last')";
    tab.wait_for(PATIENCE, "the 502 in the recent count", recent);
}

#[test]
fn a_refused_reload_shows_its_file_line_and_column() {
    let (_redis, _upstream, sluice) = rig();
    let chromium = Chromium::start();
    let mut tab = logged_in(&chromium, &sluice);
    assert!(shows_text(&mut tab, "#config").contains("none since start"));

    let good = std::fs::read_to_string(sluice.config_path()).unwrap();
    let bad = good.replace("limit: 5, window: 1m", "limit: 5, window: 1 fortnight");
    assert_ne!(good, bad);
    assert!(!sluice.reload(&bad), "the bad file was taken");
    let line = bad.lines().position(|l| l.contains("fortnight")).unwrap() + 1;
    let column = bad
        .lines()
        .nth(line - 1)
        .unwrap()
        .find("1 fortnight")
        .unwrap()
        + 1;
    let at = format!(
        "{}:{line}:{column}: window: invalid duration `1 fortnight`",
        sluice.config_path().display()
    );
    tab.wait_for(
        PATIENCE,
        "the problems",
        "document.querySelector('#config .problems li')",
    );
    let problems = shows_text(&mut tab, "#config .problems");
    assert!(problems.contains(&at), "{at} not in {problems}");
    assert!(shows_text(&mut tab, "#config").contains("refused"));
    assert!(
        problems.contains("Still serving generation 1"),
        "{problems}"
    );

    // Fixed: the next reload takes, and the page says so.
    assert!(sluice.reload(&good.replace("limit: 5,", "limit: 6,")));
    tab.wait_for(
        PATIENCE,
        "generation 2",
        "document.querySelector('#config').textContent.includes('applied')",
    );
    assert!(shows_text(&mut tab, "#config").contains("Generation2"));
    assert_eq!(
        admin(&sluice, "GET", "/v1/status").1["config"]["generation"],
        2
    );
}

#[test]
fn consumers_are_listed_created_and_revoked_from_the_page() {
    let (_redis, _upstream, sluice) = rig();
    let chromium = Chromium::start();
    let mut tab = logged_in(&chromium, &sluice);
    tab.click("nav button[data-view='consumers']");
    tab.wait_for(
        PATIENCE,
        "the empty list",
        "document.querySelector('#consumers').textContent.includes('No consumer')",
    );
    tab.eval("document.getElementById('create-consumer').value = 'acme'; document.getElementById('create').requestSubmit(); 1");
    tab.wait_for(
        PATIENCE,
        "the new key",
        "!document.getElementById('created').hidden",
    );
    let key = shows_text(&mut tab, "#created-key");
    assert!(key.len() > 20, "{key}");
    assert_eq!(
        sluice
            .get("/api/x", &[("X-User", "k"), ("x-api-key", &key)])
            .status,
        200
    );
    tab.wait_for(
        PATIENCE,
        "acme listed",
        "document.querySelector('#consumers tr[data-consumer=\"acme\"]')",
    );
    tab.click("#consumers tr[data-consumer='acme'] button");
    tab.wait_for(
        PATIENCE,
        "its key id",
        "document.querySelector('#consumers .key-id')",
    );
    let id = tab.eval("document.querySelector('#consumers .key-id').dataset.key");
    let id = id.as_str().unwrap().to_string();
    assert_eq!(id.len(), 12);
    // The page shows the key's id only: the key itself is nowhere but in the
    // one-time notice.
    assert!(!shows_text(&mut tab, "#consumers").contains(&key));
    tab.click("#consumers .key-id button.danger");
    tab.click("#consumers .key-id button.danger");
    tab.wait_for(
        PATIENCE,
        "acme gone",
        "!document.querySelector('#consumers tr[data-consumer=\"acme\"]')",
    );
    let (_, keys) = admin(&sluice, "GET", "/v1/consumers/acme/keys");
    assert_eq!(keys["keys"], json!([]));
    assert!(sluice.log().contains(&format!(
        "admin API: DELETE /v1/consumers/acme/keys/{id} from"
    )));
}

/// The key `usage` names still has nothing left (no token needed: this
/// instance has none, on loopback).
fn assert_still_denied(sluice: &Sluice, usage: &str) {
    let response = get(sluice.admin, usage, &[]);
    let after: Value = serde_json::from_str(&response.body).unwrap();
    assert_eq!(
        (response.status, after["remaining"].clone()),
        (200, json!(0)),
        "{after}"
    );
}

/// Serves `page` at `/` on a port of its own: another origin.
fn serve_other_origin(page: String) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            use std::io::{BufRead, BufReader, Write};
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            loop {
                let mut header = String::new();
                if reader.read_line(&mut header).unwrap_or(0) == 0 || header.trim().is_empty() {
                    break;
                }
            }
            let (status, body) = if line.starts_with("GET / ") {
                ("200 OK", page.as_str())
            } else {
                ("404 Not Found", "")
            };
            let mut stream = stream;
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    addr
}

#[test]
fn a_page_of_another_origin_changes_nothing() {
    let (redis, upstream) = (RedisServer::start(), Upstream::start());
    // No token: the usage API answers on loopback without one, the weakest
    // setting, so only the browser's rules and sluice's guard stand.
    let sluice = Sluice::start(&config(&redis, &[upstream.addr.to_string()]));
    send_as(&sluice, "victim", 6);
    let usage = "/v1/usage?route=api&limit=per-user&header.x-user=victim";
    assert_eq!(get(sluice.admin, usage, &[]).status, 200);
    let admin_origin = format!("http://{}", sluice.admin);
    let page = format!(
        r#"<!doctype html><html><body>
<form id="f" method="POST" action="{admin_origin}/v1/consumers/evil/keys" enctype="text/plain" target="sink">
<input name='{{"plan":"pro","x":"' value='"}}'></form>
<iframe name="sink"></iframe>
<script>
(async () => {{
  const out = {{}};
  for (const [name, init] of [
      ["delete", {{ method: "DELETE" }}],
      ["delete_bearer", {{ method: "DELETE", headers: {{ Authorization: "Bearer guess" }} }}],
      ["post_no_cors", {{ method: "POST", mode: "no-cors", body: "x" }}]]) {{
    try {{ const r = await fetch("{admin_origin}{usage}", init); out[name] = r.type + " " + r.status; }}
    catch (e) {{ out[name] = String(e); }}
  }}
  document.getElementById("f").submit();
  window.__done = out;
}})();
</script></body></html>"#
    );
    let other = serve_other_origin(page);
    let chromium = Chromium::start();
    let mut tab = chromium.tab();
    tab.open(&format!("http://{other}/"));
    let out = tab.wait_for(PATIENCE, "the attempts", "window.__done");
    assert!(
        out["delete"].as_str().unwrap().contains("TypeError"),
        "{out}"
    );
    assert!(
        out["delete_bearer"].as_str().unwrap().contains("TypeError"),
        "{out}"
    );
    // The form was sent (a simple request needs no preflight) and refused.
    wait_until(PATIENCE, "the form's refusal", || {
        sluice
            .log()
            .contains("admin API: POST /v1/consumers/evil/keys from")
    });
    let log = sluice.log();
    assert!(
        log.contains("admin API: POST /v1/consumers/evil/keys from") && log.contains(": 403"),
        "{log}"
    );
    assert!(
        !log.contains("admin API: DELETE /v1/usage"),
        "a DELETE reached the API:\n{log}"
    );
    assert_still_denied(&sluice, usage);

    // On the wire: another origin's state change, or a name that is not
    // loopback when no token is set (DNS rebinding), is refused.
    let foreign = request(
        sluice.admin,
        "DELETE",
        usage,
        &[("Origin", "http://evil.example")],
    );
    assert_eq!(foreign.status, 403, "{}", foreign.body);
    assert!(foreign.body.contains("cross_site"));
    let fetched = request(
        sluice.admin,
        "DELETE",
        usage,
        &[("Sec-Fetch-Site", "cross-site")],
    );
    assert_eq!(fetched.status, 403, "{}", fetched.body);
    let rebound = get(sluice.admin, usage, &[("Host", "evil.example:80")]);
    assert_eq!(rebound.status, 403, "{}", rebound.body);
    assert_still_denied(&sluice, usage);
    let own = request(sluice.admin, "DELETE", usage, &[("Origin", &admin_origin)]);
    assert_eq!(
        own.status, 200,
        "the admin listener's own origin: {}",
        own.body
    );
}

/// Traffic until dropped: new users each sending 4 requests (admitted; the
/// fourth shadow-denied by `trial`), and a flooder denied.
struct Load {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(addr: SocketAddr) -> Load {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = std::sync::Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut i = 0u64;
            while !flag.load(Ordering::Relaxed) {
                let user = format!("user-{i}");
                for _ in 0..4 {
                    get(addr, "/api/x", &[("X-User", &user)]);
                }
                get(addr, "/api/x", &[("X-User", "flooder")]);
                i += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        Load {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[test]
fn a_screenshot_of_the_overview_under_load() {
    let (_redis, _upstream, sluice) = rig();
    let chromium = Chromium::start();
    let mut tab = logged_in(&chromium, &sluice);
    let load = Load::start(sluice.addr);
    // The charts need a few readings; SLUICE_SCREENSHOT_SECONDS longer ones
    // (the picture in the docs was taken after 120).
    let seconds = std::env::var("SLUICE_SCREENSHOT_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    std::thread::sleep(Duration::from_secs(seconds));
    let row = |limit: &str| {
        format!("document.querySelector('[data-route=\"api\"] tr[data-limit=\"{limit}\"]').dataset.state")
    };
    tab.wait_for(
        PATIENCE,
        "the limit denying",
        &format!("{} === 'denying'", row("per-user")),
    );
    tab.wait_for(
        PATIENCE,
        "the shadow limit",
        &format!("{} === 'shadow-denying'", row("trial")),
    );
    let allowed = "Number(document.querySelector('[data-route=\"api\"] tr[data-limit=\"per-user\"] td.allowed').textContent)";
    tab.wait_for(PATIENCE, "allowed traffic", &format!("{allowed} > 0"));
    let charted = "document.querySelectorAll('#routes polyline').length >= 6";
    tab.wait_for(PATIENCE, "the charts", charted);
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-overview.png");
    let height =
        tab.eval("Math.ceil(document.getElementById('views').getBoundingClientRect().bottom) + 12");
    tab.screenshot(&path, height.as_u64().unwrap_or(1000));
    drop(load);
    let png = std::fs::read(&path).unwrap();
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "{} bytes",
        png.len()
    );
    assert_eq!(tab.violations(), json!([]));
}

/// A customer on a plan, from the page: the form takes the ids the API
/// takes (and only those), offers only the plans there are; the Consumers
/// panel shows the plan and changes it in two clicks; "Who is limited"
/// shows the usage of the consumer's plan (50 of 50, not 5 of 5).
#[test]
fn a_consumers_plan_is_shown_changed_and_used_from_the_page() {
    let (redis, upstream) = (RedisServer::start(), Upstream::start());
    let sluice = Sluice::start_with_server(
        "  admin_token_env: CONSOLE_TOKEN\n",
        &format!(
            r#"identity:
  api_key: {{ header: x-api-key, store: redis, cache_ttl: 1s }}
limiter:
  redis: {{ url: "{url}", timeout: 500ms }}
upstreams:
  api: {{ servers: ["{upstream}"] }}
routes:
  - name: api
    upstream: api
    limits:
      - {{ name: per-customer, key: [user], window: 1m, limit_from: {{ consumer: plan }}, plans: {{ free: 5, pro: 50 }} }}
"#,
            url = redis.url(),
            upstream = upstream.addr
        ),
        &[("CONSOLE_TOKEN", TOKEN)],
    );
    let chromium = Chromium::start();
    let mut tab = logged_in(&chromium, &sluice);
    tab.click("nav button[data-view='consumers']");
    tab.wait_for(
        PATIENCE,
        "the plans offered",
        "[...document.querySelectorAll('#create-plan option')].map(o => o.value).join(',') === ',free,pro'",
    );
    // The form's rule is the API's: 1-128 of A-Z a-z 0-9 . _ - @ :
    let valid = |tab: &mut Tab, id: &str| {
        let script = format!(
            "(() => {{ const i = document.getElementById('create-consumer'); i.value = {}; return i.checkValidity(); }})()",
            json!(id)
        );
        tab.eval(&script).as_bool().expect("a boolean")
    };
    for id in ["ops@acme:eu", "a.b_c-d", &"a".repeat(128)] {
        assert!(valid(&mut tab, id), "{id}");
        let path = format!("/v1/consumers/{id}");
        assert_ne!(admin(&sluice, "GET", &path).0, 400, "{id}");
    }
    for id in ["bad id", "a/b", "é"] {
        assert!(!valid(&mut tab, id), "{id}");
    }
    assert!(!valid(&mut tab, &"a".repeat(129)));

    tab.eval("document.getElementById('create-consumer').value = 'bob'; document.getElementById('create-plan').value = 'pro'; document.getElementById('create').requestSubmit(); 1");
    tab.wait_for(
        PATIENCE,
        "the new key",
        "!document.getElementById('created').hidden",
    );
    let key = shows_text(&mut tab, "#created-key");
    let statuses: Vec<u16> = (0..52)
        .map(|_| sluice.get("/x", &[("x-api-key", &key)]).status)
        .collect();
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 50);

    // "Who is limited" → Usage: the pro quota.
    tab.click("nav button[data-view='limited']");
    tab.wait_for(
        PATIENCE,
        "bob",
        "document.querySelector(\"#top tr[data-rank='1'] button\")",
    );
    tab.click("#top tr[data-rank='1'] button");
    tab.wait_for(
        PATIENCE,
        "his usage",
        "(document.querySelector('#top tr.usage') || {}).textContent",
    );
    let shown = shows_text(&mut tab, "#top tr.usage");
    assert!(shown.contains("Used 50 of 50; 0 remaining"), "{shown}");

    // Consumers: bob's plan shown, changed to free in two clicks.
    tab.click("nav button[data-view='consumers']");
    tab.wait_for(
        PATIENCE,
        "bob listed",
        "document.querySelector('#consumers tr[data-consumer=\"bob\"] button')",
    );
    tab.click("#consumers tr[data-consumer='bob'] button");
    tab.wait_for(
        PATIENCE,
        "his plan",
        "(document.querySelector('#consumers tr[data-consumer=\"bob\"] .plan-name') || {}).textContent === 'pro'",
    );
    tab.eval("document.querySelector('#consumers tr[data-consumer=\"bob\"] .plan-choice').value = 'free'; 1");
    tab.click("#consumers tr[data-consumer='bob'] .plan button.danger");
    assert_eq!(
        admin(&sluice, "GET", "/v1/consumers/bob").1["plan"],
        "pro",
        "one click changes nothing"
    );
    tab.click("#consumers tr[data-consumer='bob'] .plan button.danger");
    tab.wait_for(
        PATIENCE,
        "the new plan",
        "(document.querySelector('#consumers tr[data-consumer=\"bob\"] .plan-name') || {}).textContent === 'free'",
    );
    assert_eq!(admin(&sluice, "GET", "/v1/consumers/bob").1["plan"], "free");
    assert!(sluice.log().contains("consumer bob: plan set to free"));
    assert_eq!(sluice.get("/x", &[("x-api-key", &key)]).status, 429);
    assert_nothing_ran(&mut tab);
}
