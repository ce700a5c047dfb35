//! Validated configuration of a [`Mux`](crate::Mux).

use std::time::Duration;

use crate::churn::{ChurnLimit, DEFAULT_CHURN_LIMIT};
use crate::flush::FlushPolicy;

/// Which end of a connection a mux is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// Dials lanes, opens streams and sends their items.
    Worker,
    /// Accepts lanes and streams, consumes items, returns credit.
    Frontend,
}

impl Side {
    /// The wire role of this side.
    pub fn role(self) -> velo_wire::Role {
        match self {
            Self::Worker => velo_wire::Role::Worker,
            Self::Frontend => velo_wire::Role::Frontend,
        }
    }
}

/// Default lanes per connection. Velo measured 4 lanes against 1: 2,406 vs 1,359 req/s and
/// ITL p99 4.9 vs 15.0 ms, because one connection is limited by the one task that reads it.
pub const DEFAULT_LANES: u16 = 4;
/// Default credit window per stream, in records. Velo measured 256 against 32 with a
/// saturated frontend: TTFT p50 135-355 ms vs 88-102 ms at the same throughput.
pub const DEFAULT_WINDOW: u32 = 32;
/// Default cap on concurrent streams per connection (per worker process and frontend).
pub const DEFAULT_MAX_STREAMS: u32 = 65_536;
/// Default cap on bytes queued for one lane and not yet taken by its transport: 4 MiB, enough
/// for a 1 MiB item plus a few hundred windows of small ones.
pub const DEFAULT_MAX_BUFFERED_BYTES: usize = 4 * 1024 * 1024;
/// Default cap on a stream's prologue, in bytes: 64 KiB. A prologue is `{"error":null}` or an
/// error with its typed cause, far below this; the frontend holds each until the stream is
/// taken, so a frame-sized (32 MiB) prologue per stream would let a peer pin gigabytes.
pub const DEFAULT_MAX_PROLOGUE_LEN: u32 = 64 * 1024;
/// Default cap on OPENs a frontend lane holds unanswered (neither accepted nor refused by
/// the application yet): 4,096, above the ~2,700 smallest OPENs one 64 KiB read can carry, since
/// a driver answers each read's OPENs before it reads again. Each pins its prologue
/// (`max_prologue_len`) until answered.
pub const DEFAULT_MAX_PENDING_OPENS: u32 = 4_096;
/// Default cap on control bytes (records that carry no stream payload: ACCEPT, CANCEL,
/// CREDIT, STOP, HEARTBEAT, GOAWAY) queued on one lane and not yet taken by its transport:
/// 1 MiB. Input pauses at half of it; input that queues past it closes the lane.
pub const DEFAULT_MAX_CONTROL_BYTES: usize = 1024 * 1024;
/// Default idle timeout of a lane: a silent peer is declared lost after 10 s.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default delay before queued credit grants are flushed: 1 ms. Grants are returned when half
/// a window has been consumed, so the worker still has half a window of credit meanwhile;
/// coalescing grants of all streams for a millisecond caps the frontend at ~1,000 writes/s
/// per lane instead of one write per grant.
pub const DEFAULT_GRANT_DELAY: Duration = Duration::from_millis(1);

/// Whether this side packs (LZ4-compresses) the batches it sends.
///
/// Packing is negotiated: every HELLO announces that its sender accepts PACKED frames
/// ([`velo_wire::CAP_PACKED`]), and a side configured to pack does so only on lanes whose
/// peer announced it. A batch that does not shrink (or is shorter than
/// [`velo_wire::MIN_PACK_LEN`]) goes out as a plain BATCH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Compression {
    /// Batches go out as they are (the default: on loopback or a fast fabric packing costs
    /// CPU on both ends and saves nothing).
    #[default]
    None,
    /// Batches are packed with LZ4: several times fewer bytes for items that repeat their
    /// field names (35-44% fewer packets in the bench's 1,500-byte-MTU runs), for 0.02-0.03
    /// us of worker CPU per ~85-byte item at saturation.
    Lz4,
}

/// What can be wrong with a configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A value is outside its allowed range.
    #[error("invalid {field} {value}: {allowed}")]
    OutOfRange {
        /// The setting.
        field: &'static str,
        /// The rejected value, rendered.
        value: String,
        /// What is allowed.
        allowed: &'static str,
    },
}

