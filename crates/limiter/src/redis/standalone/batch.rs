//! Batching: decisions that arrive while a call is in flight wait in a
//! queue and travel together in the next call (one script call of up to
//! `MAX_BATCH` decisions); each is answered by its own line of the reply,
//! or at its deadline by `on_error`. A call carries the earliest of its
//! decisions' deadlines on Redis's clock, past which Redis skips it; what a
//! late run (or skip) leaves is reconciled (see `reconcile`).

use super::{KeyPassing, Lane, PendingCall, RedisLimiter, MAX_BATCH};
use crate::redis::reconcile::{Refund, Units};
use crate::redis::wire::{self, is_noscript, parse_batch_line, refund_units};
use crate::sync::Locked;
use crate::sync::ReadWriteLocked;
use crate::Lease;
use crate::LimiterError;
use redis::aio::MultiplexedConnection;
use std::time::Instant;
use tokio::sync::oneshot;

/// Decisions waiting to be sent, and whether a flush loop is running.
#[derive(Default)]
pub(super) struct Queue {
    pub(super) pending: Vec<Queued>,
    pub(super) flushing: bool,
}

/// One decision waiting for the next flush: its keys and its own arguments
/// of the decide script.
pub(super) struct Queued {
    pub(super) keys: Vec<String>,
    pub(super) args: Vec<Vec<u8>>,
    /// When its budget runs out.
    pub(super) deadline: Instant,
    /// Taken when it is answered (by its reply, or at its deadline).
    pub(super) reply: Option<oneshot::Sender<Answer>>,
    /// The decisions sent in the same round trip (0 until it is sent).
    pub(super) batch: usize,
    /// Sent with a deadline on Redis's clock: Redis skips it if it runs it
    /// after the gateway gave up.
    pub(super) skippable: bool,
}

/// A decision's reply, and the size of the batch it went in (0: never sent).
pub(super) type Answer = (Result<Vec<i64>, LimiterError>, usize);

impl Queued {
    /// Answers the decision, unless it already was.
    pub(super) fn answer(&mut self, result: Result<Vec<i64>, LimiterError>) {
        if let Some(reply) = self.reply.take() {
            let _ = reply.send((result, self.batch));
        }
    }
}

impl RedisLimiter {
    /// Sends `lane`'s queued decisions, one pipeline at a time, until its
    /// queue is empty.
    pub(super) async fn flush_loop(
        self,
        lane: std::sync::Arc<Lane>,
        mut conn: MultiplexedConnection,
    ) {
        loop {
            let batch = {
                let mut queue = lane.queue.locked();
                if queue.pending.is_empty() {
                    queue.flushing = false;
                    return;
                }
                std::mem::take(&mut queue.pending)
            };
            if let Some(current) = lane.connection.current() {
                conn = current;
            }
            self.send_batch(&mut conn, batch).await;
        }
    }

    /// Sends one batch (one script call per [`MAX_BATCH`] decisions, in one
    /// pipeline) and hands out the replies.
    pub(super) async fn send_batch(&self, conn: &mut MultiplexedConnection, batch: Vec<Queued>) {
        // Decisions out of budget are answered now and never sent: they must
        // not consume quota after their client was answered by on_error.
        let now = Instant::now();
        let (late, live): (Vec<Queued>, Vec<Queued>) =
            batch.into_iter().partition(|queued| queued.deadline <= now);
        for mut queued in late {
            queued.answer(Err(LimiterError::Timeout(self.budget)));
        }
        let mut batch: Vec<Queued> = live
            .into_iter()
            .filter(|queued| queued.reply.as_ref().is_some_and(|r| !r.is_closed()))
            .collect();
        // The call may run until its last decision's deadline; each decision
        // is answered by its own (see run_answering_expired).
        let Some(deadline) = batch.iter().map(|q| q.deadline).max() else {
            return;
        };
        let size = batch.len();
        for queued in &mut batch {
            queued.batch = size;
        }
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        let mut chunks = Vec::with_capacity(batch.len().div_ceil(MAX_BATCH));
        while !batch.is_empty() {
            let rest = batch.split_off(batch.len().min(MAX_BATCH));
            let earliest = batch.iter().map(|q| q.deadline).min();
            let redis_deadline = earliest.and_then(|at| self.clock.deadline(at));
            for queued in &mut batch {
                queued.skippable = redis_deadline.is_some();
            }
            pipe.add_command(self.batch_command(&batch, redis_deadline));
            chunks.push(std::mem::replace(&mut batch, rest));
        }
        let call = {
            let (mut conn, pipe) = (conn.clone(), pipe.clone());
            Box::pin(async move {
                pipe.query_async::<Vec<redis::RedisResult<redis::Value>>>(&mut conn)
                    .await
            })
        };
        let answered = self.answer_expired_while(call, conn, deadline, &mut chunks);
        let Some(results) = answered.await else {
            return;
        };
        let results = self.rerun_lost(conn, &pipe, results, deadline).await;
        match results {
            Ok(values) => {
                for (chunk, value) in chunks.into_iter().zip(values) {
                    self.hand_out(chunk, value, conn);
                }
            }
            Err(e) => {
                for mut queued in chunks.into_iter().flatten() {
                    queued.answer(Err(e.clone()));
                }
            }
        }
    }

