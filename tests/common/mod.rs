//! Real components for the integration tests: a `redis-server` on a free port,
//! an HTTP upstream that counts what it serves, and the `sluice` binary itself.
//! Every process is killed when its handle drops. Readiness is polled, never
//! slept for.
#![allow(dead_code)]

mod websocket;
#[allow(unused_imports)]
pub use websocket::*;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// A port nothing listens on right now, chosen below the kernel's ephemeral
/// range (32768–60999 by default) so that no outgoing connection of a parallel
/// test can take it between this check and the child process binding it.
/// Ports 10000–20999 are left to [`RedisCluster`] nodes and their bus ports.
pub fn free_port() -> u16 {
    use std::sync::atomic::AtomicU32;
    // 10000-20999 is left to Redis Cluster nodes and their bus ports (+10000).
    const LOW: u32 = 21_000;
    const SPAN: u32 = 11_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // Spread test binaries (separate processes) over the range by pid.
    let base = std::process::id().wrapping_mul(2_654_435_761) % SPAN;
    for _ in 0..SPAN {
        let port = (LOW + (base + NEXT.fetch_add(1, Ordering::SeqCst)) % SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {LOW}..{}", LOW + SPAN)
}

/// Polls `ready` every 20 ms until it holds or `limit` passes.
pub fn wait_until(limit: Duration, what: &str, mut ready: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ready() {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------- redis-server

/// A redis-server on loopback `port` that keeps nothing on disk.
fn ephemeral_redis_args(port: u16) -> [String; 8] {
    [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
    ]
    .map(str::to_string)
}

/// A `redis-server` child process on its own port.
pub struct RedisServer {
    child: Option<Child>,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers PING.
    pub fn start() -> Self {
        Self::start_on(free_port())
    }

    /// Starts a server on `port` and waits until it answers PING.
    pub fn start_on(port: u16) -> Self {
        Self::start_with_args(port, &[])
    }

    /// Like [`RedisServer::start_on`], with more `redis-server` arguments.
    pub fn start_with_args(port: u16, extra: &[&str]) -> Self {
        let child = Command::new("redis-server")
            .args(extra)
            .args(ephemeral_redis_args(port))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be on PATH (apt-get install redis-server)");
        let server = Self {
            child: Some(child),
            port,
        };
        wait_until(
            Duration::from_secs(10),
            "redis-server to answer PING",
            || {
                server
                    .try_connection()
                    .is_some_and(|mut c| redis::cmd("PING").query::<String>(&mut c).is_ok())
            },
        );
        server
    }

    /// Calls of `command` (lower case: `evalsha`, `fcall`) Redis executed
    /// successfully so far, from `INFO commandstats`.
    pub fn command_calls(&self, command: &str) -> u64 {
        command_calls(&mut self.connection(), command)
    }

    /// `redis://127.0.0.1:PORT/0`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    fn try_connection(&self) -> Option<redis::Connection> {
        redis::Client::open(self.url())
            .ok()?
            .get_connection_with_timeout(Duration::from_millis(500))
            .ok()
    }

    /// A fresh synchronous connection.
    pub fn connection(&self) -> redis::Connection {
        self.try_connection()
            .expect("cannot connect to the test redis-server")
    }

    /// Pauses every client for `millis` (`CLIENT PAUSE … ALL`); returns once
    /// the pause has begun. Redis lifts it on a cron tick after `millis`, up
    /// to 100 ms later.
    pub fn pause_clients(&self, millis: u64) {
        let _: () = redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(millis)
            .arg("ALL")
            .query(&mut self.connection())
            .expect("CLIENT PAUSE");
    }

    /// ZCARD of `key`.
    pub fn zcard(&self, key: &str) -> u64 {
        redis::cmd("ZCARD")
            .arg(key)
            .query(&mut self.connection())
            .expect("ZCARD")
    }

    /// Units logged at `key`: a `sliding_log` limit's units (its packed
    /// string at `KEY!l`, or a large limit's sorted set), or a
    /// `concurrency` limit's leases (a sorted set).
    pub fn log_len(&self, key: &str) -> u64 {
        log_len(&mut self.connection(), key)
    }

    /// The limit keys matching `pattern`: every key, a packed log's
    /// named without its `!l` (its limit's key).
    pub fn limit_keys(&self, pattern: &str) -> Vec<Vec<u8>> {
        self.keys(pattern)
            .into_iter()
            .map(|key| match key.strip_suffix(b"!l") {
                Some(limit_key) => limit_key.to_vec(),
                None => key,
            })
            .collect()
    }

    /// Every key matching `pattern`.
    pub fn keys(&self, pattern: &str) -> Vec<Vec<u8>> {
        redis::cmd("KEYS")
            .arg(pattern)
            .query(&mut self.connection())
            .expect("KEYS")
    }

    /// `CLIENT LIST`: one line per connection, with its ACL `user=`.
    pub fn client_list(&self) -> String {
        redis::cmd("CLIENT")
            .arg("LIST")
            .query(&mut self.connection())
            .expect("CLIENT LIST")
    }

    /// Its process id (0 once killed).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Loads sluice's decide code as the Redis Function the gateway
    /// loads; returns the function's name (for `FCALL`).
    #[allow(dead_code)]
    pub fn load_decide_function(&self) -> String {
        use sluice::limiter::redis::wire::{function_library, DECIDE_SCRIPT};
        let mut conn = self.connection();
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(DECIDE_SCRIPT)
            .query(&mut conn)
            .expect("SCRIPT LOAD");
        let (library, function) = function_library(&sha);
        let _: String = redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("REPLACE")
            .arg(library)
            .query(&mut conn)
            .expect("FUNCTION LOAD");
        function
    }

    /// SIGKILLs the server now.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

// ------------------------------------------------------------------- upstream

/// An HTTP/1.1 upstream (keep-alive) that answers `200 upstream ok` and counts
/// the requests it served. A path `/slow/MS...` is answered after MS ms;
/// `/big/N` is answered with N bytes; `/status/NNN...` with status NNN; a
/// query with `tokens=N` gets an `X-Usage-Tokens: N` header.
pub struct Upstream {
    /// Its address.
    pub addr: SocketAddr,
    hits: Arc<AtomicUsize>,
    in_flight: Arc<AtomicUsize>,
    last_headers: Arc<Mutex<Vec<(String, String)>>>,
    targets: Arc<Mutex<Vec<String>>>,
    arrivals: Arc<Mutex<Vec<Instant>>>,
    stop: Arc<AtomicBool>,
}

impl Upstream {
    /// Starts serving on a free port.
    pub fn start() -> Self {
        Self::start_on(0)
    }

    /// Starts serving on `port` of 127.0.0.1 (0: a free one).
    pub fn start_on(port: u16) -> Self {
        Self::start_at("127.0.0.1", port)
    }

    /// Starts serving on `port` of `ip` (any loopback address; port 0: a
    /// free one).
    pub fn start_at(ip: &str, port: u16) -> Self {
        let listener = TcpListener::bind((ip, port)).expect("bind upstream");
        let addr = listener.local_addr().expect("upstream addr");
        let hits = Arc::new(AtomicUsize::new(0));
        let in_flight = Arc::new(AtomicUsize::new(0));
        let last_headers = Arc::new(Mutex::new(Vec::new()));
        let targets = Arc::new(Mutex::new(Vec::new()));
        let arrivals = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (h, f, l, t, a, s) = (
            hits.clone(),
            in_flight.clone(),
            last_headers.clone(),
            targets.clone(),
            arrivals.clone(),
            stop.clone(),
        );
        thread::spawn(move || {
            for stream in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let (h, f, l, t, a) = (h.clone(), f.clone(), l.clone(), t.clone(), a.clone());
                thread::spawn(move || serve_upstream_connection(stream, &h, &f, &l, &t, &a));
            }
        });
        Self {
            addr,
            hits,
            in_flight,
            last_headers,
            targets,
            arrivals,
            stop,
        }
    }

    /// When each request it received arrived, in order.
    pub fn arrivals(&self) -> Vec<Instant> {
        self.arrivals.lock().unwrap().clone()
    }

    /// The request targets it received, in order, as sent on the wire.
    pub fn targets(&self) -> Vec<String> {
        self.targets.lock().unwrap().clone()
    }

    /// Requests served so far.
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    /// Requests being served right now (slow paths).
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Header of the last request served (lower-case name).
    pub fn last_header(&self, name: &str) -> Option<String> {
        let headers = self.last_headers.lock().unwrap();
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

fn serve_upstream_connection(
    stream: TcpStream,
    hits: &AtomicUsize,
    in_flight: &AtomicUsize,
    last: &Mutex<Vec<(String, String)>>,
    targets: &Mutex<Vec<String>>,
    arrivals: &Mutex<Vec<Instant>>,
) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let mut writer = match stream.try_clone() {
        Ok(w) => w,
        Err(_) => return,
    };
    let mut reader = BufReader::new(stream);
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let mut headers = Vec::new();
        let mut content_length = 0usize;
        let mut chunked = false;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                let name = name.trim().to_ascii_lowercase();
                let value = value.trim().to_string();
                if name == "content-length" {
                    content_length = value.parse().unwrap_or(0);
                }
                if name == "transfer-encoding" && value.contains("chunked") {
                    chunked = true;
                }
                headers.push((name, value));
            }
        }
        let mut body = vec![0; content_length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        if chunked && read_chunked_body(&mut reader).is_none() {
            return;
        }
        *last.lock().unwrap() = headers;
        if let Some(target) = request_line.split_whitespace().nth(1) {
            arrivals.lock().unwrap().push(Instant::now());
            targets.lock().unwrap().push(target.to_string());
        }
        let delay = request_line
            .split_whitespace()
            .nth(1)
            .and_then(|path| path.strip_prefix("/slow/"))
            .and_then(|rest| rest.split(['/', '?']).next())
            .and_then(|ms| ms.parse::<u64>().ok());
        if let Some(ms) = delay {
            in_flight.fetch_add(1, Ordering::SeqCst);
            thread::sleep(Duration::from_millis(ms));
            in_flight.fetch_sub(1, Ordering::SeqCst);
        }
        hits.fetch_add(1, Ordering::SeqCst);
        // `/big/N`: a body of N bytes, for clients that stop reading.
        let big = request_line
            .split_whitespace()
            .nth(1)
            .and_then(|path| path.strip_prefix("/big/"))
            .and_then(|n| n.parse::<usize>().ok());
        if let Some(size) = big {
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {size}\r\n\r\n"
            );
            if writer.write_all(head.as_bytes()).is_err() {
                return;
            }
            let chunk = vec![b'x'; 64 * 1024];
            let mut left = size;
            while left > 0 {
                let n = left.min(chunk.len());
                if writer.write_all(&chunk[..n]).is_err() {
                    return;
                }
                left -= n;
            }
            continue;
        }
        // `/status/NNN`: answered with that status; `tokens=N` in the query:
        // an `X-Usage-Tokens: N` header (a usage-priced API).
        let target = request_line.split_whitespace().nth(1).unwrap_or("/");
        let status = target
            .strip_prefix("/status/")
            .and_then(|rest| rest.get(..3))
            .and_then(|code| code.parse::<u16>().ok())
            .unwrap_or(200);
        let tokens = target
            .split_once('?')
            .and_then(|(_, query)| query.split('&').find_map(|kv| kv.strip_prefix("tokens=")))
            .map(|n| format!("X-Usage-Tokens: {n}\r\n"))
            .unwrap_or_default();
        let me = writer
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        let response = format!(
            "HTTP/1.1 {status} Status\r\nContent-Type: text/plain\r\nX-Powered-By: test-upstream\r\nX-Served-By: {me}\r\n{tokens}Content-Length: 11\r\n\r\nupstream ok"
        );
        if writer.write_all(response.as_bytes()).is_err() {
            return;
        }
    }
}

/// Reads a chunked request body to its last chunk; `None` if the
/// connection ends first.
fn read_chunked_body(reader: &mut BufReader<TcpStream>) -> Option<usize> {
    let mut total = 0;
    loop {
        let mut size = String::new();
        if reader.read_line(&mut size).ok()? == 0 {
            return None;
        }
        let size = usize::from_str_radix(size.trim().split(';').next()?, 16).ok()?;
        let mut chunk = vec![0; size + 2];
        reader.read_exact(&mut chunk).ok()?;
        total += size;
        if size == 0 {
            return Some(total);
        }
    }
}

// --------------------------------------------------------------------- client

/// A parsed HTTP response.
#[derive(Debug, Clone)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Headers, names lower-case.
    pub headers: Vec<(String, String)>,
    /// Body as text.
    pub body: String,
    /// Wall time of the exchange.
    pub elapsed: Duration,
}

