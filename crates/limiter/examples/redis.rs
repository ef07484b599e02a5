//! Two "instances" of a service sharing one limit through Redis: each has a
//! `Decider` of its own (its own connection, as two processes would), and
//! between them they admit exactly the limit.
//!
//! ```text
//! redis-server --port 6390 --save '' &
//! REDIS_URL=redis://127.0.0.1:6390/0 cargo run -p sluice-limiter --example redis
//! ```
//!
//! Without `REDIS_URL`, it uses `redis://127.0.0.1:6379/0`.

use sluice_limiter::settings::{LimiterConfig, OnError, RedisConfig};
use sluice_limiter::{Algorithm, Decider, LimitCheck, Source, Unobserved};
use std::sync::Arc;
use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into());
    let settings = LimiterConfig {
        redis: RedisConfig {
            url,
            key_prefix: "example:".into(),
            ..RedisConfig::default()
        },
        // A Redis that cannot be reached is an error here, not a fallback.
        on_error: OnError::Deny,
        ..LimiterConfig::default()
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let first = Decider::new(&settings, Arc::new(Unobserved))?;
        let second = Decider::new(&settings, Arc::new(Unobserved))?;
        first.connect().await?;
        second.connect().await?;

        // A key of its own per run, so that runs do not share a window.
        let key = format!("{{example:{}}}", std::process::id());
        let check = LimitCheck::plain(&key, 5, Duration::from_secs(10), Algorithm::SlidingLog);
        let mut admitted = 0;
        for n in 0..12 {
            let decider = if n % 2 == 0 { &first } else { &second };
            let outcome = decider.decide(&[check]).await;
            if !matches!(outcome.source, Source::Redis | Source::DenyCache) {
                return Err(format!("Redis did not decide: {:?}", outcome.source).into());
            }
            let decision = &outcome.decisions[0];
            println!(
                "request {n:>2} via instance {}: {} (remaining {}, retry after {:?})",
                n % 2 + 1,
                if outcome.admitted {
                    "admitted"
                } else {
                    "denied"
                },
                decision.remaining,
                decision.retry_after,
            );
            admitted += usize::from(outcome.admitted);
        }
        println!("admitted {admitted} of 12 with a limit of 5 shared by both");
        if admitted != 5 {
            return Err("the shared limit was not exact".into());
        }
        Ok(())
    })
}
