//! `identity.api_key` and its consumers file: who each API key belongs to,
//! kept as the SHA-256 of each key (never the key), read with the config
//! and reloaded with it. A key is looked up by its hash: the file, a log or
//! a memory dump gives no key away.

use super::checker::Checker;
use super::file::ConsumersFile;
use super::position::PositionIndex;
use super::problem::{KeyPath, ProblemKind};
use super::{ConfigError, Problem};
use sha2::{Digest, Sha256};
use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// `identity.api_key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKeyConfig {
    /// Where a request carries its key.
    pub source: KeySource,
    /// Where the consumers are kept.
    pub store: KeyStore,
    /// Answer 401 to a request without a valid key, on every route.
    pub required: bool,
    /// Unknown keys one client IP may present per window.
    pub failures: Failures,
}

/// Where a request carries its API key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// A header (lower-case name).
    Header(String),
    /// A query parameter (removed from the target sent upstream).
    Query(String),
}

/// `identity.api_key.store`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyStore {
    /// A consumers file, read with the config.
    File {
        /// The file, as written.
        path: String,
        /// Its consumers, read when the config loads.
        consumers: Arc<Consumers>,
    },
    /// Redis: one hash per key, `<key_prefix>key:<sha256 hex>`.
    Redis {
        /// How long a lookup's answer is trusted (an unknown key's: at
        /// most 1 s).
        cache_ttl: Duration,
    },
}

/// `identity.api_key.failures`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failures {
    /// Unknown keys allowed per window.
    pub limit: u64,
    /// The window.
    pub window: Duration,
}

/// The consumers a key can belong to, by the SHA-256 of the key.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Consumers {
    list: Vec<Consumer>,
    by_hash: HashMap<[u8; 32], usize>,
}

impl std::fmt::Debug for Consumers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Consumers({} consumers, {} keys)",
            self.list.len(),
            self.by_hash.len()
        )
    }
}

/// One consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Consumer {
    /// Its id: the `user` key part and `x-consumer-id` of its requests.
    pub id: Arc<str>,
    /// Its plan, for `limit_from: {consumer: plan}`.
    pub plan: Option<Arc<str>>,
}

impl Consumers {
    /// The consumer whose key is `key` (the bytes as sent).
    pub fn find(&self, key: &[u8]) -> Option<&Consumer> {
        self.by_hash.get(&key_hash(key)).map(|&i| &self.list[i])
    }

    /// The consumer whose id is `id`.
    pub fn by_id(&self, id: &str) -> Option<&Consumer> {
        self.list.iter().find(|c| &*c.id == id)
    }

    /// How many consumers there are.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The plans the consumers name.
    pub fn plans(&self) -> BTreeSet<&str> {
        self.list.iter().filter_map(|c| c.plan.as_deref()).collect()
    }
}

/// A new API key: 256 bits from the operating system's generator, in
/// URL-safe base64 without padding (43 characters).
pub fn generate_key() -> Result<String, getrandom::Error> {
    use base64::Engine;
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

/// The SHA-256 of `key`.
pub fn key_hash(key: &[u8]) -> [u8; 32] {
    Sha256::digest(key).into()
}

/// The line a consumers file holds for `key`: `sha256:<64 hex>`.
pub fn key_line(key: &[u8]) -> String {
    format!("sha256:{}", hex(&key_hash(key)))
}

/// `hash` in lower-case hex.
pub fn hex(hash: &[u8; 32]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(64);
    for byte in hash {
        let _ = write!(out, "{byte:02x}");
    }
    out
}

/// The hash a `sha256:<64 hex>` line names (either case of hex).
fn parse_key_line(line: &str) -> Option<[u8; 32]> {
    let hex = line.strip_prefix("sha256:")?;
    if hex.len() != 64 {
        return None;
    }
    let mut hash = [0u8; 32];
    for (i, byte) in hash.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(i * 2..i * 2 + 2)?, 16).ok()?;
    }
    Some(hash)
}

/// Whether `id` can be a consumer id: 1 to 128 of `A-Z a-z 0-9 . _ - @ :`,
/// so that it is a header value and a key part as it is.
pub(crate) fn valid_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-@:".contains(&b))
}

