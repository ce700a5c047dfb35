//! The "rapid reset" guard (HTTP/2's CVE-2023-44487, in this protocol's terms): a worker
//! whose streams are refused, or that opens streams and resets them before their first
//! item, makes the frontend work per stream for nothing. Each such stream costs a token from
//! a per-connection bucket; a connection with no token left has the lane that caused it
//! closed with CLOSE `churn_limit`.

use std::time::Instant;

/// How much churn (streams refused, or reset by their opener before their first item) a
/// connection may cause: a burst, refilled at a steady rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChurnLimit {
    /// Churn absorbed at once, in streams.
    pub burst: u32,
    /// Churn absorbed per second after a burst, in streams.
    pub per_second: u32,
}

/// Default churn limit: a burst of 1,024 streams, then 256 per second per connection. A
/// healthy worker causes churn only when clients give up before a prologue (a refused OPEN)
/// or its engine drops a request before answering (an OPEN then ERROR): a few a second. A
/// flood is cut after its burst, and then at most 256 refusals a second cost the frontend
/// anything.
pub const DEFAULT_CHURN_LIMIT: ChurnLimit = ChurnLimit {
    burst: 1024,
    per_second: 256,
};

/// Tokens are counted in thousandths, so a rate refills smoothly by the microsecond.
const MILLI: u64 = 1000;

/// One connection's bucket.
#[derive(Debug, Clone)]
pub(crate) struct ChurnBucket {
    limit: ChurnLimit,
    /// Tokens left, in thousandths of a stream.
    milli_tokens: u64,
    refilled_at: Instant,
}

impl ChurnBucket {
    pub(crate) fn new(limit: ChurnLimit, now: Instant) -> Self {
        Self {
            limit,
            milli_tokens: u64::from(limit.burst) * MILLI,
            refilled_at: now,
        }
    }

    /// Takes one stream's token at `now`; `false` once the connection is over its limit.
    pub(crate) fn take(&mut self, now: Instant) -> bool {
        let micros = now.saturating_duration_since(self.refilled_at).as_micros();
        // `per_second` tokens per 10^6 us is `per_second` thousandths per 1,000 us.
        let refill = micros.saturating_mul(u128::from(self.limit.per_second)) / 1000;
        let cap = u64::from(self.limit.burst) * MILLI;
        let refill = u64::try_from(refill).unwrap_or(u64::MAX);
        self.milli_tokens = self.milli_tokens.saturating_add(refill).min(cap);
        self.refilled_at = self.refilled_at.max(now);
        match self.milli_tokens.checked_sub(MILLI) {
            Some(left) => {
                self.milli_tokens = left;
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_burst_is_absorbed_then_only_the_rate() {
        #[allow(clippy::disallowed_methods)] // the epoch of a virtual clock; never read again
        let t0 = Instant::now();
        let mut b = ChurnBucket::new(
            ChurnLimit {
                burst: 10,
                per_second: 100,
            },
            t0,
        );
        assert!((0..10).all(|_| b.take(t0)), "the burst");
        assert!(!b.take(t0), "past the burst");
        // 100 per second: one token every 10 ms.
        assert!(!b.take(t0 + Duration::from_millis(9)));
        assert!(b.take(t0 + Duration::from_millis(10)));
        assert!(!b.take(t0 + Duration::from_millis(10)));
        // A long quiet spell refills the burst, not more.
        let later = t0 + Duration::from_secs(60);
        assert_eq!((0..20).filter(|_| b.take(later)).count(), 10);
    }
}
