//! Late replies: a decision that ran out of budget was answered by
//! `on_error`, but its script had been sent, and Redis may still run it when
//! a stall ends. Whatever that late run admitted must agree with what the
//! request was really told:
//!
//! - the fallback denied the request (or failed closed): everything Redis
//!   admitted for it is refunded;
//! - the fallback admitted it: Redis counted a request that did pass, which
//!   is right, except for `concurrency` leases: the request's end releases
//!   only the fallback's own leases, so the Redis lease is released at once
//!   instead of being held for `lease`;
//! - the fallback's verdict is not known (yet): leases are released, counts
//!   are kept (stricter, never looser).
//!
//! When no reply comes at all (a stall longer than the connection's response
//! timeout, or a broken connection), whether Redis ran the decision is
//! unknown. A refund that only removes the request's own member
//! (`concurrency`, and `sliding_log` over a sorted set) is the same whether or not Redis ran it, so
//! it is sent anyway, on the same connection, behind the stalled call: Redis
//! runs it after the late decision. A counter's refund would give back units
//! that may never have been taken, so counters keep the stricter rule and
//! are refunded only from a reply that was seen.
//!
//! The [`Decider`](crate::Decider) writes each timed-out decision's verdict
//! into the [`FallbackLedger`]; the Redis backend reads it when a late reply
//! arrives and sends the refund.

use crate::sync::Locked;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Verdicts older than this are of no use: a late reply comes within the
/// connection's response timeout.
const KEEP: Duration = Duration::from_secs(10);
/// Pruning starts above this many entries.
const PRUNE_ABOVE: usize = 4096;

/// The fallback's verdicts on decisions that timed out, by request member.
#[derive(Debug, Default)]
pub struct FallbackLedger {
    verdicts: Mutex<HashMap<String, (bool, Instant)>>,
}

impl FallbackLedger {
    /// Records that `on_error` admitted (`true`) or refused the request
    /// `member` after its Redis decision timed out.
    pub fn record(&self, member: &str, admitted: bool) {
        let now = Instant::now();
        let mut verdicts = self.verdicts.locked();
        if verdicts.len() >= PRUNE_ABOVE {
            verdicts.retain(|_, (_, at)| now.duration_since(*at) < KEEP);
        }
        verdicts.insert(member.to_string(), (admitted, now));
    }

    /// The verdict on `member`, removed; `None` if none was recorded.
    pub fn take(&self, member: &str) -> Option<bool> {
        let mut verdicts = self.verdicts.locked();
        verdicts.remove(member).map(|(admitted, _)| admitted)
    }
}

/// What to give back for a late admission, given the fallback's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refund {
    /// Every limit the request consumed.
    All,
    /// Only `concurrency` leases.
    LeasesOnly,
}

/// How a limit's units are given back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Units {
    /// A `concurrency` lease: the request's own member, removed.
    Lease,
    /// A `sliding_log` entry of a large limit (a sorted set): the
    /// request's own member, removed. (A packed log gives back by stamp:
    /// [`Units::Count`].)
    LogEntry,
    /// A count (every other algorithm): units subtracted.
    Count,
}

impl Refund {
    /// What to refund when the fallback said `verdict`.
    pub fn for_verdict(verdict: Option<bool>) -> Self {
        match verdict {
            Some(false) => Refund::All,
            Some(true) | None => Refund::LeasesOnly,
        }
    }

    /// Whether a limit whose units are `units` is given back, when Redis's
    /// reply was `seen` (it ran the decision and admitted it) or not (it may
    /// have run it or not). A refund sent without a reply must be harmless if
    /// Redis never ran the decision: only removing the request's own member
    /// is.
    pub fn gives_back(self, units: Units, seen: bool) -> bool {
        match (self, units) {
            (_, Units::Lease) => true,
            (Refund::All, Units::LogEntry) => true,
            (Refund::All, Units::Count) => seen,
            (Refund::LeasesOnly, _) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_are_taken_once() {
        let ledger = FallbackLedger::default();
        ledger.record("m-1", false);
        ledger.record("m-2", true);
        assert_eq!(ledger.take("m-1"), Some(false));
        assert_eq!(ledger.take("m-1"), None);
        assert_eq!(ledger.take("m-2"), Some(true));
        assert_eq!(ledger.take("m-3"), None);
    }

    #[test]
    fn what_is_refunded() {
        assert_eq!(Refund::for_verdict(Some(false)), Refund::All);
        assert_eq!(Refund::for_verdict(Some(true)), Refund::LeasesOnly);
        assert_eq!(Refund::for_verdict(None), Refund::LeasesOnly);
    }

    #[test]
    fn without_a_reply_only_members_are_given_back() {
        use Units::*;
        for seen in [true, false] {
            assert!(Refund::All.gives_back(Lease, seen));
            assert!(Refund::All.gives_back(LogEntry, seen));
            assert!(Refund::LeasesOnly.gives_back(Lease, seen));
            assert!(!Refund::LeasesOnly.gives_back(LogEntry, seen));
            assert!(!Refund::LeasesOnly.gives_back(Count, seen));
        }
        assert!(Refund::All.gives_back(Count, true));
        assert!(!Refund::All.gives_back(Count, false));
    }
}