/// Reads the consumers file `path`: its problems are reported against it,
/// `file:line:column`, and its warnings (a plan `known_plans` lacks) are
/// returned.
pub(super) fn load(
    path: &str,
    known_plans: &BTreeSet<String>,
) -> Result<(Consumers, Vec<String>), ConfigError> {
    let fail = |problems: Vec<Problem>| ConfigError {
        path: Path::new(path).to_path_buf(),
        problems,
    };
    let text = std::fs::read_to_string(path).map_err(|e| {
        fail(vec![Problem {
            position: None,
            message: format!("cannot read the consumers file: {e}"),
        }])
    })?;
    let parsed: ConsumersFile = if text.trim().is_empty() {
        ConsumersFile::default()
    } else {
        serde_yaml::from_str(&text).map_err(|e| fail(vec![super::serde_problem(&e)]))?
    };
    let index = PositionIndex::build(&text);
    let no_env = |_: &str| None;
    let mut c = Checker::new(&index, &no_env);
    let consumers = consumers(&mut c, &parsed, known_plans);
    if !c.problems.is_empty() {
        return Err(fail(c.problems));
    }
    let warnings = fail(c.warnings)
        .to_string()
        .lines()
        .filter(|line| !line.is_empty())
        .map(str::to_string)
        .collect();
    Ok((consumers, warnings))
}

/// The consumers of `f`: ids unique and well formed, every key a
/// `sha256:` line held by one consumer only.
fn consumers(c: &mut Checker, f: &ConsumersFile, known_plans: &BTreeSet<String>) -> Consumers {
    let mut out = Consumers::default();
    let mut ids = BTreeSet::new();
    for (i, consumer) in f.consumers.iter().enumerate() {
        let at = KeyPath::root("consumers").index(i);
        if !valid_id(&consumer.id) {
            c.problem(
                &at.key("id"),
                ProblemKind::BadConsumerId(consumer.id.clone()),
            );
        } else if !ids.insert(consumer.id.as_str()) {
            c.problem(
                &at.key("id"),
                ProblemKind::DuplicateConsumer(consumer.id.clone()),
            );
        }
        if let Some(plan) = &consumer.plan {
            if !known_plans.contains(plan) {
                c.warning(
                    &at.key("plan"),
                    ProblemKind::UnknownConsumerPlan(plan.clone()),
                );
            }
        }
        let index = out.list.len();
        for (k, line) in consumer.keys.iter().enumerate() {
            let at = at.key("keys").index(k);
            match parse_key_line(line) {
                None => c.problem(&at, ProblemKind::BadKeyHash),
                Some(hash) => {
                    if out.by_hash.insert(hash, index).is_some() {
                        c.problem(&at, ProblemKind::DuplicateKey);
                    }
                }
            }
        }
        out.list.push(Consumer {
            id: consumer.id.as_str().into(),
            plan: consumer.plan.as_deref().map(Arc::from),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_line_is_the_sha256_of_the_key_and_reads_back() {
        // sha256("abc"), the FIPS 180-2 example.
        let line = key_line(b"abc");
        assert_eq!(
            line,
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(parse_key_line(&line), Some(key_hash(b"abc")));
        assert_eq!(
            parse_key_line(&line.to_ascii_uppercase().replace("SHA256", "sha256")),
            Some(key_hash(b"abc"))
        );
        for bad in [
            "abc",
            "sha256:",
            "sha256:zz",
            &line[..70],
            &format!("{line}0"),
            "sha1:ba78",
        ] {
            assert_eq!(parse_key_line(bad), None, "{bad}");
        }
        // A multi-byte character where hex belongs is refused, not a panic.
        let wide = format!("sha256:é{}", &line[9..]);
        assert_eq!(parse_key_line(&wide), None);
    }

    #[test]
    fn a_new_key_is_url_safe_and_never_the_same() {
        let (a, b) = (generate_key().unwrap(), generate_key().unwrap());
        assert_eq!(a.len(), 43);
        assert_ne!(a, b);
        assert!(
            a.bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_'),
            "{a}"
        );
    }

    #[test]
    fn consumer_ids_are_header_values_and_key_parts() {
        for good in ["acme", "user@example.com", "team:42", "a.b-c_d"] {
            assert!(valid_id(good), "{good}");
        }
        for bad in ["", "a b", "a\nb", "ac{me}", &"x".repeat(129), "é"] {
            assert!(!valid_id(bad), "{bad}");
        }
    }
}
