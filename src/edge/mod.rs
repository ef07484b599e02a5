//! The edge layer: sluice on Pingora's side. [`proxy`] implements
//! `ProxyHttp` and reads as the request's walk: read the request
//! (`request`), judge it (`policy`), answer it ([`respond`]) or forward it
//! ([`attempt`]: each try's server, retries and failures). [`context`] is
//! what one request carries between Pingora's filters. Around the
//! connections: the connection cap and timeouts ([`front_door`]), TLS
//! handshakes and their deadline ([`handshake`], [`tls`]), the settle time
//! before unread connections drop ([`drain`]), `SIGINT` ([`fast_stop`]) and
//! connecting the limiter before the listeners accept ([`warm_up`]).
//!
//! The only layer that touches a Pingora session. May use every layer
//! below it (`policy`, `observe`, `upstream`, `request`, `config`, the
//! limiter and the leaves).

pub mod attempt;
pub mod context;
pub mod drain;
pub mod early_body;
pub mod fast_stop;
pub mod front_door;
pub mod handshake;
pub mod proxy;
pub mod respond;
pub mod shutdown_delay;
pub mod tls;
pub mod warm_up;