impl Response {
    /// First value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Sends `method path` with `headers` on a new connection (`Connection:
/// close`), and `Host: addr` unless `headers` has a Host.
pub fn request(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> Response {
    let own_host = headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host"));
    let host = if own_host {
        String::new()
    } else {
        format!("Host: {addr}\r\n")
    };
    let mut raw = format!("{method} {path} HTTP/1.1\r\n{host}Connection: close\r\n").into_bytes();
    for (name, value) in headers {
        raw.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
    }
    raw.extend_from_slice(b"\r\n");
    raw_request(addr, &raw)
}

/// Reads one message head from `reader`: its first line and its
/// `Content-Length` (0 without one); `None` when the peer closed first.
pub fn read_head(reader: &mut impl BufRead) -> Option<(String, usize)> {
    let mut first = String::new();
    if reader.read_line(&mut first).ok()? == 0 {
        return None;
    }
    let mut length = 0;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line == "\r\n" {
            return Some((first, length));
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().ok()?;
        }
    }
}

/// `GET path` with `headers`.
pub fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Response {
    request(addr, "GET", path, headers)
}

/// Writes `raw` bytes as they are and parses the response (read to EOF).
pub fn raw_request(addr: SocketAddr, raw: &[u8]) -> Response {
    let start = Instant::now();
    let mut stream = TcpStream::connect(addr).expect("connect to sluice");
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    stream.write_all(raw).expect("write request");
    let mut bytes = Vec::new();
    let _ = stream.read_to_end(&mut bytes);
    let elapsed = start.elapsed();
    parse_response(&bytes, elapsed)
}

fn parse_response(bytes: &[u8], elapsed: Duration) -> Response {
    let text = String::from_utf8_lossy(bytes);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    Response {
        status,
        headers,
        body,
        elapsed,
    }
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

// --------------------------------------------------------------------- sluice

/// The real `sluice` binary with a temporary config.
pub struct Sluice {
    child: Option<Child>,
    /// Proxy listener.
    pub addr: SocketAddr,
    /// Admin listener.
    pub admin: SocketAddr,
    log: PathBuf,
    config: PathBuf,
    dir: tempfile::TempDir,
}

/// The `server:` section every test instance uses: loopback ports, short grace.
pub fn server_section(listen: SocketAddr, admin: SocketAddr) -> String {
    format!("server:\n  listen: [\"{listen}\"]\n  admin: \"{admin}\"\n  threads: 2\n  grace_period: 1s\n")
}

impl Sluice {
    /// Starts sluice with `body` (the config without `server:`) and waits until
    /// both listeners accept and `/healthz` answers.
    pub fn start(body: &str) -> Self {
        Self::start_with_server("", body, &[])
    }

    /// Like [`Sluice::start`], with `server_keys` (lines indented by two
    /// spaces) added to the `server:` section and `env` set.
    pub fn start_with_server(server_keys: &str, body: &str, env: &[(&str, &str)]) -> Self {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let config = format!("{}{server_keys}{body}", server_section(addr, admin));
        Self::start_with(&config, addr, admin, env)
    }

    /// Starts sluice with a complete config text, listeners known to the caller,
    /// and extra environment variables.
    pub fn start_with(
        config: &str,
        addr: SocketAddr,
        admin: SocketAddr,
        env: &[(&str, &str)],
    ) -> Self {
        let binary = Path::new(env!("CARGO_BIN_EXE_sluice"));
        Self::start_binary(binary, config, addr, admin, env)
    }

    /// Like [`Sluice::start_with`], running `binary` (an earlier build, for
    /// a before/after benchmark).
    pub fn start_binary(
        binary: &Path,
        config: &str,
        addr: SocketAddr,
        admin: SocketAddr,
        env: &[(&str, &str)],
    ) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sluice.yaml");
        std::fs::write(&path, config).expect("write config");
        let log = dir.path().join("sluice.log");
        let mut command = Command::new(binary);
        command
            .arg("--config")
            .arg(&path)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"));
        for (name, value) in env {
            command.env(name, value);
        }
        let child = command.spawn().expect("start sluice");
        let mut sluice = Self {
            child: Some(child),
            addr,
            admin,
            log,
            config: path,
            dir,
        };
        let start = Instant::now();
        loop {
            if let Some(status) = sluice
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("sluice exited early ({status}):\n{}", sluice.log());
            }
            let admin_ok =
                TcpStream::connect(admin).is_ok() && get(admin, "/healthz", &[]).status == 200;
            if admin_ok && TcpStream::connect(addr).is_ok() {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "sluice did not start:\n{}",
                sluice.log()
            );
            thread::sleep(Duration::from_millis(20));
        }
        sluice
    }

