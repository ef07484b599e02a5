//! The Redis store of API keys (`identity.api_key.store: redis`), in a
//! layout other tools may write:
//!
//! - `<key_prefix>key:<sha256 hex of the key>`: a hash with the fields
//!   `consumer` (its id), `created` (Unix seconds, optional) and `plan`
//!   (optional: a per-key plan, as earlier versions wrote it);
//! - `<key_prefix>consumer:<id>:plan`: a string, the consumer's plan — it
//!   applies to every key of the consumer and wins over a per-key `plan`;
//! - `<key_prefix>consumer:<id>:keys`: a set of the hex hashes of the
//!   consumer's keys (what the admin API lists and revokes by);
//! - `<key_prefix>consumers`: a set of the ids of the consumers that have
//!   keys made through the admin API (what it lists consumers by).
//!
//! A lookup's answer is cached in process: a known key for `cache_ttl`, an
//! unknown one for at most 1 s — so a flood of invented keys costs Redis at
//! most one lookup per key per second, a key created a moment ago works
//! within 1 s, and a revoked one stops working within `cache_ttl`. The
//! cache holds at most [`MAX_CACHED`] answers.

use crate::config::consumers::{generate_key, hex, key_hash, Consumer};
use crate::limiter::{Decider, LimiterError};
use crate::sync::Locked;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Answers kept at most; a full cache drops its expired answers, then all.
pub const MAX_CACHED: usize = 100_000;

/// Consumers whose plans a start or reload reads at most.
pub const MAX_SURVEYED: usize = 10_000;

/// How long an unknown key's answer is kept at most.
const UNKNOWN_TTL: Duration = Duration::from_secs(1);

/// Admin writes get at least this long (a decision's budget is meant for
/// the request path).
const ADMIN_TIMEOUT: Duration = Duration::from_secs(2);

/// A consumer of the Redis store, as the admin API shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ConsumerView {
    /// Its own plan (`consumer:<id>:plan`), if set.
    pub plan: Option<String>,
    /// Its keys that still exist, sorted by id.
    pub keys: Vec<KeyView>,
}

impl ConsumerView {
    /// The plan the consumer's requests get: its own, else the one plan
    /// all its keys name (`None` when they name none, or differ).
    pub fn applied_plan(&self) -> Option<String> {
        if self.plan.is_some() {
            return self.plan.clone();
        }
        let mut key_plans = self.keys.iter().map(|k| k.plan.as_deref());
        let first = key_plans.next().flatten();
        first
            .filter(|p| key_plans.all(|other| other == Some(*p)))
            .map(str::to_string)
    }
}

/// One key of a consumer, without the key.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct KeyView {
    /// The first 12 hex digits of the key's SHA-256.
    pub key_id: String,
    /// When it was made (Unix seconds), if it says.
    pub created: Option<u64>,
    /// A per-key plan, as earlier versions wrote it: used only while the
    /// consumer has no plan of its own.
    pub plan: Option<String>,
}