    /// NOSCRIPT: Redis lost the script (restart, SCRIPT FLUSH). Loads it
    /// once and runs again only the calls of `pipe` that did not execute.
    pub(super) async fn rerun_lost(
        &self,
        conn: &mut MultiplexedConnection,
        pipe: &redis::Pipeline,
        results: Result<Vec<redis::RedisResult<redis::Value>>, LimiterError>,
        deadline: Instant,
    ) -> Result<Vec<redis::RedisResult<redis::Value>>, LimiterError> {
        let lost: Vec<usize> = match &results {
            Ok(values) => values
                .iter()
                .enumerate()
                .filter(|(_, v)| is_noscript(v))
                .map(|(i, _)| i)
                .collect(),
            Err(_) => Vec::new(),
        };
        if lost.is_empty() {
            return results;
        }
        log::info!("Redis has no sluice script (restarted?): loading it");
        let mut retry = redis::pipe();
        retry.ignore_errors();
        let commands: Vec<&redis::Cmd> = pipe.cmd_iter().collect();
        for &i in &lost {
            retry.add_command(commands[i].clone());
        }
        let load = tokio::time::timeout_at(deadline.into(), self.reload_code(conn));
        let reloaded = match load.await {
            Ok(Ok(())) => self.run(conn, &retry, deadline).await,
            Ok(Err(e)) => Err(e),
            Err(_) => Err(LimiterError::Timeout(self.budget)),
        };
        match (results, reloaded) {
            (Ok(mut values), Ok(again)) => {
                for (&i, value) in lost.iter().zip(again) {
                    values[i] = value;
                }
                Ok(values)
            }
            (_, Err(e)) | (Err(e), _) => Err(e),
        }
    }

    /// Waits for `call` until `deadline` (the latest of its decisions'),
    /// answering each decision whose own deadline passes first with a
    /// timeout: no decision waits past its budget, and none fails because
    /// another member of its batch ran out of budget. Once every decision
    /// has been answered, the call is left to finish in the background
    /// (bounded by the connection's response timeout) so that what Redis
    /// admits late is reconciled, with or without a reply (see `reconcile`);
    /// then `None`.
    pub(super) async fn answer_expired_while(
        &self,
        mut call: PendingCall,
        conn: &MultiplexedConnection,
        deadline: Instant,
        chunks: &mut Vec<Vec<Queued>>,
    ) -> Option<Result<Vec<redis::RedisResult<redis::Value>>, LimiterError>> {
        loop {
            let next = chunks
                .iter()
                .flatten()
                .filter(|q| q.reply.is_some())
                .map(|q| q.deadline)
                .min();
            let Some(next) = next else {
                let (this, conn) = (self.clone(), conn.clone());
                let mut chunks = std::mem::take(chunks);
                tokio::spawn(async move {
                    match call.await {
                        Ok(values) => {
                            for (chunk, value) in chunks.into_iter().zip(values) {
                                this.hand_out(chunk, value, &conn);
                            }
                        }
                        Err(_) => {
                            for queued in chunks.iter_mut().flatten() {
                                if queued.skippable {
                                    this.skipped(queued, &conn);
                                } else {
                                    this.reconcile(queued, None, &conn);
                                }
                            }
                        }
                    }
                });
                return None;
            };
            tokio::select! {
                biased;
                result = &mut call => return Some(result.map_err(|e| self.classify(e))),
                _ = tokio::time::sleep_until(next.min(deadline).into()) => {
                    let now = Instant::now();
                    for queued in chunks.iter_mut().flatten().filter(|q| q.deadline <= now) {
                        queued.answer(Err(LimiterError::Timeout(self.budget)));
                    }
                }
            }
        }
    }

