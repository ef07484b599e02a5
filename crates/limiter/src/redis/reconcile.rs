//! Late runs: a decision that ran out of budget was answered by `on_error`,
//! but its script had been sent, and Redis may still run it when a stall
//! ends. What Redis keeps must agree with what the request was really told.
//!
//! A batch carries its deadline on Redis's clock (see `deadline`): Redis
//! skips a batch it runs after it, answering `~` for each decision. A
//! skipped decision changed nothing, so:
//!
//! - the fallback refused the request (or failed closed): nothing to do;
//! - the fallback admitted it: its units are written once, now (`add`, on
//!   the same connection, so after anything Redis still holds), for every
//!   limit but `concurrency` (the request's end releases only the fallback's
//!   own lease, so a Redis lease would be held for `lease`). Redis then
//!   counts exactly the requests that were admitted, whatever the stall's
//!   length.
//!
//! When no reply comes at all (a stall longer than the connection's
//! response timeout, or a broken connection), a batch sent with a deadline
//! is skipped whenever Redis runs it, so it is reconciled as skipped.
//!
//! A decision Redis ran before its deadline whose reply came after the
//! gateway's budget (the reply's trip back was slower than the one the
//! clock was read from), or one sent before the first reply told where
//! Redis's clock stands, is reconciled from what Redis did:
//!
//! - the fallback denied the request (or failed closed): everything Redis
//!   admitted for it is refunded;
//! - the fallback admitted it: Redis counted a request that did pass, which
//!   is right, except for `concurrency` leases, released at once;
//! - the fallback's verdict is not known (yet): leases are released, counts
//!   are kept (stricter, never looser);
//! - no reply and no deadline: a refund that only removes the request's own
//!   member (`concurrency`, and `sliding_log` over a sorted set) is sent,
//!   behind the stalled call; a counter keeps the stricter rule.
//!
//! The [`Decider`](crate::Decider) writes each timed-out decision's verdict
//! into the [`FallbackLedger`]; the Redis backend reads it when a late reply
//! (or the lack of one) arrives. Either may come first: a decision Redis
//! skipped before the fallback's verdict was written waits in the ledger
//! with what to write should the verdict admit it.

use crate::sync::Locked;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Verdicts older than this are of no use: a late reply comes within the
/// connection's response timeout.
const KEEP: Duration = Duration::from_secs(10);
/// Pruning starts above this many entries.
const PRUNE_ABOVE: usize = 4096;

/// What the ledger knows of one timed-out decision.
#[derive(Debug)]
enum Entry {
    /// The fallback's verdict: admitted or not.
    Verdict(bool),
    /// Redis skipped it; what writes its units, should the verdict admit
    /// it (`None`: nothing to write).
    Skipped(Option<redis::Cmd>),
}

/// The fallback's verdicts on decisions that timed out, and the decisions
/// Redis skipped before a verdict was written, by request member.
#[derive(Debug, Default)]
pub struct FallbackLedger {
    entries: Mutex<HashMap<String, (Entry, Instant)>>,
}

impl FallbackLedger {
    /// Records that `on_error` admitted (`true`) or refused the request
    /// `member` after its Redis decision timed out. Returns what writes
    /// its units when Redis already skipped it and the fallback admitted it.
    pub fn record(&self, member: &str, admitted: bool) -> Option<redis::Cmd> {
        let mut entries = self.entries.locked();
        if let Some((Entry::Skipped(write), _)) = entries.remove(member) {
            return write.filter(|_| admitted);
        }
        insert(&mut entries, member, Entry::Verdict(admitted));
        None
    }

    /// Records that Redis skipped `member`'s decision (it ran past its
    /// deadline, or will if ever): `write` writes its units. Returns it when
    /// the fallback's verdict is known and admitted the request; keeps it
    /// until [`FallbackLedger::record`] when the verdict is not known yet.
    pub fn skipped(&self, member: &str, write: Option<redis::Cmd>) -> Option<redis::Cmd> {
        let mut entries = self.entries.locked();
        match entries.remove(member) {
            Some((Entry::Verdict(admitted), _)) => write.filter(|_| admitted),
            _ => {
                insert(&mut entries, member, Entry::Skipped(write));
                None
            }
        }
    }

    /// The verdict on `member`, removed; `None` if none was recorded.
    pub fn take(&self, member: &str) -> Option<bool> {
        let mut entries = self.entries.locked();
        match entries.remove(member) {
            Some((Entry::Verdict(admitted), _)) => Some(admitted),
            Some(skipped) => {
                entries.insert(member.to_string(), skipped);
                None
            }
            None => None,
        }
    }
}

/// Inserts `entry` for `member`, first dropping entries older than
/// [`KEEP`] when the ledger is large.
fn insert(entries: &mut HashMap<String, (Entry, Instant)>, member: &str, entry: Entry) {
    let now = Instant::now();
    if entries.len() >= PRUNE_ABOVE {
        entries.retain(|_, (_, at)| now.duration_since(*at) < KEEP);
    }
    entries.insert(member.to_string(), (entry, now));
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
    fn a_skipped_admission_is_written_once_whichever_comes_first() {
        let ledger = FallbackLedger::default();
        let write = || Some(redis::cmd("PING"));
        // The verdict first, then Redis's skip.
        assert!(ledger.record("m-1", true).is_none());
        assert!(ledger.skipped("m-1", write()).is_some());
        assert!(ledger.skipped("m-1", write()).is_none(), "written once");
        // The skip first, then the verdict.
        assert!(ledger.skipped("m-2", write()).is_none());
        assert!(ledger.record("m-2", true).is_some());
        // Refused: nothing is written, in either order.
        assert!(ledger.record("m-3", false).is_none());
        assert!(ledger.skipped("m-3", write()).is_none());
        assert!(ledger.skipped("m-4", write()).is_none());
        assert!(ledger.record("m-4", false).is_none());
        // A skip is not a verdict.
        assert!(ledger.skipped("m-5", write()).is_none());
        assert_eq!(ledger.take("m-5"), None);
        assert!(ledger.record("m-5", true).is_some(), "still waiting");
    }

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