    /// The config file it runs with.
    pub fn config_path(&self) -> &Path {
        &self.config
    }

    /// Its temporary directory (config, log, sockets).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// Sends `signal` (such as "-HUP") without waiting.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(signal)
            .arg(self.pid().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} failed");
    }

    /// Whether the process has exited.
    pub fn exited(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => child.try_wait().ok().flatten().is_some(),
            None => true,
        }
    }

    /// Value of `sluice_config_reloads_total{result}`.
    pub fn reloads(&self, result: &str) -> u64 {
        metric_value(
            &self.metrics(),
            &format!("sluice_config_reloads_total{{result=\"{result}\"}} "),
        )
    }

    /// Writes `config` (a complete file) over its config file, sends SIGHUP
    /// and waits until the reload is counted; returns whether it succeeded.
    pub fn reload(&self, config: &str) -> bool {
        let (ok, failed) = (self.reloads("success"), self.reloads("failure"));
        std::fs::write(&self.config, config).expect("write config");
        self.signal("-HUP");
        let mut result = None;
        wait_until(Duration::from_secs(10), "the reload to be counted", || {
            if self.reloads("success") > ok {
                result = Some(true);
            } else if self.reloads("failure") > failed {
                result = Some(false);
            }
            result.is_some()
        });
        result.unwrap_or(false)
    }

    /// What sluice wrote to stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `GET path` through the proxy.
    pub fn get(&self, path: &str, headers: &[(&str, &str)]) -> Response {
        get(self.addr, path, headers)
    }

    /// The `/metrics` text.
    pub fn metrics(&self) -> String {
        get(self.admin, "/metrics", &[]).body
    }

    /// Value of `sluice_ratelimit_decisions_total` for these labels (0 if absent).
    pub fn decisions(&self, route: &str, limit: &str, decision: &str, source: &str) -> u64 {
        let series = format!(
            "sluice_ratelimit_decisions_total{{decision=\"{decision}\",limit=\"{limit}\",route=\"{route}\",source=\"{source}\"}} "
        );
        metric_value(&self.metrics(), &series)
    }

    /// Sends `signal` (such as "-INT") and waits for the process to exit,
    /// returning how long that took.
    pub fn stop_with(&mut self, signal: &str) -> Duration {
        let start = Instant::now();
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .arg(signal)
                .arg(child.id().to_string())
                .status();
            let deadline = Instant::now() + Duration::from_secs(30);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        start.elapsed()
    }
}

