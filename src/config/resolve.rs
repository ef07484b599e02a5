//! Name resolution of upstream servers, after validation: the one step of
//! loading that does network I/O (DNS). It runs where blocking is allowed:
//! before the server starts, and on a blocking thread for a reload, never on
//! a thread that serves requests.

use super::checker::Checker;
use super::position::PositionIndex;
use super::problem::{KeyPath, ProblemKind};
use super::{Config, Problem, ResolvedServer};
use std::net::ToSocketAddrs;

/// Fills every upstream's `servers` with the addresses its `addresses`
/// resolve to; the problems, positioned, when one does not resolve.
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
            match server.to_socket_addrs() {
                Ok(addrs) => {
                    let before = servers.len();
                    servers.extend(addrs.map(|addr| ResolvedServer { addr, spec: i }));
                    if servers.len() == before {
                        let kind = ProblemKind::ResolvesToNothing(server.clone());
                        c.problem(&path.index(i), kind);
                    }
                }
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
