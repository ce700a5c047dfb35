//! Counters a mux keeps, returned by value; only runtime-glue turns them into metrics.
//!
//! Every plain counter is declared once, in the table inside [`counters!`]: that declares
//! the field, adds it to [`MuxStats`]'s `+=` and to [`MuxStats::COUNTERS`], by which the
//! metrics exporter finds it (and its tests notice one it does not export).

use std::ops::AddAssign;

use crate::FlushReason;

/// Upper bounds (inclusive) of the records-per-batch histogram buckets; the last bucket
/// takes everything larger.
pub const BATCH_RECORDS_BUCKETS: [u32; 11] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024];

/// One plain counter of a stats struct: its field name, its doc line, and how to read it.
#[derive(Debug, Clone, Copy)]
pub struct Counter<S> {
    /// The field's name, also the metric's (with a prefix).
    pub name: &'static str,
    /// The field's documentation (its first line, as written: trim it), also the metric's
    /// help.
    pub help: &'static str,
    /// Reads the field.
    pub read: fn(&S) -> u64,
}

/// Declares the plain counters of [`MuxStats`] from one table.
macro_rules! counters {
    ($($(#[doc = $doc:literal])+ $field:ident,)*) => {
        /// Counters since the mux was created. Plain `u64`s: cheap to copy, diff, add up and
        /// export.
        #[non_exhaustive]
        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
        pub struct MuxStats {
            $($(#[doc = $doc])+ pub $field: u64,)*
            /// Histogram of records per sent batch; bucket `i` counts batches with at most
            /// `BATCH_RECORDS_BUCKETS[i]` records (and more than the previous bound); the last
            /// counts larger batches.
            pub batch_records: [u64; BATCH_RECORDS_BUCKETS.len() + 1],
            /// Batches flushed, by [`FlushReason`] (index: the reason's position in
            /// [`FlushReason::ALL`]).
            pub flushes: [u64; FlushReason::ALL.len()],
        }

        impl MuxStats {
            /// Every plain counter (the histogram and the flushes by reason are arrays).
            pub const COUNTERS: &'static [Counter<Self>] = &[$(Counter {
                name: stringify!($field),
                help: counters!(@first $($doc)+),
                read: |s| s.$field,
            },)*];
        }

        impl AddAssign for MuxStats {
            fn add_assign(&mut self, other: Self) {
                $(self.$field += other.$field;)*
                for (a, b) in self.batch_records.iter_mut().zip(other.batch_records) {
                    *a += b;
                }
                for (a, b) in self.flushes.iter_mut().zip(other.flushes) {
                    *a += b;
                }
            }
        }
    };
    (@first $first:literal $($rest:literal)*) => { $first };
}

counters! {
    /// Records written into batches (all kinds).
    records_sent,
    /// Records decoded from received batches (all kinds).
    records_received,
    /// DATA and FINAL payload bytes sent.
    payload_bytes_sent,
    /// DATA and FINAL payload bytes received.
    payload_bytes_received,
    /// Frame bytes handed to the transport (headers included).
    bytes_sent,
    /// Bytes received from the transport.
    bytes_received,
    /// Batches sealed and handed to the transport.
    batches_sent,
    /// Batches received.
    batches_received,
    /// Batches sent packed (LZ4, where this side packs and the peer accepts it); also in
    /// `batches_sent`.
    batches_packed,
    /// Bytes packing saved: the BATCH frames' length minus the PACKED frames' sent instead.
    packed_bytes_saved,
    /// Sends refused for lack of stream credit.
    credit_stalls,
    /// Sends (and large OPENs) refused because the lane buffer was full.
    lane_stalls,
    /// Times input stopped because the bytes queued for a peer that does not read were at
    /// their limit.
    input_pauses,
    /// CREDIT records sent.
    grants_sent,
    /// HEARTBEAT records sent.
    heartbeats_sent,
    /// Records dropped because they named a stream that is gone (stale generation).
    stale_drops,
    /// Worker: streams this side ended (FINAL or ERROR) before the frontend accepted them,
    /// whose lane failed or that the frontend refused first: their end was not delivered.
    ends_undelivered,
    /// Worker: streams whose lane died before the frontend accepted them, announced again
    /// on another lane as abandoned so the frontend's request ends.
    opens_lost,
    /// Frontend: records naming a stream the worker had already ended with FINAL or ERROR.
    records_after_end,
    /// Streams opened (worker) or accepted (frontend).
    streams_opened,
    /// Streams that ended with FINAL.
    streams_finished,
    /// Streams that ended with ERROR.
    streams_errored,
    /// Streams that ended by cancellation.
    streams_cancelled,
    /// Streams that ended because their lane failed.
    streams_lost,
    /// Streams ended for breaking a protocol rule.
    streams_violated,
    /// Streams refused by the frontend (limit, unknown ticket, bad token).
    streams_refused,
    /// Frontend: streams refused, or reset by the worker before their first item (the churn
    /// the churn limit bounds).
    churn,
    /// Frontend: lanes closed for going past the churn limit.
    churn_closes,
    /// Frontend: OPENs refused because their lane held `max_pending_opens` unanswered (also
    /// in `streams_refused` and `churn`).
    pending_opens_refused,
    /// Lanes closed because input queued more than `max_control_bytes` of control records
    /// for a peer that does not read them.
    control_queue_closes,
    /// Worker: streams the frontend asked to stop or cancelled, each counted once.
    remote_cancellations,
    /// Lanes that came up.
    lanes_up,
    /// Lanes that failed or closed.
    lanes_closed,
}

impl MuxStats {
    pub(crate) fn record_batch(&mut self, sealed: crate::lane::Sealed) {
        let records = sealed.records;
        if sealed.saved > 0 {
            self.batches_packed += 1;
            self.packed_bytes_saved += sealed.saved as u64;
        }
        let bucket = BATCH_RECORDS_BUCKETS
            .iter()
            .position(|&b| records <= b)
            .unwrap_or(BATCH_RECORDS_BUCKETS.len());
        self.batch_records[bucket] += 1;
        self.batches_sent += 1;
    }

    /// Counts a batch flushed for `reason`.
    pub(crate) fn record_flush(&mut self, reason: FlushReason) {
        self.flushes[reason as usize] += 1;
    }

    /// Batches flushed for `reason`.
    pub fn flushed(&self, reason: FlushReason) -> u64 {
        self.flushes[reason as usize]
    }

    /// Streams currently open: opened minus every kind of end.
    pub fn streams_active(&self) -> u64 {
        self.streams_opened.saturating_sub(
            self.streams_finished
                + self.streams_errored
                + self.streams_cancelled
                + self.streams_lost
                + self.streams_violated,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_add_up_field_by_field_and_the_table_reads_each_field() {
        let mut a = MuxStats {
            records_sent: 1,
            streams_refused: 2,
            ..MuxStats::default()
        };
        a.flushes[FlushReason::Hint as usize] = 3;
        let mut b = a;
        b += a;
        assert_eq!(b.records_sent, 2);
        assert_eq!(b.streams_refused, 4);
        assert_eq!(b.flushed(FlushReason::Hint), 6);
        let refused = MuxStats::COUNTERS
            .iter()
            .find(|c| c.name == "streams_refused")
            .expect("listed");
        assert_eq!((refused.read)(&b), 4);
        assert!(refused.help.trim().starts_with("Streams refused"));
        for (i, reason) in FlushReason::ALL.iter().enumerate() {
            assert_eq!(*reason as usize, i, "ALL is in discriminant order");
        }
    }
}
