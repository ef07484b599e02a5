//! Upstream pools: Pingora load balancers over the resolved server addresses.

use crate::config::UpstreamConfig;
use pingora::lb::{health_check::TcpHealthCheck, selection::RoundRobin, LoadBalancer};
use pingora::services::background::{background_service, GenBackgroundService};
use std::sync::Arc;
use std::time::Duration;

/// One upstream pool, ready for peer selection.
pub struct Upstream {
    /// Name from the config (for logs and errors).
    pub name: String,
    /// Round-robin balancer; with a health check, unhealthy servers are skipped.
    pub balancer: Arc<LoadBalancer<RoundRobin>>,
    /// Connect timeout to a server.
    pub connect_timeout: Duration,
    /// Read timeout on a server's response.
    pub read_timeout: Duration,
}

/// The background health-check service of an upstream, if it has one; it
/// must be added to the Pingora server for checks to run.
pub type HealthCheckService = GenBackgroundService<LoadBalancer<RoundRobin>>;

/// Builds the pool for `config`. Addresses were resolved at config load, so
/// this performs no DNS lookup.
pub fn build(config: &UpstreamConfig) -> std::io::Result<(Upstream, Option<HealthCheckService>)> {
    let mut balancer = LoadBalancer::<RoundRobin>::try_from_iter(config.servers.iter().copied())?;
    let (balancer, service) = match config.health_check {
        Some(interval) => {
            balancer.set_health_check(TcpHealthCheck::new());
            balancer.health_check_frequency = Some(interval);
            let service = background_service(&format!("health check {}", config.name), balancer);
            (service.task(), Some(service))
        }
        None => (Arc::new(balancer), None),
    };
    Ok((
        Upstream {
            name: config.name.clone(),
            balancer,
            connect_timeout: config.connect_timeout,
            read_timeout: config.read_timeout,
        },
        service,
    ))
}
