//! Counters of a response plane, in the plane's own terms (no mux or wire types).

/// Upper bounds of the records-per-batch histogram buckets (the last bucket is unbounded).
pub const BATCH_RECORDS_BUCKETS: [u32; 11] = velo_mux::BATCH_RECORDS_BUCKETS;

/// Counters since the plane started; plain numbers that runtime-glue exports as metrics.
#[non_exhaustive]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PlaneStats {
    /// Frontend: streams registered.
    pub streams_registered: u64,
    /// Streams whose prologue was delivered (frontend) or that were set up (worker).
    pub streams_established: u64,
    /// Streams that failed before their prologue (frontend: refusal, loss, timeout; worker:
    /// the frontend unreachable, plane mismatch, bad address): the `response_stream` errors.
    pub stream_setup_failures: u64,
    /// Frontend: arriving streams refused (unknown ticket, bad token, dropped handle).
    pub streams_refused: u64,
    /// Worker: streams the frontend asked to stop or killed, each counted once.
    pub cancellations: u64,
    /// Streams opened on the transport (velo).
    pub streams_opened: u64,
    /// Streams ended cleanly (velo).
    pub streams_finished: u64,
    /// Streams ended by an error or a dropped sender (velo).
    pub streams_errored: u64,
    /// Streams ended by cancellation (velo).
    pub streams_cancelled: u64,
    /// Streams ended because their connection was lost (velo).
    pub streams_lost: u64,
    /// Records sent (velo).
    pub records_sent: u64,
    /// Records received (velo).
    pub records_received: u64,
    /// Bytes written to the transport (velo).
    pub bytes_sent: u64,
    /// Bytes read from the transport (velo).
    pub bytes_received: u64,
    /// Batches written (velo).
    pub batches_sent: u64,
    /// Records per written batch, histogram over [`BATCH_RECORDS_BUCKETS`] (velo).
    pub batch_records: [u64; 12],
    /// Batches flushed by: control records, the flush hint, size, deadline, greedy, a
    /// stream's edge records (velo).
    pub flush_reasons: [u64; 6],
    /// Sends that waited for credit (velo).
    pub credit_stalls: u64,
    /// Records dropped for naming a stream that is gone (velo).
    pub stale_drops: u64,
    /// Lanes that came up (velo).
    pub lanes_up: u64,
    /// Lanes that closed (velo).
    pub lanes_closed: u64,
    /// Connections whose handshake failed or timed out (velo).
    pub handshake_failures: u64,
}

/// Names of [`PlaneStats::flush_reasons`] entries, in order.
pub const FLUSH_REASONS: [&str; 6] = ["control", "hint", "size", "deadline", "greedy", "edge"];

impl PlaneStats {
    /// Streams currently open on the transport (velo).
    pub fn streams_active(&self) -> u64 {
        self.streams_opened.saturating_sub(
            self.streams_finished
                + self.streams_errored
                + self.streams_cancelled
                + self.streams_lost,
        )
    }

    pub(crate) fn add_velo(&mut self, m: &velo_mux::MuxStats, t: &velo_session::HandshakeStats) {
        self.add_mux(m);
        self.handshake_failures += t.handshake_failures + t.handshake_timeouts + t.dial_failures;
    }

    pub(crate) fn add_mux(&mut self, m: &velo_mux::MuxStats) {
        self.cancellations += m.remote_cancellations;
        self.streams_opened += m.streams_opened;
        self.streams_finished += m.streams_finished;
        self.streams_errored += m.streams_errored + m.streams_violated;
        self.streams_cancelled += m.streams_cancelled;
        self.streams_lost += m.streams_lost;
        self.records_sent += m.records_sent;
        self.records_received += m.records_received;
        self.bytes_sent += m.bytes_sent;
        self.bytes_received += m.bytes_received;
        self.batches_sent += m.batches_sent;
        for (a, b) in self.batch_records.iter_mut().zip(m.batch_records) {
            *a += b;
        }
        for (a, b) in self.flush_reasons.iter_mut().zip([
            m.flush_control,
            m.flush_hint,
            m.flush_size,
            m.flush_deadline,
            m.flush_greedy,
            m.flush_edge,
        ]) {
            *a += b;
        }
        self.credit_stalls += m.credit_stalls;
        self.stale_drops += m.stale_drops;
        self.lanes_up += m.lanes_up;
        self.lanes_closed += m.lanes_closed;
    }
}
