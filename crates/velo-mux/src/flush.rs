//! The flush policy: when a lane's pending records become a batch on the wire.
//!
//! The policy is data plus one pure function, [`FlushPolicy::decide`], so it is tested on its
//! own and the mux only feeds it facts.

use std::time::{Duration, Instant};

use crate::config::ConfigError;

/// Default maximum delay before a batch is written: 5 ms (Dynamo PR #15231's
/// `DYN_VELO_RESPONSE_BATCH_MS` default).
pub const DEFAULT_MAX_DELAY: Duration = Duration::from_millis(5);
/// Default batch size cap: 64 KiB, one socket read on the frontend.
pub const DEFAULT_MAX_BATCH_BYTES: usize = 64 * 1024;
/// Default batch record cap: 1,024 records, about 100 KiB of 100-byte items.
pub const DEFAULT_MAX_BATCH_RECORDS: u32 = 1024;

/// When pending records are flushed into a batch.
///
/// A batch is flushed when the first of these happens:
/// - control records are pending that must not wait (stop, cancel, heartbeat, goaway);
/// - a stream's edge records are pending (its first item, its FINAL or ERROR, and with
///   `eager_opens` its OPEN) and `eager_edges` is on (the default), so the first token and
///   the end never wait for a batch;
/// - the application asked for it with a flush hint (an engine does so once per forward pass,
///   so batching then adds no delay at all);
/// - the batch reached `max_batch_bytes` or `max_batch_records`;
/// - its oldest record has waited `max_delay` (`Duration::ZERO` is *greedy*: flush as soon as
///   anything is pending), or queued credit grants reached their own deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlushPolicy {
    /// Longest time a record waits for its batch to fill.
    pub max_delay: Duration,
    /// Size at which a batch is flushed regardless of time, in bytes.
    pub max_batch_bytes: usize,
    /// Record count at which a batch is flushed regardless of time.
    pub max_batch_records: u32,
    /// Flush a stream's edge records at once, whatever `max_delay` says: its OPEN (the
    /// prologue), its first item (the first token: TTFT) and its end (FINAL or ERROR: the
    /// request's completion). Those are what users feel; the items in between batch as
    /// usual. On by default. (Delaying ends also makes a closed-loop load send its next
    /// requests in clumps, which lengthens prefill passes and so every TTFT.)
    pub eager_edges: bool,
    /// With `eager_edges` on, whether a stream's end (FINAL or ERROR) is an edge too. Off,
    /// ends wait for their batch like the items between (the prologue and the first item
    /// still go at once): a request completes up to `max_delay` later, and a closed-loop
    /// client's next requests then arrive together. On by default.
    pub eager_ends: bool,
    /// With `eager_edges` on, whether a stream's OPEN (its prologue) is an edge too. Off, the
    /// OPEN waits for its batch, and goes at the latest with the stream's first item (an
    /// edge) or after `max_delay`: the first token and the end are as prompt as before, and
    /// a stream costs one eager batch fewer (a write, a packet and a reader wake-up on each
    /// side), for a prologue that reaches the frontend up to `max_delay` later. Off by
    /// default: at concurrency 256 on a 1,500-byte-MTU network, 16% fewer packets and 10%
    /// less frontend CPU per token, TTFT unchanged, the prologue's p50 0.1 -> 1.8 ms.
    pub eager_opens: bool,
}

impl Default for FlushPolicy {
    fn default() -> Self {
        Self {
            max_delay: DEFAULT_MAX_DELAY,
            max_batch_bytes: DEFAULT_MAX_BATCH_BYTES,
            max_batch_records: DEFAULT_MAX_BATCH_RECORDS,
            eager_edges: true,
            eager_ends: true,
            eager_opens: false,
        }
    }
}

/// Facts about a lane's pending records, as the mux sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pending {
    /// Records waiting in the open batch.
    pub records: u32,
    /// Bytes waiting in the open batch.
    pub bytes: usize,
    /// When the oldest waiting data record was queued.
    pub oldest: Option<Instant>,
    /// When queued credit grants must go out at the latest.
    pub grant_deadline: Option<Instant>,
    /// Control records that must not wait are pending.
    pub urgent: bool,
    /// The application asked for a flush.
    pub hinted: bool,
    /// A stream's first item is pending (see [`FlushPolicy::eager_edges`]).
    pub edge: bool,
    /// A stream's OPEN is pending (see [`FlushPolicy::eager_opens`]).
    pub open_edge: bool,
    /// A stream's end (FINAL or ERROR) is pending (see [`FlushPolicy::eager_ends`]).
    pub end_edge: bool,
    /// A stream spent half of its credit window, or the last of it, on a pending record. The
    /// frontend returns credit only for records it has read, so a stream that sends faster
    /// than the batch delay would wait out the rest of the delay with nothing left to send:
    /// the batch goes at once, under every policy. A stream crosses these marks at most
    /// twice per window, so batches still carry at least half a window of its records.
    pub credit_low: bool,
}

