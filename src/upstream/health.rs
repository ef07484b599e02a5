//! Upstream health checks and DNS refreshes: one background service that
//! checks (and re-resolves) the pools its source names at each tick (the
//! current state's, so that pools added by a reload are checked and removed
//! ones stop being checked).

use crate::upstream::Upstream;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the service looks for a due check; health-check intervals are
/// honoured to this granularity.
const TICK: Duration = Duration::from_millis(250);

/// Runs each upstream's TCP health check and DNS refresh at its configured
/// interval.
pub struct HealthChecks {
    current: Box<dyn Fn() -> Vec<Arc<Upstream>> + Send + Sync>,
}

impl HealthChecks {
    /// Checks the upstreams `current` returns, asked again at each tick.
    pub fn new(current: impl Fn() -> Vec<Arc<Upstream>> + Send + Sync + 'static) -> Self {
        Self {
            current: Box::new(current),
        }
    }
}

#[async_trait]
impl BackgroundService for HealthChecks {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        loop {
            let upstreams = (self.current)();
            let now = Instant::now();
            for upstream in &upstreams {
                if upstream.claim_due_health_check(now) {
                    // Each check runs on its own, so a server that hangs until
                    // its connect timeout delays no other pool's check.
                    let upstream = Arc::clone(upstream);
                    tokio::spawn(async move { upstream.run_health_check().await });
                }
                if upstream.servers.claim_due_refresh(now) {
                    let upstream = Arc::clone(upstream);
                    tokio::spawn(async move { upstream.refresh_dns().await });
                }
            }
            drop(upstreams);
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(TICK) => {}
            }
        }
    }
}
