//! The floor: the smallest Pingora reverse proxy, built from the same
//! Pingora version and features as sluice. One route, no filters, no
//! downstream modules, upstream keep-alive (Pingora's connection pool), the
//! worker threads and runtime flavour asked for. Whatever sluice costs above
//! this is sluice's; below it nothing on Pingora can go.

use async_trait::async_trait;
use pingora::prelude::{HttpPeer, Result};
use pingora::proxy::{http_proxy_service, ProxyHttp, Session};
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::Server;
use std::net::SocketAddr;

struct Bare {
    upstream: SocketAddr,
}

#[async_trait]
impl ProxyHttp for Bare {
    type CTX = ();

    fn new_ctx(&self) {}

    /// No downstream modules (Pingora's default adds a disabled compression
    /// module), as sluice.
    fn init_downstream_modules(&self, _modules: &mut pingora::modules::http::HttpModules) {}

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut ()) -> Result<Box<HttpPeer>> {
        Ok(Box::new(HttpPeer::new(self.upstream, false, String::new())))
    }
}

/// Serves on `listen`, proxying everything to `upstream`; never returns.
pub fn run(listen: &str, upstream: SocketAddr, threads: usize, work_stealing: bool) -> ! {
    let conf = ServerConf {
        threads,
        work_stealing,
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(0),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(Opt::default(), conf);
    server.bootstrap();
    let mut service = http_proxy_service(&server.configuration, Bare { upstream });
    service.add_tcp(listen);
    server.add_service(service);
    server.run_forever()
}
