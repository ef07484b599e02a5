//! Each deciding thread's lane: its own connection to this Redis, made on
//! its first decision by a task on its own runtime, and its queue of
//! decisions (see the parent module); the connect itself, and the choice of
//! how calls run the decide code.

use super::batch::Queue;
use super::{RedisLimiter, Target};
use crate::redis::client;
use crate::redis::client::RESPONSE_TIMEOUT;
use crate::redis::lazy::LazyConnection;
use crate::redis::wire::CallForm;
use crate::sync::ReadWriteLocked;
use crate::LimiterError;
use redis::aio::MultiplexedConnection;
use redis::AsyncConnectionConfig;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// How [`RedisLimiter::load_function`] says Redis did not answer in time.
const NO_ANSWER: &str = "no answer within";

/// One thread's connection to this Redis and its queue of decisions to
/// send on it. Only that thread's decisions use it, so its flush loop and
/// the connection's reader run where the decisions are made.
pub(super) struct Lane {
    pub(super) connection: LazyConnection<MultiplexedConnection>,
    pub(super) queue: std::sync::Mutex<Queue>,
}

impl Lane {
    pub(super) fn new() -> Self {
        Self {
            connection: LazyConnection::new(),
            queue: std::sync::Mutex::new(Queue::default()),
        }
    }
}

impl RedisLimiter {
    /// This thread's lane (made on its first use).
    pub(super) fn lane(&self) -> Arc<Lane> {
        self.lanes.get_or(|| Arc::new(Lane::new())).clone()
    }

    /// This thread's connection, if it has one.
    pub(super) fn current(&self) -> Option<MultiplexedConnection> {
        self.lanes.get()?.connection.current()
    }

    /// Some established connection: this thread's, or else any lane's.
    pub(super) fn any_connection(&self) -> Option<MultiplexedConnection> {
        self.current()
            .or_else(|| self.lanes.iter().find_map(|lane| lane.connection.current()))
    }

    /// Forgets every lane's connection: what broke one (Redis gone, a
    /// failover) broke them all; each lane connects again on its next call.
    pub(super) fn drop_connection(&self) {
        for lane in self.lanes.iter() {
            lane.connection.clear();
        }
    }

    /// Another lane with a connection, and that connection: what a thread
    /// whose own lane is still connecting sends on meanwhile, so that a
    /// decision never waits for (or falls back because of) a connect that
    /// another thread no longer needs.
    pub(super) fn connected_lane(&self) -> Option<(Arc<Lane>, MultiplexedConnection)> {
        self.lanes
            .iter()
            .find_map(|lane| Some((lane.clone(), lane.connection.current()?)))
    }

    /// Starts connecting `lane` in the background (on this thread's
    /// runtime), unless it is connected or connecting.
    pub(super) fn connect_soon(&self, lane: &Arc<Lane>) {
        let (this, dialing) = (self.clone(), lane.clone());
        lane.connection.start(move || {
            tokio::spawn(async move { this.dial(dialing).await });
        });
    }

    /// This thread's connection, connecting (once, in the background) if needed.
    pub(super) async fn connection(&self) -> Result<MultiplexedConnection, LimiterError> {
        self.lane_connection(&self.lane()).await
    }

    /// `lane`'s connection, connecting it (once, in the background, on this
    /// thread's runtime) if needed.
    pub(super) async fn lane_connection(
        &self,
        lane: &Arc<Lane>,
    ) -> Result<MultiplexedConnection, LimiterError> {
        let (this, dialing) = (self.clone(), lane.clone());
        let conn = lane
            .connection
            .get(move || {
                tokio::spawn(async move { this.dial(dialing).await });
            })
            .await;
        conn.ok_or_else(|| {
            if self.connect_refused.load(Ordering::Relaxed) {
                LimiterError::Refused("cannot connect to Redis".into())
            } else {
                LimiterError::Io("cannot connect to Redis".into())
            }
        })
    }

