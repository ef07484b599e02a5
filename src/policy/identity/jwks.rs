//! An identity provider's keys kept fresh from its JWKS URL by a thread of
//! their own (the keys themselves are `config::jwks`'s).
//!
//! The fetcher asks the URL at start and every `refresh`, and when a token
//! names a `kid` the set lacks — at most once per `min_refresh`, however many
//! such tokens arrive, so invented `kid`s cannot make sluice hammer the
//! provider. A fetch that fails keeps the last good set (with a warning and
//! a metric). The set is swapped atomically; verifying reads it lock-free.

pub use crate::config::jwks::{KeySet, VerificationKey};
use crate::config::JwksSource;
use crate::observe::metrics::IdentityMetrics;
use arc_swap::ArcSwap;
use jsonwebtoken::Algorithm;
use prometheus::{IntCounter, IntGauge};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Why the JWKS URL's keys were not taken.
#[derive(Debug, thiserror::Error)]
#[error("fetching {url}: {reason}")]
pub(crate) struct FetchError {
    /// The JWKS URL.
    url: String,
    /// What failed.
    reason: String,
}

/// The JWKS metrics of one verifier.
#[derive(Clone)]
struct JwksMetrics {
    fetched: IntCounter,
    failed: IntCounter,
    keys: IntGauge,
    last_success: IntGauge,
}

impl JwksMetrics {
    fn of(metrics: &IdentityMetrics) -> Self {
        Self {
            fetched: metrics.jwks_fetches.with_label_values(&["ok"]),
            failed: metrics.jwks_fetches.with_label_values(&["error"]),
            keys: metrics.jwks_keys.clone(),
            last_success: metrics.jwks_last_success.clone(),
        }
    }
}

/// The last good key set of each JWKS URL in this process: a reload's new
/// verifier starts from it instead of from nothing.
fn last_good() -> &'static Mutex<HashMap<String, Arc<KeySet>>> {
    static LAST_GOOD: OnceLock<Mutex<HashMap<String, Arc<KeySet>>>> = OnceLock::new();
    LAST_GOOD.get_or_init(Mutex::default)
}

/// What the verifier and its fetcher share.
struct Shared {
    /// The keys tokens are verified with (the file's and the URL's).
    current: ArcSwap<KeySet>,
    /// The file's keys, kept under every fetched set.
    file: KeySet,
    /// When a fetch for an unknown `kid` was last asked for (ms since the
    /// verifier started, plus one; 0: never).
    last_asked_ms: AtomicU64,
    started: Instant,
    min_refresh: Duration,
    wake: Option<SyncSender<()>>,
}

/// A verifier's keys: read by `kid`; an unknown `kid` asks the fetcher for a
/// fresh set (at most once per `min_refresh`).
pub(crate) struct Jwks {
    shared: Arc<Shared>,
}

impl Jwks {
    /// Keys from `source`: the file's at once, the URL's from a fetcher
    /// thread that starts now (beginning with the URL's last good set in
    /// this process, if any) and ends when this value is dropped.
    pub fn start(
        source: &JwksSource,
        allowed: &[Algorithm],
        metrics: &IdentityMetrics,
    ) -> Result<Self, crate::config::jwks::JwksError> {
        let file = match &source.file {
            Some(document) => KeySet::parse(document, allowed)?,
            None => KeySet::default(),
        };
        let remembered = source.url.as_ref().and_then(|url| {
            let cache = last_good().lock().ok()?;
            cache.get(url).cloned()
        });
        let current = match &remembered {
            Some(fetched) => file.merged(fetched),
            None => file.merged(&KeySet::default()),
        };
        let (wake, woken) = match source.url {
            Some(_) => {
                let (tx, rx) = mpsc::sync_channel(1);
                (Some(tx), Some(rx))
            }
            None => (None, None),
        };
        let metrics = JwksMetrics::of(metrics);
        metrics.keys.set(current.len() as i64);
        let shared = Arc::new(Shared {
            current: ArcSwap::from_pointee(current),
            file,
            last_asked_ms: AtomicU64::new(0),
            started: Instant::now(),
            min_refresh: source.min_refresh,
            wake,
        });
        if let (Some(url), Some(woken)) = (&source.url, woken) {
            let fetcher = Fetcher {
                url: url.clone(),
                allowed: allowed.to_vec(),
                refresh: source.refresh,
                min_refresh: source.min_refresh,
                shared: Arc::downgrade(&shared),
                metrics,
            };
            let spawned = std::thread::Builder::new()
                .name("sluice-jwks".into())
                .spawn(move || fetcher.run(woken));
            if let Err(e) = spawned {
                log::error!("identity.jwt.jwks_url: cannot start the fetcher thread: {e}");
            }
        }
        Ok(Self { shared })
    }

