//! The plans a consumer may have, and what happens to one that is not
//! among them: its requests get each limit's own number (`limit`), as a
//! request without a plan does, and the gateway says so — once per plan
//! name and configuration, in the log, and for the Redis key store with
//! the number of consumers concerned after each start and reload.

use crate::limiter::Decider;
use crate::policy::identity::key_store::RedisKeys;
use crate::sync::Locked;
use std::collections::BTreeSet;
use std::sync::Mutex;

/// Unknown plan names logged at most, per configuration (a store full of
/// junk plan names cannot flood the log).
const MAX_WARNED: usize = 64;

/// The plans of `limit_from: {consumer: plan}`, with the unknown ones
/// already reported.
#[derive(Debug, Default)]
pub struct ConsumerPlans {
    known: BTreeSet<String>,
    warned: Mutex<BTreeSet<String>>,
}

impl ConsumerPlans {
    /// The plans `known` (see [`crate::config::Config::consumer_plans`]).
    pub fn new(known: BTreeSet<String>) -> Self {
        Self {
            known,
            warned: Mutex::new(BTreeSet::new()),
        }
    }

    /// The plans a consumer may have, sorted.
    pub fn known(&self) -> &BTreeSet<String> {
        &self.known
    }

    /// Notes that a request carries a consumer's `plan`: an unknown one is
    /// logged the first time it is seen.
    pub fn note(&self, plan: &str) {
        if self.known.contains(plan) {
            return;
        }
        let mut warned = self.warned.locked();
        if warned.len() < MAX_WARNED && warned.insert(plan.to_string()) {
            log::warn!(
                "consumer plan `{plan}` is in no limit's `plans` (plans: {}): its requests get each limit's own number",
                self.listed()
            );
        }
    }

    /// Logs, for the Redis key store, how many listed consumers have each
    /// plan no limit lists (a reload that removed a plan, a tool that wrote
    /// a typo).
    pub async fn report_store(&self, store: &RedisKeys, decider: &Decider) {
        if decider.link() != crate::limiter::Link::Connected {
            return; // said when Redis is not connected; the next reload reports
        }
        let in_use = match store.plans_in_use(decider).await {
            Ok(in_use) => in_use,
            Err(e) => {
                log::warn!("API keys in Redis: the consumers' plans could not be read ({e})");
                return;
            }
        };
        for (plan, consumers) in in_use.iter().filter(|(p, _)| !self.known.contains(*p)) {
            log::warn!(
                "API keys in Redis: {consumers} consumer(s) have plan `{plan}`, which no limit's `plans` lists (plans: {}): their requests get each limit's own number until their plan is changed (PUT /v1/consumers/ID)",
                self.listed()
            );
        }
    }

    fn listed(&self) -> String {
        if self.known.is_empty() {
            return "none".to_string();
        }
        self.known.iter().cloned().collect::<Vec<_>>().join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_plan_is_remembered_once_and_the_memory_is_bounded() {
        let plans = ConsumerPlans::new(["free".to_string(), "pro".to_string()].into());
        plans.note("pro");
        assert!(plans.warned.locked().is_empty());
        plans.note("Pro");
        plans.note("Pro");
        assert_eq!(plans.warned.locked().len(), 1);
        for i in 0..1000 {
            plans.note(&format!("junk{i}"));
        }
        assert_eq!(plans.warned.locked().len(), MAX_WARNED);
    }
}
