//! A small driver of Debian's headless Chromium through its DevTools
//! protocol (a WebSocket on a local port): open a tab, evaluate script in
//! it, wait for what the page shows, take a screenshot, and see every
//! dialog and Content-Security-Policy violation the page caused.

#![allow(dead_code)] // each test binary that includes it uses part of it

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tungstenite::{Message, WebSocket};

/// Headless Chromium with a fresh profile, killed on drop.
pub struct Chromium {
    child: Child,
    port: u16,
    _profile: tempfile::TempDir,
}

impl Chromium {
    /// Starts Chromium and waits for its DevTools port.
    pub fn start() -> Chromium {
        let profile = tempfile::tempdir().expect("profile dir");
        let child = Command::new("chromium")
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
            ])
            .args(["--disable-extensions", "--disable-background-networking"])
            .args(["--remote-debugging-port=0", "--window-size=1400,1000"])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromium must be on PATH (apt-get install chromium)");
        // Chromium writes the port it took in the profile directory.
        let file = profile.path().join("DevToolsActivePort");
        let started = Instant::now();
        let port = loop {
            let text = std::fs::read_to_string(&file).unwrap_or_default();
            if let Some(port) = text.lines().next().and_then(|l| l.trim().parse().ok()) {
                break port;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "chromium did not open its DevTools port"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        Chromium {
            child,
            port,
            _profile: profile,
        }
    }

    /// A new tab, blank, with dialogs and CSP violations recorded.
    pub fn tab(&self) -> Tab {
        let target = http(self.port, "PUT", "/json/new?about:blank");
        let target: Value = serde_json::from_str(&target).expect(&target);
        let url = target["webSocketDebuggerUrl"]
            .as_str()
            .expect("a debugger URL")
            .to_string();
        let stream = TcpStream::connect(("127.0.0.1", self.port)).expect("devtools");
        let (socket, _) = tungstenite::client(url.as_str(), stream).expect("devtools socket");
        let mut tab = Tab {
            socket,
            next: 0,
            dialogs: Vec::new(),
        };
        tab.call("Page.enable", json!({}));
        tab.call("Runtime.enable", json!({}));
        // Runs before any script of each page, unaffected by its policy.
        let watch = "window.__violations = [];
            document.addEventListener('securitypolicyviolation',
                e => window.__violations.push(e.violatedDirective + ' ' + e.blockedURI));";
        tab.call(
            "Page.addScriptToEvaluateOnNewDocument",
            json!({ "source": watch }),
        );
        tab
    }
}

impl Drop for Chromium {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One request to the DevTools HTTP endpoint; the body.
fn http(port: u16, method: &str, path: &str) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("devtools http");
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut reader = BufReader::new(stream);
    let mut length = None;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).expect("read");
        if line.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse::<usize>().ok();
            }
        }
    }
    let mut body = Vec::new();
    match length {
        Some(n) => {
            body.resize(n, 0);
            reader.read_exact(&mut body).expect("body");
        }
        None => {
            reader.read_to_end(&mut body).expect("body");
        }
    }
    String::from_utf8_lossy(&body).into_owned()
}

/// One tab, driven over its DevTools socket.
pub struct Tab {
    socket: WebSocket<TcpStream>,
    next: u64,
    dialogs: Vec<String>,
}

impl Tab {
    /// Calls `method` and returns its result, noting the events that
    /// arrive meanwhile (a dialog is recorded, then dismissed, so that a
    /// page that opens one cannot stall the test).
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        self.next += 1;
        let id = self.next;
        let message = json!({ "id": id, "method": method, "params": params });
        self.socket
            .send(Message::text(message.to_string()))
            .expect("send to devtools");
        loop {
            let message = self.socket.read().expect("read from devtools");
            let Message::Text(text) = message else {
                continue;
            };
            let value: Value = serde_json::from_str(text.as_str()).expect("devtools json");
            if value["id"] == id {
                if let Some(error) = value.get("error") {
                    panic!("{method}: {error}");
                }
                return value["result"].clone();
            }
            if value["method"] == "Page.javascriptDialogOpening" {
                self.dialogs.push(
                    value["params"]["message"]
                        .as_str()
                        .unwrap_or("")
                        .to_string(),
                );
                self.next += 1;
                let dismiss = json!({ "id": self.next, "method": "Page.handleJavaScriptDialog",
                                      "params": { "accept": false } });
                self.socket
                    .send(Message::text(dismiss.to_string()))
                    .expect("dismiss dialog");
            }
        }
    }

    /// Opens `url` in the tab.
    pub fn open(&mut self, url: &str) {
        self.call("Page.navigate", json!({ "url": url }));
    }

    /// The value of `expression` (awaited if a promise).
    pub fn eval(&mut self, expression: &str) -> Value {
        let result = self.call(
            "Runtime.evaluate",
            json!({ "expression": expression, "returnByValue": true, "awaitPromise": true }),
        );
        if let Some(exception) = result.get("exceptionDetails") {
            panic!("{expression}: {exception}");
        }
        result["result"]["value"].clone()
    }

    /// Waits (up to `limit`) until `expression` is truthy, and returns it;
    /// on time out, panics with `what` and the page's text.
    pub fn wait_for(&mut self, limit: Duration, what: &str, expression: &str) -> Value {
        let started = Instant::now();
        let guarded = format!(
            "(() => {{ try {{ return ({expression}); }} catch (_) {{ return null; }} }})()"
        );
        loop {
            let value = self.eval(&guarded);
            let truthy = match &value {
                Value::Null => false,
                Value::Bool(b) => *b,
                Value::String(s) => !s.is_empty(),
                Value::Number(n) => n.as_f64() != Some(0.0),
                _ => true,
            };
            if truthy {
                return value;
            }
            if started.elapsed() > limit {
                let text = self.eval("document.body ? document.body.innerText : ''");
                panic!("timed out waiting for {what}; the page shows:\n{text}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Clicks the element `selector` names.
    pub fn click(&mut self, selector: &str) {
        let clicked = self.eval(&format!(
            "(() => {{ const e = document.querySelector({}); if (!e) return false; e.click(); return true; }})()",
            json!(selector)
        ));
        assert_eq!(clicked, json!(true), "nothing to click at {selector}");
    }

    /// A PNG of the tab's top `height` CSS pixels, written to `path`.
    pub fn screenshot(&mut self, path: &Path, height: u64) {
        let width = self.eval("document.documentElement.clientWidth");
        let clip = json!({ "x": 0, "y": 0, "width": width, "height": height, "scale": 1 });
        let shot = self.call(
            "Page.captureScreenshot",
            json!({ "format": "png", "clip": clip }),
        );
        let data = shot["data"].as_str().expect("png data");
        use base64::Engine;
        let png = base64::engine::general_purpose::STANDARD
            .decode(data)
            .expect("base64");
        std::fs::write(path, png).expect("write screenshot");
    }

    /// The messages of the dialogs the page opened (each dismissed).
    pub fn dialogs(&mut self) -> Vec<String> {
        // Any event still queued comes in with this call.
        self.eval("1");
        self.dialogs.clone()
    }

    /// The policy violations the page caused, as "directive blocked-URI".
    pub fn violations(&mut self) -> Value {
        self.eval("window.__violations || []")
    }
}
