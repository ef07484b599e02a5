//! The shared upstream: Pingora answering `200 ok` on one thread, counting
//! what it serves (`GET /__hits` answers the count, and is not counted). It
//! is also the auth service of the `auth_request` case: `GET /__auth`
//! answers 200 naming the request's `X-Key` as its user, not counted.

use crate::common::{self, free_port};
use crate::process::{wait_for_port, Daemon};
use async_trait::async_trait;
use http::Response;
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::Server;
use pingora::services::listening::Service;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

struct Ok200 {
    hits: Arc<AtomicU64>,
}

#[async_trait]
impl ServeHttp for Ok200 {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let path = session.req_header().uri.path();
        // The auth service of the `auth_request` case: the caller's X-Key
        // is its user; not counted as a hit.
        let user = (path == "/__auth").then(|| {
            session
                .req_header()
                .headers
                .get("x-key")
                .cloned()
                .unwrap_or(http::HeaderValue::from_static("anonymous"))
        });
        let body = if path == "/__hits" {
            self.hits.load(Ordering::Relaxed).to_string().into_bytes()
        } else if user.is_some() {
            Vec::new()
        } else {
            self.hits.fetch_add(1, Ordering::Relaxed);
            b"ok".to_vec()
        };
        let length = body.len();
        let mut response = Response::new(body);
        response
            .headers_mut()
            .insert(http::header::CONTENT_LENGTH, length.into());
        if let Some(user) = user {
            response.headers_mut().insert("x-auth-user", user);
        }
        response
    }
}

pub fn run(addr: &str) -> ! {
    let conf = ServerConf {
        threads: 1,
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(Opt::default(), conf);
    server.bootstrap();
    let mut service = Service::new(
        "bench upstream".into(),
        Ok200 {
            hits: Arc::new(AtomicU64::new(0)),
        },
    );
    service.add_tcp(addr);
    server.add_service(service);
    server.run_forever()
}

/// Starts this binary again as the upstream on a free port (its log in
/// `dir`); returns it and the port, once it listens.
pub fn spawn(dir: &Path) -> (Daemon, u16) {
    let port = free_port();
    let daemon = Daemon::spawn(
        &format!("upstream-{port}"),
        Command::new(std::env::current_exe().expect("current exe"))
            .args(["--upstream", &format!("127.0.0.1:{port}")]),
        dir,
    );
    wait_for_port(port);
    (daemon, port)
}

/// Requests served so far (other than `/__hits`).
pub fn hits(addr: SocketAddr) -> u64 {
    common::get(addr, "/__hits", &[])
        .body
        .trim()
        .parse()
        .unwrap_or(0)
}