    /// The key named `kid`; when there is none and the keys come from a URL,
    /// asks for a fresh set, at most once per `min_refresh`.
    pub fn key(&self, kid: &str) -> Option<KeyGuard> {
        let set = self.shared.current.load_full();
        if set.get(kid).is_some() {
            return Some(KeyGuard {
                set,
                kid: kid.to_string(),
            });
        }
        self.ask_for_fresh_keys();
        None
    }

    fn ask_for_fresh_keys(&self) {
        let Some(wake) = &self.shared.wake else {
            return;
        };
        let now = self.shared.started.elapsed().as_millis() as u64 + 1;
        let last = self.shared.last_asked_ms.load(Ordering::Relaxed);
        let due =
            last == 0 || now.saturating_sub(last) >= self.shared.min_refresh.as_millis() as u64;
        if due
            && self
                .shared
                .last_asked_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            // A full channel means a fetch is already asked for.
            let _ = wake.try_send(());
        }
    }
}

/// A key of the current set, held while a token is verified.
pub(crate) struct KeyGuard {
    set: Arc<KeySet>,
    kid: String,
}

impl KeyGuard {
    /// The key (present: the guard is only made for a `kid` the set has).
    pub fn get(&self) -> Option<&VerificationKey> {
        self.set.get(&self.kid)
    }
}

/// Fetches a JWKS URL on its own thread, until its verifier is gone.
struct Fetcher {
    url: String,
    allowed: Vec<Algorithm>,
    refresh: Duration,
    min_refresh: Duration,
    shared: Weak<Shared>,
    metrics: JwksMetrics,
}

/// The longest a fetch may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest JWKS document accepted.
const MAX_DOCUMENT: u64 = 1 << 20;

impl Fetcher {
    fn run(self, woken: Receiver<()>) {
        let client = match reqwest::blocking::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
        {
            Ok(client) => client,
            Err(e) => {
                log::error!("identity.jwt.jwks_url: no HTTP client: {e}");
                return;
            }
        };
        loop {
            let started = Instant::now();
            match self.fetch(&client) {
                Ok(set) => {
                    if !self.install(set) {
                        return;
                    }
                }
                Err(e) => {
                    self.metrics.failed.inc();
                    log::warn!("identity.jwt: {e}; keeping the last good keys");
                }
            }
            // The next fetch: at the refresh, or when a token names an
            // unknown kid, but never sooner than min_refresh after this one.
            let wait = self.refresh.saturating_sub(started.elapsed());
            match woken.recv_timeout(wait) {
                Ok(()) => {
                    let since = started.elapsed();
                    if since < self.min_refresh {
                        std::thread::sleep(self.min_refresh - since);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
            if self.shared.strong_count() == 0 {
                return;
            }
        }
    }

    fn fetch(&self, client: &reqwest::blocking::Client) -> Result<KeySet, FetchError> {
        let failed = |reason: String| FetchError {
            url: self.url.clone(),
            reason,
        };
        let response = client
            .get(&self.url)
            .header("accept", "application/json")
            .send()
            .map_err(|e| failed(e.without_url().to_string()))?;
        if !response.status().is_success() {
            return Err(failed(format!("status {}", response.status())));
        }
        let mut body = Vec::new();
        use std::io::Read as _;
        response
            .take(MAX_DOCUMENT + 1)
            .read_to_end(&mut body)
            .map_err(|e| failed(e.to_string()))?;
        if body.len() as u64 > MAX_DOCUMENT {
            return Err(failed(format!("document over {MAX_DOCUMENT} bytes")));
        }
        let set = KeySet::parse(&body, &self.allowed).map_err(|e| failed(e.to_string()))?;
        for kid in set.ambiguous() {
            log::warn!(
                "identity.jwt.jwks_url: two usable keys share the kid `{kid}`; tokens naming it are refused until the provider's JWKS names one"
            );
        }
        Ok(set)
    }

    /// Makes `set` the verifier's keys; false when the verifier is gone.
    fn install(&self, set: KeySet) -> bool {
        let Some(shared) = self.shared.upgrade() else {
            return false;
        };
        let fetched = Arc::new(set);
        let current = shared.file.merged(&fetched);
        self.metrics.keys.set(current.len() as i64);
        shared.current.store(Arc::new(current));
        if let Ok(mut cache) = last_good().lock() {
            cache.insert(self.url.clone(), fetched);
        }
        self.metrics.fetched.inc();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self.metrics.last_success.set(now as i64);
        true
    }
}
