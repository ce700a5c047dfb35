//! Counters a mux keeps, returned by value; only runtime-glue turns them into metrics.

/// Upper bounds (inclusive) of the records-per-batch histogram buckets; the last bucket
/// takes everything larger.
pub const BATCH_RECORDS_BUCKETS: [u32; 11] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024];

/// Counters since the mux was created. Plain `u64`s: cheap to copy, diff and export.
#[non_exhaustive]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MuxStats {
    /// Records written into batches (all kinds).
    pub records_sent: u64,
    /// Records decoded from received batches (all kinds).
    pub records_received: u64,
    /// DATA and FINAL payload bytes sent.
    pub payload_bytes_sent: u64,
    /// DATA and FINAL payload bytes received.
    pub payload_bytes_received: u64,
    /// Frame bytes handed to the transport (headers included).
    pub bytes_sent: u64,
    /// Bytes received from the transport.
    pub bytes_received: u64,
    /// Batches sealed and handed to the transport.
    pub batches_sent: u64,
    /// Batches received.
    pub batches_received: u64,
    /// Histogram of records per sent batch; bucket `i` counts batches with at most
    /// `BATCH_RECORDS_BUCKETS[i]` records (and more than the previous bound); the last counts
    /// larger batches.
    pub batch_records: [u64; BATCH_RECORDS_BUCKETS.len() + 1],
    /// Batches flushed because control records could not wait.
    pub flush_control: u64,
    /// Batches flushed on the application's hint.
    pub flush_hint: u64,
    /// Batches flushed because they were full.
    pub flush_size: u64,
    /// Batches flushed when their oldest record reached the maximum delay.
    pub flush_deadline: u64,
    /// Batches flushed by the greedy policy.
    pub flush_greedy: u64,
    /// Batches flushed at once for a stream's edge records (prologue, first item, end).
    pub flush_edge: u64,
    /// Sends refused for lack of stream credit.
    pub credit_stalls: u64,
    /// Sends refused because the lane buffer was full.
    pub lane_stalls: u64,
    /// CREDIT records sent.
    pub grants_sent: u64,
    /// HEARTBEAT records sent.
    pub heartbeats_sent: u64,
    /// Records dropped because they named a stream that is gone (stale generation).
    pub stale_drops: u64,
    /// Frontend: records naming a stream the worker had already ended with FINAL or ERROR
    /// (a broken worker; the stream's end becomes a violation if it was not read yet).
    pub records_after_end: u64,
    /// Streams opened (worker) or accepted (frontend).
    pub streams_opened: u64,
    /// Streams that ended with FINAL.
    pub streams_finished: u64,
    /// Streams that ended with ERROR.
    pub streams_errored: u64,
    /// Streams that ended by cancellation.
    pub streams_cancelled: u64,
    /// Streams that ended because their lane failed.
    pub streams_lost: u64,
    /// Streams ended for breaking a protocol rule.
    pub streams_violated: u64,
    /// Streams refused by the frontend (limit, going away, unknown ticket).
    pub streams_refused: u64,
    /// Worker: streams the frontend asked to stop or cancelled, each counted once (the
    /// cancellations a serving runtime reports).
    pub remote_cancellations: u64,
    /// Lanes that came up.
    pub lanes_up: u64,
    /// Lanes that failed or closed.
    pub lanes_closed: u64,
}

impl MuxStats {
    pub(crate) fn record_batch(&mut self, records: u32) {
        let bucket = BATCH_RECORDS_BUCKETS
            .iter()
            .position(|&b| records <= b)
            .unwrap_or(BATCH_RECORDS_BUCKETS.len());
        self.batch_records[bucket] += 1;
        self.batches_sent += 1;
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
