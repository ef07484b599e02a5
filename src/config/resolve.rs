//! Name resolution of upstream servers, after validation: the one step of
//! loading that does network I/O (DNS). It runs where blocking is allowed:
//! before the server starts, and on a blocking thread for a reload or a DNS
//! refresh, never on a thread that serves requests.

use super::checker::Checker;
use super::position::PositionIndex;
use super::problem::{KeyPath, ProblemKind};
use super::{Config, Problem, ResolvedServer};
use std::net::{SocketAddr, ToSocketAddrs};

/// The addresses `server` (`host:port`) resolves to now, sorted and without
/// repeats (a resolver's rotation of the same set is no change); an error
/// when it does not resolve, or resolves to nothing.
pub fn resolve_server(server: &str) -> std::io::Result<Vec<SocketAddr>> {
    let mut addrs: Vec<SocketAddr> = server.to_socket_addrs()?.collect();
    addrs.sort_unstable();
    addrs.dedup();
    if addrs.is_empty() {
        return Err(std::io::Error::other("no addresses"));
    }
    Ok(addrs)
}

/// Fills every upstream's `servers` with the addresses its `addresses`
/// resolve to; the problems, positioned, when one does not resolve. An
/// upstream with `dns_refresh` only logs a warning for such a name: it has
/// no address until a refresh resolves it (its requests get 502 till then).
pub(super) fn resolve(
    config: &mut Config,
    index: &PositionIndex,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), Vec<Problem>> {
    let mut c = Checker::new(index, env);
    for upstream in &mut config.upstreams {
        let path = KeyPath::root("upstreams")
            .key(&upstream.name)
            .key("servers");
        let mut servers = Vec::new();
        for (i, spec) in upstream.addresses.iter().enumerate() {
            let server = &spec.addr;
            match resolve_server(server) {
                Ok(addrs) => servers.extend(addrs.into_iter().map(|addr| ResolvedServer { addr, spec: i })),
                Err(e) if upstream.dns_refresh.is_some() => log::warn!(
                    "upstream `{}`: server `{server}` does not resolve ({e}); it gets no requests until a DNS refresh resolves it",
                    upstream.name
                ),
                Err(e) => {
                    let kind = ProblemKind::Unresolvable {
                        server: server.clone(),
                        error: e.to_string(),
                    };
                    c.problem(&path.index(i), kind);
                }
            }
        }
        upstream.servers = servers;
    }
    if c.problems.is_empty() {
        Ok(())
    } else {
        Err(c.problems)
    }
}