impl ConfigError {
    /// `Ok` when `value` lies in `range`, else [`OutOfRange`](Self::OutOfRange) naming
    /// `field`, the value and what is `allowed`: the check every configuration builder of the
    /// stack makes.
    ///
    /// # Errors
    ///
    /// [`OutOfRange`](Self::OutOfRange) when `value` is outside `range`.
    pub fn check_range<T: PartialOrd + std::fmt::Debug>(
        field: &'static str,
        value: T,
        range: std::ops::RangeInclusive<T>,
        allowed: &'static str,
    ) -> Result<(), Self> {
        if range.contains(&value) {
            Ok(())
        } else {
            Err(Self::OutOfRange {
                field,
                value: format!("{value:?}"),
                allowed,
            })
        }
    }
}

/// The configuration of a [`Mux`](crate::Mux), checked when built.
#[derive(Debug, Clone)]
pub struct MuxConfig {
    pub(crate) side: Side,
    pub(crate) lanes: u16,
    pub(crate) window: u32,
    pub(crate) max_streams: u32,
    pub(crate) max_frame_len: u32,
    pub(crate) max_buffered_bytes: usize,
    pub(crate) flush: FlushPolicy,
    pub(crate) grant_delay: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) max_prologue_len: u32,
    pub(crate) churn: ChurnLimit,
    pub(crate) max_pending_opens: u32,
    pub(crate) max_control_bytes: usize,
    pub(crate) compression: Compression,
}

impl MuxConfig {
    /// A builder starting from the defaults for `side`.
    pub fn builder(side: Side) -> MuxConfigBuilder {
        MuxConfigBuilder {
            config: Self {
                side,
                lanes: DEFAULT_LANES,
                window: DEFAULT_WINDOW,
                max_streams: DEFAULT_MAX_STREAMS,
                max_frame_len: velo_wire::DEFAULT_MAX_FRAME_LEN,
                max_buffered_bytes: DEFAULT_MAX_BUFFERED_BYTES,
                flush: FlushPolicy::default(),
                grant_delay: DEFAULT_GRANT_DELAY,
                idle_timeout: DEFAULT_IDLE_TIMEOUT,
                max_prologue_len: DEFAULT_MAX_PROLOGUE_LEN,
                churn: DEFAULT_CHURN_LIMIT,
                max_pending_opens: DEFAULT_MAX_PENDING_OPENS,
                max_control_bytes: DEFAULT_MAX_CONTROL_BYTES,
                compression: Compression::None,
            },
        }
    }

    /// This side.
    pub fn side(&self) -> Side {
        self.side
    }
    /// Lanes per connection.
    pub fn lanes(&self) -> u16 {
        self.lanes
    }
    /// Credit window, in records, that this side grants each stream it accepts.
    pub fn window(&self) -> u32 {
        self.window
    }
    /// Most concurrent streams on this connection.
    pub fn max_streams(&self) -> u32 {
        self.max_streams
    }
    /// Largest frame body this side accepts and sends, in bytes.
    pub fn max_frame_len(&self) -> u32 {
        self.max_frame_len
    }
    /// Largest item (record payload) this side sends or accepts, in bytes.
    pub fn max_record_len(&self) -> u32 {
        self.max_frame_len.saturating_sub(RECORD_HEADROOM)
    }
    /// Most bytes queued per lane before senders are held back.
    pub fn max_buffered_bytes(&self) -> usize {
        self.max_buffered_bytes
    }
    /// When batches are written.
    pub fn flush(&self) -> &FlushPolicy {
        &self.flush
    }
    /// Delay before queued credit grants are flushed.
    pub fn grant_delay(&self) -> Duration {
        self.grant_delay
    }
    /// Silence after which a lane is declared lost.
    pub fn idle_timeout(&self) -> Duration {
        self.idle_timeout
    }
    /// Largest prologue a stream carries, in bytes (both sides): the configured cap, or the
    /// largest record if that is smaller.
    pub fn max_prologue_len(&self) -> u32 {
        self.max_prologue_len.min(self.max_record_len())
    }
    /// Churn a connection may cause before a lane of it closes (frontend).
    pub fn churn_limit(&self) -> ChurnLimit {
        self.churn
    }
    /// Most OPENs a lane holds unanswered (frontend); past it an OPEN is refused.
    pub fn max_pending_opens(&self) -> u32 {
        self.max_pending_opens
    }

