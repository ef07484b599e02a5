//! The servers an upstream has now: the addresses its names resolved to at
//! load, replaced by each DNS refresh, and the service discovery through
//! which its balancer sees them. Names are resolved on a blocking thread,
//! never on one that serves requests; a name that stops resolving keeps
//! its last addresses.

use crate::config::{resolve_server, ResolvedServer, ServerSpec, UpstreamConfig};
use crate::sync::Locked;
use arc_swap::ArcSwap;
use http::HeaderValue;
use pingora::lb::discovery::ServiceDiscovery;
use pingora::lb::Backend;
use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A server's name as written in `servers` (`host:port`), carried in its
/// backend's extensions: the `Host` of `upstream_host: upstream`.
#[derive(Debug, Clone)]
pub(crate) struct WrittenAddr(pub HeaderValue);

/// An upstream's current addresses and their DNS refresh schedule.
pub struct Servers {
    /// The upstream's name, for the log.
    upstream: String,
    /// Its servers as written.
    addresses: Arc<[ServerSpec]>,
    /// What they resolve to now (sorted by entry, then address).
    now: Arc<ArcSwap<Vec<ResolvedServer>>>,
    /// `dns_refresh`, and when the next refresh is due.
    refresh: Option<(Duration, Mutex<Instant>)>,
    /// A refresh is running (a slow resolver never stacks them up).
    resolving: AtomicBool,
}

impl Servers {
    /// The servers `config` resolved to at load, and the discovery that
    /// hands them to a balancer.
    pub fn new(config: &UpstreamConfig) -> (Servers, Box<dyn ServiceDiscovery + Send + Sync>) {
        let addresses: Arc<[ServerSpec]> = config.addresses.clone().into();
        let now = Arc::new(ArcSwap::from_pointee(config.servers.clone()));
        let discovered = Discovered {
            addresses: Arc::clone(&addresses),
            now: Arc::clone(&now),
        };
        let servers = Servers {
            upstream: config.name.clone(),
            addresses,
            now,
            refresh: config
                .dns_refresh
                .map(|every| (every, Mutex::new(Instant::now()))),
            resolving: AtomicBool::new(false),
        };
        (servers, Box::new(discovered))
    }

    /// What the servers resolve to now.
    pub fn current(&self) -> Arc<Vec<ResolvedServer>> {
        self.now.load_full()
    }

    /// Whether a DNS refresh is due at `now` (and none is running); if so,
    /// the next is scheduled `dns_refresh` later, so each is claimed once.
    pub fn claim_due_refresh(&self, now: Instant) -> bool {
        let Some((every, next)) = &self.refresh else {
            return false;
        };
        let mut next = next.locked();
        if *next > now || self.resolving.swap(true, Ordering::AcqRel) {
            return false;
        }
        *next = now + *every;
        true
    }

    /// Resolves every name again on a blocking thread (a name that fails
    /// keeps its last addresses); true when the set changed, and the
    /// balancer must rebuild its selection. Ends a claimed refresh.
    pub async fn refresh(&self) -> bool {
        let addresses = Arc::clone(&self.addresses);
        let before = self.current();
        let upstream = self.upstream.clone();
        let last = Arc::clone(&before);
        let fresh =
            tokio::task::spawn_blocking(move || resolve_keeping(&upstream, &addresses, &last))
                .await;
        self.resolving.store(false, Ordering::Release);
        match fresh {
            Ok(fresh) if fresh != *before => {
                log::info!("upstream `{}`: servers now {}", self.upstream, list(&fresh));
                self.now.store(Arc::new(fresh));
                true
            }
            _ => false,
        }
    }
}

/// Each of `addresses` resolved now, or, where that fails, its addresses in
/// `last` (a warning says so).
fn resolve_keeping(
    upstream: &str,
    addresses: &[ServerSpec],
    last: &[ResolvedServer],
) -> Vec<ResolvedServer> {
    let mut servers = Vec::with_capacity(last.len());
    for (spec, server) in addresses.iter().enumerate() {
        match resolve_server(&server.addr) {
            Ok(addrs) => {
                servers.extend(addrs.into_iter().map(|addr| ResolvedServer { addr, spec }))
            }
            Err(e) => {
                let kept = last.iter().filter(|s| s.spec == spec);
                log::warn!(
                    "upstream `{upstream}`: server `{}` does not resolve ({e}); keeping {}",
                    server.addr,
                    list(&kept.clone().copied().collect::<Vec<_>>())
                );
                servers.extend(kept);
            }
        }
    }
    servers
}

/// `a, b, c` (or `no address`), for the log.
fn list(servers: &[ResolvedServer]) -> String {
    if servers.is_empty() {
        return "no address".to_string();
    }
    let addrs: Vec<String> = servers.iter().map(|s| s.addr.to_string()).collect();
    addrs.join(", ")
}

/// The backends of `servers`: each with its entry's weight and its name as
/// written.
pub fn backends(addresses: &[ServerSpec], servers: &[ResolvedServer]) -> BTreeSet<Backend> {
    servers
        .iter()
        .filter_map(|server| {
            let spec = addresses.get(server.spec)?;
            Some(backend(server.addr, spec))
        })
        .collect()
}

/// The backend for `addr`, an address of `spec`.
pub fn backend(addr: SocketAddr, spec: &ServerSpec) -> Backend {
    let mut backend = Backend {
        addr: pingora::protocols::l4::socket::SocketAddr::Inet(addr),
        weight: spec.weight,
        ext: http::Extensions::new(),
    };
    if let Ok(name) = HeaderValue::from_str(&spec.addr) {
        backend.ext.insert(WrittenAddr(name));
    }
    backend
}

/// Service discovery over addresses resolved off the serving threads (at
/// load, and by each DNS refresh): it never waits.
struct Discovered {
    addresses: Arc<[ServerSpec]>,
    now: Arc<ArcSwap<Vec<ResolvedServer>>>,
}

#[async_trait::async_trait]
impl ServiceDiscovery for Discovered {
    async fn discover(&self) -> pingora::Result<(BTreeSet<Backend>, HashMap<u64, bool>)> {
        Ok((backends(&self.addresses, &self.now.load()), HashMap::new()))
    }
}