    /// Gives back, on `conn`, what Redis admitted late for a decision
    /// already answered by `on_error`: `late` is Redis's clock when it ran
    /// it, from its reply, or `None` when no reply came and whether it ran
    /// is unknown (then only what is harmless to give back twice; see
    /// `reconcile.rs`). Sent on the connection the decision went on, so that
    /// Redis runs the refund after the late decision.
    pub(super) fn reconcile(
        &self,
        queued: &Queued,
        late: Option<i64>,
        conn: &MultiplexedConnection,
    ) {
        let member = queued
            .args
            .first()
            .map(|m| String::from_utf8_lossy(m).into_owned());
        let Some(member) = member else {
            return;
        };
        let refund = Refund::for_verdict(self.ledger.take(&member));
        let gives_back = |limit: &[Vec<u8>]| refund.gives_back(refund_units(limit), late.is_some());
        let Some(command) = self.own_call(queued, &member, "refund", late.unwrap_or(0), gives_back)
        else {
            return;
        };
        log::debug!("Redis ran (or may have run) a timed-out decision late: refunding ({refund:?}) for {member}");
        let mut conn = conn.clone();
        tokio::spawn(async move {
            if let Err(e) = command.query_async::<redis::Value>(&mut conn).await {
                log::debug!("refund of a late admission failed (leases expire by themselves): {e}");
            }
        });
    }

    /// A decision Redis skipped (or will skip, if it ever runs it): it
    /// changed nothing. Answered by `on_error` now if it was not yet; its
    /// units are written once the fallback's verdict admits it.
    pub(super) fn skipped(&self, queued: &mut Queued, conn: &MultiplexedConnection) {
        let Some(member) = queued.args.first() else {
            return;
        };
        let member = String::from_utf8_lossy(member).into_owned();
        let write = self.admission_write(queued, &member);
        if let Some(write) = self.ledger.skipped(&member, write) {
            self.send_write(write, conn);
        }
        queued.answer(Err(LimiterError::Timeout(self.budget)));
    }

    /// What writes the units `queued` takes (`add`), for every limit but a
    /// `concurrency` lease; `None` when that leaves nothing.
    fn admission_write(&self, queued: &Queued, member: &str) -> Option<redis::Cmd> {
        let not_a_lease = |limit: &[Vec<u8>]| refund_units(limit) != Units::Lease;
        self.own_call(queued, member, "add", 0, not_a_lease)
    }

    /// A single-decision call of `op` at `time` for `member` on the limits
    /// of `queued` that `keep` keeps; `None` when it keeps none (or the
    /// decision's arguments are short of its keys).
    fn own_call(
        &self,
        queued: &Queued,
        member: &str,
        op: &str,
        time: i64,
        keep: impl Fn(&[Vec<u8>]) -> bool,
    ) -> Option<redis::Cmd> {
        let mut keys = Vec::new();
        let mut limits = Vec::new();
        for (i, key) in queued.keys.iter().enumerate() {
            let limit = queued.args.get(3 + 6 * i..9 + 6 * i)?;
            if keep(limit) {
                keys.push(key.as_str());
                limits.push(limit);
            }
        }
        if keys.is_empty() {
            return None;
        }
        let mut command = self.call_with_keys(&keys);
        command.arg(member).arg(op).arg(time);
        for arg in limits.into_iter().flatten() {
            command.arg(arg.as_slice());
        }
        Some(command)
    }