/// What the policy decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flush {
    /// Nothing is pending.
    Idle,
    /// Flush now, for this reason.
    Now(FlushReason),
    /// Flush at this instant unless something else triggers it first.
    At(Instant),
}

/// Why a batch was flushed, counted in [`MuxStats`](crate::MuxStats).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FlushReason {
    /// Control records that must not wait.
    Control,
    /// The application's flush hint.
    Hint,
    /// The batch reached its byte or record cap.
    Size,
    /// The oldest record (or a queued grant) reached its maximum delay.
    Deadline,
    /// Greedy policy: data was pending.
    Greedy,
    /// A stream's edge records (its OPEN with the prologue, its first item, its end) went
    /// out without waiting.
    Edge,
    /// A stream spent half of its credit window or the last of it ([`Pending::credit_low`]).
    Credit,
}

impl FlushReason {
    /// Every reason, in the order of [`MuxStats::flushes`](crate::MuxStats::flushes).
    pub const ALL: [Self; 7] = [
        Self::Control,
        Self::Hint,
        Self::Size,
        Self::Deadline,
        Self::Greedy,
        Self::Edge,
        Self::Credit,
    ];

    /// A short lower-case name for logs and metrics labels.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Control => "control",
            Self::Hint => "hint",
            Self::Size => "size",
            Self::Deadline => "deadline",
            Self::Greedy => "greedy",
            Self::Edge => "edge",
            Self::Credit => "credit",
        }
    }
}

impl FlushPolicy {
    /// A greedy policy: flush whenever anything is pending.
    pub fn greedy() -> Self {
        Self {
            max_delay: Duration::ZERO,
            ..Self::default()
        }
    }

    /// The default policy with another maximum delay.
    pub fn with_max_delay(max_delay: Duration) -> Self {
        Self {
            max_delay,
            ..Self::default()
        }
    }

