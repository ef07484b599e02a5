//! Graceful drain of the proxy listener on shutdown and upgrade.
//!
//! When Pingora stops a listening service it stops accepting and then calls
//! the application's `cleanup`, which makes the HTTP proxy drop every
//! connection still waiting for its request — including one accepted an
//! instant earlier whose request bytes are still on their way. Under load that
//! turns a handful of requests per upgrade into "connection closed without a
//! response". Waiting a short settle time before that cleanup lets a
//! connection accepted before the listener stopped get its request served
//! (with `Connection: close`); idle keep-alive connections close after it.
//! The front door (the `front_door` module) waits [`settle_time`]
//! before that cleanup.

use std::time::Duration;

/// The settle time for a server that drains for `grace_period`: a
/// second, or half the grace period if that is shorter, so that requests
/// it lets in still have time to finish.
pub fn settle_time(grace_period: Duration) -> Duration {
    (grace_period / 2).min(Duration::from_secs(1))
}