    /// One connect attempt of `lane`, ended with [`LazyConnection::finish`].
    pub(super) async fn dial(self, lane: Arc<Lane>) {
        let connect_timeout = self.connect_timeout;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            // Bounds each flush task when Redis stops answering; every request is
            // separately bounded by the (shorter) decision budget.
            .set_response_timeout(Some(RESPONSE_TIMEOUT.max(self.budget)));
        let result = tokio::time::timeout(connect_timeout, async {
            let client = match &self.target {
                Target::Direct(client) => client.clone(),
                Target::Sentinel(sentinel) => sentinel.lock().await.async_get_client().await?,
            };
            let conn = client
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            Ok::<_, redis::RedisError>((conn, client.get_connection_info().addr().to_string()))
        })
        .await;
        let conn = match result {
            Ok(Ok((mut conn, addr))) => {
                log::info!("connected to Redis {addr} {}", self.place);
                self.choose_call_form(&mut conn).await;
                Some(conn)
            }
            Ok(Err(e)) => {
                self.connect_refused
                    .store(e.is_connection_refusal(), Ordering::Relaxed);
                client::connect_failed(&self.place, &e);
                None
            }
            Err(_) => {
                self.connect_refused.store(false, Ordering::Relaxed);
                log::debug!("cannot connect to Redis: no answer within {connect_timeout:?}");
                None
            }
        };
        self.observer.set_up(conn.is_some());
        self.attempted.store(true, Ordering::Release);
        lane.connection.finish(conn);
    }

    /// Loads the decide code as a Redis Function where the server has them
    /// (Redis 7 and later) and calls it with `FCALL` from then on; otherwise
    /// (an older server, `FUNCTION` disabled or denied by an ACL) calls go on
    /// as `EVALSHA` of the script. Either form decides alike. Chosen once,
    /// by the first connect Redis answers; a `FUNCTION LOAD` that gets no
    /// answer (a stall) chooses nothing, and a later connect asks again.
    pub(super) async fn choose_call_form(&self, conn: &mut MultiplexedConnection) {
        if self.form_chosen.load(Ordering::Acquire) {
            return;
        }
        let form = match self.load_function(conn).await {
            Ok(()) => CallForm::Function(self.library.1.clone()),
            Err(e) if e.starts_with(NO_ANSWER) => {
                log::info!(
                    "Redis did not answer FUNCTION LOAD ({e}): asking again on the next connect"
                );
                return;
            }
            Err(e) => {
                log::info!(
                    "Redis Functions not used ({e}): calling the decide script with EVALSHA"
                );
                CallForm::Script(self.script.get_hash().to_string())
            }
        };
        *self.call_form.write_locked() = form;
        self.form_chosen.store(true, Ordering::Release);
    }

    /// `FUNCTION LOAD` of the library; one already loaded is as good.
    pub(super) async fn load_function(
        &self,
        conn: &mut MultiplexedConnection,
    ) -> Result<(), String> {
        let mut command = redis::cmd("FUNCTION");
        command.arg("LOAD").arg(self.library.0.as_str());
        let load = command.query_async::<redis::Value>(conn);
        match tokio::time::timeout(self.connect_timeout, load).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) if e.to_string().contains("already exists") => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("{NO_ANSWER} {:?}", self.connect_timeout)),
        }
    }

    /// Loads the decide code again in the form calls use (Redis lost it).
    pub(super) async fn reload_code(
        &self,
        conn: &mut MultiplexedConnection,
    ) -> Result<(), LimiterError> {
        let form = self.call_form.read_locked().clone();
        match form {
            CallForm::Function(_) => self.load_function(conn).await.map_err(LimiterError::Server),
            CallForm::Script(_) => self
                .script
                .load_async(conn)
                .await
                .map(|_| ())
                .map_err(|e| self.classify(e)),
        }
    }
}