    /// Decides whether `pending` should be flushed at `now`.
    pub fn decide(&self, pending: &Pending, now: Instant) -> Flush {
        if pending.urgent {
            return Flush::Now(FlushReason::Control);
        }
        if pending.records == 0 {
            return Flush::Idle;
        }
        if pending.hinted {
            return Flush::Now(FlushReason::Hint);
        }
        if pending.credit_low {
            return Flush::Now(FlushReason::Credit);
        }
        if self.eager_edges
            && (pending.edge
                || (pending.end_edge && self.eager_ends)
                || (pending.open_edge && self.eager_opens))
        {
            return Flush::Now(FlushReason::Edge);
        }
        if pending.bytes >= self.max_batch_bytes || pending.records >= self.max_batch_records {
            return Flush::Now(FlushReason::Size);
        }
        let data_deadline = match pending.oldest {
            Some(_) if self.max_delay.is_zero() => return Flush::Now(FlushReason::Greedy),
            Some(oldest) => Some(oldest + self.max_delay),
            None => None,
        };
        let deadline = match (data_deadline, pending.grant_deadline) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).unwrap_or(now),
        };
        if deadline <= now {
            Flush::Now(FlushReason::Deadline)
        } else {
            Flush::At(deadline)
        }
    }

    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        if self.max_delay > Duration::from_secs(10) {
            return Err(ConfigError::OutOfRange {
                field: "flush max_delay",
                value: format!("{:?}", self.max_delay),
                allowed: "must be at most 10 s",
            });
        }
        if self.max_batch_bytes < 1024 {
            return Err(ConfigError::OutOfRange {
                field: "flush max_batch_bytes",
                value: self.max_batch_bytes.to_string(),
                allowed: "must be at least 1024 bytes",
            });
        }
        if self.max_batch_records == 0 {
            return Err(ConfigError::OutOfRange {
                field: "flush max_batch_records",
                value: "0".into(),
                allowed: "must be at least 1",
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    /// The epoch of a virtual clock (never read again).
    fn epoch() -> Instant {
        #[allow(clippy::disallowed_methods)]
        Instant::now()
    }

    /// One 40-byte record, queued at `t0`.
    fn one_record(t0: Instant) -> Pending {
        Pending {
            records: 1,
            bytes: 40,
            oldest: Some(t0),
            ..Pending::default()
        }
    }

    fn check(policy: FlushPolicy, pending: Pending, now: Instant, expect: Flush) {
        assert_eq!(policy.decide(&pending, now), expect, "{pending:?}");
    }

    #[test]
    fn nothing_pending_is_idle() {
        let t0 = epoch();
        check(FlushPolicy::default(), Pending::default(), t0, Flush::Idle);
        check(FlushPolicy::greedy(), Pending::default(), t0, Flush::Idle);
    }

    #[test]
    fn a_record_waits_at_most_max_delay() {
        let t0 = epoch();
        let p = one_record(t0);
        let policy = FlushPolicy::default();
        check(policy, p, t0, Flush::At(at(t0, 5)));
        check(policy, p, at(t0, 4), Flush::At(at(t0, 5)));
        check(policy, p, at(t0, 5), Flush::Now(FlushReason::Deadline));
        check(policy, p, at(t0, 50), Flush::Now(FlushReason::Deadline));
    }

    #[test]
    fn greedy_flushes_whenever_data_is_pending() {
        let t0 = epoch();
        let p = one_record(t0);
        check(
            FlushPolicy::greedy(),
            p,
            t0,
            Flush::Now(FlushReason::Greedy),
        );
    }

    #[test]
    fn hints_and_control_flush_immediately() {
        let t0 = epoch();
        let p = Pending {
            records: 3,
            bytes: 300,
            oldest: Some(t0),
            hinted: true,
            ..Pending::default()
        };
        check(FlushPolicy::default(), p, t0, Flush::Now(FlushReason::Hint));
        let c = Pending {
            records: 1,
            bytes: 1,
            urgent: true,
            ..Pending::default()
        };
        check(
            FlushPolicy::default(),
            c,
            t0,
            Flush::Now(FlushReason::Control),
        );
        // A hint with nothing pending does nothing.
        let h = Pending {
            hinted: true,
            ..Pending::default()
        };
        check(FlushPolicy::default(), h, t0, Flush::Idle);
    }

    #[test]
    fn size_caps_flush_before_the_deadline() {
        let t0 = epoch();
        let policy = FlushPolicy::default();
        let bytes = Pending {
            records: 10,
            bytes: policy.max_batch_bytes,
            oldest: Some(t0),
            ..Pending::default()
        };
        check(policy, bytes, t0, Flush::Now(FlushReason::Size));
        let recs = Pending {
            records: policy.max_batch_records,
            bytes: 10,
            oldest: Some(t0),
            ..Pending::default()
        };
        check(policy, recs, t0, Flush::Now(FlushReason::Size));
    }

    #[test]
    fn a_streams_edge_records_flush_at_once_unless_turned_off() {
        let t0 = epoch();
        let p = Pending {
            edge: true,
            ..one_record(t0)
        };
        check(FlushPolicy::default(), p, t0, Flush::Now(FlushReason::Edge));
        let off = FlushPolicy {
            eager_edges: false,
            ..FlushPolicy::default()
        };
        check(off, p, t0, Flush::At(at(t0, 5)));
    }

    #[test]
    fn an_open_waits_for_its_batch_unless_eager_opens_is_on() {
        let t0 = epoch();
        let p = Pending {
            open_edge: true,
            ..one_record(t0)
        };
        check(FlushPolicy::default(), p, t0, Flush::At(at(t0, 5)));
        let eager = FlushPolicy {
            eager_opens: true,
            ..FlushPolicy::default()
        };
        check(eager, p, t0, Flush::Now(FlushReason::Edge));
        let no_edges = FlushPolicy {
            eager_edges: false,
            ..eager
        };
        check(no_edges, p, t0, Flush::At(at(t0, 5)));
    }

    #[test]
    fn a_stream_low_on_credit_flushes_at_once_under_every_policy() {
        let t0 = epoch();
        let p = Pending {
            credit_low: true,
            ..one_record(t0)
        };
        let no_edges = FlushPolicy {
            eager_edges: false,
            ..FlushPolicy::default()
        };
        for policy in [FlushPolicy::default(), no_edges] {
            check(policy, p, t0, Flush::Now(FlushReason::Credit));
        }
    }

    #[test]
    fn grants_have_their_own_deadline() {
        let t0 = epoch();
        let g = Pending {
            records: 1,
            bytes: 4,
            grant_deadline: Some(at(t0, 1)),
            ..Pending::default()
        };
        check(FlushPolicy::default(), g, t0, Flush::At(at(t0, 1)));
        check(
            FlushPolicy::default(),
            g,
            at(t0, 1),
            Flush::Now(FlushReason::Deadline),
        );
        // Data and grants: the earlier deadline wins.
        let both = Pending {
            oldest: Some(t0),
            ..g
        };
        check(FlushPolicy::default(), both, t0, Flush::At(at(t0, 1)));
    }
}
