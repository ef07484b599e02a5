//! The upstream layer: where a proxied request goes. Here: one pool per
//! upstream (its peers, TLS trust and connection-pool key); below, the
//! servers' current addresses and DNS refreshes ([`servers`]), the choice of
//! a server ([`balance`]), passive health ([`passive`]) and the background
//! service running active checks and refreshes ([`health`]).
//!
//! May use `config`, `request` (a hashing upstream keys on a request's
//! parts) and the leaves; it knows nothing of policy, limits or sessions.

pub mod balance;
pub mod health;
pub mod passive;
pub mod servers;

use crate::config::{UpstreamConfig, UpstreamProtocol, UpstreamTls};
use crate::sync::Locked;
use crate::upstream::balance::Balancer;
use crate::upstream::passive::PassiveHealth;
use crate::upstream::servers::{backend, Servers, WrittenAddr};
use http::HeaderValue;
use pingora::lb::health_check::TcpHealthCheck;
use pingora::lb::{Backend, Backends};
use pingora::prelude::HttpPeer;
use pingora::protocols::tls::CaType;
use pingora::protocols::ALPN;
use pingora::upstreams::peer::PeerOptions;
use pingora::utils::tls::{parse_x509, WrappedX509};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One upstream pool, ready for peer selection.
pub struct Upstream {
    /// The settings it was built from (a reload keeps the pool, and its
    /// servers' health, when they are unchanged).
    pub config: UpstreamConfig,
    /// The balancer its `balance` names; with a health check, unhealthy
    /// servers are skipped.
    pub balancer: Balancer,
    /// When the next health check is due (`None`: no health check).
    next_check: Mutex<Option<Instant>>,
    /// The CAs an HTTPS upstream's certificate is verified against, parsed
    /// once (`None`: the system's roots, or plain HTTP).
    ca: Option<Arc<CaType>>,
    /// Its connections' pool: see [`pool_key`].
    pool_key: u64,
    /// Servers taken out by their recent failures.
    pub passive: PassiveHealth,
    /// The addresses its servers resolve to now.
    pub servers: Servers,
    /// Its requests answered 502 or 504 since the pool was built.
    pub gateway_errors: GatewayErrors,
}

/// Requests of one upstream answered `502 Bad Gateway` or `504 Gateway
/// Timeout`, counted since its pool was built (a reload that keeps the
/// pool keeps the counts).
#[derive(Debug, Default)]
pub struct GatewayErrors {
    bad_gateway: AtomicU64,
    gateway_timeout: AtomicU64,
}

impl GatewayErrors {
    /// Counts a request of this upstream answered with `status` (only 502
    /// and 504 count).
    pub fn count(&self, status: u16) {
        let counter = match status {
            502 => &self.bad_gateway,
            504 => &self.gateway_timeout,
            _ => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The counts so far: (502s, 504s).
    pub fn totals(&self) -> (u64, u64) {
        (
            self.bad_gateway.load(Ordering::Relaxed),
            self.gateway_timeout.load(Ordering::Relaxed),
        )
    }
}

/// The key that keeps an upstream's pooled connections its own. Pingora
/// pools connections by address, scheme, SNI, client certificate and
/// whether the certificate and name are verified — not by the CAs trusted
/// nor by the protocol spoken — so two upstreams on one `host:port` with
/// different trust would share a connection the one verified for the
/// other. The key covers the upstream's name, its whole `tls` (CAs
/// included) and its `protocol`: a connection serves only the upstream
/// (and the settings) that made it, and a reload that changes its trust
/// starts new connections.
fn pool_key(config: &UpstreamConfig) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (&config.name, &config.tls, config.protocol).hash(&mut hasher);
    hasher.finish()
}

/// The CAs of `tls.ca_file` as Pingora's TLS connector takes them.
fn trusted_cas(config: &UpstreamConfig) -> Option<Arc<CaType>> {
    let ders = config.tls.as_ref()?.ca_der.as_ref()?;
    let cas: Vec<WrappedX509> = ders
        .iter()
        .map(|der| WrappedX509::new(der.clone(), parse_x509))
        .collect();
    Some(Arc::from(cas))
}

/// Applies `tls` (name, verification, CAs) to a peer's options.
fn apply_tls(options: &mut PeerOptions, tls: &UpstreamTls, ca: &Option<Arc<CaType>>) {
    options.verify_cert = tls.verify;
    options.verify_hostname = tls.verify;
    options.ca = ca.clone();
}

impl Upstream {
    /// Builds the pool for `config`. Addresses were resolved at config load,
    /// so this performs no DNS lookup.
    pub fn build(config: &UpstreamConfig) -> std::io::Result<Upstream> {
        let (servers, discovery) = Servers::new(config);
        let mut balancer = Balancer::new(&config.balance, Backends::new(discovery))?;
        let ca = trusted_cas(config);
        if config.health_check.is_some() {
            // An HTTPS upstream's check is a TLS handshake, verified alike.
            let check = match &config.tls {
                Some(tls) => {
                    let mut check = TcpHealthCheck::new_tls(&tls.sni);
                    apply_tls(&mut check.peer_template.options, tls, &ca);
                    check
                }
                None => TcpHealthCheck::new(),
            };
            balancer.set_health_check(check);
        }
        Ok(Upstream {
            config: config.clone(),
            balancer,
            next_check: Mutex::new(config.health_check.map(|_| Instant::now())),
            ca,
            pool_key: pool_key(config),
            passive: PassiveHealth::new(config.max_fails, config.fail_timeout),
            servers,
            gateway_errors: GatewayErrors::default(),
        })
    }

