//! `SIGHUP` reload (docs/operations.md), and with `server.watch_config` a reload
//! when the file changes: read and validate the file again, build a new
//! [`GatewayState`] and swap it in for new requests.
//!
//! Any error — unreadable file, invalid config, key material that does not
//! parse — leaves the running state untouched, is logged with its
//! `path:line:column`, and counts `sluice_config_reloads_total{result="failure"}`.
//! Settings only a restart can apply (listeners, threads, …) are reported and
//! keep their running values.

use crate::admin::config_status::ConfigStatus;
use crate::admin::watch::{ConfigWatch, POLL};
use crate::config::diff::{diff, ConfigDiff};
use crate::config::{Config, ConfigError};
use crate::observe::metrics::Metrics;
use crate::policy::state::{BuildError, GatewayState, SharedState};
use crate::sync::Locked;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use tokio::io::AsyncReadExt;

/// Why a reload was refused.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The file could not be read or is invalid.
    #[error("{0}")]
    Config(#[from] ConfigError),
    /// The configuration is valid but could not be put into service.
    #[error("{path}: {source}")]
    Build {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: BuildError,
    },
}

/// Reloads the configuration file into the shared state.
pub struct Reloader {
    job: ReloadJob,
    /// Read end of the SIGHUP self-pipe, until the service takes it.
    hangups: Mutex<Option<UnixStream>>,
    /// The watch of the files as loaded at start, until the service takes
    /// it (taken at start, a change made before the service ran counts).
    watch: Mutex<Option<ConfigWatch>>,
}

/// The rules files the configuration of `state` names, watched with it.
fn watched_rules(state: &SharedState) -> Vec<PathBuf> {
    let state = state.load();
    let rules = state.config.server.rls.iter();
    rules.map(|r| PathBuf::from(&r.config_path)).collect()
}

/// What one reload needs; cheap to clone onto a blocking thread (loading
/// reads a file and resolves upstream names, which must not stall a runtime).
#[derive(Clone)]
struct ReloadJob {
    path: PathBuf,
    state: SharedState,
    metrics: Arc<Metrics>,
    status: Arc<ConfigStatus>,
}

impl Reloader {
    /// A reloader of the file at `path`. Installs the `SIGHUP` handler now, so
    /// that a `SIGHUP` arriving at any time after this call (even before the
    /// service runs) triggers a reload rather than the default action, which
    /// would end the process. Each reload's outcome is recorded in its
    /// [`status`](Self::status).
    pub fn new(path: PathBuf, state: SharedState, metrics: Arc<Metrics>) -> std::io::Result<Self> {
        let status = Arc::new(ConfigStatus::new(&path));
        let (read, write) = UnixStream::pair()?;
        read.set_nonblocking(true)?;
        signal_hook::low_level::pipe::register(signal_hook::consts::SIGHUP, write)?;
        let mut watch = ConfigWatch::new(&path);
        watch.also(watched_rules(&state));
        Ok(Self {
            watch: Mutex::new(Some(watch)),
            job: ReloadJob {
                path,
                state,
                metrics,
                status,
            },
            hangups: Mutex::new(Some(read)),
        })
    }

    /// Reloads now: on success the new state serves the next request and the
    /// changes are returned; on failure nothing changes. Either way the
    /// outcome is counted. Blocks while the file is read and names resolve.
    pub fn reload(&self) -> Result<ConfigDiff, ReloadError> {
        self.job.reload()
    }

    /// The running file's generation and its reloads' outcomes.
    pub fn status(&self) -> Arc<ConfigStatus> {
        Arc::clone(&self.job.status)
    }
}

impl ReloadJob {
    fn reload(&self) -> Result<ConfigDiff, ReloadError> {
        let result = self.try_reload();
        let label = if result.is_ok() { "success" } else { "failure" };
        self.metrics
            .config_reloads
            .with_label_values(&[label])
            .inc();
        result
    }