    /// Unanswered OPENs on a lane at which its input pauses: half of `max_pending_opens`, at
    /// least 1.
    pub(crate) fn pending_opens_pause(&self) -> u32 {
        (self.max_pending_opens / 2).max(1)
    }
    /// Most control bytes queued on a lane; input pauses at half of it, and input that
    /// queues past it closes the lane.
    pub fn max_control_bytes(&self) -> usize {
        self.max_control_bytes
    }

    /// Whether this side packs the batches it sends (where the peer accepts it).
    pub fn compression(&self) -> Compression {
        self.compression
    }

    /// The same configuration with another lane count (a frontend adopts each worker's).
    ///
    /// # Panics
    ///
    /// If `lanes` is not `1..=64` (a HELLO never carries such a count: the codec rejects it).
    pub fn with_lanes(&self, lanes: u16) -> Self {
        assert!(
            (1..=velo_wire::MAX_LANES).contains(&lanes),
            "lane count {lanes} out of range"
        );
        Self {
            lanes,
            ..self.clone()
        }
    }

    /// The HELLO this side sends on lane `lane_index`.
    pub fn hello(
        &self,
        lane_index: u16,
        instance_id: velo_wire::InstanceId,
        peer_instance_id: velo_wire::InstanceId,
    ) -> velo_wire::Hello {
        velo_wire::Hello {
            role: self.side.role(),
            lane_index,
            lane_count: self.lanes,
            instance_id,
            peer_instance_id,
            max_frame_len: self.max_frame_len,
            initial_window: self.window,
            idle_timeout_ms: u32::try_from(self.idle_timeout.as_millis()).unwrap_or(u32::MAX),
            capabilities: velo_wire::CAP_PACKED,
            auth_nonce: None,
            worker_instance: None,
        }
    }
}

/// Least `max_control_bytes`: room for a few hundred control records.
const MIN_CONTROL_BYTES: usize = 4096;

/// Bytes of a frame reserved for headers when sizing the largest record: frame header (5),
/// the longest record header (OPEN, 42) and slack.
const RECORD_HEADROOM: u32 = 64;

/// Builds a [`MuxConfig`]; [`build`](Self::build) checks every value.
#[derive(Debug, Clone)]
pub struct MuxConfigBuilder {
    config: MuxConfig,
}

