//! The floor: the smallest Pingora reverse proxy, built from the same
//! Pingora version and features as sluice. One route, no filters, no
//! downstream modules, upstream keep-alive (Pingora's connection pool), the
//! worker threads and runtime flavour asked for. Whatever sluice costs above
//! this is sluice's; below it nothing on Pingora can go. Asked to deny, it
//! answers every request with a fixed 429 from `request_filter` instead:
//! the floor of a denial.

use async_trait::async_trait;
use pingora::http::ResponseHeader;
use pingora::prelude::{HttpPeer, Result};
use pingora::proxy::{http_proxy_service, ProxyHttp, Session};
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::Server;
use std::net::SocketAddr;

struct Bare {
    upstream: SocketAddr,
    deny: bool,
}

#[async_trait]
impl ProxyHttp for Bare {
    type CTX = ();

    fn new_ctx(&self) {}

    /// No downstream modules (Pingora's default adds a disabled compression
    /// module), as sluice.
    fn init_downstream_modules(&self, _modules: &mut pingora::modules::http::HttpModules) {}

    /// The fixed 429: a JSON body and its length, the connection kept
    /// alive (Pingora's `respond_error` would close it).
    async fn request_filter(&self, session: &mut Session, _ctx: &mut ()) -> Result<bool> {
        if !self.deny {
            return Ok(false);
        }
        let body = bytes::Bytes::from_static(br#"{"error":"rate limited"}"#);
        let mut response = ResponseHeader::build(429, Some(2))?;
        response.insert_header(http::header::CONTENT_TYPE, "application/json")?;
        response.insert_header(http::header::CONTENT_LENGTH, body.len())?;
        session
            .write_response_header(Box::new(response), false)
            .await?;
        session.write_response_body(Some(body), true).await?;
        Ok(true)
    }

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut ()) -> Result<Box<HttpPeer>> {
        Ok(Box::new(HttpPeer::new(self.upstream, false, String::new())))
    }
}

/// Serves on `listen`, proxying everything to `upstream` (or, with `deny`,
/// answering 429); never returns.
pub fn run(
    listen: &str,
    upstream: SocketAddr,
    threads: usize,
    work_stealing: bool,
    deny: bool,
) -> ! {
    let conf = ServerConf {
        threads,
        work_stealing,
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(0),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(Opt::default(), conf);
    server.bootstrap();
    let mut service = http_proxy_service(&server.configuration, Bare { upstream, deny });
    service.add_tcp(listen);
    server.add_service(service);
    server.run_forever()
}
