//! Server selection for an upstream: Pingora's load balancers (weighted
//! round robin, weighted random, Ketama consistent hashing) behind one type,
//! and the key a consistent-hash upstream chooses by.

use crate::config::{Balance, KeyPart};
use crate::request::parts::{part_value, PartValue, RequestParts};
use pingora::lb::selection::{BackendIter, BackendSelection, Consistent, Random, RoundRobin};
use pingora::lb::{health_check::HealthCheck, Backend, Backends, LoadBalancer};

/// One upstream's balancer, of the kind its `balance` names.
pub enum Balancer {
    /// Weighted round robin.
    RoundRobin(LoadBalancer<RoundRobin>),
    /// Weighted random.
    Random(LoadBalancer<Random>),
    /// Ketama consistent hashing (weighted).
    Hash(LoadBalancer<Consistent>),
}

/// Runs `$body` with `$lb` bound to whichever balancer `$balancer` holds.
macro_rules! each {
    ($balancer:expr, $lb:ident => $body:expr) => {
        match $balancer {
            Balancer::RoundRobin($lb) => $body,
            Balancer::Random($lb) => $body,
            Balancer::Hash($lb) => $body,
        }
    };
}

impl Balancer {
    /// A balancer of kind `balance` over `backends`, with its selection
    /// built from what their discovery holds now (which must not wait).
    pub fn new(balance: &Balance, backends: Backends) -> std::io::Result<Self> {
        let balancer = match balance {
            Balance::RoundRobin => Balancer::RoundRobin(LoadBalancer::from_backends(backends)),
            Balance::Random => Balancer::Random(LoadBalancer::from_backends(backends)),
            Balance::ConsistentHash(_) => Balancer::Hash(LoadBalancer::from_backends(backends)),
        };
        balancer.update_now()?;
        Ok(balancer)
    }

    /// Runs discovery and rebuilds the selection; discovery that waits is
    /// an error (sluice's never does: addresses are resolved elsewhere).
    pub fn update_now(&self) -> std::io::Result<()> {
        each!(self, lb => update_now(lb))
    }

    /// The first server, in the order the balancer tries them for `key`,
    /// that `accept` takes (given whether the health check has it up).
    pub fn select_with(
        &self,
        key: &[u8],
        accept: impl Fn(&Backend, bool) -> bool,
    ) -> Option<Backend> {
        each!(self, lb => lb.select_with(key, 256, accept))
    }

    /// The servers and their health.
    pub fn backends(&self) -> &Backends {
        each!(self, lb => lb.backends())
    }

    /// Checks servers with `check` (run by the caller's schedule).
    pub fn set_health_check(&mut self, check: Box<dyn HealthCheck + Send + Sync + 'static>) {
        each!(self, lb => lb.set_health_check(check))
    }
}

/// Polls `balancer`'s update once: ready at once for a discovery that
/// never waits.
fn update_now<S>(balancer: &LoadBalancer<S>) -> std::io::Result<()>
where
    S: BackendSelection + 'static,
    S::Iter: BackendIter,
{
    use std::future::Future;
    let mut update = std::pin::pin!(balancer.update());
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match update.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(Ok(())) => Ok(()),
        std::task::Poll::Ready(Err(e)) => Err(std::io::Error::other(e.to_string())),
        std::task::Poll::Pending => Err(std::io::Error::other("discovery did not finish at once")),
    }
}

/// The bytes a consistent-hash upstream chooses a server by: each part's
/// raw value, joined by a byte no value holds unescaped; a missing or
/// ambiguous part counts as empty (such requests share a server).
pub fn hash_key(parts: &[KeyPart], request: &RequestParts<'_>) -> Vec<u8> {
    let mut key = Vec::with_capacity(64);
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            key.push(0);
        }
        if let PartValue::One(value) = part_value(part, request) {
            key.extend_from_slice(&value);
        }
    }
    key
}