impl Drop for Sluice {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The value of the first line of `metrics` that starts with `series`.
pub fn metric_value(metrics: &str, series: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
        .unwrap_or(0)
}

/// Runs `count` requests at once (released together by a barrier) through
/// `pick(i)`-chosen instances and returns their statuses.
pub fn concurrent<F>(count: usize, send: F) -> Vec<u16>
where
    F: Fn(usize) -> Response + Send + Sync + 'static,
{
    let send = Arc::new(send);
    let barrier = Arc::new(std::sync::Barrier::new(count));
    let handles: Vec<_> = (0..count)
        .map(|i| {
            let (send, barrier) = (send.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                send(i).status
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("request thread"))
        .collect()
}

/// Calls of `command` (lower case) the Redis behind `conn` executed
/// successfully so far, from `INFO commandstats`.
fn command_calls(conn: &mut redis::Connection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(conn)
        .expect("INFO commandstats");
    let prefix = format!("cmdstat_{command}:");
    let Some(line) = info.lines().find_map(|l| l.strip_prefix(prefix.as_str())) else {
        return 0;
    };
    let field = |name: &str| -> u64 {
        line.split(',')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    field("calls") - field("failed_calls") - field("rejected_calls")
}

// -------------------------------------------------------------- redis cluster

/// A Redis Cluster of `redis-server` children (primaries only) on loopback.
/// Nodes use ports 10000–10999 so that their bus ports (+10000) never meet
/// the ports [`free_port`] hands out.
pub struct RedisCluster {
    nodes: Vec<Option<Child>>,
    /// The nodes' ports.
    pub ports: Vec<u16>,
    /// The nodes' TLS ports, in the order of `ports` (none without TLS).
    pub tls_ports: Vec<u16>,
    _dir: tempfile::TempDir,
}

impl RedisCluster {
    /// Starts `n` primaries, creates the cluster and waits until every node
    /// reports `cluster_state:ok`.
    pub fn start(n: usize) -> Self {
        Self::start_with(n, None)
    }

    /// Like [`RedisCluster::start`], every node also serving TLS (on
    /// [`RedisCluster::tls_ports`]) with `certs`' `server.crt`/`server.key`
    /// signed by `ca.crt`, the cluster bus over TLS, and the ACL user
    /// `alice` / `s3cret`. A client over TLS is told the nodes' TLS ports;
    /// the test's own plain connections, their plain ports.
    pub fn start_tls(n: usize, certs: &Path) -> Self {
        Self::start_with(n, Some(certs))
    }

    fn start_with(n: usize, tls: Option<&Path>) -> Self {
        use std::sync::atomic::AtomicU32;
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = tempfile::tempdir().expect("tempdir");
        let base = std::process::id().wrapping_mul(2_654_435_761) % 1000;
        // A node's bus listens 10,000 above its port (its TLS port when the
        // bus is TLS): both must be free.
        let pick = || loop {
            let port = (10_000 + (base + NEXT.fetch_add(1, Ordering::SeqCst)) % 1000) as u16;
            if TcpListener::bind(("127.0.0.1", port)).is_ok()
                && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok()
            {
                return port;
            }
        };
        let ports: Vec<u16> = (0..n).map(|_| pick()).collect();
        let tls_ports: Vec<u16> = match tls {
            Some(_) => (0..n).map(|_| pick()).collect(),
            None => Vec::new(),
        };
        let nodes = ports
            .iter()
            .enumerate()
            .map(|(i, port)| {
                let conf = dir.path().join(format!("nodes-{port}.conf"));
                let mut command = Command::new("redis-server");
                command
                    .args(ephemeral_redis_args(*port))
                    .args(["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"])
                    .args(["--cluster-require-full-coverage", "no"])
                    .arg("--cluster-config-file")
                    .arg(&conf)
                    .arg("--dir")
                    .arg(dir.path());
                if let Some(certs) = tls {
                    command
                        .args(["--tls-port", &tls_ports[i].to_string()])
                        .arg("--tls-cert-file")
                        .arg(certs.join("server.crt"))
                        .arg("--tls-key-file")
                        .arg(certs.join("server.key"))
                        .arg("--tls-ca-cert-file")
                        .arg(certs.join("ca.crt"))
                        .args(["--tls-auth-clients", "no"])
                        .args(["--tls-cluster", "yes", "--tls-replication", "yes"])
                        .args(["--user", "alice", "on", ">s3cret", "~*", "&*", "+@all"]);
                }
                Some(
                    command
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .spawn()
                        .expect("redis-server must be on PATH"),
                )
            })
            .collect();
        let cluster = Self {
            nodes,
            ports,
            tls_ports,
            _dir: dir,
        };
        for &port in &cluster.ports {
            wait_until(
                Duration::from_secs(10),
                "cluster node to answer PING",
                || {
                    cluster
                        .node(port)
                        .is_some_and(|mut c| redis::cmd("PING").query::<String>(&mut c).is_ok())
                },
            );
        }
        let mut create = Command::new("redis-cli");
        let addresses: Vec<String> = match tls {
            Some(certs) => {
                create
                    .arg("--tls")
                    .arg("--cacert")
                    .arg(certs.join("ca.crt"));
                cluster
                    .tls_ports
                    .iter()
                    .map(|p| format!("127.0.0.1:{p}"))
                    .collect()
            }
            None => cluster
                .ports
                .iter()
                .map(|p| format!("127.0.0.1:{p}"))
                .collect(),
        };
        let status = create
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("redis-cli must be on PATH");
        assert!(status.success(), "redis-cli --cluster create failed");
        for &port in &cluster.ports {
            wait_until(Duration::from_secs(20), "cluster_state:ok", || {
                cluster.node(port).is_some_and(|mut c| {
                    redis::cmd("CLUSTER")
                        .arg("INFO")
                        .query::<String>(&mut c)
                        .is_ok_and(|info| info.contains("cluster_state:ok"))
                })
            });
        }
        cluster
    }

    fn node(&self, port: u16) -> Option<redis::Connection> {
        redis::Client::open(format!("redis://127.0.0.1:{port}/"))
            .ok()?
            .get_connection_with_timeout(Duration::from_millis(500))
            .ok()
    }

    /// The YAML list of node URLs for `limiter.redis.cluster`.
    pub fn urls_yaml(&self) -> String {
        let urls: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("\"redis://127.0.0.1:{p}\""))
            .collect();
        format!("[{}]", urls.join(", "))
    }

    /// The port of the primary that owns `key`'s slot.
    pub fn owner(&self, key: &str) -> u16 {
        let mut conn = self.node(self.ports[0]).expect("cluster node");
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut conn)
            .expect("KEYSLOT");
        let slots: redis::Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query(&mut conn)
            .expect("SLOTS");
        let redis::Value::Array(ranges) = slots else {
            panic!("CLUSTER SLOTS")
        };
        for range in ranges {
            let redis::Value::Array(parts) = range else {
                continue;
            };
            if let (
                redis::Value::Int(start),
                redis::Value::Int(end),
                redis::Value::Array(primary),
            ) = (&parts[0], &parts[1], &parts[2])
            {
                if (*start as u16..=*end as u16).contains(&slot) {
                    if let redis::Value::Int(port) = primary[1] {
                        return port as u16;
                    }
                }
            }
        }
        panic!("no owner for slot {slot}")
    }

    /// ZCARD of `key` on the node that owns it.
    pub fn zcard(&self, key: &str) -> u64 {
        let mut conn = self.node(self.owner(key)).expect("owner node");
        redis::cmd("ZCARD")
            .arg(key)
            .query(&mut conn)
            .expect("ZCARD")
    }

    /// [`RedisServer::log_len`] of `key`, on the node that owns it.
    pub fn log_len(&self, key: &str) -> u64 {
        let mut conn = self.node(self.owner(key)).expect("owner node");
        log_len(&mut conn, key)
    }

    /// Calls of `command` (lower case) the node at `port` executed.
    pub fn command_calls(&self, port: u16, command: &str) -> u64 {
        command_calls(&mut self.node(port).expect("node"), command)
    }

    /// A command's reply from the node at `port`.
    pub fn query<T: redis::FromRedisValue>(&self, port: u16, command: &redis::Cmd) -> T {
        command
            .query(&mut self.node(port).expect("node"))
            .expect("cluster node command")
    }

    /// Moves `key`'s slot, with its keys, to the primary at `to`, the way
    /// a resharding does (IMPORTING/MIGRATING, MIGRATE, SETSLOT NODE).
    pub fn move_slot_of(&self, key: &str, to: u16) {
        let from = self.owner(key);
        assert_ne!(from, to, "{key} is already on {to}");
        let id = |port: u16| -> String { self.query(port, redis::cmd("CLUSTER").arg("MYID")) };
        let slot: u16 = self.query(from, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key));
        let (from_id, to_id) = (id(from), id(to));
        let _: () = self.query(
            to,
            redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg("IMPORTING")
                .arg(&from_id),
        );
        let _: () = self.query(
            from,
            redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg("MIGRATING")
                .arg(&to_id),
        );
        let keys: Vec<String> = self.query(
            from,
            redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(slot)
                .arg(1000),
        );
        if !keys.is_empty() {
            let _: redis::Value = self.query(
                from,
                redis::cmd("MIGRATE")
                    .arg("127.0.0.1")
                    .arg(to)
                    .arg("")
                    .arg(0)
                    .arg(5000)
                    .arg("KEYS")
                    .arg(&keys),
            );
        }
        for &port in &self.ports {
            let _: () = self.query(
                port,
                redis::cmd("CLUSTER")
                    .arg("SETSLOT")
                    .arg(slot)
                    .arg("NODE")
                    .arg(&to_id),
            );
        }
        assert_eq!(self.owner(key), to, "the slot of {key} did not move");
    }

    /// Number of keys on the node at `port`.
    pub fn dbsize(&self, port: u16) -> u64 {
        redis::cmd("DBSIZE")
            .query(&mut self.node(port).expect("node"))
            .expect("DBSIZE")
    }

    /// The nodes' process ids (of those still running).
    pub fn pids(&self) -> Vec<u32> {
        self.nodes.iter().flatten().map(Child::id).collect()
    }

    /// Empties every node (FLUSHALL).
    pub fn flush_all(&self) {
        for &port in &self.ports {
            let _: () = self.query(port, &redis::cmd("FLUSHALL"));
        }
    }

    /// SIGKILLs the node at `port`.
    pub fn kill(&mut self, port: u16) {
        let i = self
            .ports
            .iter()
            .position(|p| *p == port)
            .expect("known node");
        if let Some(mut child) = self.nodes[i].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for child in self.nodes.iter_mut().filter_map(Option::take) {
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

// ----------------------------------------------------------------------- load

/// A load generator: threads sending requests back to back, each on a new
/// connection, each with its own `X-Client` value (so no limit denies them),
/// recording every response that is not a 200.
pub struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<(u64, Vec<String>)>>,
}

/// What a [`Load`] saw.
#[derive(Debug)]
pub struct LoadReport {
    /// Requests sent.
    pub total: u64,
    /// One line per request that did not get a 200 (status 0: no response).
    pub failures: Vec<String>,
}

impl LoadReport {
    /// Fails the test, showing the first failures and `context`, unless every
    /// request got a 200; returns the number of requests sent.
    pub fn assert_no_failures(&self, context: &str) -> u64 {
        assert!(
            self.failures.is_empty(),
            "{} of {} requests failed: {:?}\n{context}",
            self.failures.len(),
            self.total,
            &self.failures[..self.failures.len().min(5)]
        );
        self.total
    }
}

/// A command for `tool`, failing the test with how to install it (from
/// Debian's `package`, as .ci/run does) when it is not on `PATH`.
pub fn installed(tool: &str, package: &str) -> Command {
    let found = Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok(); // spawned: on PATH (some tools have no --version)
    assert!(
        found,
        "`{tool}` is not installed: apt-get install {package} (.ci/run does)"
    );
    Command::new(tool)
}

impl Load {
    /// Starts `threads` senders of `GET path` to `addr`.
    pub fn start(addr: SocketAddr, threads: usize, path: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..threads)
            .map(|t| {
                let stop = stop.clone();
                let path = path.to_string();
                thread::spawn(move || {
                    let mut total = 0u64;
                    let mut failures = Vec::new();
                    while !stop.load(Ordering::SeqCst) {
                        let client = format!("load-{t}-{total}");
                        let response = try_get(addr, &path, &[("X-Client", &client)]);
                        total += 1;
                        match response {
                            Ok(r) if r.status == 200 => {}
                            Ok(r) => failures.push(format!("{client}: {} {}", r.status, r.body)),
                            Err(e) => failures.push(format!("{client}: {e}")),
                        }
                    }
                    (total, failures)
                })
            })
            .collect();
        Self { stop, threads }
    }

    /// Stops the senders and reports.
    pub fn stop(self) -> LoadReport {
        self.stop.store(true, Ordering::SeqCst);
        let mut report = LoadReport {
            total: 0,
            failures: Vec::new(),
        };
        for handle in self.threads {
            let (total, failures) = handle.join().expect("load thread");
            report.total += total;
            report.failures.extend(failures);
        }
        report
    }
}

/// Like [`get`], but a refused, reset or empty exchange is an error, not a panic.
pub fn try_get(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> std::io::Result<Response> {
    let mut raw =
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n").into_bytes();
    for (name, value) in headers {
        raw.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
    }
    raw.extend_from_slice(b"\r\n");
    let start = Instant::now();
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(20)))?;
    stream.write_all(&raw)?;
    let mut bytes = Vec::new();
    stream.read_to_end(&mut bytes)?;
    if bytes.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "connection closed without a response",
        ));
    }
    Ok(parse_response(&bytes, start.elapsed()))
}

