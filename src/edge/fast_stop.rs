//! A bound on the fast stop (`SIGINT`).
//!
//! On `SIGINT` Pingora drops its runtimes at once without telling the accept
//! loops to stop. A loop whose listener belonged to a runtime that went first
//! then fails every `accept` at once ("Tokio context … being shutdown") and,
//! never waiting, never lets its own thread see that it should stop: under
//! load the process sometimes kept spinning instead of exiting. The watch
//! ends the process [`FAST_STOP_LIMIT`] after `SIGINT` if Pingora has not.
//! A fast stop abandons requests in flight either way; this only bounds it.
//!
//! The handler is installed before the server starts (so a `SIGINT` that
//! arrives before Pingora's own handler is not lost); the thread that waits
//! for it starts with the service, after `--daemon` has forked.

use crate::sync::Locked;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use std::io::Read;
use std::os::unix::net::UnixStream;
use std::sync::Mutex;
use std::time::Duration;

/// How long Pingora's own fast stop may take before the process is ended.
pub const FAST_STOP_LIMIT: Duration = Duration::from_millis(300);

/// Ends the process [`FAST_STOP_LIMIT`] after `SIGINT`.
pub struct FastStopWatch {
    /// Read end of the `SIGINT` self-pipe, until the service takes it.
    interrupts: Mutex<Option<UnixStream>>,
}

impl FastStopWatch {
    /// Installs the `SIGINT` handler now; the watch begins when the service
    /// starts. Pingora's handler still runs: both see every `SIGINT`.
    pub fn new() -> std::io::Result<Self> {
        let (read, write) = UnixStream::pair()?;
        signal_hook::low_level::pipe::register(signal_hook::consts::SIGINT, write)?;
        Ok(Self {
            interrupts: Mutex::new(Some(read)),
        })
    }
}

#[async_trait]
impl BackgroundService for FastStopWatch {
    async fn start(&self, _shutdown: ShutdownWatch) {
        let Some(mut interrupts) = self.interrupts.locked().take() else {
            return;
        };
        // A thread of its own: the runtimes are what may fail to stop.
        let watch = std::thread::Builder::new()
            .name("sluice-fast-stop".into())
            .spawn(move || {
                let mut byte = [0u8; 1];
                if interrupts.read_exact(&mut byte).is_ok() {
                    std::thread::sleep(FAST_STOP_LIMIT);
                    log::warn!("SIGINT: the fast stop took over {FAST_STOP_LIMIT:?}, exiting now");
                    std::process::exit(0);
                }
            });
        if let Err(e) = watch {
            log::warn!("SIGINT stops without a time bound: {e}");
        }
    }
}
