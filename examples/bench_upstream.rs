//! A minimal, fast HTTP upstream for `benches/load.sh`: answers every request
//! with `200 ok`. Built on Pingora so that it is never the bottleneck.
//!
//! `cargo run --release --example bench_upstream -- 127.0.0.1:3000 [threads]`

use async_trait::async_trait;
use http::Response;
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::Server;
use pingora::services::listening::Service;

struct Ok200;

#[async_trait]
impl ServeHttp for Ok200 {
    async fn response(&self, _session: &mut ServerSession) -> Response<Vec<u8>> {
        let mut response = Response::new(b"ok".to_vec());
        response
            .headers_mut()
            .insert(http::header::CONTENT_LENGTH, 2.into());
        response
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:3000".into());
    let threads = args.next().and_then(|t| t.parse().ok()).unwrap_or(1);
    let conf = ServerConf {
        threads,
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(Opt::default(), conf);
    server.bootstrap();
    let mut service = Service::new("bench upstream".into(), Ok200);
    service.add_tcp(&addr);
    server.add_service(service);
    server.run_forever();
}