/// `method path` on the admin listener `admin` with `Authorization: Bearer
/// token` and `body`: the status and the JSON answer (`Null` if none).
pub fn admin_call(
    admin: SocketAddr,
    token: &str,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, serde_json::Value) {
    let raw = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let response = raw_request(admin, raw.as_bytes());
    let value = serde_json::from_str(&response.body).unwrap_or(serde_json::Value::Null);
    (response.status, value)
}

// ------------------------------------------------------------------ --check

/// Runs `sluice --check` on `text`, written to a temporary file: its exit
/// code and what it printed to stderr.
pub fn check_config(text: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("sluice.yaml");
    std::fs::write(&path, text).expect("write config");
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("--check")
        .arg("--config")
        .arg(&path)
        .output()
        .expect("run sluice --check");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

// ---------------------------------------------------------------- certificates

/// Runs the `openssl` command in `dir`.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl must be on PATH (apt-get install openssl)");
    assert!(out.status.success(), "openssl {args:?}: {out:?}");
}

/// `openssl req` arguments for a new, unencrypted P-256 key.
const NEW_P256_KEY: [&str; 5] = [
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:prime256v1",
    "-nodes",
];

/// A throwaway CA in `dir`: `{name}.crt` and `{name}.key` (P-256).
pub fn make_ca(dir: &Path, name: &str) {
    let (cert, key, subject) = (
        format!("{name}.crt"),
        format!("{name}.key"),
        format!("/CN={name}"),
    );
    let args = [
        &["req", "-x509", "-days", "2"][..],
        &NEW_P256_KEY,
        &["-keyout", &key, "-out", &cert, "-subj", &subject],
    ];
    openssl(dir, &args.concat());
}

