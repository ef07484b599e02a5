//! The observing layer: what sluice tells its operators about the traffic it
//! sees. [`metrics`] (the Prometheus registry and every metric's names and
//! labels, label values from the config or fixed sets only), [`access_log`]
//! (the JSON line and its non-blocking writer), [`trace`] (OpenTelemetry
//! spans and their exporter) and [`top_keys`] (the bounded sketches of the
//! keys each limit denied most).
//!
//! May use `config`, the limiter's vocabulary (to report decisions) and the
//! leaves; it decides nothing and never changes a request or a response.

pub mod access_log;
pub mod instance;
pub mod metrics;
pub mod top_keys;
pub mod trace;
