//! The Redis store of API keys (`identity.api_key.store: redis`), in a
//! layout other tools may write:
//!
//! - `<key_prefix>key:<sha256 hex of the key>`: a hash with the fields
//!   `consumer` (its id) and `plan` (optional);
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
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Answers kept at most; a full cache drops its expired answers, then all.
pub const MAX_CACHED: usize = 100_000;

/// How long an unknown key's answer is kept at most.
const UNKNOWN_TTL: Duration = Duration::from_secs(1);

/// Admin writes get at least this long (a decision's budget is meant for
/// the request path).
const ADMIN_TIMEOUT: Duration = Duration::from_secs(2);

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
        let answer = fields
            .get("consumer")
            .filter(|id| crate::config::consumers::valid_id(id))
            .map(|id| Consumer {
                id: Arc::from(id.as_str()),
                plan: fields.get("plan").map(|p| Arc::from(p.as_str())),
            });
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

    /// Creates a key for `consumer` (with `plan`): the key, returned once,
    /// and its id (the first 12 hex digits of its hash).
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
            .arg(consumer);
        if let Some(plan) = plan {
            hset.arg("plan").arg(plan);
        }
        decider.query(hset, ADMIN_TIMEOUT).await?;
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