/// A certificate for `sans` (`DNS:api.example.test,IP:127.0.0.1`) signed by
/// the CA `ca` of [`make_ca`]: `{name}.crt` and `{name}.key` in `dir`.
pub fn make_cert(dir: &Path, ca: &str, name: &str, sans: &str) {
    let (cert, key, csr, ext) = (
        format!("{name}.crt"),
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.ext"),
    );
    let subject = format!("/CN={name}");
    let args = [
        &["req"][..],
        &NEW_P256_KEY,
        &["-keyout", &key, "-out", &csr, "-subj", &subject],
    ];
    openssl(dir, &args.concat());
    std::fs::write(dir.join(&ext), format!("subjectAltName={sans}\n")).expect("write ext");
    let (ca_cert, ca_key) = (format!("{ca}.crt"), format!("{ca}.key"));
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca_cert,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &ext,
            "-out",
            &cert,
        ],
    );
}

/// The packed log's header, and the width of one unit in it (the layout of
/// `sliding_log.lua`).
const PACKED_HEADER: usize = 24;
const PACKED_WIDTH: usize = 6;

/// Units logged at `key` (see [`RedisServer::log_len`]).
fn log_len(conn: &mut redis::Connection, key: &str) -> u64 {
    let packed: Option<Vec<u8>> = redis::cmd("GET")
        .arg(format!("{key}!l"))
        .query(conn)
        .expect("GET");
    match packed {
        Some(raw) => ((raw.len() - PACKED_HEADER) / PACKED_WIDTH) as u64,
        None => redis::cmd("ZCARD").arg(key).query(conn).expect("ZCARD"),
    }
}

/// The stamps (µs) of the packed log at `key`, oldest first.
pub fn packed_stamps(conn: &mut redis::Connection, key: &str) -> Vec<u64> {
    let raw: Option<Vec<u8>> = redis::cmd("GET")
        .arg(format!("{key}!l"))
        .query(conn)
        .expect("GET");
    let Some(raw) = raw else {
        return Vec::new();
    };
    let base = u64::from_be_bytes(raw[..8].try_into().expect("header"));
    raw[PACKED_HEADER..]
        .chunks_exact(PACKED_WIDTH)
        .map(|unit| {
            let mut offset = [0u8; 8];
            offset[2..].copy_from_slice(unit);
            base + u64::from_be_bytes(offset)
        })
        .collect()
}