    /// Sends `write` on `conn` (behind anything Redis still holds of it).
    pub(super) fn send_write(&self, write: redis::Cmd, conn: &MultiplexedConnection) {
        log::debug!("Redis skipped a timed-out decision the fallback admitted: writing its units");
        let mut conn = conn.clone();
        tokio::spawn(async move {
            if let Err(e) = write.query_async::<redis::Value>(&mut conn).await {
                log::warn!(
                    "could not write a request the fallback admitted during a Redis stall: {e}"
                );
            }
        });
    }

    /// A call of the decide code on `keys`; its arguments follow.
    pub(super) fn call_with_keys(&self, keys: &[&str]) -> redis::Cmd {
        let form = self.call_form.read_locked();
        match self.keys {
            KeyPassing::Declared => {
                let mut command = form.command(keys.len());
                command.arg(keys);
                command
            }
            KeyPassing::AsArguments => {
                let mut command = form.command(0);
                command.arg("@").arg(keys.len()).arg(keys);
                command
            }
        }
    }

    /// The decide code's renewal of `leases` (see `lua/decide.lua`).
    pub(super) fn renewal_command(&self, leases: &[Lease]) -> redis::Cmd {
        let keys: Vec<&str> = leases.iter().map(|l| l.key.as_str()).collect();
        let mut command = self.call_with_keys(&keys);
        command.arg("~");
        for lease in leases {
            command
                .arg(lease.member.as_str())
                .arg(lease.lease.as_micros() as u64)
                .arg(lease.cost);
        }
        command
    }

    /// The decide call in batch mode for `chunk`, skipped by Redis past
    /// `deadline` (on its clock), if one is given.
    pub(super) fn batch_command(&self, chunk: &[Queued], deadline: Option<i64>) -> redis::Cmd {
        let keys: Vec<&str> = chunk
            .iter()
            .flat_map(|q| q.keys.iter().map(String::as_str))
            .collect();
        let mut command = self.call_with_keys(&keys);
        let decisions = chunk.iter().map(|q| (q.keys.len(), q.args.as_slice()));
        wire::push_batch(&mut command, deadline, decisions);
        command
    }

    /// Gives each decision of `chunk` its own reply (or error) from the
    /// batch call's reply: one line per decision.
    pub(super) fn hand_out(
        &self,
        chunk: Vec<Queued>,
        value: redis::RedisResult<redis::Value>,
        conn: &MultiplexedConnection,
    ) {
        let text = match value {
            Ok(redis::Value::BulkString(text)) => text,
            Ok(other) => {
                let error = LimiterError::Server(format!("unexpected batch reply: {other:?}"));
                for mut queued in chunk {
                    queued.answer(Err(error.clone()));
                }
                return;
            }
            Err(e) => {
                let error = self.classify(e);
                for mut queued in chunk {
                    queued.answer(Err(error.clone()));
                }
                return;
            }
        };
        let mut lines = text.split(|&b| b == b'\n');
        let now = lines
            .next()
            .and_then(|line| std::str::from_utf8(line).ok()?.parse::<i64>().ok());
        if let Some(now) = now {
            self.clock.observe(now, Instant::now());
        }
        for mut queued in chunk {
            let line = lines.next();
            if line == Some(&b"~"[..]) {
                self.skipped(&mut queued, conn);
                continue;
            }
            let decoded = match (line, now) {
                (Some(line), Some(now)) => parse_batch_line(line, now),
                (_, None) => Err(LimiterError::Server("batch reply without its time".into())),
                (None, _) => Err(LimiterError::Server("batch reply too short".into())),
            };
            match (&queued.reply, &decoded) {
                // Answered by on_error already, and Redis admitted it.
                (None, Ok(values)) if values.first() == Some(&1) => {
                    self.reconcile(&queued, Some(values.get(1).copied().unwrap_or(0)), conn);
                }
                _ => queued.answer(decoded),
            }
        }
    }
}