    fn try_reload(&self) -> Result<ConfigDiff, ReloadError> {
        let config = Config::load(&self.path)?;
        let current = self.state.load_full();
        let changes = diff(&current.config, &config);
        for warning in &config.warnings {
            log::warn!("{warning}");
        }
        let mut next =
            GatewayState::build(config, &self.metrics, Some(&current)).map_err(|source| {
                ReloadError::Build {
                    path: self.path.clone(),
                    source,
                }
            })?;
        // Of the server settings only `access_log`, the front-door limits,
        // `server_header`, `watch_config` and the TLS listeners' certificates
        // and client-certificate rules are reloadable
        // (new connections and handshakes take them); the others keep their
        // running values (reported in `changes.needs_restart`).
        let reloaded = std::mem::replace(&mut next.config.server, current.config.server.clone());
        let server = &mut next.config.server;
        server.access_log = reloaded.access_log;
        server.front_door = reloaded.front_door;
        server.server_header = reloaded.server_header;
        server.watch_config = reloaded.watch_config;
        for listener in &mut server.tls {
            if let Some(new) = reloaded.tls.iter().find(|n| n.listen == listener.listen) {
                listener.certs = new.certs.clone();
                listener.client_auth = new.client_auth.clone();
            }
        }
        // The rate-limit service takes its new rules, defaults and
        // certificates; its address, and TLS on or off, need a restart.
        if let (Some(running), Some(mut new)) = (&mut server.rls, reloaded.rls) {
            new.listen = running.listen.clone();
            match (&running.tls, &mut new.tls) {
                (Some(_), Some(tls)) => tls.listen = running.listen.clone(),
                _ => new.tls = running.tls.clone(),
            }
            *running = new;
        }
        next.rls = crate::policy::state::CompiledRls::build(&next.config, &self.metrics);
        self.state.store(Arc::new(next));
        Ok(changes)
    }

    /// Reloads and logs the outcome, and why it reloads (`cause`).
    fn reload_and_log(&self, cause: &str) {
        log::info!("{cause}: reloading {}", self.path.display());
        let result = self.reload();
        match &result {
            Ok(changes) => self.status.reloaded(
                cause,
                changes.applied.clone(),
                changes.needs_restart.clone(),
            ),
            Err(e) => self
                .status
                .refused(cause, e.to_string().lines().map(str::to_string).collect()),
        }
        match result {
            Ok(changes) => {
                if changes.is_empty() {
                    log::info!("config reloaded: no changes");
                } else {
                    log::info!("config reloaded: {} change(s)", changes.applied.len());
                }
                for change in &changes.applied {
                    log::info!("  {change}");
                }
                for setting in &changes.needs_restart {
                    log::warn!(
                        "{setting} changed in {}: it takes effect only after a restart or an upgrade (--upgrade); the running value is kept",
                        self.path.display()
                    );
                }
            }
            Err(e) => log::error!("config reload failed; still serving the previous config:\n{e}"),
        }
    }
}

#[async_trait]
impl BackgroundService for Reloader {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let taken = self.hangups.locked().take();
        let Some(read) = taken else {
            return;
        };
        let mut hangups = match tokio::net::UnixStream::from_std(read) {
            Ok(stream) => stream,
            Err(e) => {
                log::error!("SIGHUP reload is unavailable: {e}");
                return;
            }
        };
        let mut buffer = [0u8; 64];
        let taken = self.watch.locked().take();
        let mut watch = taken.unwrap_or_else(|| ConfigWatch::new(&self.job.path));
        loop {
            let cause = tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(POLL) => {
                    watch.also(watched_rules(&self.job.state));
                    let watching = self.job.state.load().config.server.watch_config;
                    if !(watching && watch.changed()) {
                        continue;
                    }
                    "config file changed"
                }
                read = hangups.read(&mut buffer) => match read {
                    // Several signals may have arrived at once: one reload
                    // reads the file as it is now, which covers them all.
                    // The watch takes the file as it is now, before the
                    // reload reads it: a change made during the reload is
                    // then still a change (taking it after could swallow it).
                    Ok(n) if n > 0 => {
                        watch.reloaded();
                        "SIGHUP"
                    }
                    Ok(_) => return,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        log::error!("SIGHUP reload stopped: {e}");
                        return;
                    }
                },
            };
            let job = self.job.clone();
            if let Err(e) = tokio::task::spawn_blocking(move || job.reload_and_log(cause)).await {
                log::error!("config reload did not finish: {e}");
            }
            self.job.state.load_full().report_consumer_plans().await;
        }
    }
}