impl MuxConfigBuilder {
    /// Lanes per connection, `1..=64` (default 4).
    pub fn lanes(mut self, lanes: u16) -> Self {
        self.config.lanes = lanes;
        self
    }
    /// Credit window per stream in records, `1..=65536` (default 32).
    pub fn window(mut self, window: u32) -> Self {
        self.config.window = window;
        self
    }
    /// Most concurrent streams per connection, `1..=2^24` (default 65,536).
    pub fn max_streams(mut self, max: u32) -> Self {
        self.config.max_streams = max;
        self
    }
    /// Largest frame body in bytes, `4096..=1 GiB` (default 32 MiB).
    pub fn max_frame_len(mut self, max: u32) -> Self {
        self.config.max_frame_len = max;
        self
    }
    /// Most bytes queued per lane before senders wait, at least 64 KiB (default 4 MiB).
    pub fn max_buffered_bytes(mut self, max: usize) -> Self {
        self.config.max_buffered_bytes = max;
        self
    }
    /// The flush policy (default: 5 ms, 64 KiB, 1,024 records).
    pub fn flush(mut self, flush: FlushPolicy) -> Self {
        self.config.flush = flush;
        self
    }
    /// Delay before credit grants are flushed, at most 1 s (default 1 ms).
    pub fn grant_delay(mut self, delay: Duration) -> Self {
        self.config.grant_delay = delay;
        self
    }
    /// Silence (or a write making no progress) after which a lane is lost,
    /// `100 ms..=1 h` (default 10 s): the range every peer accepts in a HELLO
    /// ([`handshake::MIN_IDLE_TIMEOUT`](crate::handshake::MIN_IDLE_TIMEOUT)).
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.config.idle_timeout = timeout;
        self
    }

    /// Largest prologue of a stream in bytes, at least 2 (default 64 KiB); a prologue never
    /// exceeds the largest record either.
    pub fn max_prologue_len(mut self, max: u32) -> Self {
        self.config.max_prologue_len = max;
        self
    }
    /// Churn (streams refused, or reset before their first item) a connection may cause,
    /// each of `burst` and `per_second` at least 1 (default: 1,024, then 256/s).
    pub fn churn_limit(mut self, limit: ChurnLimit) -> Self {
        self.config.churn = limit;
        self
    }
    /// Most OPENs a frontend lane holds before the application answers them (ACCEPT or
    /// CANCEL), `1..=2^24` (default 4,096); past it an OPEN is refused with CANCEL
    /// `too_many_streams`, counted `pending_opens_refused` and as churn.
    pub fn max_pending_opens(mut self, max: u32) -> Self {
        self.config.max_pending_opens = max;
        self
    }
    /// Most control bytes (ACCEPT, CANCEL, CREDIT, STOP, HEARTBEAT, GOAWAY) queued on a lane,
    /// at least 4 KiB (default 1 MiB): input pauses at half of it
    /// ([`Mux::wants_input`](crate::Mux::wants_input)); input that queues past it closes the
    /// lane ([`LaneError::ControlQueueFull`](crate::LaneError), CLOSE `limit`).
    pub fn max_control_bytes(mut self, max: usize) -> Self {
        self.config.max_control_bytes = max;
        self
    }

    /// Whether batches this side sends are packed, where the peer accepts it (default
    /// [`Compression::None`]).
    pub fn compression(mut self, compression: Compression) -> Self {
        self.config.compression = compression;
        self
    }

    /// Checks every value.
    ///
    /// # Errors
    ///
    /// [`ConfigError::OutOfRange`] naming the first value outside its range.
    pub fn build(self) -> Result<MuxConfig, ConfigError> {
        let c = self.config;
        fn range<T: PartialOrd + std::fmt::Debug>(
            field: &'static str,
            v: T,
            lo: T,
            hi: T,
            allowed: &'static str,
        ) -> Result<(), ConfigError> {
            ConfigError::check_range(field, v, lo..=hi, allowed)
        }
        range("lanes", c.lanes, 1, velo_wire::MAX_LANES, "must be 1..=64")?;
        range("window", c.window, 1, 65_536, "must be 1..=65536 records")?;
        range(
            "max_streams",
            c.max_streams,
            1,
            1 << 24,
            "must be 1..=16777216",
        )?;
        range(
            "max_frame_len",
            c.max_frame_len,
            velo_wire::MIN_MAX_FRAME_LEN,
            1 << 30,
            "must be 4096..=1073741824 bytes",
        )?;
        range(
            "max_buffered_bytes",
            c.max_buffered_bytes,
            64 * 1024,
            usize::MAX,
            "must be at least 65536 bytes",
        )?;
        range(
            "grant_delay",
            c.grant_delay,
            Duration::ZERO,
            Duration::from_secs(1),
            "must be at most 1 s",
        )?;
        range(
            "idle_timeout",
            c.idle_timeout,
            crate::handshake::MIN_IDLE_TIMEOUT,
            crate::handshake::MAX_IDLE_TIMEOUT,
            "must be 100 ms..=1 h",
        )?;
        range(
            "max_prologue_len",
            c.max_prologue_len,
            2,
            u32::MAX,
            "must be at least 2 bytes",
        )?;
        range(
            "churn burst",
            c.churn.burst,
            1,
            u32::MAX,
            "must be at least 1",
        )?;
        range(
            "churn rate",
            c.churn.per_second,
            1,
            u32::MAX,
            "must be at least 1 per second",
        )?;
        range(
            "max_pending_opens",
            c.max_pending_opens,
            1,
            1 << 24,
            "must be 1..=16777216",
        )?;
        range(
            "max_control_bytes",
            c.max_control_bytes,
            MIN_CONTROL_BYTES,
            usize::MAX,
            "must be at least 4096 bytes",
        )?;
        c.flush.check()?;
        Ok(c)
    }
}

impl Default for MuxConfigBuilder {
    fn default() -> Self {
        MuxConfig::builder(Side::Worker)
    }
}