/// Now, in whole seconds since the Unix epoch.
fn unix_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Lookup answers by key hash: when each was fetched, and the consumer (or
/// `None`: no such key).
type Cache = HashMap<[u8; 32], (Instant, Option<Consumer>)>;

/// The Redis key store of one configuration, with its lookup cache.
pub struct RedisKeys {
    prefix: String,
    cache_ttl: Duration,
    cache: Mutex<Cache>,
}

impl RedisKeys {
    /// A store under `prefix` whose answers are kept `cache_ttl`.
    pub fn new(prefix: &str, cache_ttl: Duration) -> Self {
        RedisKeys {
            prefix: prefix.to_string(),
            cache_ttl,
            cache: Mutex::new(HashMap::new()),
        }
    }

    fn key_hash_key(&self, hash_hex: &str) -> String {
        format!("{}key:{hash_hex}", self.prefix)
    }

    fn consumer_set(&self, consumer: &str) -> String {
        format!("{}consumer:{consumer}:keys", self.prefix)
    }

    fn consumers_set(&self) -> String {
        format!("{}consumers", self.prefix)
    }

    fn consumer_plan_key(&self, consumer: &str) -> String {
        format!("{}consumer:{consumer}:plan", self.prefix)
    }

    /// The consumer's own plan (`consumer:<id>:plan`), if one is set.
    async fn own_plan(
        &self,
        consumer: &str,
        timeout: Duration,
        decider: &Decider,
    ) -> Result<Option<String>, LimiterError> {
        let mut get = redis::cmd("GET");
        get.arg(self.consumer_plan_key(consumer));
        let reply = decider.query(get, timeout).await?;
        let plan: Option<String> = redis::from_redis_value(reply)
            .map_err(|e| LimiterError::Server(format!("unexpected consumer plan: {e}")))?;
        Ok(plan.filter(|p| !p.is_empty()))
    }

    /// The consumer of `key` (the bytes as sent): from the cache while its
    /// answer lasts, else from Redis within `decider`'s budget.
    pub async fn find(
        &self,
        key: &[u8],
        decider: &Decider,
    ) -> Result<Option<Consumer>, LimiterError> {
        let hash = key_hash(key);
        if let Some(answer) = self.cached(&hash) {
            return Ok(answer);
        }
        let mut cmd = redis::cmd("HGETALL");
        cmd.arg(self.key_hash_key(&hex(&hash)));
        let reply = decider.query(cmd, decider.budget()).await?;
        let fields: HashMap<String, String> = redis::from_redis_value(reply)
            .map_err(|e| LimiterError::Server(format!("unexpected key hash: {e}")))?;
        let answer = match fields
            .get("consumer")
            .filter(|id| crate::config::consumers::valid_id(id))
        {
            Some(id) => {
                let own = self.own_plan(id, decider.budget(), decider).await?;
                Some(Consumer {
                    id: Arc::from(id.as_str()),
                    plan: own
                        .or_else(|| fields.get("plan").cloned())
                        .map(|p| Arc::from(p.as_str())),
                })
            }
            None => None,
        };
        self.remember(hash, answer.clone());
        Ok(answer)
    }

    /// The cached answer for the key whose hash is `hash`, while it lasts:
    /// `Some(None)` for a key known not to exist.
    pub fn cached(&self, hash: &[u8; 32]) -> Option<Option<Consumer>> {
        let cache = self.cache.locked();
        let (at, answer) = cache.get(hash)?;
        let ttl = match answer {
            Some(_) => self.cache_ttl,
            None => self.cache_ttl.min(UNKNOWN_TTL),
        };
        (at.elapsed() < ttl).then(|| answer.clone())
    }

    /// Caches `answer` for the key whose hash is `hash`, from now.
    pub fn remember(&self, hash: [u8; 32], answer: Option<Consumer>) {
        let now = Instant::now();
        let mut cache = self.cache.locked();
        if cache.len() >= MAX_CACHED {
            let longest = self.cache_ttl.max(UNKNOWN_TTL);
            cache.retain(|_, (at, _)| now.duration_since(*at) < longest);
            if cache.len() >= MAX_CACHED {
                cache.clear();
            }
        }
        cache.insert(hash, (now, answer));
    }

    /// Creates a key for `consumer` (and, with `plan`, makes that the
    /// consumer's plan): the key, returned once, and its id (the first 12
    /// hex digits of its hash).
    pub async fn create(
        &self,
        consumer: &str,
        plan: Option<&str>,
        decider: &Decider,
    ) -> Result<(String, String), LimiterError> {
        let key = generate_key().map_err(|e| LimiterError::Server(e.to_string()))?;
        let hash_hex = hex(&key_hash(key.as_bytes()));
        let mut hset = redis::cmd("HSET");
        hset.arg(self.key_hash_key(&hash_hex))
            .arg("consumer")
            .arg(consumer)
            .arg("created")
            .arg(unix_seconds());
        decider.query(hset, ADMIN_TIMEOUT).await?;
        if plan.is_some() {
            self.set_plan(consumer, plan, decider).await?;
        }
        let mut sadd = redis::cmd("SADD");
        sadd.arg(self.consumer_set(consumer)).arg(&hash_hex);
        decider.query(sadd, ADMIN_TIMEOUT).await?;
        let mut index = redis::cmd("SADD");
        index.arg(self.consumers_set()).arg(consumer);
        decider.query(index, ADMIN_TIMEOUT).await?;
        Ok((key, hash_hex[..12].to_string()))
    }

    /// The ids of the consumers with keys made through the admin API, sorted.
    pub async fn consumers(&self, decider: &Decider) -> Result<Vec<String>, LimiterError> {
        let mut smembers = redis::cmd("SMEMBERS");
        smembers.arg(self.consumers_set());
        let reply = decider.query(smembers, ADMIN_TIMEOUT).await?;
        let mut ids: Vec<String> = redis::from_redis_value(reply)
            .map_err(|e| LimiterError::Server(format!("unexpected consumer set: {e}")))?;
        ids.retain(|id| crate::config::consumers::valid_id(id));
        ids.sort();
        Ok(ids)
    }

    /// Sets (or, with `None`, clears) `consumer`'s plan: every instance
    /// applies it to the consumer's keys within `cache_ttl`, this one on
    /// the next request.
    pub async fn set_plan(
        &self,
        consumer: &str,
        plan: Option<&str>,
        decider: &Decider,
    ) -> Result<(), LimiterError> {
        let key = self.consumer_plan_key(consumer);
        let cmd = match plan {
            Some(plan) => {
                let mut set = redis::cmd("SET");
                set.arg(key).arg(plan);
                set
            }
            None => {
                let mut del = redis::cmd("DEL");
                del.arg(key);
                del
            }
        };
        decider.query(cmd, ADMIN_TIMEOUT).await?;
        self.cache
            .locked()
            .retain(|_, (_, answer)| answer.as_ref().is_none_or(|c| &*c.id != consumer));
        Ok(())
    }

    /// The plan `consumer`'s requests get: its own, else the one plan all
    /// its keys name (`None` when they name none, or differ).
    pub async fn plan_of(
        &self,
        consumer: &str,
        decider: &Decider,
    ) -> Result<Option<String>, LimiterError> {
        Ok(self.describe(consumer, decider).await?.applied_plan())
    }

    /// `consumer` as the admin API shows it: its plan and its keys (id,
    /// creation time, per-key plan), the keys sorted by id.
    pub async fn describe(
        &self,
        consumer: &str,
        decider: &Decider,
    ) -> Result<ConsumerView, LimiterError> {
        let plan = self.own_plan(consumer, ADMIN_TIMEOUT, decider).await?;
        let mut keys = Vec::new();
        for hash_hex in self.hashes(consumer, decider).await? {
            let mut hgetall = redis::cmd("HGETALL");
            hgetall.arg(self.key_hash_key(&hash_hex));
            let reply = decider.query(hgetall, ADMIN_TIMEOUT).await?;
            let fields: HashMap<String, String> = redis::from_redis_value(reply)
                .map_err(|e| LimiterError::Server(format!("unexpected key hash: {e}")))?;
            if fields.get("consumer").map(String::as_str) != Some(consumer) {
                continue; // revoked, or written for someone else
            }
            keys.push(KeyView {
                key_id: hash_hex.get(..12).unwrap_or(&hash_hex).to_string(),
                created: fields.get("created").and_then(|c| c.parse().ok()),
                plan: fields.get("plan").filter(|p| !p.is_empty()).cloned(),
            });
        }
        keys.sort_by(|a, b| a.key_id.cmp(&b.key_id));
        Ok(ConsumerView { plan, keys })
    }

    /// How many of the listed consumers (`<key_prefix>consumers`; the first
    /// [`MAX_SURVEYED`] in id order) get each plan, by the plan their requests carry (see [`RedisKeys::plan_of`]).
    pub async fn plans_in_use(
        &self,
        decider: &Decider,
    ) -> Result<BTreeMap<String, usize>, LimiterError> {
        let mut counts = BTreeMap::new();
        for consumer in self.consumers(decider).await?.iter().take(MAX_SURVEYED) {
            if let Some(plan) = self.plan_of(consumer, decider).await? {
                *counts.entry(plan).or_insert(0) += 1;
            }
        }
        Ok(counts)
    }

    /// The ids of `consumer`'s keys, sorted.
    pub async fn list(
        &self,
        consumer: &str,
        decider: &Decider,
    ) -> Result<Vec<String>, LimiterError> {
        let mut ids: Vec<String> = self
            .hashes(consumer, decider)
            .await?
            .iter()
            .filter_map(|h| h.get(..12).map(str::to_string))
            .collect();
        ids.sort();
        Ok(ids)
    }

    /// Revokes `consumer`'s key whose id is `key_id`: its hash is deleted
    /// (every instance stops taking it within `cache_ttl`; this one at
    /// once). False when the consumer has no such key.
    pub async fn revoke(
        &self,
        consumer: &str,
        key_id: &str,
        decider: &Decider,
    ) -> Result<bool, LimiterError> {
        let hashes = self.hashes(consumer, decider).await?;
        let Some(hash_hex) = hashes.iter().find(|h| h.starts_with(key_id)) else {
            return Ok(false);
        };
        let mut del = redis::cmd("DEL");
        del.arg(self.key_hash_key(hash_hex));
        decider.query(del, ADMIN_TIMEOUT).await?;
        let mut srem = redis::cmd("SREM");
        srem.arg(self.consumer_set(consumer)).arg(hash_hex);
        decider.query(srem, ADMIN_TIMEOUT).await?;
        if hashes.len() == 1 {
            // Its last key: the consumer leaves the list.
            let mut index = redis::cmd("SREM");
            index.arg(self.consumers_set()).arg(consumer);
            decider.query(index, ADMIN_TIMEOUT).await?;
        }
        let mut cache = self.cache.locked();
        cache.retain(|hash, _| hex(hash) != *hash_hex);
        Ok(true)
    }

    async fn hashes(&self, consumer: &str, decider: &Decider) -> Result<Vec<String>, LimiterError> {
        let mut smembers = redis::cmd("SMEMBERS");
        smembers.arg(self.consumer_set(consumer));
        let reply = decider.query(smembers, ADMIN_TIMEOUT).await?;
        redis::from_redis_value(reply)
            .map_err(|e| LimiterError::Server(format!("unexpected key set: {e}")))
    }
}