    /// Its name in the config.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Connect timeout to a server.
    pub fn connect_timeout(&self) -> Duration {
        self.config.connect_timeout
    }

    /// Read timeout on a server's response.
    pub fn read_timeout(&self) -> Duration {
        self.config.read_timeout
    }

    /// A peer for the next server in turn (round robin over the healthy
    /// ones), with this pool's timeouts, and the server's name as written;
    /// `None` when no server is healthy.
    pub fn peer(
        &self,
        key: &[u8],
        tried: &[SocketAddr],
    ) -> Option<(HttpPeer, Option<HeaderValue>)> {
        let now = Instant::now();
        let untried = |b: &Backend| b.addr.as_inet().is_none_or(|a| !tried.contains(a));
        let live = |b: &Backend| {
            b.addr
                .as_inet()
                .is_none_or(|a| !self.passive.is_out(*a, now))
        };
        // Untried and live; else live; else (every server out) any the
        // health check has up: never a self-inflicted outage.
        let backend = self
            .balancer
            .select_with(key, |b, healthy| healthy && live(b) && untried(b))
            .or_else(|| {
                self.balancer
                    .select_with(key, |b, healthy| healthy && live(b))
            })
            .or_else(|| self.balancer.select_with(key, |_, healthy| healthy))?;
        let name = backend.ext.get::<WrittenAddr>().map(|w| w.0.clone());
        let mut peer = match &self.config.tls {
            Some(tls) => {
                let mut peer = HttpPeer::new(backend, true, tls.sni.clone());
                apply_tls(&mut peer.options, tls, &self.ca);
                peer
            }
            None => HttpPeer::new(backend, false, String::new()),
        };
        peer.group_key = self.pool_key;
        if self.config.protocol != UpstreamProtocol::Http1 {
            // h2 by ALPN over TLS; without TLS, HTTP/2 with prior knowledge.
            peer.options.alpn = ALPN::H2;
        }
        peer.options.connection_timeout = Some(self.connect_timeout());
        peer.options.read_timeout = Some(self.read_timeout());
        Some((peer, name))
    }

    /// [`Upstream::peer`], or the error answered as a 502 when no server
    /// is healthy.
    pub fn select(
        &self,
        key: &[u8],
        tried: &[SocketAddr],
    ) -> pingora::Result<(HttpPeer, Option<HeaderValue>)> {
        self.peer(key, tried).ok_or_else(|| {
            let why = format!("no healthy server in upstream `{}`", self.name());
            pingora::Error::explain(pingora::ErrorType::HTTPStatus(502), why)
        })
    }

    /// Whether the active health check has `addr` (an address of
    /// `servers[spec]`) up; true without a health check.
    pub fn passes_health_check(&self, spec: usize, addr: SocketAddr) -> bool {
        let Some(written) = self.config.addresses.get(spec) else {
            return false;
        };
        self.balancer.backends().ready(&backend(addr, written))
    }

    /// Whether the server written as `servers[spec]` is up: one of its
    /// addresses passes the health check and is not out for its failures.
    pub fn server_up(&self, spec: usize) -> bool {
        let now = Instant::now();
        let Some(written) = self.config.addresses.get(spec) else {
            return false;
        };
        self.servers
            .current()
            .iter()
            .filter(|s| s.spec == spec)
            .any(|s| {
                let backend = backend(s.addr, written);
                self.balancer.backends().ready(&backend) && !self.passive.is_out(s.addr, now)
            })
    }

    /// Whether a health check is due at `now`; if so, the next one is
    /// scheduled an interval later, so each due check is claimed once.
    pub fn claim_due_health_check(&self, now: Instant) -> bool {
        let Some(interval) = self.config.health_check else {
            return false;
        };
        let mut next = self.next_check.locked();
        match *next {
            Some(due) if due <= now => {
                *next = Some(now + interval);
                true
            }
            _ => false,
        }
    }

    /// Resolves the servers' names again; when their addresses changed,
    /// the balancer chooses among the new ones from then on (a server that
    /// stays keeps its health).
    pub async fn refresh_dns(&self) {
        if self.servers.refresh().await {
            if let Err(e) = self.balancer.update_now() {
                log::warn!("upstream `{}`: new servers not taken: {e}", self.name());
            }
        }
    }

    /// Runs one TCP health check of every server. Servers that fail are
    /// skipped by selection until a later check succeeds.
    pub async fn run_health_check(&self) {
        self.balancer.backends().run_health_check(false).await;
    }
}
